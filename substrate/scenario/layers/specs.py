"""Field types shared by the service classes' typed specs (the A3-T catalog models).

A spec is what an agent states when it creates an instance; a patch what it states when it
modifies one (RFC 7396 merge-patch: a field left out keeps its value, an explicit ``null`` clears
an optional one). Resources the agent does not choose (SID functions, table ids, marks) are
allocated from the scenario's pools, so a spec never names them. Each service-class module
defines its own specs from these types; :mod:`servers.a3_intent.catalog` assembles them.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field

from substrate.scenario.model import NoBoolAsNumber
from substrate.topology import IFNAME_RE, NODE_NAME_RE

#: Instance ids: short, lowercase, no '-' or '/' (they appear inside invariant ids such as
#: ``l3vpn/t3/isolated/t3s1-x-t1s2``).
ID_RE = r"^[a-z][a-z0-9_]{0,31}$"
#: A value the server allocates from a pool.
AUTO = "auto"


def no_zone(v: str) -> str:
    """``v`` unchanged if it has no zone index. Python's ``ipaddress`` reads ``fe80::%eth0/64``
    (RFC 4007 section 11) as a network, but a routed prefix never has one, and FRR and iproute2
    refuse the text.

    Raises:
        ValueError: ``v`` contains ``%``.
    """
    if "%" in v:
        raise ValueError(f"{v!r} has a zone index ('%...'); a routed prefix has none")
    return v


def prefix_type(version: int, length: int) -> Any:
    """A validator of a site prefix of one family and length, or ``auto``."""
    example = "fd10:0:0:7::/64" if version == 6 else "10.0.7.0/24"

    def check(v: str) -> str:
        if v == AUTO:
            return v
        no_zone(v)
        try:
            net = ipaddress.ip_network(v, strict=False)
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv{version} prefix (e.g. {example}) or 'auto'") from None
        if net.version != version:
            raise ValueError(f"{v!r} is an IPv{net.version} prefix; an IPv{version} prefix is expected here")
        if net.prefixlen != length:
            raise ValueError(f"site prefixes are /{length} (PE gets host 1, CE host 2); got /{net.prefixlen}")
        try:
            ipaddress.ip_network(v, strict=True)
        except ValueError:
            raise ValueError(f"{v!r} has host bits set; did you mean {net}?") from None
        return str(net)

    return AfterValidator(check)


def ipv4_address(v: str) -> str:
    """An IPv4 address (canonical form) or ``auto``. Raises ValueError."""
    if v == AUTO:
        return v
    try:
        return str(ipaddress.IPv4Address(v))
    except ValueError:
        raise ValueError(f"{v!r} is not an IPv4 address (e.g. 198.51.100.20) or 'auto'") from None


def link_slash64(v: str, what: str) -> str:
    """``v`` as a canonical IPv6 /64 whose ``::1`` and ``::2`` are two ends of a link (``what``
    names them in the error, e.g. "the shared prefix is a /64 (PE ::1, host ::2)").

    Raises:
        ValueError: not an IPv6 network, or not a /64.
    """
    try:
        net = ipaddress.IPv6Network(no_zone(v))
    except ValueError as e:
        raise ValueError(f"not an IPv6 network: {e}") from None
    if net.prefixlen != 64:
        raise ValueError(f"{what}, got /{net.prefixlen}")
    return str(net)


def distinct(v: list[Any] | None) -> list[Any] | None:
    """``v`` unchanged if no item appears twice (a list field whose items become device entries,
    e.g. prefix-list lines). Raises ValueError naming the first repeated item."""
    seen: set[Any] = set()
    for item in v or []:
        if item in seen:
            raise ValueError(f"{item!r} is listed twice; list each item once")
        seen.add(item)
    return v


InstanceId = Annotated[str, Field(pattern=ID_RE, description="Instance id: lowercase letters, digits and '_', starting with a letter.")]
NodeName = Annotated[str, Field(pattern=NODE_NAME_RE, description="Device name, e.g. 'r2'.")]
IfName = Annotated[str, Field(pattern=IFNAME_RE, description="Interface name, e.g. 'eth5'.")]
Prefix6 = Annotated[str, prefix_type(6, 64), Field(description="IPv6 /64 from the tenant pool, or 'auto' (allocated lowest-free from the pool).",
                                                   examples=["fd10:0:0:7::/64", "auto"])]
Prefix4 = Annotated[str, prefix_type(4, 24), Field(description="IPv4 /24 from the tenant pool, or 'auto'.", examples=["10.0.7.0/24", "auto"])]
Address4 = Annotated[str, AfterValidator(ipv4_address), Field(description="IPv4 address from the floating pool, or 'auto'.",
                                                               examples=["198.51.100.20", "auto"])]


class Spec(NoBoolAsNumber):
    """Base of every spec and patch model: unknown fields are errors, and a boolean is never
    read as a number (pydantic's lax mode reads true as 1: a rate of 1 Mbit/s, port 1), as the
    servers' argument policy says (:data:`servers.common.args.ARGUMENT_POLICY`)."""

    model_config = ConfigDict(extra="forbid")

