"""The SRv6 data plane of a lab, and which one runs here.

Two implementations of the same SRv6 behaviours (RFC 8986, RFC 8754, RFC 9800 NEXT-C-SID) sit
behind one iproute2 surface (``ip route ... encap seg6|seg6local ...``, ``ip sr tunsrc``):

- ``kernel``: the kernel's own seg6/seg6local lightweight tunnels (``CONFIG_IPV6_SEG6_LWTUNNEL``),
  used where the kernel has them (users' stock distribution kernels);
- ``ebpf``: the project's own eBPF programs (``substrate.dataplane.ebpf``: LWT BPF on the routes,
  tc programs where packets must be rewritten), for kernels built without seg6 -- the CI and
  developer machines since 2026-12-05 (kernel 6.18 Firecracker guests).

:func:`select` decides, from ``--dataplane auto|kernel|ebpf`` or ``$ANIBENCH_DATAPLANE``
(``auto`` by default: ``kernel`` where the feature probe finds seg6, else ``ebpf``), and says in
one line which data plane runs and why. A data plane that cannot carry a lab on this machine is
refused in that line, never silently replaced (DESIGN.md: "never silently degrade").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from substrate.errors import EnvironmentProblem

#: The data planes, in the order ``auto`` tries them.
DATAPLANES: tuple[str, ...] = ("kernel", "ebpf")
#: What ``--dataplane`` accepts.
Mode = Literal["auto", "kernel", "ebpf"]
MODES: tuple[str, ...] = ("auto", *DATAPLANES)
#: Environment variable read when no ``--dataplane`` is given.
ENV = "ANIBENCH_DATAPLANE"

#: Name prefixes of the eBPF data plane's own devices in a node (its GSO helper bridge, its
#: decapsulation helpers): not part of the node's configuration -- the node's ``ip`` does not show
#: them and the device-state capture leaves them out (with their qdiscs and sysctls).
OWN_DEVICE_PREFIXES: tuple[str, ...] = ("sr6gso", "sr6d")


def own_device(name: str) -> bool:
    """Whether ``name`` is one of the data plane's own devices (:data:`OWN_DEVICE_PREFIXES`)."""
    return name.startswith(OWN_DEVICE_PREFIXES)


#: The feature probes (``substrate.features``) the kernel data plane needs.
KERNEL_SEG6_PROBES: tuple[str, ...] = (
    "seg6-encap", "seg6local-end-next-csid", "seg6local-end-dt6", "seg6local-end-dx4",
)  # fmt: skip


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`select`.

    Attributes:
        mode: what was asked (``auto``, ``kernel`` or ``ebpf``).
        dataplane: the data plane that runs, or None when none can carry a lab here.
        reason: why, in a few words per data plane considered.
    """

    mode: str
    dataplane: str | None
    reason: str

    def line(self) -> str:
        """One line for a human, e.g. ``data plane: kernel (auto: the kernel has seg6)``."""
        if self.dataplane is None:
            return f"data plane: NONE usable ({self.mode}): {self.reason}"
        return f"data plane: {self.dataplane} ({self.mode}: {self.reason})"


def mode_from(value: str | None = None) -> str:
    """The mode asked for: ``value``, else ``$ANIBENCH_DATAPLANE``, else ``auto``.

    Raises:
        EnvironmentProblem: a value that is not one of :data:`MODES`.
    """
    mode = (value or os.environ.get(ENV) or "auto").strip().lower()
    if mode not in MODES:
        raise EnvironmentProblem(f"unknown data plane {mode!r} (--dataplane / ${ENV}): use one of {', '.join(MODES)}")
    return mode


def kernel_status() -> tuple[bool, str]:
    """Whether the kernel's own seg6 data plane works here, and why not (the feature probe's
    ``MISSING`` names)."""
    from substrate.features import probe

    rep = probe()
    missing = [p for p in KERNEL_SEG6_PROBES if p not in rep.present]
    if missing:
        return False, f"the kernel lacks seg6 (MISSING: {', '.join(missing)})"
    return True, "the kernel has seg6"


def ebpf_status() -> tuple[bool, str]:
    """Whether the eBPF data plane can carry a lab here, and why not.

    Builds (once, cached) its programs with clang and its netlink shim with gcc; refuses when
    either fails.
    """
    from substrate.dataplane.ebpf import build, front

    try:
        build.build_all()
        front.build_shim()
    except (EnvironmentProblem, OSError) as e:
        return False, f"cannot build the eBPF programs: {str(e).splitlines()[0]}"
    return True, "eBPF programs built"


def select(value: str | None = None) -> Choice:
    """Decide which data plane a lab uses.

    Args:
        value: ``auto``, ``kernel`` or ``ebpf``; None reads ``$ANIBENCH_DATAPLANE`` (default ``auto``).

    Returns:
        The choice; ``dataplane`` is None when none can run (see :func:`require`).

    Raises:
        EnvironmentProblem: an unknown mode; not root or iproute2 missing (nothing can be probed).
    """
    mode = mode_from(value)
    status = {"kernel": kernel_status, "ebpf": ebpf_status}
    reasons: list[str] = []
    for name in DATAPLANES if mode == "auto" else (mode,):
        ok, why = status[name]()
        if ok:
            return Choice(mode, name, "; ".join([*reasons, why]))
        reasons.append(f"{name}: {why}")
    return Choice(mode, None, "; ".join(reasons))


def require(value: str | None = None) -> Choice:
    """:func:`select`, raising when no data plane can carry a lab here.

    Raises:
        EnvironmentProblem: with :meth:`Choice.line` when none is usable, or an unknown mode.
    """
    choice = select(value)
    if choice.dataplane is None:
        raise EnvironmentProblem(choice.line())
    return choice
