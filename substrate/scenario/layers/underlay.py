"""Layer ``underlay``: IS-IS and SRv6 locators (deployed by the substrate itself).

Instance: one, ``underlay``. Invariants (global): every core link's IS-IS adjacency is Up on
both ends; every router's uSID locator is installed as End with the NEXT-C-SID flavor; every
router's FIB holds every other router's loopback and locator; every router reaches the next
router's loopback with real packets.
"""

from __future__ import annotations

import random

from substrate import addressing as a
from substrate.scenario.layers.base import Layer, LayerParams, register
from substrate.scenario.model import Invariant, NodeConfig, Scenario

SERVICE = "underlay"


@register
class Underlay(Layer):
    name = "underlay"
    requires = ()
    Params = LayerParams
    records = ()
    intents = ()

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        return sc  # deployed by the substrate itself (substrate.frr, substrate.lab)

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        pass  # the same

    def address_owners(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        for r in sc.topology.routers:
            if r.node_id is not None:
                out.setdefault(str(a.loopback(r.node_id).ip), set()).add(r.name)

    def invariants(self, sc: Scenario) -> list[Invariant]:
        topo = sc.topology
        out: list[Invariant] = []
        for lk in topo.core_links():
            for me, peer in ((lk.a, lk.b), (lk.b, lk.a)):
                out.append(Invariant(
                    id=f"underlay/adjacency/{me.node}:{me.interface}",
                    kind="isis_adjacency",
                    service=SERVICE,
                    params={"node": me.node, "interface": me.interface, "neighbor": peer.node},
                    description=f"IS-IS adjacency {me.node} {me.interface} -> {peer.node} is Up",
                ))
        for r in topo.routers:
            if r.node_id is None:  # an external AS's router (Role.EXTERNAL) is not in the underlay
                continue
            out.append(Invariant(
                id=f"underlay/locator/{r.name}",
                kind="sid_bound",
                service=SERVICE,
                params={"node": r.name, "sid": str(a.locator(r.node_id)), "action": "End", "flavors": ["next-csid"]},
                description=f"{r.name}'s locator {a.locator(r.node_id)} is installed as End (NEXT-C-SID)",
            ))
            expected = sorted(
                str(p)
                for n in topo.routers
                if n.name != r.name and n.node_id is not None
                for p in (a.loopback(n.node_id).network, a.locator(n.node_id))
            )
            out.append(Invariant(
                id=f"underlay/fib/{r.name}",
                kind="fib_has",
                service=SERVICE,
                params={"node": r.name, "prefixes": expected},
                description=f"{r.name}'s FIB has every other router's loopback and locator",
            ))
        # data plane of the core: each router reaches the loopback of the next one (in router
        # order, wrapping) with real pings -- catches what a FIB check cannot, e.g. a flushed
        # main-table rule that cuts a router's own traffic off while its routes look intact
        routers = [r for r in topo.routers if r.node_id is not None]
        for i, r in enumerate(routers):
            if len(routers) < 2:
                break
            nxt = routers[(i + 1) % len(routers)]
            assert nxt.node_id is not None
            out.append(Invariant(
                id=f"underlay/ping/{r.name}->{nxt.name}",
                kind="reach",
                service=SERVICE,
                params={"src": r.name, "dst": str(a.loopback(nxt.node_id).ip), "family": 6},
                description=f"{r.name} reaches {nxt.name}'s loopback over the underlay",
            ))
        return out
