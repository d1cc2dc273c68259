#!/usr/bin/env python3
"""Builds rekindle's image as an OCI archive without a container engine or registry.

The runtime stage of the Dockerfile is the specification: every `COPY --from=build /src/target/release/X
/DST` becomes /DST from this machine's `just release` build, and its USER, EXPOSE and ENTRYPOINT become
the image config. The base (`gcr.io/distroless/cc-debian12:nonroot`) is assembled from this Debian
machine: the shared libraries the binaries load (found with ldd), the CA bundle, and the passwd/group
entries of distroless's nonroot user (65532). The result is named after the chart's default
`image.repository:appVersion` and imported into the real node's containerd by `just node-up`.

  build-image.py [--out target/image/rekindle.tar] [--name REF]
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# What distroless/cc-debian12:nonroot sets besides what the Dockerfile declares.
BASE_ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    f"SSL_CERT_FILE={CA_BUNDLE}",
]
PASSWD = "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
GROUP = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
NSSWITCH = "passwd: files\ngroup: files\nhosts: files dns\n"


def runtime_stage(dockerfile):
    """The instructions of the Dockerfile's last stage, continuation lines joined."""
    lines, cur = [], ""
    for raw in open(dockerfile):
        line = raw.rstrip("\n")
        if line.lstrip().startswith("#") and not cur:
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            lines.append(cur.strip())
        cur = ""
    starts = [i for i, l in enumerate(lines) if l.upper().startswith("FROM ")]
    if not starts:
        sys.exit("build-image: the Dockerfile has no FROM")
    return lines[starts[-1]:]


def parse_stage(stage):
    spec = {"base": stage[0].split()[1], "copies": [], "user": "", "expose": [], "entrypoint": None, "env": []}
    for line in stage[1:]:
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "COPY":
            args = shlex.split(rest)
            flags = [a for a in args if a.startswith("--")]
            paths = [a for a in args if not a.startswith("--")]
            if "--from=build" not in flags or len(paths) != 2:
                sys.exit(f"build-image: cannot map Dockerfile line {line!r}")
            src, dst = paths
            m = re.fullmatch(r"/src/target/release/([\w.-]+)", src)
            if not m:
                sys.exit(f"build-image: {src} in {line!r} is not a release binary")
            spec["copies"].append((os.path.join(ROOT, "target/release", m.group(1)), dst))
        elif word == "USER":
            spec["user"] = rest.strip()
        elif word == "EXPOSE":
            spec["expose"] += [p if "/" in p else f"{p}/tcp" for p in rest.split()]
        elif word == "ENTRYPOINT":
            spec["entrypoint"] = json.loads(rest)
        elif word == "ENV":
            spec["env"] += rest.split()
        else:
            sys.exit(f"build-image: the runtime stage's {word} is not supported here: {line!r}")
    return spec


def shared_libraries(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        line = line.strip()
        if "=>" in line:
            path = line.split("=>")[1].split("(")[0].strip()
            if path:
                libs.append(path)
        elif line.startswith("/"):
            libs.append(line.split()[0])
        if "not found" in line:
            sys.exit(f"build-image: {binary} needs a library this machine lacks: {line}")
    return libs


def chart_image():
    values = open(os.path.join(ROOT, "charts/rekindle/values.yaml")).read()
    repo = re.search(r"^image:\n(?:  .*\n)*?  repository: (\S+)", values, re.M).group(1)
    chart = open(os.path.join(ROOT, "charts/rekindle/Chart.yaml")).read()
    version = re.search(r'^appVersion: "?([^"\n]+)"?', chart, re.M).group(1)
    return f"{repo}:{version}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(ROOT, "target/image/rekindle.tar"))
    p.add_argument("--name", default=None, help="default: the chart's image.repository:appVersion")
    a = p.parse_args()

    spec = parse_stage(runtime_stage(os.path.join(ROOT, "Dockerfile")))
    if not spec["base"].startswith("gcr.io/distroless/cc-debian12"):
        sys.exit(f"build-image: the runtime base {spec['base']} is not the distroless/cc one this assembles")
    files = []
    for src, dst in spec["copies"]:
        if not os.access(src, os.X_OK):
            sys.exit(f"build-image: {src} is missing: run `just release` first")
        files.append(f"{src}:{dst}:0755")
    libs = sorted({lib for src, _ in spec["copies"] for lib in shared_libraries(src)})
    for lib in libs:
        real = os.path.realpath(lib)
        files.append(f"{real}:{lib}:0755")
    if not os.path.isfile(CA_BUNDLE):
        sys.exit(f"build-image: {CA_BUNDLE} is missing (Debian package ca-certificates)")
    files.append(f"{CA_BUNDLE}:{CA_BUNDLE}:0644")
    with tempfile.TemporaryDirectory() as tmp:
        for name, body in (("passwd", PASSWD), ("group", GROUP), ("nsswitch.conf", NSSWITCH)):
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(body)
            files.append(f"{path}:/etc/{name}:0644")
        cmd = [sys.executable, os.path.join(ROOT, "e2e/scripts/oci-image.py"),
               "--name", a.name or chart_image(), "--out", a.out,
               "--user", spec["user"], "--entrypoint", json.dumps(spec["entrypoint"]),
               "--dir", "/tmp:1777", "--dir", "/home/nonroot:700:65532"]
        for f in files:
            cmd += ["--file", f]
        for e in BASE_ENV + spec["env"]:
            cmd += ["--env", e]
        for e in spec["expose"]:
            cmd += ["--expose", e]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
