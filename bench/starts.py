#!/usr/bin/env python3
"""Start-ups of rekindle builds taking turns over the objects of the local control plane.

Each start runs a build cluster-wide (no webhook) against `just cluster-up`'s cluster and records:
process start to `/ready`, the process's CPU (user + system) at `/ready`, its RSS 2 s later and its
peak (VmHWM), and the apiserver's CPU from start to `/ready`. The builds take turns going first; the
report gives each start and the medians. `--create KIND:N` first creates N StatefulSets or DaemonSets
(no pods: 0 replicas, or a node selector no node has) spread over `--namespaces` namespaces, each
reading its namespace's ConfigMap, and waits for the control plane to settle.

    bench/starts.py --build old=/tmp/rekindle-old --build new=target/release/rekindle \\
        --create statefulset:20000 --starts 5 --out bench/results/starts.md
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("REKINDLE_E2E_STATE", ROOT / "target/e2e"))
TICK = os.sysconf("SC_CLK_TCK")


@functools.cache
def bin_dir():
    """The control plane's binaries (built, or found cached, by the e2e harness's script)."""
    return Path(subprocess.run(
        [ROOT / "e2e/scripts/build-binaries.sh", "all"], check=True, capture_output=True, text=True
    ).stdout.strip().splitlines()[-1])


def kubectl(*args, stdin=None):
    return subprocess.run(
        [bin_dir() / "kubectl", "--kubeconfig", STATE / "kubeconfig", *args],
        input=stdin, check=True, capture_output=True, text=True,
    ).stdout


def workload(kind, namespace, i):
    template = {
        "metadata": {"labels": {"app": f"w-{i}"}},
        "spec": {"containers": [{"name": "app", "image": "busybox",
                                 "envFrom": [{"configMapRef": {"name": "cfg"}}]}]},
    }
    spec = {"selector": {"matchLabels": {"app": f"w-{i}"}}, "template": template}
    if kind == "StatefulSet":
        spec |= {"replicas": 0, "serviceName": f"w-{i}"}
    else:
        template["spec"]["nodeSelector"] = {"bench.rekindle.io/none": "true"}
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": f"w-{i}", "namespace": namespace,
                         "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": spec}


def create(kind, n, namespaces):
    kind = {"statefulset": "StatefulSet", "daemonset": "DaemonSet"}[kind.lower()]
    names = [f"bench-{kind.lower()}s-{j}" for j in range(namespaces)]
    items = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in names]
    items += [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": ns},
               "data": {"v": "1"}} for ns in names]
    items += [workload(kind, names[i % namespaces], i) for i in range(n)]
    for at in range(0, len(items), 500):
        chunk = {"apiVersion": "v1", "kind": "List", "items": items[at:at + 500]}
        kubectl("create", "-f", "-", stdin=json.dumps(chunk))
        print(f"created {min(at + 500, len(items))} of {len(items)} objects", file=sys.stderr)


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_kib(pid, field):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def settle(quiet_cpu=0.10, window=5.0, most=300.0):
    """Waits (at most `most` seconds) until the apiserver uses under `quiet_cpu` of a core over
    `window` seconds."""
    apiserver = int((STATE / "pids/kube-apiserver.pid").read_text())
    until = time.monotonic() + most
    while time.monotonic() < until:
        before = cpu_seconds(apiserver)
        time.sleep(window)
        if (cpu_seconds(apiserver) - before) / window < quiet_cpu:
            return
    print(f"the apiserver was not quiet within {most:.0f} s; starting anyway", file=sys.stderr)


def start(binary, flags):
    apiserver = int((STATE / "pids/kube-apiserver.pid").read_text())
    port = 19400 + os.getpid() % 500
    log = open(STATE / "logs/bench-starts.log", "a")
    api_before = cpu_seconds(apiserver)
    began = time.monotonic()
    proc = subprocess.Popen(
        [binary, "--kubeconfig", STATE / "rekindle.kubeconfig", f"--admin-addr=127.0.0.1:{port}",
         f"--webhook-addr=127.0.0.1:{port + 1}", *flags],
        stdout=log, stderr=log, env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
    )
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{binary} exited with {proc.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.02)
        ready = time.monotonic() - began
        cpu = cpu_seconds(proc.pid)
        api_cpu = cpu_seconds(apiserver) - api_before
        time.sleep(2)
        return {"ready_s": ready, "cpu_s": cpu, "apiserver_cpu_s": api_cpu,
                "rss_kib": status_kib(proc.pid, "VmRSS"), "peak_kib": status_kib(proc.pid, "VmHWM")}
    finally:
        proc.terminate()
        proc.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", action="append", required=True, metavar="NAME=BINARY")
    p.add_argument("--create", metavar="KIND:N", help="statefulset:N or daemonset:N")
    p.add_argument("--namespaces", type=int, default=100)
    p.add_argument("--starts", type=int, default=5)
    p.add_argument("--out", type=Path, help="the markdown report (JSON beside it)")
    p.add_argument("flags", nargs="*", help="rekindle flags for every start (after --)")
    args = p.parse_args()
    builds = [b.split("=", 1) for b in args.build]
    for name, binary in builds:
        if not os.access(binary, os.X_OK):
            p.error(f"--build {name}: {binary} is not an executable")
    if args.create:
        kind, _, n = args.create.partition(":")
        if kind.lower() not in ("statefulset", "daemonset") or not n.isdigit():
            p.error(f"--create {args.create}: expected statefulset:N or daemonset:N")
        create(kind, int(n), args.namespaces)
    runs = {name: [] for name, _ in builds}
    for turn in range(args.starts):
        order = builds if turn % 2 == 0 else builds[::-1]
        for name, binary in order:
            settle()
            r = start(binary, args.flags)
            runs[name].append(r)
            print(f"start {turn + 1} {name}: {r}", file=sys.stderr)
    md = ["| build | starts | start to `/ready` s | CPU to ready s | apiserver CPU to ready s "
          "| RSS after sync MiB | peak MiB |", "|---|---|---|---|---|---|---|"]
    for name, binary in builds:
        med = {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
        md.append(f"| {name} (`{binary}`) | {len(runs[name])} | {med['ready_s']:.2f} | "
                  f"{med['cpu_s']:.2f} | {med['apiserver_cpu_s']:.2f} | {med['rss_kib'] / 1024:.1f} | "
                  f"{med['peak_kib'] / 1024:.1f} |")
    md.append("")
    md.append("Per start (ready s / CPU s / apiserver CPU s / RSS MiB):")
    for name, _ in builds:
        cells = "; ".join(f"{r['ready_s']:.2f} / {r['cpu_s']:.2f} / {r['apiserver_cpu_s']:.2f} / "
                          f"{r['rss_kib'] / 1024:.1f}" for r in runs[name])
        md.append(f"- {name}: {cells}")
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
