"""Layer ``addressing``: IPAM pools for tenant prefixes, SID function and routing-table allocation.

The pools (:class:`~substrate.scenario.model.Pools`) are shared by every tenant service, which
is what makes collisions possible: two tenants' prefixes are adjacent (lowest-free allocation)
or, at a tunable rate, overlap; SID functions of different services share each PE's function
space; table ids and firewall marks are global. :class:`Ipam` rebuilds the allocation state from
a scenario's inventory, so A3-T and task variants allocate from the same pools the generator
used, never from a private copy.

Invariants (service ``addressing``): every allocated SID is still bound to its behaviour (the
seg6local route exists with the allocated action and parameters).
"""

from __future__ import annotations

import ipaddress
import random

from pydantic import ValidationInfo, field_validator

from substrate import addressing as a
from substrate.scenario.layers.base import GenerationError, Layer, LayerParams, register, registry
from substrate.scenario.layers.specs import no_zone
from substrate.scenario.model import Invariant, NodeConfig, Pools, Scenario

SERVICE = "addressing"


class AddressingParams(LayerParams):
    """Pools of the brownfield (defaults: ULA fd10::/32 for tenant IPv6, 10.0.0.0/16 for tenant
    IPv4, tables 100-199, local SID functions 0xe000-0xefff, TEST-NET-2 floating addresses)."""

    prefix6: str = "fd10::/32"
    prefix4: str = "10.0.0.0/16"
    tables: tuple[int, int] = (100, 199)
    functions: tuple[int, int] = (0xE000, 0xEFFF)
    floating4: str = "198.51.100.0/24"

    @field_validator("prefix6", "prefix4", "floating4")
    @classmethod
    def _network(cls, v: str, info: ValidationInfo) -> str:
        version, longest = (6, 64) if info.field_name == "prefix6" else (4, 24)
        try:
            net = ipaddress.ip_network(no_zone(v))
        except ValueError as e:
            raise ValueError(f"not an IPv{version} network: {e}") from None
        if net.version != version or net.prefixlen > longest:
            raise ValueError(f"expected an IPv{version} network of length /{longest} or shorter, got {v}")
        return v

    @field_validator("tables", "functions")
    @classmethod
    def _range(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] > v[1]:
            raise ValueError(f"the range is empty: {v[0]} > {v[1]}")
        return v


class PoolExhausted(GenerationError):
    """A pool has no free element left."""


class Ipam:
    """Allocation state over a scenario's pools (lowest free first, so deterministic)."""

    #: The sets of resources in use, besides prefixes and SID functions, that A3-T also finds
    #: on devices (its ``Found`` has a field of each name): table ids, marks, floating addresses.
    NUMBERED: tuple[str, ...] = ("tables", "marks", "floating")

    def __init__(self, pools: Pools):
        self.pools = pools
        self.used6: set[str] = set()
        self.used4: set[str] = set()
        self.tables: set[int] = set()
        self.functions: dict[str, set[int]] = {}
        self.marks: set[int] = set()
        self.floating: set[str] = set()
        self._next6 = 0
        self._next4 = 0

    @classmethod
    def from_scenario(cls, sc: Scenario) -> Ipam:
        """Allocation state implied by ``sc``'s inventory."""
        ipam = cls(sc.pools)
        for c in registry():
            c.claim(sc, ipam)
        return ipam

    def prefix6(self) -> str:
        """Lowest free /64 of the IPv6 pool. Raises PoolExhausted."""
        pool = ipaddress.IPv6Network(self.pools.prefix6)
        total = 2 ** (64 - pool.prefixlen)
        while self._next6 < total:
            net = str(ipaddress.IPv6Network((int(pool.network_address) + (self._next6 << 64), 64)))
            self._next6 += 1
            if net not in self.used6:
                self.used6.add(net)
                return net
        raise PoolExhausted("pools.prefix6", f"no free /64 left in {pool}")

    def prefix4(self) -> str:
        """Lowest free /24 of the IPv4 pool. Raises PoolExhausted."""
        pool = ipaddress.IPv4Network(self.pools.prefix4)
        total = 2 ** (24 - pool.prefixlen)
        while self._next4 < total:
            net = str(ipaddress.IPv4Network((int(pool.network_address) + (self._next4 << 8), 24)))
            self._next4 += 1
            if net not in self.used4:
                self.used4.add(net)
                return net
        raise PoolExhausted("pools.prefix4", f"no free /24 left in {pool} ({total} in all)")

    def table(self) -> int:
        """Lowest free routing-table id. Raises PoolExhausted."""
        lo, hi = self.pools.tables
        for t in range(lo, hi + 1):
            if t not in self.tables:
                self.tables.add(t)
                return t
        raise PoolExhausted("pools.tables", f"all table ids {lo}-{hi} are in use")

    def function(self, node: str) -> int:
        """Lowest free local SID function on ``node``. Raises PoolExhausted."""
        lo, hi = self.pools.functions
        used = self.functions.setdefault(node, set())
        for f in range(lo, hi + 1):
            if f not in used:
                used.add(f)
                return f
        raise PoolExhausted("pools.functions", f"no free SID function left on {node}")

    def mark(self) -> int:
        """Lowest free firewall mark. Raises PoolExhausted."""
        lo, hi = self.pools.marks
        for m in range(lo, hi + 1):
            if m not in self.marks:
                self.marks.add(m)
                return m
        raise PoolExhausted("pools.marks", f"all marks {lo:#x}-{hi:#x} are in use")

    def floating4(self) -> str:
        """Lowest free floating address (host part 10 and up). Raises PoolExhausted."""
        pool = ipaddress.IPv4Network(self.pools.floating4)
        for host in list(pool.hosts())[9:]:
            if str(host) not in self.floating:
                self.floating.add(str(host))
                return str(host)
        raise PoolExhausted("pools.floating4", f"no free floating address left in {pool}")


def sid_invariants(sc: Scenario) -> list[Invariant]:
    """One ``sid_bound`` invariant per SID the inventory allocates."""
    out: list[Invariant] = []

    def add(node: str, fn: int, action: str, what: str, **extra: object) -> None:
        nid = sc.topology.node(node).node_id
        assert nid is not None
        sid = str(a.function_sid(nid, fn))
        out.append(Invariant(
            id=f"addressing/sid/{node}/{fn:x}",
            kind="sid_bound",
            service=SERVICE,
            params={"node": node, "sid": sid, "action": action, **extra},
            description=f"{sid} on {node} is still {action} ({what})",
        ))

    for c in registry():
        for node, fn, action, what, extra in c.sids(sc):
            add(node, fn, action, what, **extra)
    return out


@register
class Addressing(Layer):
    name = "addressing"
    requires = ("underlay",)
    Params = AddressingParams
    records = ()
    intents = ()
    error_fields = ("pools",)

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        assert isinstance(params, AddressingParams)
        pools = Pools(prefix6=params.prefix6, prefix4=params.prefix4, tables=params.tables,
                      functions=params.functions, floating4=params.floating4)
        try:
            ipaddress.IPv6Network(pools.prefix6)
            ipaddress.IPv4Network(pools.prefix4)
            ipaddress.IPv4Network(pools.floating4)
        except ValueError as e:
            raise GenerationError("layers.addressing", str(e)) from None
        return sc.model_copy(update={"pools": pools})

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        pass  # pools have no device state of their own: the classes that allocate render it

    def invariants(self, sc: Scenario) -> list[Invariant]:
        return sid_invariants(sc)
