"""Which eBPF programs carry which SRv6 behaviour, for the data-plane service (host side).

:func:`install_programs` turns a checked SRv6 route (:mod:`.seg6`) into loaded program instances
for the route's ``encap bpf`` hooks (LWT_BPF_IN 1, LWT_BPF_XMIT 3), each configured through its
.rodata (:mod:`.loader`):

- H.Encaps / H.Encaps.Red (``encap seg6 mode encap|encap.red``): ``encap.c``, hook ``xmit``
  alone: a forwarded packet is encapsulated after its inner forward, so that netfilter's
  POSTROUTING sees the inner packet (conntrack confirms it, SNAT applies) as with the kernel's
  seg6_input under ``net.netfilter.nf_hooks_lwtunnel = 1``, which every lab router sets; the
  program restores the inner hop limit and puts the decrement on the outer. The node's
  ``tunsrc`` map is shared;
- End, End with NEXT-C-SID (``encap seg6local action End [flavors next-csid ...]``): ``end.c``,
  hook ``xmit``;
- End.DT6/DT4/DT46 (``table``/``vrftable N``), End.DX4/DX6: ``decap.c``, hook ``xmit`` on the SID
  route, redirecting into a helper device whose tc program strips the outer headers, so the inner
  packet takes the kernel's own forwarding path in table N or to the next hop (:mod:`.decap`);
- End.X, End.T, End.B6, End.B6.Encaps: refused with one line until their programs exist (issue
  34), never accepted and silently not forwarded.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from substrate.dataplane.ebpf import loader, seg6
from substrate.dataplane.ebpf.seg6 import Seg6Encap, Seg6Error, Seg6Local

AF_INET = 2


def install_programs(b: Seg6Encap | Seg6Local, family: int, node: object) -> tuple[dict[int, int], int, int, Callable[[], None]]:
    """Load the program instance(s) of route behaviour ``b`` for a route of ``family``
    (AF_INET 2 or AF_INET6 10) on ``node`` (a :class:`substrate.dataplane.ebpf.service.Node`).

    Returns:
        (program fd by LWT hook attribute, the instance's program id, xmit headroom in bytes,
        a function that closes the fds once the kernel holds the route).

    Raises:
        Seg6Error: EOPNOTSUPP for a behaviour the eBPF data plane does not forward yet; ENOMEM
            with the loader's message when the kernel refused the program.
    """
    if isinstance(b, Seg6Encap):
        _prepare_encap(node)
        spec = loader.encap_program(
            b.segments, mode=seg6.MODE_NAMES[b.mode], family=4 if family == AF_INET else 6,
            tunsrc_fd=node.maps.tunsrc_fd, xmit_only=True,  # type: ignore[attr-defined]
        )  # fmt: skip
    elif b.action == seg6.END:
        flv = b.flavors()
        if flv is None:
            spec = loader.end_program()
        else:
            _ops, lb, nf = flv
            spec = loader.end_program(next_csid=True, lblen=lb, nflen=nf)
    elif b.action in DECAP_ACTIONS:
        spec = _decap_program(b, node)
    else:
        raise Seg6Error(errno.EOPNOTSUPP, f"the eBPF SRv6 data plane does not forward seg6local action "
                                          f"{seg6.ACTION_NAMES.get(b.action, b.action)} yet")  # fmt: skip
    hooks = {"in": seg6.LWT_BPF_IN, "out": seg6.LWT_BPF_OUT, "xmit": seg6.LWT_BPF_XMIT}
    # Routes with the same behaviour share one program instance (its parameters are all in
    # .rodata and the maps it reuses); the kernel holds a reference per route, so the instance
    # lives as long as one of them. A counting route keeps its own: its counters are per route.
    shared = not (isinstance(b, Seg6Local) and b.counters)
    key = (spec.obj, tuple(sorted(spec.hooks.items())), spec.rodata, tuple(sorted(spec.maps.items())))
    cache: dict[tuple, dict[str, int]] | None = getattr(node, "shared_programs", None)
    ids = cache.get(key) if shared and cache is not None else None
    fds = loader.reopen(ids) if ids else None
    if ids and fds is not None:
        held = list(fds.values())
        return {hooks[h]: fd for h, fd in fds.items()}, min(ids.values()), spec.headroom, lambda: _close(held)
    try:
        obj = loader.load(spec)
    except (loader.BpfError, ValueError) as e:
        raise Seg6Error(errno.ENOMEM, f"the eBPF SRv6 data plane could not load the route's program: {str(e).splitlines()[0]}") from None
    if shared and cache is not None:
        cache[key] = dict(obj.ids)
    return {hooks[h]: fd for h, fd in obj.fds.items()}, min(obj.ids.values()), spec.headroom, obj.close


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


#: The decapsulating behaviours (bpf/decap.c with a helper device per table or next hop, :mod:`.decap`).
DECAP_ACTIONS = frozenset({seg6.END_DT6, seg6.END_DT4, seg6.END_DT46, seg6.END_DX4, seg6.END_DX6})
#: Preference of the decapsulation helpers' rules (``iif HELPER lookup N`` at 1, ``unreachable`` at
#: 2): right after ``lookup local`` (0), before any rule of the node's own, as the kernel's End.DT*
#: looks table N up directly.
DECAP_RULE_PREF = 1


def _decap_program(b: Seg6Local, node: object) -> loader.ProgramSpec:
    """The program of a decapsulating SID (End.DT6/DT4/DT46 ``table``/``vrftable N``, End.DX4 ``nh4``,
    End.DX6 ``nh6``), its helper device, rules and (DX) private table made first when missing; the
    helper's ifindex joins the node's hidden ones."""
    import ipaddress
    import os

    from substrate.dataplane.ebpf import decap

    dn = getattr(node, "decap", None)
    if dn is None:
        dn = decap.DecapNode(os.path.basename(node.netns), rule_pref=DECAP_RULE_PREF)  # type: ignore[attr-defined]
        node.decap = dn  # type: ignore[attr-defined]
    table = b.u32(seg6.SEG6_LOCAL_TABLE) or b.u32(seg6.SEG6_LOCAL_VRFTABLE)
    nh = None
    if b.action == seg6.END_DX4:
        nh = str(ipaddress.IPv4Address(b.params[seg6.SEG6_LOCAL_NH4][:4]))
    elif b.action == seg6.END_DX6:
        nh = str(ipaddress.IPv6Address(b.params[seg6.SEG6_LOCAL_NH6][:16]))
    sid = decap.DecapSid(sid="::/128", behaviour=seg6.ACTION_NAMES[b.action], table=None if nh else table, nh=nh)
    try:
        spec = dn.program(sid)
    except (decap.DecapError, loader.BpfError) as e:
        raise Seg6Error(errno.ENOMEM, f"the eBPF SRv6 data plane could not set up {sid.behaviour}: {str(e).splitlines()[0]}") from None
    node.hidden.update(h.ifindex for h in dn.helpers.values())  # type: ignore[attr-defined]
    return spec


def _prepare_encap(node: object) -> None:
    """Once per node, before its first encapsulating route: the GSO helper (a portless bridge whose
    tc program encapsulates GSO packets, which bpf_lwt_push_encap refuses with an SRH:
    :func:`loader.gso_helper_up`) and the node's default encapsulation source, the kernel's choice
    for a locator destination (RFC 6724 rule 8: the global address sharing the longest prefix,
    the router's ``sr0`` address, else its loopback's), used while ``ip sr tunsrc`` is unset."""
    if getattr(node, "encap_ready", False):
        return
    import json
    import os
    import subprocess

    ns = os.path.basename(node.netns)  # type: ignore[attr-defined]
    if not getattr(node, "gso_ready", False):
        try:
            node.hidden.add(loader.gso_helper_up(ns, node.maps))  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 -- refused in one line, the route is not installed
            raise Seg6Error(errno.ENOMEM, f"the eBPF SRv6 data plane could not set up its GSO path: {str(e).splitlines()[0]}") from None
        node.gso_ready = True  # type: ignore[attr-defined]
    src = ""
    for dev in ("sr0", "lo"):
        r = subprocess.run(["ip", "-n", ns, "-6", "-j", "addr", "show", "dev", dev, "scope", "global"],
                           capture_output=True, text=True, check=False)  # fmt: skip
        addrs = [a["local"] for i in json.loads(r.stdout or "[]") for a in i.get("addr_info", []) if a.get("local")]
        if addrs:
            src = addrs[0]
            break
    if src:  # else asked again at the next route (the address may come later, with FRR's configuration)
        node.maps.set_default_source(src)  # type: ignore[attr-defined]
        node.encap_ready = True  # type: ignore[attr-defined]


def read_counters(prog_id: int) -> tuple[int, int, int]:
    """(packets, bytes, errors) of a counting route's program instance.

    Raises:
        loader.BpfError: the program is gone (the route was deleted meanwhile).
    """
    c = loader.read_counters(prog_id)
    return c.packets, c.bytes, c.errors
