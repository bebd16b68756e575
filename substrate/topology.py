"""Topology model: nodes with roles, links between named interfaces, generated bases, YAML form.

A topology is pure data (pydantic); deploying it is a backend's job. Roles follow common provider
terminology: ``P`` (core router), ``PE`` (provider-edge router, where hosts and tenant sites
attach) and ``host`` (a plain Linux namespace: tenant CE, external peer, test host).

Generated bases (``Topology.from_spec``):

- ``line:N``  -- r1 - r2 - ... - rN; the two ends are PEs.
- ``ring:N``  -- a line closed into a ring; odd-numbered routers are PEs.
- ``grid:RxC`` -- an R-by-C mesh; perimeter routers are PEs, inner ones are P.

Each base attaches one host ``h<i>`` to every PE ``r<i>`` unless the spec ends in ``:nohosts``
(e.g. ``grid:5x5:nohosts``). Anything else is read as a path to a YAML file::

    name: triangle
    nodes:
      r1: {role: PE}
      r2: {role: P}
      r3: {role: PE}
      h1: {role: host}
    links:
      - [r1:eth1, r2:eth1]
      - [r2, r3]            # interface names may be left out: next free ethN on each side
      - [h1, r1]

Interface names are ``ethN`` (N >= 1) by default, as in Containerlab, where ``eth0`` is the
management interface. Names are at most 15 characters (Linux ``IFNAMSIZ`` - 1).
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from substrate.errors import TopologyError

#: Node names: short, DNS-label-like, so that namespace and file names stay readable.
NODE_NAME_RE = r"^[a-z][a-z0-9]{0,11}$"
#: Interface names: Linux allows 15 bytes; we also forbid the ones the substrate uses itself.
IFNAME_RE = r"^[a-zA-Z][a-zA-Z0-9_.-]{0,14}$"
RESERVED_IFNAMES = frozenset({"lo", "eth0", "sr0"})
#: Largest router count of a generated base (node ids are written as decimal digits in a 16-bit uSID).
MAX_ROUTERS = 9999


class Role(StrEnum):
    """Role of a node in the provider network."""

    P = "P"
    PE = "PE"
    HOST = "host"


class Node(BaseModel):
    """One node of the topology."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NODE_NAME_RE, description="Node name, unique in the topology.")
    role: Role = Field(description="P, PE or host.")
    node_id: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ROUTERS,
        description="Router number (1..9999) used for its locator and loopback; None for hosts. "
        "Filled in automatically when left out.",
    )

    managed: bool = Field(
        default=False,
        description="Hosts only: addressed by a scenario layer (e.g. a tenant CE), not by the "
        "substrate's base-host plan (an address on the PE link and a default route).",
    )

    @property
    def is_router(self) -> bool:
        """True for P and PE nodes."""
        return self.role is not Role.HOST

    @property
    def is_base_host(self) -> bool:
        """A host the substrate addresses itself (see ``managed``)."""
        return self.role is Role.HOST and not self.managed


class Endpoint(BaseModel):
    """One end of a link: a node and the interface name inside that node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = Field(pattern=NODE_NAME_RE)
    interface: str = Field(pattern=IFNAME_RE)

    @field_validator("interface")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v in RESERVED_IFNAMES:
            raise ValueError(f"interface name {v!r} is reserved ({', '.join(sorted(RESERVED_IFNAMES))})")
        return v

    def __str__(self) -> str:
        return f"{self.node}:{self.interface}"


class Link(BaseModel):
    """A point-to-point link (a veth pair in the netns backend)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    a: Endpoint
    b: Endpoint
    metric: int = Field(default=10, ge=1, le=16777215, description="IS-IS wide metric of both ends.")

    def endpoint_of(self, node: str) -> Endpoint:
        """The endpoint of this link on ``node``. Raises KeyError if the link does not touch it."""
        if self.a.node == node:
            return self.a
        if self.b.node == node:
            return self.b
        raise KeyError(node)

    def peer_of(self, node: str) -> Endpoint:
        """The endpoint at the other end from ``node``. Raises KeyError if the link does not touch it."""
        if self.a.node == node:
            return self.b
        if self.b.node == node:
            return self.a
        raise KeyError(node)


class Topology(BaseModel):
    """A set of nodes and links. Validation guarantees a deployable, unambiguous topology."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="topology", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:x-]{0,63}$")
    nodes: list[Node]
    links: list[Link] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Topology:
        names = [n.name for n in self.nodes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate node names: {', '.join(dup)}")
        if not self.nodes:
            raise ValueError("a topology needs at least one node")
        known = set(names)
        seen: set[tuple[str, str]] = set()
        pairs: set[frozenset[str]] = set()
        for link in self.links:
            for ep in (link.a, link.b):
                if ep.node not in known:
                    raise ValueError(f"link {link.a} -- {link.b} names unknown node {ep.node!r}")
                key = (ep.node, ep.interface)
                if key in seen:
                    raise ValueError(f"interface {ep} is used by more than one link")
                seen.add(key)
            if link.a.node == link.b.node:
                raise ValueError(f"link {link.a} -- {link.b} connects a node to itself")
            pair = frozenset((link.a.node, link.b.node))
            if pair in pairs:
                raise ValueError(f"more than one link between {link.a.node} and {link.b.node}")
            pairs.add(pair)
        ids = [n.node_id for n in self.nodes if n.node_id is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("duplicate router node_id")
        for n in self.nodes:
            if n.role is Role.HOST and n.node_id is not None:
                raise ValueError(f"host {n.name} must not have a node_id")
            if n.is_router and n.node_id is None:
                raise ValueError(f"router {n.name} has no node_id (use Topology.build to fill it in)")
        for h in self.hosts:
            if not self.links_of(h.name):
                raise ValueError(f"host {h.name} has no link")
        roles = {n.name: n.role for n in self.nodes}
        for lk in self.links:
            if roles[lk.a.node] is Role.HOST and roles[lk.b.node] is Role.HOST:
                raise ValueError(f"link {lk.a} -- {lk.b} joins two hosts; hosts attach to routers")
        routers = [n.name for n in self.nodes if n.is_router]
        # a topology without any link is a node inventory (e.g. what an operator renders
        # configuration for); with links, every router must reach every other
        if len(routers) > 1 and self.links:
            seen = {routers[0]}
            todo = [routers[0]]
            while todo:
                cur = todo.pop()
                for lk in self.links_of(cur):
                    nxt = lk.peer_of(cur).node
                    if roles[nxt] is not Role.HOST and nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
            cut = [r for r in routers if r not in seen]
            if cut:
                raise ValueError(f"the routers are not all connected: {', '.join(cut[:5])} cannot reach {routers[0]}")
        return self

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def build(cls, name: str, nodes: list[dict[str, Any]], links: list[Any]) -> Topology:
        """Build a topology from loose data, filling in router node ids and interface names.

        Args:
            name: topology name.
            nodes: dicts with ``name``, ``role`` and optionally ``node_id``.
            links: each either ``[a, b]`` or ``{"endpoints": [a, b], "metric": m}`` where an end is
                ``"node:iface"`` or just ``"node"`` (next free ``ethN`` on that node).

        Raises:
            TopologyError: on any inconsistency, with a message naming the offending item.
        """
        try:
            used_ids = {int(n["node_id"]) for n in nodes if n.get("node_id") is not None}
            filled: list[dict[str, Any]] = []
            next_id = 1
            for raw in nodes:
                n = dict(raw)
                try:
                    role = Role(n.get("role", "P"))
                except ValueError:
                    raise TopologyError(
                        f"node {n.get('name')!r}: unknown role {n.get('role')!r} (use P, PE or host)"
                    ) from None
                if role is not Role.HOST and n.get("node_id") is None:
                    guess = _digits_of(str(n.get("name", "")))
                    if guess is not None and guess not in used_ids and 1 <= guess <= MAX_ROUTERS:
                        n["node_id"] = guess
                    else:
                        while next_id in used_ids:
                            next_id += 1
                        n["node_id"] = next_id
                    used_ids.add(n["node_id"])
                filled.append(n)
            counters: dict[str, int] = {}
            used_if: dict[str, set[str]] = {}
            for raw in links:
                eps = raw["endpoints"] if isinstance(raw, dict) else raw
                for ep in eps:
                    node, _, iface = str(ep).partition(":")
                    if iface:
                        used_if.setdefault(node, set()).add(iface)
            parsed_links = []
            for i, raw in enumerate(links):
                if isinstance(raw, dict):
                    eps, metric = raw.get("endpoints"), raw.get("metric", 10)
                else:
                    eps, metric = raw, 10
                if not isinstance(eps, (list, tuple)) or len(eps) != 2:
                    raise TopologyError(f"links[{i}]: expected two endpoints, got {eps!r}")
                ends = []
                for ep in eps:
                    node, _, iface = str(ep).partition(":")
                    if not iface:
                        k = counters.get(node, 0)
                        while True:
                            k += 1
                            iface = f"eth{k}"
                            if iface not in used_if.setdefault(node, set()):
                                break
                        counters[node] = k
                        used_if[node].add(iface)
                    ends.append({"node": node, "interface": iface})
                parsed_links.append({"a": ends[0], "b": ends[1], "metric": metric})
            return cls.model_validate({"name": name, "nodes": filled, "links": parsed_links})
        except ValidationError as e:
            raise TopologyError(_first_error(e, nodes)) from None
        except (KeyError, ValueError, TypeError) as e:
            if isinstance(e, TopologyError):
                raise
            raise TopologyError(f"topology {name!r}: {e}") from None

    @classmethod
    def from_spec(cls, spec: str) -> Topology:
        """Parse ``line:N``, ``ring:N``, ``grid:RxC`` (optionally ``:nohosts``) or a YAML path.

        Raises:
            TopologyError: unknown base, bad size, unreadable or invalid file.
        """
        m = re.fullmatch(r"(line|ring|grid):(\d+)(?:x(\d+))?(:nohosts)?", spec.strip())
        if m:
            kind, a, b, nohosts = m.group(1), int(m.group(2)), m.group(3), bool(m.group(4))
            if kind == "grid":
                if b is None:
                    raise TopologyError(f"grid needs RxC, e.g. grid:5x5 (got {spec!r})")
                return grid(a, int(b), hosts=not nohosts)
            if b is not None:
                raise TopologyError(f"{kind} takes one size, e.g. {kind}:5 (got {spec!r})")
            return line(a, hosts=not nohosts) if kind == "line" else ring(a, hosts=not nohosts)
        path = Path(spec)
        if path.suffix in (".yaml", ".yml") or path.exists():
            return cls.from_yaml(path)
        raise TopologyError(
            f"unknown topology spec {spec!r}: use line:N, ring:N, grid:RxC (optionally :nohosts) or a YAML file"
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> Topology:
        """Load the YAML form (see module docstring).

        Raises:
            TopologyError: file missing, malformed YAML (with line), or invalid content.
        """
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise TopologyError(f"cannot read topology file {p}: {e.strerror}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise TopologyError(f"{p}: malformed YAML{where}: {getattr(e, 'problem', e)}") from None
        if not isinstance(data, dict) or "nodes" not in data:
            raise TopologyError(f"{p}: expected a mapping with 'nodes' and 'links'")
        unknown = sorted(set(data) - {"name", "nodes", "links"})
        if unknown:
            raise TopologyError(f"{p}: unknown key(s) {', '.join(map(repr, unknown))}; a topology file has name, nodes and links")
        raw_nodes = data["nodes"]
        if isinstance(raw_nodes, dict):
            nodes = [{"name": k, **(v or {})} for k, v in raw_nodes.items()]
        elif isinstance(raw_nodes, list):
            nodes = list(raw_nodes)
        else:
            raise TopologyError(f"{p}: 'nodes' must be a mapping or a list")
        return cls.build(str(data.get("name", p.stem)), nodes, list(data.get("links") or []))

    # -- queries ----------------------------------------------------------------------------

    def node(self, name: str) -> Node:
        """The node called ``name``. Raises KeyError if there is none."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def routers(self) -> list[Node]:
        """P and PE nodes, in topology order."""
        return [n for n in self.nodes if n.is_router]

    @property
    def hosts(self) -> list[Node]:
        """Host nodes, in topology order."""
        return [n for n in self.nodes if n.role is Role.HOST]

    def links_of(self, node: str) -> list[Link]:
        """Links that touch ``node``, in topology order."""
        return [lk for lk in self.links if node in (lk.a.node, lk.b.node)]

    def neighbors(self, node: str) -> list[str]:
        """Names of the nodes adjacent to ``node``."""
        return [lk.peer_of(node).node for lk in self.links_of(node)]

    def core_links(self) -> list[Link]:
        """Router-to-router links (where the IGP runs)."""
        return [lk for lk in self.links if self.node(lk.a.node).is_router and self.node(lk.b.node).is_router]

    def gateway_of(self, host: str) -> tuple[Node, Link]:
        """The router a host hangs off, and the link to it (its first router link).

        Raises:
            KeyError: the host has no link to a router.
        """
        for lk in self.links_of(host):
            peer = self.node(lk.peer_of(host).node)
            if peer.is_router:
                return peer, lk
        raise KeyError(f"host {host} has no router link")

    def base_hosts_of(self, router: str) -> list[str]:
        """Base hosts (not scenario-managed) cabled to ``router``, in link order; the k-th gets
        the router's k-th base-host prefix."""
        return [lk.peer_of(router).node for lk in self.links_of(router) if self.node(lk.peer_of(router).node).is_base_host]

    def with_nodes(self, nodes: list[Node], links: list[Link]) -> Topology:
        """A copy with extra nodes and links appended (used by scenario layers that add hosts)."""
        return Topology.model_validate(
            {"name": self.name, "nodes": [*self.nodes, *nodes], "links": [*self.links, *links]}
        )


def _digits_of(name: str) -> int | None:
    m = re.fullmatch(r"[a-z]+(\d+)", name)
    return int(m.group(1)) if m else None


_PATTERN_HELP = {
    NODE_NAME_RE: "use 1-12 lowercase letters and digits, starting with a letter",
    IFNAME_RE: "use 1-15 letters, digits, '_', '.' or '-', starting with a letter",
}


def _first_error(e: ValidationError, nodes: list[dict[str, Any]] | None = None) -> str:
    """One line naming the node (not its index) and saying what the rule is."""
    err = e.errors()[0]
    loc = list(err["loc"])
    where = ".".join(str(x) for x in loc) or "topology"
    if nodes is not None and len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int) and loc[1] < len(nodes):
        where = f"node {nodes[loc[1]].get('name')!r}" + (f" ({'.'.join(map(str, loc[2:]))})" if loc[2:] else "")
    msg = err["msg"]
    pattern = (err.get("ctx") or {}).get("pattern")
    if pattern in _PATTERN_HELP:
        msg = f"invalid value {err.get('input')!r}: {_PATTERN_HELP[pattern]}"
    return f"{where}: {msg}"


def _with_hosts(routers: list[dict[str, Any]], links: list[Any], hosts: bool) -> tuple[list, list]:
    nodes = list(routers)
    if hosts:
        for r in routers:
            if r["role"] == Role.PE:
                h = "h" + r["name"][1:]
                nodes.append({"name": h, "role": Role.HOST})
                links.append([f"{h}:eth1", r["name"]])
    return nodes, links


def _check_count(kind: str, n: int, minimum: int) -> None:
    if not minimum <= n <= MAX_ROUTERS:
        raise TopologyError(f"{kind} size must be between {minimum} and {MAX_ROUTERS} routers (got {n})")


def line(n: int, *, hosts: bool = True) -> Topology:
    """``line:N``: r1 - ... - rN; PEs at both ends. Raises TopologyError if N < 2."""
    _check_count("line", n, 2)
    routers = [{"name": f"r{i}", "role": Role.PE if i in (1, n) else Role.P} for i in range(1, n + 1)]
    links: list[Any] = [[f"r{i}", f"r{i + 1}"] for i in range(1, n)]
    nodes, links = _with_hosts(routers, links, hosts)
    return Topology.build(f"line:{n}", nodes, links)


def ring(n: int, *, hosts: bool = True) -> Topology:
    """``ring:N``: a closed line; odd-numbered routers are PEs. Raises TopologyError if N < 3."""
    _check_count("ring", n, 3)
    routers = [{"name": f"r{i}", "role": Role.PE if i % 2 == 1 else Role.P} for i in range(1, n + 1)]
    links: list[Any] = [[f"r{i}", f"r{i % n + 1}"] for i in range(1, n + 1)]
    nodes, links = _with_hosts(routers, links, hosts)
    return Topology.build(f"ring:{n}", nodes, links)


def grid(rows: int, cols: int, *, hosts: bool = True) -> Topology:
    """``grid:RxC``: routers r1..r(R*C) row by row; perimeter PEs, inner P.

    Raises:
        TopologyError: if R or C is below 1 or the grid has fewer than 2 routers.
    """
    if rows < 1 or cols < 1:
        raise TopologyError(f"grid dimensions must be positive (got {rows}x{cols})")
    _check_count("grid", rows * cols, 2)

    def idx(r: int, c: int) -> int:
        return r * cols + c + 1

    routers = []
    for r in range(rows):
        for c in range(cols):
            edge = r in (0, rows - 1) or c in (0, cols - 1)
            routers.append({"name": f"r{idx(r, c)}", "role": Role.PE if edge else Role.P})
    links: list[Any] = []
    for r in range(rows):
        for c in range(cols):
            if c + 1 < cols:
                links.append([f"r{idx(r, c)}", f"r{idx(r, c + 1)}"])
            if r + 1 < rows:
                links.append([f"r{idx(r, c)}", f"r{idx(r + 1, c)}"])
    nodes, links = _with_hosts(routers, links, hosts)
    return Topology.build(f"grid:{rows}x{cols}", nodes, links)
