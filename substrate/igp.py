"""Convergence of routers that run their own FRR configuration (an imported lab): every IGP
adjacency the configuration asks for is up.

The substrate's own underlay knows what to expect (every loopback and locator, see
:meth:`substrate.lab.Lab.wait_converged`); a lab's own configuration does not say it in a form
worth parsing, so the daemons are asked instead. For each link between two such routers and
each IGP both run -- OSPFv2 (ospfd), OSPFv3 (ospf6d), IS-IS (isisd) -- the link must carry an
adjacency in state Full with its link-state flooding done (OSPF: empty retransmission and request
lists) or Up (IS-IS) when the protocol is active on both of its ends:
enabled on the interface, interface up, not passive (FRR's own JSON: ``show ip ospf interface``,
``show ipv6 ospf6 interface``, ``show isis interface detail``, and the matching ``neighbor``
commands, over the daemons' vty sockets). An interface a protocol does not run on, or runs
passively, asks for nothing, so a lab that leaves a link out of its IGP converges all the same.

FRR's OSPF starts an interface on a broadcast network (a veth's default type) in state Waiting
for RouterDeadInterval (40 s by default) before electing a designated router (RFC 2328 section
9.4): such a lab converges in about 40 s, whatever the machine.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from substrate.lab import Lab

#: IGP daemons whose adjacencies are waited for, with the protocol name shown in messages.
IGPS = {"ospfd": "OSPF", "ospf6d": "OSPFv3", "isisd": "IS-IS"}


def _json(lab: Lab, node: str, daemon: str, command: str) -> Any:
    from substrate.vty import VtyError

    try:
        text, status = lab.vty(node, daemon, command, timeout_s=5)[0]
    except VtyError:
        return None
    if status != 0:
        return None
    try:
        return json.loads(text or "null")
    except ValueError:
        return None


def _ospf(lab: Lab, node: str) -> tuple[set[str], set[str]]:
    ifs = (_json(lab, node, "ospfd", "show ip ospf interface json") or {}).get("interfaces", {})
    active = {n for n, i in ifs.items() if i.get("ospfEnabled") and i.get("ifUp") and not i.get("timerPassiveIface")}
    nbrs = (_json(lab, node, "ospfd", "show ip ospf neighbor json") or {}).get("neighbors", {})
    up = set()
    for entries in nbrs.values():
        for nb in entries if isinstance(entries, list) else [entries]:
            state = str(nb.get("converged") or nb.get("nbrState") or nb.get("state") or "")
            # Full and synchronised: nothing left to retransmit or request (flooding done)
            pending = any(nb.get(k) for k in ("retransmitCounter", "requestCounter", "linkStateRetransmissionListCounter",
                                                "linkStateRequestListCounter"))
            if state.startswith("Full") and not pending:
                up.add(str(nb.get("ifaceName", "")).split(":", 1)[0])
    return active, up


def _ospf6(lab: Lab, node: str) -> tuple[set[str], set[str]]:
    ifs = _json(lab, node, "ospf6d", "show ipv6 ospf6 interface json") or {}
    active = {
        n for n, i in ifs.items()
        if isinstance(i, dict) and i.get("attachedToArea") and i.get("status") == "up" and not i.get("passive")
        and str(i.get("ospf6InterfaceState", "")).lower() not in ("loopback", "down")
    }  # fmt: skip
    nbrs = (_json(lab, node, "ospf6d", "show ipv6 ospf6 neighbor json") or {}).get("neighbors", [])
    up = {str(nb.get("interfaceName", "")) for nb in nbrs if str(nb.get("state", "")).startswith("Full")}
    return active, up


def _isis(lab: Lab, node: str) -> tuple[set[str], set[str]]:
    active: set[str] = set()
    for area in (_json(lab, node, "isisd", "show isis interface detail json") or {}).get("areas", []):
        for c in area.get("circuits", []):
            i = c.get("interface") or {}
            if i.get("state") == "Up" and i.get("type") != "loopback" and not i.get("passive"):
                active.add(str(i.get("name", "")))
    up: set[str] = set()
    for area in (_json(lab, node, "isisd", "show isis neighbor json") or {}).get("areas", []):
        for c in area.get("circuits", []):
            if c.get("state") == "Up":
                up.add(str(c.get("interface", "")))
    return active, up


_READERS = {"ospfd": _ospf, "ospf6d": _ospf6, "isisd": _isis}


def missing_adjacencies(lab: Lab, routers: list[str]) -> dict[str, set[str]]:
    """Per router (of ``routers``, which configure themselves), the adjacencies still missing, as
    ``"OSPF adjacency on eth1 (to router2:eth1)"``; routers with nothing missing are left out."""
    topo = lab.topology
    mine = set(routers)
    asks = [(r, d) for r in routers for d in IGPS if d in lab.state(r).daemons]
    views = dict(zip(asks, lab.map(lambda rd: _READERS[rd[1]](lab, rd[0]), asks), strict=True))
    missing: dict[str, set[str]] = {}
    for lk in topo.links:
        a, b = lk.a, lk.b
        if a.node not in mine or b.node not in mine:
            continue
        for d, proto in IGPS.items():
            va, vb = views.get((a.node, d)), views.get((b.node, d))
            if va is None or vb is None or a.interface not in va[0] or b.interface not in vb[0]:
                continue
            for end, peer, view in ((a, b, va), (b, a, vb)):
                if end.interface not in view[1]:
                    missing.setdefault(end.node, set()).add(f"{proto} adjacency on {end.interface} (to {peer})")
    return missing
