"""Which eBPF programs carry which SRv6 behaviour, for the data-plane service (host side).

:func:`install_programs` turns a checked SRv6 route (:mod:`.seg6`) into loaded program instances
for the route's ``encap bpf`` hooks (LWT_BPF_IN 1, LWT_BPF_XMIT 3), each configured through its
.rodata (:mod:`.loader`):

- H.Encaps / H.Encaps.Red (``encap seg6 mode encap|encap.red``): ``encap.c``, hooks ``in``
  (forwarded packets, encapsulated at route input as the kernel's seg6_input) and ``xmit``
  (locally originated ones, as seg6_output); the node's ``tunsrc`` map shared;
- End, End with NEXT-C-SID (``encap seg6local action End [flavors next-csid ...]``): ``end.c``,
  hook ``xmit``;
- the decapsulating behaviours (End.DT6/DT4/DT46, End.DX4/DX6) and End.X/End.T: refused with one
  line until their programs carry labs (issue 34), never accepted and silently not forwarded.
"""

from __future__ import annotations

import errno
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
            tunsrc_fd=node.maps.tunsrc_fd,  # type: ignore[attr-defined]
        )  # fmt: skip
    elif b.action == seg6.END:
        flv = b.flavors()
        if flv is None:
            spec = loader.end_program()
        else:
            _ops, lb, nf = flv
            spec = loader.end_program(next_csid=True, lblen=lb, nflen=nf)
    else:
        raise Seg6Error(errno.EOPNOTSUPP, f"the eBPF SRv6 data plane does not forward seg6local action "
                                          f"{seg6.ACTION_NAMES.get(b.action, b.action)} yet")  # fmt: skip
    try:
        obj = loader.load(spec)
    except (loader.BpfError, ValueError) as e:
        raise Seg6Error(errno.ENOMEM, f"the eBPF SRv6 data plane could not load the route's program: {str(e).splitlines()[0]}") from None
    hooks = {"in": seg6.LWT_BPF_IN, "out": seg6.LWT_BPF_OUT, "xmit": seg6.LWT_BPF_XMIT}
    fds = {hooks[h]: fd for h, fd in obj.fds.items()}
    return fds, min(obj.ids.values()), spec.headroom, obj.close


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
