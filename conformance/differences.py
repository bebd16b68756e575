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
        ignore: a regular expression whose capturing groups are the difference: blanked in both
            outputs, they must be equal, so the rest of a command's output stays compared (the
            numbers of one route's counters, say). None: the whole command or probe.
    """

    id: str
    why: str
    cases: tuple[str, ...] = ()
    command: str | None = None
    probes: tuple[str, ...] = ()
    ignore: str | None = None


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
    Documented(
        "host-af-alg",
        "Not the data plane's: iproute2 hashes an End.BPF object file through the kernel's crypto API (an AF_ALG "
        "sha1 socket, lib/bpf_legacy.c bpf_obj_hash) before it opens it; the CI kernel has no AF_ALG hash, so "
        "iproute2 skips to its next step and the line 'Error opening object FILE: No such file or directory' is "
        "not printed there. Both print the rest and exit 255; no request reaches the kernel or the service.",
        cases=("seg6local-errors",),
        command=r"action End\.BPF endpoint obj /nonexistent\.o",
    ),
    Documented(
        "ebpf-encap-inner-hop-limit-1",
        "An encapsulating router (H.Encaps, H.Encaps.Red) that receives an inner packet with hop limit 1 answers "
        "it with ICMPv6 Time Exceeded to its sender on the eBPF data plane: the SRv6 route is an ordinary "
        "forwarding route whose ip6_forward checks the hop limit before the LWT xmit program encapsulates. The "
        "kernel's seg6 encapsulates in the route's input handler, copies hop limit 1 to the outer header, and "
        "the outer packet expires in the ip6_forward that follows, its Time Exceeded going to the router's own "
        "address: nothing reaches the sender (a traceroute through an SRv6 PE does not show that PE).",
        probes=("v6-hl1",),
    ),
    Documented(
        "ebpf-end-no-route-after-shift",
        "A packet whose destination has no route after an End (NEXT-C-SID shift or Segments Left step) is "
        "dropped silently on the eBPF data plane: the End program is an LWT xmit program, and the kernel drops "
        "without a word what BPF_LWT_REROUTE cannot route (net/core/lwt_bpf.c bpf_lwt_xmit_reroute). The "
        "kernel's seg6local End looks the new destination up on input and answers a miss with ICMPv6 Destination "
        "Unreachable (no route), sent from the router towards the packet's source (here over SRv6 back to r1). "
        "The probe usid-unknown shows it, and the counters after the probes with it: r1's End.DT6 counts the "
        "returning error and r2's locator counts it in transit on the kernel only.",
        probes=("usid-unknown",),
    ),
    Documented(
        "ebpf-end-no-route-after-shift-counters",
        "The counters that the Destination Unreachable of ebpf-end-no-route-after-shift adds on the kernel: one "
        "packet on r1's End.DT6 (the error, decapsulated) and on r2's locator (the error in transit).",
        cases=("counters:r1",),
        command=r"-s( -j)? route show dev sr0$",
        ignore=r'fcbb:bb00:1:e006::/64[^\n]*?(?:packets |"packets":)(\d+)[^\n]*?(?:bytes |"bytes":)(\d+)',
    ),
    Documented(
        "ebpf-end-hop-limit-counted-before",
        "r2's NEXT-C-SID locator: the kernel counts one more packet (the Destination Unreachable of "
        "ebpf-end-no-route-after-shift in transit) and one error: the outer packet of the outer-hl1-end probe, "
        "which its End rewrites and the ip6_forward that follows drops (hop limit), an error of the action "
        "for the kernel; on the eBPF data plane ip6_forward drops it before the End program runs, uncounted.",
        cases=("counters:r2",),
        command=r"-s( -j)? route show dev sr0$",
        ignore=r'fcbb:bb00:2::/48[^\n]*?(?:packets |"packets":)(\d+)[^\n]*?(?:bytes |"bytes":)(\d+)[^\n]*?(?:errors |"errors":)(\d+)',
    ),
)
