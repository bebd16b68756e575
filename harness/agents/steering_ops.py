"""The scripted operator's device-level steering change (task class ``steering-change`` at A0,
A1 and A2): from the request, the tenant's sites and what the PEs show, the per-device change
that creates or re-routes a steering policy as the design builds one (RFC 9800 uSID):

- on the waypoint, a new End SID with the NEXT-C-SID flavor (block 32 bits, node+function 32
  bits, so it shifts both C-SIDs at once), on the lowest free local function of its locator;
- on the ingress PE, the tenant table's routes toward the destination site's prefixes replaced by
  ones whose segment list is ``<waypoint uN><that function><egress PE uN><egress uDT6 / uDX4>``;
- for a modified policy, the old waypoint's End SID (the function the ingress route carried
  after the old waypoint's uN) deleted.

Pure: the agent reads the devices (rules, main-table SIDs, the tenant table of the ingress PE)
and applies the :class:`~substrate.scenario.apply.ConfigDelta` at its level.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from substrate import addressing
from substrate.scenario.apply import ConfigDelta

FUNCTION_MIN, FUNCTION_MAX = 0xE000, 0xEFFF


def _nid(router: str) -> int:
    return addressing.usid_value(int(router.lstrip("r")))


def _sid(router: str, fn: int) -> str:
    return f"{addressing.usid_container([_nid(router), fn])}/64"


def _container_csids(seg: str) -> list[int]:
    g = ipaddress.IPv6Address(seg).exploded.split(":")
    return [int(x, 16) for x in g[2:]]


def plan_steering(req: dict[str, Any], sites: list[dict[str, str]], facts: dict[str, Any],
                  ingress_table_routes: list[dict[str, Any]]) -> dict[str, ConfigDelta]:
    """Per-device changes of a steering request (see module docstring).

    ``facts``: router -> :class:`harness.agents.scripted.PeFacts` of the ingress PE, the
    destination's PE, the waypoint (and the old waypoint of a modification);
    ``ingress_table_routes``: ``ip -6 -d -j route show table T`` of the ingress PE.

    Raises:
        ValueError: the devices do not show what the design says.
    """
    ing, wp = req["ingress_pe"], req["waypoint"]
    by_id = {s["site"]: s for s in sites}
    dst = by_id[req["dst_site"]]
    own_ports = {s["pe_port"] for s in sites if s["pe"] == ing}
    table = next((facts[ing].table_of_port(p) for p in sorted(own_ports) if facts[ing].table_of_port(p) is not None), None)
    if table is None:
        raise ValueError(f"no policy rule of {req['tenant']} on {ing}: cannot find the tenant's table")
    dt6 = facts[dst["pe"]].function_of("End.DT6", table=str(table))
    if dt6 is None:
        raise ValueError(f"{dst['pe']} has no End.DT6 SID for table {table}")
    dx4 = None
    if dst.get("prefix4"):
        nh4 = str(ipaddress.ip_network(dst["prefix4"]).network_address + 2)
        dx4 = facts[dst["pe"]].function_of("End.DX4", nh4=nh4)
    used = facts[wp].used_functions(wp)
    fn = next((f for f in range(FUNCTION_MIN, FUNCTION_MAX + 1) if f not in used), None)
    if fn is None:
        raise ValueError(f"no free SID function on {wp}")
    out: dict[str, ConfigDelta] = {}
    wpd = out.setdefault(wp, ConfigDelta(node=wp))
    wpd.additions.append(f"-6 route replace {_sid(wp, fn)} metric 1024 encap seg6local action End flavors next-csid "
                         f"lblen {addressing.BLOCK_LEN} nflen {2 * addressing.CSID_LEN} count dev sr0")
    old_wp = req.get("was_waypoint")
    if old_wp:
        cur = next((r for r in ingress_table_routes if r.get("dst") == dst["prefix6"] and r.get("segs")), None)
        if cur is not None:
            seg = cur["segs"][0] if isinstance(cur["segs"], list) else str(cur["segs"]).split(",")[0]
            cs = _container_csids(seg)
            if cs[0] == _nid(old_wp):
                old = out.setdefault(old_wp, ConfigDelta(node=old_wp))
                old.removals.append(f"-6 route del {_sid(old_wp, cs[1])}")
    ind = out.setdefault(ing, ConfigDelta(node=ing))
    seg6 = addressing.usid_container([_nid(wp), fn, _nid(dst["pe"]), dt6])
    ind.additions.append(f"-6 route replace {dst['prefix6']} table {table} metric 1024 encap seg6 mode encap.red "
                         f"segs {seg6} dev sr0")
    if dst.get("prefix4") and dx4 is not None:
        seg4 = addressing.usid_container([_nid(wp), fn, _nid(dst["pe"]), dx4])
        ind.additions.append(f"-4 route replace {dst['prefix4']} table {table} encap seg6 mode encap.red segs {seg4} dev sr0")
    return out
