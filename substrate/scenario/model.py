"""Scenario data model: the service inventory, the rendered device state and the baseline
invariants of a brownfield (draft-salsano-nmrg-nmaa-benchmarking-framework, sections 2 and 6).

Everything is pydantic and JSON-serialisable with a stable order, so that the same manifest and
seed always give a byte-identical scenario file.

Network design of the tenant services (what the layers render; shared/notes/substrate.md lists
the kernel facts it rests on):

- a tenant (L3VPN) has one routing table with the same id on every PE where it has sites
  (policy routing: ``ip rule iif <CE port> lookup <table>``; no VRF devices on this kernel), an
  ``unreachable default`` in that table so lookups never fall through to the main table, and on
  each such PE an End.DT6 SID (uDT6) that decapsulates into the table;
- a site is a CE host behind a PE port, with an IPv6 /64 and optionally an IPv4 /24 on that link
  (PE ``::1``/``.1``, CE ``::2``/``.2``); remote PEs reach it with H.Encaps.Red to the site PE's
  uDT6 (IPv6) or to the site's own End.DX4 SID (IPv4: End.DX4 resolves its next hop in the main
  table, so an IPv4 prefix appears at most once per PE);
- every PE has ``ip -6 rule to fcbb:bb00::/32 lookup main`` ahead of tenant rules, so that the
  encapsulated packet (outer destination: a SID) is routed in the main table;
- a steering policy pins a tenant's traffic from one PE to one site through a waypoint router:
  the segment list starts with a waypoint SID of its own (End, NEXT-C-SID, 32-bit node+function)
  whose counters prove the path;
- a firewall policy is a tenant's chain in the shared ``inet tenant_fw`` table of each PE that
  hosts a destination site of a rule, filtering traffic forwarded to the CE port;
- a floating IP is a 1:1 NAT on the border PE from a TEST-NET-2 address to a site's IPv4
  address, with a firewall mark selecting the tenant table; replies return through an End.DX4
  SID of the border PE toward the external host;
- shared services (DNS/NTP-like hosts) sit in a routing table of their own on one PE, reached
  through an End.DT6 SID of that PE; a route leak gives one tenant a route to them in its table
  and them a route back to the tenant's sites (``substrate.scenario.layers.shared_services``).
"""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationInfo, field_validator, model_serializer

from substrate.topology import Topology

SCENARIO_SCHEMA_VERSION = 1
#: Routing-table metric of the per-tenant ``unreachable default`` (the kernel's VRF default uses
#: the same value: 4278198272 = 0xff000000).
UNREACHABLE_METRIC = 4278198272
#: Rule priorities: SIDs to main first, then tenant ports, then floating-IP marks.
RULE_PRIO_SIDS = 900
RULE_PRIO_TENANT = 1000
RULE_PRIO_FWMARK = 1100
#: The SRv6 locator block as a rule selector.
SID_BLOCK = "fcbb:bb00::/32"


class NoBoolAsNumber(BaseModel):
    """A model whose fields never read a boolean as a number: pydantic's lax mode reads ``true``
    as 1 (a rate of 1 Mbit/s, TCP port 1), against the servers' argument policy
    (:data:`servers.common.args.ARGUMENT_POLICY`: "booleans are never numbers"). The base of A3-T's
    specs and of the records they hold; not of every record (it makes a scenario's load 7x slower)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, bool) and info.field_name is not None:
            ann = cls.model_fields[info.field_name].annotation
            if ann is not bool and bool not in typing.get_args(ann):
                raise ValueError(f"{str(v).lower()} is a boolean, not a {info.field_name}")
        return v


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Site(_M):
    """One tenant site: a CE host behind a PE port (an attachment circuit)."""

    id: str = Field(description="Site id, e.g. 't3s2'.")
    tenant: str
    pe: str = Field(description="PE router the site attaches to.")
    pe_if: str = Field(description="PE interface toward the CE.")
    ce: str = Field(description="CE host node.")
    ce_if: str = "eth1"
    prefix6: str = Field(description="Site IPv6 prefix (/64): PE ::1, CE ::2.")
    prefix4: str | None = Field(default=None, description="Site IPv4 prefix (/24): PE .1, CE .2.")
    dx4_function: int | None = Field(default=None, description="Local function id of the site's End.DX4 SID on its PE.")


class Tenant(_M):
    """A tenant's L3VPN over SRv6: routing table, per-PE uDT6 SIDs, sites."""

    id: str = Field(description="Tenant id, e.g. 't3'.")
    name: str = Field(description="Customer name (for prompts and reports).")
    table: int = Field(description="Routing table id on every PE of the tenant.")
    dt6_functions: dict[str, int] = Field(default_factory=dict, description="PE -> local function id of its uDT6.")
    sites: list[Site] = Field(default_factory=list)


class SteeringPolicy(_M):
    """Traffic of ``tenant`` entering at ``ingress_pe`` toward ``dst_site`` goes through ``waypoint``."""

    id: str
    tenant: str
    ingress_pe: str
    dst_site: str
    waypoint: str
    waypoint_function: int = Field(description="Local function id of the policy's End SID on the waypoint.")


class FirewallRule(NoBoolAsNumber, _M):  # inside A3-T's firewall specs: agent input
    """One verdict of a tenant firewall: traffic to ``dst_site`` (from ``src_site`` or any) on a TCP port."""

    src_site: str | None = Field(default=None, description="Source site id; None = any source.")
    dst_site: str
    port: int = Field(ge=1, le=65535)
    action: Literal["accept", "drop"]


class FirewallPolicy(_M):
    """A tenant's firewall rule set (a chain in the shared ``inet tenant_fw`` table of each PE
    hosting a destination site)."""

    id: str
    tenant: str
    rules: list[FirewallRule]


class FloatingIP(_M):
    """1:1 NAT of a public (TEST-NET-2) IPv4 address to a site's CE on the border PE."""

    id: str
    tenant: str
    site: str
    address: str = Field(description="The floating IPv4 address, from 198.51.100.0/24 (RFC 5737).")
    mark: int = Field(description="Firewall mark that selects the tenant table for NATed traffic.")


class External(_M):
    """The external (Internet-side) segment on the border PE."""

    border_pe: str
    pe_if: str
    host: str
    host_if: str = "eth1"
    prefix4: str = Field(description="Link prefix, from 203.0.113.0/24 (TEST-NET-3, RFC 5737).")
    dx4_function: int = Field(description="Border PE's End.DX4 SID function toward the external host.")


class SharedServices(_M):
    """The shared-services segment (DNS/NTP-like hosts) on one PE, with a routing table of its own."""

    pe: str = Field(description="PE the shared-services host hangs off.")
    pe_if: str
    host: str
    host_if: str = "eth1"
    prefix6: str = Field(description="The shared-services /64 (PE ::1, host ::2), outside the tenant pools.")
    table: int = Field(description="Routing table of the shared services on their PE (from the table pool).")
    dt6_function: int = Field(description="Local function of the End.DT6 SID into that table, on the PE.")


class RouteLeak(_M):
    """Tenant ``tenant`` reaches the shared services (and they reach its sites); nobody else does."""

    id: str
    tenant: str


class RateLimit(_M):
    """A shaper on a tenant circuit: traffic the PE sends to the site's CE is held to ``rate_mbit``."""

    id: str
    site: str
    rate_mbit: int = Field(ge=1, le=1000, description="Rate in Mbit/s (10^6 bit/s).")


class EbgpPeering(_M):
    """An eBGP session between a PE and the router of an external AS, with the prefixes each side
    lets through (``substrate.scenario.layers.ebgp_peering``)."""

    id: str
    pe: str = Field(description="The border PE that peers.")
    pe_if: str = Field(description="The PE's port toward the external router.")
    router: str = Field(description="The external AS's router (a node of role external).")
    router_if: str = "eth1"
    link6: str = Field(description="The peering link's /64 (PE ::1, external router ::2), documentation space (RFC 3849).")
    local_as: int = Field(description="The provider's AS number (documentation ASNs, RFC 5398).")
    peer_as: int = Field(description="The external AS number.")
    announced: list[str] = Field(description="What the external AS sends (its own prefixes and bogons): not the operator's to choose.")
    accept: list[str] = Field(description="Prefixes the PE accepts from the peer (its inbound prefix-list).")
    advertise: list[str] = Field(description="Prefixes the PE advertises to the peer (its outbound prefix-list).")
    internal: list[str] = Field(description="Provider routes redistributed into BGP on the PE that are never advertised.")


class SpareCircuit(_M):
    """An unconfigured attachment circuit: a CE host cabled to a PE port, for onboarding tasks."""

    pe: str
    pe_if: str
    ce: str
    ce_if: str = "eth1"


class Pools(_M):
    """Resource pools the layers allocate from; A3-T and task variants allocate from the same."""

    prefix6: str = "fd10::/32"
    prefix4: str = "10.0.0.0/16"
    tables: tuple[int, int] = (100, 199)
    functions: tuple[int, int] = (0xE000, 0xEFFF)
    floating4: str = "198.51.100.0/24"
    marks: tuple[int, int] = (0x100, 0x1FF)


class Invariant(_M):
    """A machine-checkable condition a service instance (or the network) satisfies at baseline
    and must keep satisfying (draft section 2, "baseline invariant")."""

    id: str = Field(description="Stable id, e.g. 'l3vpn/t3/reach/t3s1->t3s2/6'.")
    kind: str = Field(description="Check kind (the observer's registry key).")
    service: str = Field(description="Service instance id, or 'global'.")
    params: dict[str, Any] = Field(default_factory=dict)
    description: str = ""


class NodeConfig(_M):
    """Service-owned device state of one node, in canonical ``ip``/``nft``/FRR form.

    ``routes*``/``rules*`` are ``route add``/``rule add`` arguments, ``addresses`` are
    ``addr add`` arguments, ``nft`` maps an nftables table (``"inet tenant_fw"``) to its full
    text. Deploy applies it; A3-T diffs two renderings to change exactly what an intent changed.
    """

    links_up: list[str] = Field(default_factory=list)
    addresses: list[str] = Field(default_factory=list)
    rules6: list[str] = Field(default_factory=list)
    rules4: list[str] = Field(default_factory=list)
    routes6: list[str] = Field(default_factory=list)
    routes4: list[str] = Field(default_factory=list)
    nft: dict[str, str] = Field(default_factory=dict)
    sysctls: dict[str, str] = Field(default_factory=dict)
    frr: list[str] = Field(default_factory=list)
    qdiscs: dict[str, str] = Field(default_factory=dict, description="Interface -> its root queueing discipline, in "
                                   "canonical form (substrate.scenario.apply.qdisc_value, e.g. 'tbf rate 10000000bit').")

    def is_empty(self) -> bool:
        return not any(getattr(self, f) for f in type(self).model_fields)

    @model_serializer(mode="wrap")
    def _omit_empty_qdiscs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # left out while empty, so that renderings without shapers keep the bytes they had before
        data = handler(self)
        if not data.get("qdiscs"):
            data.pop("qdiscs", None)
        return data


class Scenario(_M):
    """A generated brownfield: topology, service inventory, rendered state, baseline invariants."""

    schema_version: int = SCENARIO_SCHEMA_VERSION
    name: str
    manifest_digest: str = Field(description="SHA-256 of the manifest's canonical JSON.")
    seed: int
    density: int
    layers: list[str]
    topology: Topology
    pools: Pools = Field(default_factory=Pools)
    tenants: list[Tenant] = Field(default_factory=list)
    steering: list[SteeringPolicy] = Field(default_factory=list)
    firewalls: list[FirewallPolicy] = Field(default_factory=list)
    floating_ips: list[FloatingIP] = Field(default_factory=list)
    external: External | None = None
    shared_services: SharedServices | None = Field(default=None, json_schema_extra={"omit_default": True})
    route_leaks: list[RouteLeak] = Field(default_factory=list, json_schema_extra={"omit_default": True})
    rate_limits: list[RateLimit] = Field(default_factory=list, json_schema_extra={"omit_default": True})
    ebgp_peerings: list[EbgpPeering] = Field(default_factory=list, json_schema_extra={"omit_default": True})
    spares: list[SpareCircuit] = Field(default_factory=list)
    node_config: dict[str, NodeConfig] = Field(default_factory=dict)
    invariants: list[Invariant] = Field(default_factory=list)

    # -- queries ---------------------------------------------------------------------------------

    def tenant(self, tid: str) -> Tenant:
        """The tenant ``tid``. Raises KeyError."""
        for t in self.tenants:
            if t.id == tid:
                return t
        raise KeyError(tid)

    def site(self, sid: str) -> Site:
        """The site ``sid`` (any tenant). Raises KeyError."""
        for t in self.tenants:
            for s in t.sites:
                if s.id == sid:
                    return s
        raise KeyError(sid)

    def all_sites(self) -> list[Site]:
        return [s for t in self.tenants for s in t.sites]

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, 1-space indent, trailing newline): byte-stable."""
        import json

        data = self.model_dump(mode="json")
        # fields of later service classes are left out while they hold their default, so that a
        # scenario without those classes stays byte-identical to the one written before them
        for name, f in type(self).model_fields.items():
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            if extra.get("omit_default") and getattr(self, name) == f.get_default(call_default_factory=True):
                data.pop(name, None)
        return json.dumps(data, sort_keys=True, indent=1) + "\n"

    @classmethod
    def load(cls, path: str) -> Scenario:
        """Read a scenario file. Raises OSError, pydantic.ValidationError."""
        from pathlib import Path

        return cls.model_validate_json(Path(path).read_text())
