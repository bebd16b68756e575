"""Kernel and tool feature probe, run before a lab is deployed.

Each probe performs the real operation in a throw-away network namespace, so the answer is what
this kernel actually does, not what its version suggests. Required features missing -> the lab is
refused with one line naming them; optional ones missing are reported, never silently worked
around (DESIGN.md: "never silently degrade"). Results are cached per boot in
``/run/anibench/features.json`` (the kernel cannot change without a reboot, which clears /run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from substrate.errors import EnvironmentProblem
from substrate.paths import STATE_ROOT

#: name -> (required?, commands run in the probe namespace, in order; the last one is the test).
_PROBES: dict[str, tuple[bool, list[str]]] = {
    "seg6-encap": (True, ["-6 route add fc00:1::/64 encap seg6 mode encap segs fcbb:bb00:2:e000:: dev sr0"]),
    "seg6local-end-next-csid": (
        True,
        ["-6 route add fcbb:bb00:1::/48 encap seg6local action End flavors next-csid lblen 32 nflen 16 count dev sr0"],
    ),
    "seg6local-end-dt6": (
        True,
        ["-6 route add fcbb:bb00:1:e000::/64 encap seg6local action End.DT6 table 100 count dev sr0"],
    ),
    "seg6local-end-dx4": (
        True,
        ["-6 route add fcbb:bb00:1:e001::/64 encap seg6local action End.DX4 nh4 192.0.2.1 count dev sr0"],
    ),
    "vrf": (False, ["link add vrfprobe type vrf table 10"]),
    "dummy": (False, ["link add dprobe type dummy"]),
}
_NETEM = "netem"
_NFT = "nftables"


@dataclass(frozen=True)
class FeatureReport:
    """What the probe found. ``missing_required`` non-empty means no lab can run here."""

    present: list[str] = field(default_factory=list)
    missing_required: list[str] = field(default_factory=list)
    missing_optional: list[str] = field(default_factory=list)

    def line(self, dataplane: str | None = None) -> str:
        """One line for a human: what is present and what is missing. With ``dataplane`` "ebpf"
        the kernel's missing seg6 is said as such, not as missing and required: that data plane
        does SRv6 itself."""
        from substrate.dataplane import KERNEL_SEG6_PROBES

        parts = [f"kernel features ok: {', '.join(self.present) or 'none'}"]
        required = self.missing_required
        if dataplane == "ebpf":
            seg6 = [m for m in required if m in KERNEL_SEG6_PROBES]
            required = [m for m in required if m not in KERNEL_SEG6_PROBES]
            if seg6:
                parts.append(f"no kernel seg6 ({', '.join(seg6)}): not needed on the eBPF data plane")
        if required:
            parts.append(f"MISSING (required): {', '.join(required)}")
        if self.missing_optional:
            parts.append(f"missing (optional, not used): {', '.join(self.missing_optional)}")
        return "; ".join(parts)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def probe(use_cache: bool = True) -> FeatureReport:
    """Probe the kernel for what labs need.

    Args:
        use_cache: reuse this boot's earlier result.

    Returns:
        The report. Does not raise for missing features; see :func:`require`.

    Raises:
        EnvironmentProblem: not root, or iproute2 missing (nothing can be probed).
    """
    cache = STATE_ROOT / "features.json"
    if use_cache:
        try:
            data = json.loads(cache.read_text())
            if data.get("boot_id") == _boot_id():
                return FeatureReport(data["present"], data["missing_required"], data["missing_optional"])
        except (OSError, ValueError, KeyError):
            pass
    check_root_and_tools(need_frr=False)
    ns = f"anibench-probe-{os.getpid()}"
    run = lambda *a: subprocess.run(a, capture_output=True, text=True, stdin=subprocess.DEVNULL)  # noqa: E731
    present: list[str] = []
    req: list[str] = []
    opt: list[str] = []
    if run("ip", "netns", "add", ns).returncode != 0:
        raise EnvironmentProblem("cannot create a network namespace (are you root, with CAP_SYS_ADMIN?)")
    try:
        for cmd in ("link add sr0 type bridge", "link set sr0 up", "link set lo up",
                    "link add pv0 type veth peer name pv1", "link set pv0 up"):
            run("ip", "-n", ns, *cmd.split())
        for name, (required, cmds) in _PROBES.items():
            ok = all(run("ip", "-n", ns, *c.split()).returncode == 0 for c in cmds)
            (present if ok else req if required else opt).append(name)
        ok = run("tc", "-n", ns, "qdisc", "add", "dev", "pv0", "root", "netem", "delay", "1ms").returncode == 0
        (present if ok else opt).append(_NETEM)
        ok = shutil.which("nft") is not None and run(
            "ip", "netns", "exec", ns, "nft", "add", "table", "inet", "anibenchprobe"
        ).returncode == 0
        (present if ok else req).append(_NFT)
    finally:
        run("ip", "netns", "del", ns)
    report = FeatureReport(present, req, opt)
    try:
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"boot_id": _boot_id(), **report.__dict__}))
    except OSError:
        pass
    return report


def require(dataplane: str | None = None) -> FeatureReport:
    """Probe and raise if a lab cannot run here: a required feature other than the kernel's seg6
    is missing, or no SRv6 data plane can carry the lab (``substrate.dataplane.require``: the
    seg6 probes are required by the ``kernel`` data plane only).

    Args:
        dataplane: ``auto``, ``kernel`` or ``ebpf``; None reads ``$ANIBENCH_DATAPLANE``.

    Raises:
        EnvironmentProblem: with the one-line report (and the data-plane line) when something
            required is missing.
    """
    from substrate.dataplane import KERNEL_SEG6_PROBES, select

    report = probe()
    other = [m for m in report.missing_required if m not in KERNEL_SEG6_PROBES]
    choice = select(dataplane)
    if other or choice.dataplane is None:
        head = f"MISSING (required): {', '.join(other)}; " if other else ""
        raise EnvironmentProblem(head + choice.line())
    return report


#: Binaries a lab needs, with the Debian package that ships them.
REQUIRED_TOOLS = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "setpriv": "util-linux",
    "nft": "nftables",
}
FRR_DAEMON_DIR = Path("/usr/lib/frr")


def check_root_and_tools(need_frr: bool = True) -> None:
    """Fail early, in one line, if the process is not root or a needed program is missing.

    Raises:
        EnvironmentProblem: naming what is missing and the package to install.
    """
    if os.geteuid() != 0:
        raise EnvironmentProblem("labs need root (network, mount and PID namespaces): run with sudo")
    missing = [f"{tool} (apt install {pkg})" for tool, pkg in REQUIRED_TOOLS.items() if shutil.which(tool) is None]
    if need_frr and not (FRR_DAEMON_DIR / "zebra").exists():
        missing.append("FRR daemons in /usr/lib/frr (apt install frr)")
    if need_frr and shutil.which("vtysh") is None:
        missing.append("vtysh (apt install frr)")
    if missing:
        raise EnvironmentProblem(f"missing programs: {', '.join(missing)}")
