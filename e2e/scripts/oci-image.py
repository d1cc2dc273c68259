#!/usr/bin/env python3
"""Writes an OCI image layout archive (one uncompressed layer) that `ctr images import` accepts.

  oci-image.py --name REF --out FILE [--file SRC:DST[:MODE]]... [--dir DST[:MODE[:UID]]]... [--user U]
               [--entrypoint JSON] [--cmd JSON] [--env K=V]... [--expose PORT/PROTO]... [--workdir DIR]

Files are stored with uid/gid 0 and mtime 0, so the same inputs give the same digest.
"""
import argparse
import hashlib
import io
import json
import os
import sys
import tarfile


def add_dirs(tar, seen, path):
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d and d not in seen:
            seen.add(d)
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)


def layer(files, dirs):
    buf = io.BytesIO()
    seen = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for spec in dirs:
            d, mode, owner = (spec.split(":") + ["755", "0"])[:3]
            d = d.strip("/")
            add_dirs(tar, seen, d)
            if d not in seen:
                seen.add(d)
                info = tarfile.TarInfo(d)
                info.type = tarfile.DIRTYPE
                info.mode = int(mode, 8)
                info.uid = info.gid = int(owner)
                tar.addfile(info)
        for src, dst, mode in files:
            dst = dst.strip("/")
            add_dirs(tar, seen, dst)
            with open(src, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(dst)
            info.size = len(data)
            info.mode = mode if mode is not None else (os.stat(src).st_mode & 0o777)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def blob(out, data):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    info.mode = 0o644
    out.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}", len(data)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--dir", action="append", default=[])
    p.add_argument("--user", default="")
    p.add_argument("--entrypoint", default="null")
    p.add_argument("--cmd", default="null")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--expose", action="append", default=[])
    p.add_argument("--workdir", default="")
    a = p.parse_args()

    files = []
    for spec in a.file:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            sys.exit(f"oci-image: --file wants SRC:DST[:MODE], got {spec!r}")
        if not os.path.isfile(parts[0]):
            sys.exit(f"oci-image: --file {spec!r}: {parts[0]} is not a file")
        files.append((parts[0], parts[1], int(parts[2], 8) if len(parts) == 3 else None))
    data = layer(files, a.dir)
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            k: v
            for k, v in {
                "User": a.user or None,
                "Entrypoint": json.loads(a.entrypoint),
                "Cmd": json.loads(a.cmd),
                "Env": a.env or None,
                "ExposedPorts": {e: {} for e in a.expose} or None,
                "WorkingDir": a.workdir or None,
            }.items()
            if v is not None
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "e2e/scripts/oci-image.py"}],
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as out:
        layer_digest, layer_size = blob(out, data)
        config_digest, config_size = blob(out, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}],
        }
        manifest_digest, manifest_size = blob(out, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "annotations": {"io.containerd.image.name": a.name, "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1]},
            }],
        }
        for name, body in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            raw = json.dumps(body).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            info.mode = 0o644
            out.addfile(info, io.BytesIO(raw))
    os.replace(tmp, a.out)
    print(f"{a.name} {manifest_digest} -> {a.out}")


if __name__ == "__main__":
    main()
