#!/usr/bin/env bash
# Sets anibench up on a Debian 12 (bookworm) machine, as root: the system packages the labs need,
# then a virtual environment in .venv with anibench and its test dependencies.
# Idempotent: run it again at will.
set -euo pipefail
cd "$(dirname "$0")"

if [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (sudo ./install.sh): it installs system packages" >&2
  exit 1
fi

# frr: the routers (zebra, staticd, isisd, bgpd, vtysh); iproute2: netns, veth, seg6/seg6local;
# nftables/iptables: tenant firewalls, NAT, loss faults; util-linux: unshare/nsenter/setpriv for
# node isolation; tcpdump, iputils-ping, traceroute, netcat: data-plane probes; python3-venv: .venv;
# gcc, libyang2-dev: the libyang binding (A2's YANG validation) is built from source;
# libnetfilter-queue-dev (with libnfnetlink-dev): the NetfilterQueue binding of the latency fault;
# clang, llvm, libbpf-dev, bpftool: the eBPF SRv6 data plane (substrate/dataplane/bpf/*.c is built
# here, for kernels without seg6; bpftool counts what a lab leaves behind).
PKGS=(frr frr-pythontools iproute2 nftables iptables util-linux procps tcpdump iputils-ping
      traceroute netcat-openbsd python3 python3-venv gcc libc6-dev libyang2-dev
      libnetfilter-queue-dev libnfnetlink-dev clang llvm libbpf-dev bpftool)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The distribution's FRR service is not used (each lab node runs its own daemons); make sure it
# does not hold the default sockets where an init system started it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet frr 2>/dev/null; then
  systemctl disable --now frr >/dev/null 2>&1 || true
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test,ray]'
# the eBPF SRv6 data plane (for kernels without seg6): its programs (clang) and the netlink shim of
# the nodes' ip (gcc), built into /var/lib/anibench/bpf ($ANIBENCH_BPF_BUILD)
.venv/bin/python -c 'from substrate.dataplane.ebpf import build, front; build.build_all(); front.build_shim()'
echo "anibench installed: .venv/bin/harness ($(.venv/bin/python --version))"
