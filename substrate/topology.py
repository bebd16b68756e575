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

import os
import re
import stat
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from substrate import frr_daemons
from substrate.errors import TopologyError

#: Node names: short, DNS-label-like, so that namespace and file names stay readable.
NODE_NAME_RE = r"^[a-z][a-z0-9]{0,11}$"
#: Interface names: Linux allows 15 bytes; we also forbid the ones the substrate uses itself.
IFNAME_RE = r"^[a-zA-Z][a-zA-Z0-9_.-]{0,14}$"
RESERVED_IFNAMES = frozenset({"lo", "eth0", "sr0"})
#: Files a router's /etc/frr may be given (besides the daemons file, which is ``Node.daemons``).
FRR_FILE_NAMES = frozenset({"frr.conf", "vtysh.conf"} | {f"{d}.conf" for d in frr_daemons.KNOWN_DAEMONS})
#: Largest router count of a generated base (node ids are written as decimal digits in a 16-bit uSID).
MAX_ROUTERS = 9999


#: Largest topology or configuration file a user gives that is read (bytes).
MAX_FILE_BYTES = 1 << 20


def read_regular_file(path: str | Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, read without blocking or growing
    without bound: a FIFO, a device (``/dev/zero``), a socket or a directory is refused before
    anything is read (the file is opened non-blocking, then checked with ``fstat``).

    Raises:
        OSError: the file cannot be opened or read (``strerror`` says why).
        ValueError: not a regular file, or larger than ``limit`` (the message says which).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"larger than {limit // 1024} KiB")
    return raw



class Role(StrEnum):
    """Role of a node in the provider network."""

    P = "P"
    PE = "PE"
    HOST = "host"
    #: A router of another autonomous system (an external BGP peer, e.g. of the ``ebgp_peering``
    #: service class): it runs FRR from its own configuration like an imported router (reset,
    #: drift reading, daemon faults and confinement treat it as a router) but never joins the
    #: underlay: no node id, no IS-IS, no SRv6 locator, and its links are not core links.
    EXTERNAL = "external"


#: Linux hostnames: at most 64 bytes.
HOSTNAME_MAX = 64


class NodeSource(BaseModel):
    """Where an imported node came from: what the source file said that deploying does not use,
    and the names the substrate had to change (see :mod:`substrate.clab`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(description="Path of the source topology file.")
    name: str = Field(description="The node's name there (may be longer or use characters a node name cannot).")
    kind: str = Field(default="", description="Containerlab kind (linux, frr).")
    image: str = Field(default="", description="Container image named there; noted only (netns nodes run the host's programs).")
    mgmt_ipv4: str = Field(default="", description="Management IPv4 address there (metadata: netns nodes have no management network).")
    mgmt_ipv6: str = Field(default="", description="Management IPv6 address there (metadata).")
    interfaces: dict[str, str] = Field(
        default_factory=dict, description="Renamed interfaces: name in the node -> name in the source file.")
    exec_lines: tuple[int, ...] = Field(default=(), description="Line of each exec command in the source file.")
    files: dict[str, str] = Field(
        default_factory=dict, description="Where each of the router's FRR files came from (file name -> path or field).")


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
        description="Hosts only: addressed by a scenario layer (e.g. a tenant CE) or by its own exec "
        "commands (an imported lab), not by the substrate's base-host plan (an address on the PE link "
        "and a default route).",
    )

    daemons: tuple[str, ...] | None = Field(
        default=None,
        description="Routers only: the FRR daemons the router runs, in start order (zebra and staticd "
        "always; see substrate.frr_daemons). None: the underlay's set (zebra, staticd, isisd).",
    )
    frr_files: dict[str, str] = Field(
        default_factory=dict,
        description="Routers only: files of the router's /etc/frr given by the lab, by name (frr.conf, "
        "vtysh.conf, per-daemon files such as ospfd.conf), e.g. imported from a Containerlab lab. A "
        "router with a configuration file of its own runs it as it is: the substrate adds no underlay "
        "to it (no IS-IS, no SRv6 locator, no base-host addresses).",
    )
    exec: tuple[str, ...] = Field(
        default=(),
        description="Commands run in the node, in order, once it and its links are up (and FRR started): "
        "each is split like a shell word list and run without a shell, as Containerlab's exec does.",
    )
    sysctls: dict[str, str] = Field(
        default_factory=dict, description="net.* sysctls set in the node before its exec commands run.")
    source: NodeSource | None = Field(
        default=None, description="Where an imported node came from (kept for the user; deploying ignores it).")

    @model_serializer(mode="wrap")
    def _omit_unset_setup(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Nodes without their own set-up serialise as before it existed (lab records, scenario
        files): a reader of the older model -- another checkout's ``harness lab cleanup`` -- can
        still read them, and a scenario file stays byte-identical."""
        out = handler(self)
        for k in SETUP_FIELDS:
            if k in out and not out[k]:
                del out[k]
        return out

    @field_validator("daemons")
    @classmethod
    def _daemon_order(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else frr_daemons.ordered(v)

    @model_validator(mode="after")
    def _check_node(self) -> Node:
        if not self.is_router and (self.daemons is not None or self.frr_files):
            raise ValueError(f"host {self.name} runs no FRR: daemons and frr_files are for routers")
        bad = sorted(set(self.frr_files) - FRR_FILE_NAMES)
        if bad:
            raise ValueError(f"frr_files of {self.name}: {', '.join(bad)} cannot go to /etc/frr (allowed: frr.conf, "
                             "vtysh.conf, <daemon>.conf; the daemon set is the daemons field)")
        for key in self.sysctls:
            if not key.startswith("net."):
                raise ValueError(f"sysctl {key} of {self.name}: only net.* sysctls can be set in a node")
        if any(not line.strip() for line in self.exec):
            raise ValueError(f"exec of {self.name}: empty command")
        return self

    @property
    def is_router(self) -> bool:
        """True for P and PE nodes."""
        return self.role is not Role.HOST

    @property
    def self_configured(self) -> bool:
        """A router that brings its own FRR configuration (frr.conf or per-daemon files): deployed
        as it is, without the substrate's underlay."""
        return self.is_router and any(f != "vtysh.conf" for f in self.frr_files)

    @property
    def frr_daemons(self) -> tuple[str, ...]:
        """The FRR daemons the node runs (empty for hosts)."""
        if not self.is_router:
            return ()
        return self.daemons if self.daemons is not None else frr_daemons.BASE_DAEMONS

    @property
    def hostname(self) -> str:
        """The node's hostname: its name in the source file when it was imported (Containerlab
        sets a container's hostname to the node name), else its name."""
        src = self.source.name if self.source is not None else ""
        return src if src and len(src.encode()) <= HOSTNAME_MAX else self.name

    @property
    def is_base_host(self) -> bool:
        """A host the substrate addresses itself (see ``managed``)."""
        return self.role is Role.HOST and not self.managed


#: Node fields an imported lab sets (empty/None on the substrate's own nodes).
SETUP_FIELDS = ("daemons", "frr_files", "exec", "sysctls", "source")


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
        # the substrate's own plan (IS-IS underlay, base-host addressing) needs single links and
        # connected routers; nodes that configure themselves (an imported lab) need neither
        planned = {n.name for n in self.nodes if (n.is_router and not n.self_configured) or n.is_base_host}
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
            if pair in pairs and pair <= planned:
                raise ValueError(f"more than one link between {link.a.node} and {link.b.node}")
            pairs.add(pair)
        ids = [n.node_id for n in self.nodes if n.node_id is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("duplicate router node_id")
        for n in self.nodes:
            if n.role is Role.HOST and n.node_id is not None:
                raise ValueError(f"host {n.name} must not have a node_id")
            if n.role is Role.EXTERNAL and n.node_id is not None:
                raise ValueError(f"external router {n.name} must not have a node_id (it is not in the underlay)")
            if n.is_router and n.role is not Role.EXTERNAL and n.node_id is None:
                raise ValueError(f"router {n.name} has no node_id (use Topology.build to fill it in)")
        for h in self.hosts:
            if h.is_base_host and not self.links_of(h.name):
                raise ValueError(f"host {h.name} has no link")
        roles = {n.name: n.role for n in self.nodes}
        for lk in self.links:
            if roles[lk.a.node] is Role.HOST and roles[lk.b.node] is Role.HOST and {lk.a.node, lk.b.node} & planned:
                raise ValueError(f"link {lk.a} -- {lk.b} joins two hosts; hosts attach to routers")
        routers = [n.name for n in self.nodes if n.is_router and n.name in planned]
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
                        f"node {n.get('name')!r}: unknown role {n.get('role')!r} (use P, PE, host or external)"
                    ) from None
                if role not in (Role.HOST, Role.EXTERNAL) and n.get("node_id") is None:
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
        """Load the YAML form (see module docstring). A Containerlab topology file (a mapping with
        ``topology``) is :func:`substrate.clab.load`'s; :func:`substrate.clab.from_spec` takes both.

        Raises:
            TopologyError: file missing, malformed YAML (with line), or invalid content.
        """
        p = Path(path)
        try:
            text = read_regular_file(p).decode()
        except OSError as e:
            raise TopologyError(f"cannot read topology file {p}: {e.strerror}") from None
        except ValueError as e:  # UnicodeDecodeError included
            raise TopologyError(f"cannot read topology file {p}: {e}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise TopologyError(f"{p}: malformed YAML{where}: {getattr(e, 'problem', e)}") from None
        if isinstance(data, dict) and "topology" in data:
            raise TopologyError(f"{p} is a Containerlab topology file: read it with substrate.clab.load "
                                "(harness lab up/import --topology FILE do)")
        if not isinstance(data, dict) or "nodes" not in data:
            raise TopologyError(f"{p}: expected a mapping with 'nodes' and 'links' (or a Containerlab file with 'topology')")
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

    def to_data(self) -> dict[str, Any]:
        """The YAML form as data (what :meth:`from_yaml` reads back into an equal topology):
        nodes by name with their non-default fields, links as ``[a:if, b:if]`` (with ``metric``
        when it is not the default)."""
        nodes = {n.name: n.model_dump(mode="json", exclude={"name"}, exclude_defaults=True) for n in self.nodes}
        links: list[Any] = []
        for lk in self.links:
            ends = [str(lk.a), str(lk.b)]
            links.append(ends if lk.metric == Link.model_fields["metric"].default else {"endpoints": ends, "metric": lk.metric})
        return {"name": self.name, "nodes": nodes, "links": links}

    def to_yaml(self) -> str:
        """:meth:`to_data` as YAML text, multi-line strings (configuration files) as literal blocks."""

        class _Dumper(yaml.SafeDumper):
            pass

        def _str(dumper: yaml.SafeDumper, v: str) -> yaml.ScalarNode:
            style = "|" if "\n" in v and not any(c in v for c in "\t\r") and not v.endswith((" ", "\n\n")) else None
            return dumper.represent_scalar("tag:yaml.org,2002:str", v, style=style)

        _Dumper.add_representer(str, _str)
        return yaml.dump(self.to_data(), Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)

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
        """Router-to-router links (where the IGP runs); links to external routers are not core links."""
        return [lk for lk in self.links
                if all(n.is_router and n.role is not Role.EXTERNAL for n in (self.node(lk.a.node), self.node(lk.b.node)))]

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
