"""Diagnostic labels of a run, beside its outcome label (issue 19, item 1): which failure of
NetConfArena's taxonomy (section IV-C) the final state shows, where that can be decided
mechanically from the observer's verdicts. Pure functions.

Decided today: ``specification_deviation`` -- a value the request or the design fixed (a site
prefix, a PE address, the PE, the port) replaced by another in the final state. It is read off
the structured differences of the state checks (``Verdict.diff`` of ``table_routes`` and
``address_bound``), pooled over the run's verdicts:

- a tenant table on a node lacks ``P -> F`` and holds ``P' -> F`` (same type and forwarding,
  another prefix of the same family): prefix P replaced by P';
- a node lacks ``P -> dev X`` and holds ``P -> dev Y``: port X replaced by Y;
- one node lacks ``P -> dev X`` (the site's attachment) and another holds ``P -> dev Y``: the
  site's PE replaced;
- a node lacks ``P -> seg6 S`` and holds ``P -> seg6 S'`` with S' a SID of another node: P routed
  to another PE (a different function on the same node is the operator's allocation, not a
  value the request fixed);
- an interface lacks address ``A/L`` and holds ``A'/L`` of the same family: address replaced.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from substrate.scenario.observer import Verdict

SPECIFICATION_DEVIATION = "specification_deviation"
LABELS = (SPECIFICATION_DEVIATION,)


@dataclass(frozen=True)
class _Shape:
    node: str
    rtype: str
    dst: str
    fwd: str  # "dev X", "seg6 S1,S2", "-"

    @classmethod
    def parse(cls, node: str, shape: str) -> _Shape | None:
        """A route shape ``TYPE DST -> FORWARDING`` (substrate.scenario.observer._route_shape)."""
        head, sep, fwd = shape.partition(" -> ")
        words = head.split()
        if not sep or len(words) != 2:
            return None
        return cls(node, words[0], words[1], fwd)


def _family(prefix: str) -> int | None:
    try:
        return ipaddress.ip_network(prefix, strict=False).version
    except ValueError:
        return None


def _sid_node(fwd: str) -> str | None:
    """The node part (third group) of the first SID of a ``seg6`` forwarding."""
    if not fwd.startswith("seg6 "):
        return None
    try:
        return ipaddress.IPv6Address(fwd[5:].split(",")[0]).exploded.split(":")[2]
    except ValueError:
        return None


def specification_deviations(verdicts: Iterable[Verdict]) -> list[str]:
    """What the final state shows replaced (module docstring), one sentence each, sorted."""
    missing: list[_Shape] = []
    extra: list[_Shape] = []
    out: set[str] = set()
    for v in verdicts:
        if v.ok or not v.diff:
            continue
        node = v.evidence[0].node if v.evidence else ""
        if v.kind == "address_bound":
            gone, new = v.diff.get("missing", []), v.diff.get("unexpected", [])
            for a in gone:
                for b in new:
                    if _family(a) == _family(b) and a.split("/")[-1] == b.split("/")[-1]:
                        out.add(f"address {a} replaced by {b} on {node}")
        elif v.kind == "table_routes":
            missing += [s for s in (_Shape.parse(node, x) for x in v.diff.get("missing", [])) if s]
            extra += [s for s in (_Shape.parse(node, x) for x in v.diff.get("unexpected", [])) if s]
    for m in missing:
        for u in extra:
            if m.rtype != u.rtype or _family(m.dst) != _family(u.dst):
                continue
            if m.node == u.node and m.fwd == u.fwd and m.dst != u.dst and m.rtype == "unicast":
                out.add(f"prefix {m.dst} replaced by {u.dst} on {m.node} ({m.fwd})")
            elif m.dst == u.dst and m.fwd.startswith("dev ") and u.fwd.startswith("dev "):
                if m.node == u.node and m.fwd != u.fwd:
                    out.add(f"port {m.fwd[4:]} replaced by {u.fwd[4:]} for {m.dst} on {m.node}")
                elif m.node != u.node:
                    out.add(f"PE {m.node} replaced by {u.node} for {m.dst}")
            elif m.node == u.node and m.dst == u.dst and _sid_node(m.fwd) and _sid_node(u.fwd) \
                    and _sid_node(m.fwd) != _sid_node(u.fwd):
                out.add(f"{m.dst} on {m.node} routed to another PE's SID ({u.fwd[5:]} instead of {m.fwd[5:]})")
    return sorted(out)


def diagnostic_labels(verdicts: Iterable[Verdict]) -> tuple[list[str], list[str]]:
    """The run's diagnostic labels (:data:`LABELS`) and the findings behind them."""
    found = specification_deviations(list(verdicts))
    return ([SPECIFICATION_DEVIATION] if found else []), found
