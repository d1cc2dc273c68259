#!/usr/bin/env bash
# Installs the Debian packages the real node needs when any is missing: containerd, runc, the CNI plugins,
# iptables, iproute2 (ip netns) and conntrack. A package apt cannot install names itself and exits non-zero.
set -euo pipefail
declare -A probe=(
  [containerd]=/usr/bin/containerd
  [runc]=/usr/sbin/runc
  [containernetworking-plugins]=/usr/lib/cni/bridge
  [iptables]=/usr/sbin/iptables
  [iproute2]=/usr/sbin/ip
  [conntrack]=/usr/sbin/conntrack
)
missing=()
for pkg in "${!probe[@]}"; do
  [ -x "${probe[$pkg]}" ] || missing+=("$pkg")
done
[ "${#missing[@]}" = 0 ] && exit 0
echo "[install-node-packages] installing ${missing[*]} from Debian" >&2
sudo_cmd=()
[ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}" >&2; then
  "${sudo_cmd[@]}" apt-get update >&2 || true
  for pkg in "${missing[@]}"; do
    "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "$pkg" >&2 \
      || { echo "[install-node-packages] Debian package '$pkg' could not be installed" >&2; exit 1; }
  done
fi
for pkg in "${missing[@]}"; do
  [ -x "${probe[$pkg]}" ] || { echo "[install-node-packages] package '$pkg' installed but ${probe[$pkg]} is missing" >&2; exit 1; }
done
