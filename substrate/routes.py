"""Canonical route strings: the identity of a route.

Routes are written in ``ip route add`` argument order with the key attributes first:
``[type] DST [table T] [metric M] [proto P] [encap ...] [via ...] [dev ...] [src ...]``.
The key (what the kernel identifies a route by: type, destination, table, metric, protocol) is
then the prefix before the first forwarding attribute, which is also what ``ip route del`` needs.
Used by device-state capture/restore and by the scenario renderers, so both agree on identity.
"""

from __future__ import annotations

_ROUTE_KEY_END = frozenset({"encap", "via", "dev", "nexthop", "src", "scope"})


def route_key(args: str) -> str:
    """The identifying prefix of a canonical route string (usable as ``route del`` arguments).

    >>> route_key("fd10::/64 table 100 metric 1024 encap seg6 mode encap.red segs fcbb:bb00:2:e000:: dev sr0")
    'fd10::/64 table 100 metric 1024'
    """
    out = []
    for w in args.split():
        if w in _ROUTE_KEY_END:
            break
        out.append(w)
    return " ".join(out)
