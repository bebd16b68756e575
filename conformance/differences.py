"""The documented differences between the eBPF data plane and the kernel's seg6 (issue 34).

Each entry says where the conformance suite shows it (cases of ``corpus/commands.txt`` and, when
given, a regular expression on the command; or probe names, ``fnmatch`` patterns) and why it is
so. A difference of the suite that no entry matches is *unexplained*: a bug of the eBPF side until
shown otherwise (``conformance/compare.py``). README "The SRv6 data plane" lists them for users.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Documented:
    """A known, explained difference.

    Attributes:
        id: a short name.
        why: the explanation (one paragraph).
        cases: case names (fnmatch patterns) whose commands it covers.
        command: a regular expression the command must match (None: every command of those cases).
        probes: probe names (fnmatch patterns) it covers.
    """

    id: str
    why: str
    cases: tuple[str, ...] = ()
    command: str | None = None
    probes: tuple[str, ...] = ()


DOCUMENTED: tuple[Documented, ...] = (
    Documented(
        "ebpf-refuses-seg6-modes",
        "seg6 mode inline, l2encap and l2encap.red are not forwarded by the eBPF data plane: the route is "
        "refused with one line (Error: the eBPF SRv6 data plane does not forward seg6 mode ...), exit status 2, "
        "where the kernel accepts it; the show that follows lacks the route.",
        cases=("ebpf-refuses-seg6-modes",),
    ),
    Documented(
        "ebpf-refuses-seg6local-actions",
        "End.X, End.T, End.DX2, End.B6, End.B6.Encaps (and End.BPF) are not forwarded by the eBPF data plane: "
        "refused with one line (Error: the eBPF SRv6 data plane does not forward seg6local action ...), where "
        "the kernel accepts them (End.X with the NEXT-C-SID flavor only from kernel 6.6 on).",
        cases=("ebpf-refuses-seg6local-actions",),
    ),
    Documented(
        "ebpf-segment-limit",
        "The eBPF data plane carries a route's SRv6 parameters in its LWT program name (256 bytes, "
        "net/core/lwt_bpf.c): at most 10 segments per route, more are refused with one line; the kernel takes "
        "up to the SRH's limit.",
        cases=("ebpf-refuses-long-segment-lists",),
    ),
    Documented(
        "ebpf-refuses-multipath",
        "Multipath SRv6 routes (nexthop ... encap seg6 ...) are refused by the eBPF data plane with one line; the "
        "kernel installs them (IPv6: as separate routes when the nexthops have no gateway).",
        cases=("ebpf-refuses-multipath",),
    ),
    Documented(
        "kernel-dt4-needs-vrf",
        "The kernel's End.DT4 and End.DT46 (vrftable N) need net.vrf.strict_mode=1 and a VRF device bound to "
        "table N (seg6_local.c __seg6_end_dt_vrf_build: 'Strict mode for VRF is disabled', 'Table has no "
        "associated VRF device'); the eBPF data plane looks table N up directly and needs neither (the CI kernel "
        "has no VRF devices). With the VRF set up (case seg6local-dt4-dt46-with-vrf, the probes' r3) both agree.",
        cases=("kernel-refuses-dt4-without-vrf",),
    ),
)
