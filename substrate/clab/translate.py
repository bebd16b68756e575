"""A Containerlab topology file (``.clab.yml``) as a substrate :class:`~substrate.topology.Topology`.

What is read, per node (after Containerlab's inheritance, :mod:`substrate.clab.resolve`):

- ``kind``: ``linux`` or ``frr`` (alias ``frrouting``); any other kind is refused. A ``linux``
  node is a router when it binds FRR files or its image is an FRR image (or its
  ``anibench.role`` label says P or PE), else a host;
- ``binds`` into ``/etc/frr`` (``frr.conf``, ``daemons``, ``vtysh.conf``, ``<daemon>.conf``, or
  a directory bound on ``/etc/frr``), sources resolved against the topology file's directory
  (``~`` and ``__clabNodeName__`` expanded); a missing source is an error naming the file;
- the daemon set: the ``daemons`` file (``linux``), ``extras.frr.daemons`` (``frr``), else the
  image's default (zebra and staticd);
- ``startup-config`` (``frr`` kind: a path, or the configuration itself when it has a line
  break): the router's ``frr.conf``;
- ``exec`` (run in the node after start, :mod:`substrate.startup`), ``sysctls`` (``net.*``);
- ``image``, ``mgmt-ipv4``/``mgmt-ipv6``: kept as metadata (``Node.source``);
- ``labels``: ``anibench.role`` (P, PE, host), ``anibench.node-id``, ``anibench.managed`` (what
  :mod:`substrate.export` writes, with ``anibench.exported`` on its groups); other labels are ignored.

Links: ``endpoints: ["node:iface", "node:iface"]`` (or ``type: veth`` with endpoint mappings).
Names that do not fit the substrate are mapped (:mod:`substrate.clab.names`); the FRR files'
mentions of a renamed interface are rewritten, and the original name becomes the interface's
Linux alternative name so exec commands can still use it.

A router's files are its configuration as it is: it runs that, not the substrate's underlay. An
export of this project (:func:`substrate.export.to_containerlab`) is recognised by its
``anibench.exported`` label:
where a node's files, exec commands and sysctls are exactly what the export writes for the
substrate's own set-up, they are dropped again, so that export then import gives the same model.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from substrate import export, frr, frr_daemons
from substrate.clab import frrfiles, names
from substrate.clab.resolve import Resolver
from substrate.clab.source import MAX_FILE_BYTES, ClabError, FieldPath, Source, field_name, read
from substrate.errors import TopologyError
from substrate.topology import FRR_FILE_NAMES, MAX_ROUTERS, Role, Topology, read_regular_file

#: Kinds imported, by the name used in files (Containerlab registers ``frrouting`` as an alias).
KINDS = {"linux": "linux", "frr": "frr", "frrouting": "frr"}
#: Node fields read (see module docstring).
USED = frozenset({"kind", "group", "image", "startup-config", "exec", "binds", "labels", "mgmt-ipv4", "mgmt-ipv6",
                  "sysctls", "extras"})
#: Shape of each field read.
FIELD_TYPES: dict[str, type] = {"kind": str, "group": str, "image": str, "startup-config": str, "mgmt-ipv4": str,
                                "mgmt-ipv6": str, "exec": list, "binds": list, "labels": dict, "sysctls": dict,
                                "extras": dict}
#: Containerlab's per-node resource limits: a netns node has the lab's limits instead (substrate.confine).
LIMIT_FIELDS = frozenset({"cpu", "cpu-set", "memory", "shm-size"})
#: Node fields without effect on the emulated network: ignored, with a note.
IGNORED = frozenset({"image-pull-policy", "restart-policy", "auto-remove", "startup-delay", "enforce-startup-config",
                     "cpu", "cpu-set", "memory", "shm-size", "dns", "certificate", "healthcheck", "runtime",
                     "aliases", "type", "license", "credentials"})
#: The rest of Containerlab's node fields (its JSON Schema's node-config): refused.
UNSUPPORTED = frozenset({"volumes", "ports", "env", "env-files", "user", "hostname", "entrypoint", "cmd",
                         "network-mode", "link-apply-mode", "config", "stages", "components", "cap-add", "privileged",
                         "cgroupns-mode", "cgroup-parent", "pid-mode", "tmpfs", "security-opts", "devices",
                         "suppress-startup-config"})
TOP_FIELDS = frozenset({"name", "prefix", "mgmt", "topology", "settings", "debug"})
TOPOLOGY_FIELDS = frozenset({"nodes", "groups", "kinds", "defaults", "links"})
LINK_FIELDS = frozenset({"type", "endpoints", "mtu", "ipv4", "ipv6", "vars", "labels"})
#: Containerlab's node name rule (its JSON Schema).
CLAB_NODE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9-._|]*$")
CLAB_LAB_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9-._]*$")
#: Endpoint node names Containerlab reserves for links leaving the lab.
SPECIAL_ENDPOINTS = {"host": "the host's network namespace", "mgmt-net": "the management network",
                     "macvlan": "a host interface (macvlan)"}
#: Containerlab's management interface of every container.
MGMT_IF = "eth0"
FRR_DIR = "/etc/frr"
#: Magic variables Containerlab expands in paths; the ones naming its lab directory cannot work here.
LAB_DIR_VARS = ("__clabDir__", "__clabNodeDir__", "__clabLabName__")


@dataclass
class ClabImport:
    """The result of an import: the topology and one-line notes on what was ignored or renamed."""

    topology: Topology
    notes: list[str] = field(default_factory=list)
    source: Path | None = None


@dataclass
class _Node:
    orig: str
    name: str
    kind: str
    router: bool
    role: Role | None = None
    node_id: int | None = None
    managed: bool | None = None
    labelled: bool = False
    daemons: tuple[str, ...] | None = None
    files: dict[str, str] = field(default_factory=dict)
    exec: list[tuple[str, int]] = field(default_factory=list)
    sysctls: dict[str, str] = field(default_factory=dict)
    image: str = ""
    mgmt4: str = ""
    mgmt6: str = ""
    ifmap: dict[str, str] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)


def is_clab_file(path: str | Path) -> bool:
    """``path`` names a Containerlab topology file (``*.clab.yml``/``*.clab.yaml``)."""
    return str(path).endswith((".clab.yml", ".clab.yaml"))


def load(path: str | Path) -> ClabImport:
    """Import a Containerlab topology file.

    Returns:
        The topology (every node's ``source`` says where it came from) and notes.

    Raises:
        ClabError: anything unsupported or malformed, in one line ``FILE:LINE: FIELD: what; what to do``.
    """
    return _Importer(read(path)).run()


class _Importer:
    def __init__(self, src: Source):
        self.src = src
        self.notes: list[str] = []
        self._per_node: dict[str, list[str]] = {}
        self._ignored_seen: set[str] = set()

    def err(self, path: FieldPath, msg: str) -> ClabError:
        return self.src.error(path, msg)

    def note(self, msg: str, node: str) -> None:
        """A note that may hold for several nodes (reported once, naming them)."""
        self._per_node.setdefault(msg, []).append(node)

    # -- document structure --------------------------------------------------------------------

    def run(self) -> ClabImport:
        doc = self.src.data
        if not isinstance(doc, dict):
            raise self.err((), "a Containerlab topology file is a mapping with 'name' and 'topology'")
        for key in doc:
            if key in ("nodes", "links", "kinds", "groups", "defaults"):
                raise self.err((key,), f"'{key}' belongs under 'topology' (topology.{key}); indent it there")
            if key not in TOP_FIELDS:
                raise self.err((key,), f"unknown field; a topology file has {', '.join(sorted(TOP_FIELDS))}")
        for key in ("prefix", "mgmt", "settings", "debug"):
            if key in doc:
                self.notes.append(f"{field_name((key,))} ignored: a netns lab has no containers or management network")
        lab = doc.get("name")
        if not isinstance(lab, str) or not CLAB_LAB_NAME.fullmatch(lab):
            raise self.err(("name",), f"the lab needs a name of letters, digits, '-', '.', '_' (got {lab!r})")
        topo = doc.get("topology")
        if not isinstance(topo, dict):
            raise self.err(("topology",), "missing or not a mapping: give topology.nodes (and topology.links)")
        for key in topo:
            if key == "endpoints":
                raise self.err(("topology", key), "a link goes in topology.links, as - endpoints: [\"a:eth1\", \"b:eth1\"]")
            if key not in TOPOLOGY_FIELDS:
                raise self.err(("topology", key), f"unknown field; topology has {', '.join(sorted(TOPOLOGY_FIELDS))}")
        for key in ("kinds", "groups", "defaults"):
            if key in topo and topo[key] is not None and not isinstance(topo[key], dict):
                raise self.err(("topology", key), "must be a mapping")
        for key in ("kinds", "groups"):
            for k, v in (topo.get(key) or {}).items():
                if v is not None and not isinstance(v, dict):
                    raise self.err(("topology", key, k), "must be a mapping of node settings")
        nodes = topo.get("nodes")
        if not isinstance(nodes, dict) or not nodes:
            raise self.err(("topology", "nodes"), "the lab needs at least one node (topology.nodes: {name: {kind: ...}})")
        for n, v in nodes.items():
            if not CLAB_NODE_NAME.fullmatch(n):
                raise self.err(("topology", "nodes", n), "a node name is letters, digits, '-', '.', '_' or '|', starting with a letter or digit")
            if v is not None and not isinstance(v, dict):
                raise self.err(("topology", "nodes", n), "a node is a mapping of settings (kind, image, binds, ...)")
        res = Resolver(topo)
        links = self._links(topo, nodes)
        try:
            mapped = names.map_nodes(list(nodes))
        except ValueError as e:
            raise self.err(("topology", "nodes"), f"{e}; rename one") from None
        renamed = [f"{o} -> {m}" for o, m in mapped.items() if o != m]
        if renamed:
            self.notes.append(f"nodes renamed (names here are 1-12 lowercase letters and digits): {', '.join(renamed)}")
        ends: dict[str, list[str]] = {n: [] for n in nodes}
        for (a, ai), (b, bi), _m, _p in links:
            ends[a].append(ai)
            ends[b].append(bi)
        specs = {n: self._node(res, n, mapped[n], ends[n]) for n in nodes}
        return self._assemble(lab, specs, links)

    def _links(self, topo: dict[str, Any], nodes: dict[str, Any]) -> list[tuple[tuple[str, str], tuple[str, str], int, FieldPath]]:
        raw = topo.get("links")
        if raw is None:
            return []
        if not isinstance(raw, list):
            raise self.err(("topology", "links"), "must be a list of links (- endpoints: [\"a:eth1\", \"b:eth1\"])")
        used: dict[tuple[str, str], FieldPath] = {}
        out = []
        for i, lk in enumerate(raw):
            at: FieldPath = ("topology", "links", i)
            if not isinstance(lk, dict):
                raise self.err(at, "a link is a mapping: - endpoints: [\"a:eth1\", \"b:eth1\"]")
            for key in lk:
                if key not in LINK_FIELDS:
                    raise self.err((*at, key), f"unknown link field; a link has {', '.join(sorted(LINK_FIELDS))}")
            kind = str(lk.get("type") or "brief")
            if kind not in ("brief", "veth"):
                raise self.err((*at, "type"), f"link type {kind!r} is not supported: only links between two nodes of "
                                              "the lab (the endpoints form, or type: veth)")
            for key in ("mtu", "ipv4", "ipv6"):
                if key in lk:
                    raise self.err((*at, key), f"link {key} is not supported; set it in the nodes' FRR "
                                               "configuration or exec commands instead")
            eps = lk.get("endpoints")
            if not isinstance(eps, list) or len(eps) != 2:
                raise self.err((*at, "endpoints"), "a link has exactly two endpoints, e.g. endpoints: [\"r1:eth1\", \"r2:eth1\"]")
            pair = []
            for j, ep in enumerate(eps):
                ep_at: FieldPath = (*at, "endpoints", j)
                if kind == "veth":
                    if not isinstance(ep, dict) or not isinstance(ep.get("node"), str) or not isinstance(ep.get("interface"), str):
                        raise self.err(ep_at, "a veth endpoint is a mapping {node: NAME, interface: IFNAME}")
                    extra = sorted(set(ep) - {"node", "interface", "mac", "vars"})
                    if extra:
                        raise self.err((*ep_at, extra[0]), "not supported on an endpoint; configure addresses in the node")
                    node, iface = ep["node"], ep["interface"]
                else:
                    if not isinstance(ep, str) or not re.fullmatch(r"\S+:\S+", ep):
                        raise self.err(ep_at, f"endpoint {ep!r} is not \"node:interface\" (e.g. \"r1:eth1\")")
                    node, iface = ep.split(":", 1)
                if node not in nodes:
                    if node in SPECIAL_ENDPOINTS or node.startswith(("macvlan", "ovs-")):
                        raise self.err(ep_at, f"links to {SPECIAL_ENDPOINTS.get(node, node)} are not supported: a netns "
                                              "lab never connects to the host; link two nodes of the lab")
                    raise self.err(ep_at, f"unknown node {node!r}; nodes: {', '.join(list(nodes)[:10])}")
                if iface == "lo":
                    raise self.err(ep_at, f"{node}:lo is the loopback; a link needs an interface of its own (eth1 ...)")
                if iface == MGMT_IF:
                    raise self.err(ep_at, f"{node}:eth0 is Containerlab's management interface, not a data link; "
                                          "use eth1 and up")
                if (node, iface) in used:
                    first = used[(node, iface)]
                    raise self.err(ep_at, f"{node}:{iface} is already used by {field_name(first[:3])} (line "
                                          f"{self.src.line(first)}); an interface joins one link")
                used[(node, iface)] = ep_at
                pair.append((node, iface))
            if pair[0][0] == pair[1][0]:
                raise self.err((*at, "endpoints"), f"link connects {pair[0][0]} to itself; join two different nodes")
            metric = export.DEFAULT_METRIC
            lvars = lk.get("vars")
            if isinstance(lvars, dict) and export.METRIC_VAR in lvars:
                m = lvars[export.METRIC_VAR]
                if not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= 16777215:
                    raise self.err((*at, "vars", export.METRIC_VAR), "an IS-IS metric is an integer 1..16777215")
                metric = m
            out.append((pair[0], pair[1], metric, at))
        return out

    # -- nodes ---------------------------------------------------------------------------------

    def _check_levels(self, res: Resolver, n: str) -> None:
        for lv in res.levels(n):
            for key in lv.data:
                at = (*lv.path, key)
                if key in ("links", "endpoints"):
                    raise self.err(at, "links are listed under topology.links (- endpoints: [\"a:eth1\", \"b:eth1\"]), "
                                       "not in a node definition")
                if key in UNSUPPORTED:
                    raise self.err(at, f"'{key}' is not supported on the netns substrate (nodes are namespaces, "
                                       "not containers); remove it")
                if key in IGNORED:
                    where = field_name(at)
                    if where not in self._ignored_seen:
                        self._ignored_seen.add(where)
                        self.notes.append(
                            f"{where} ignored: every node of a netns lab has the lab's limits (ANIBENCH_NODE_LIMITS)"
                            if key in LIMIT_FIELDS else f"{where} ignored: no effect on a netns node")
                elif key not in USED:
                    raise self.err(at, f"unknown node field {key!r} (a typo?); see containerlab.dev/manual/nodes")
                else:
                    self._check_type(key, lv.data[key], at)

    def _check_type(self, key: str, v: Any, at: FieldPath) -> None:
        want = FIELD_TYPES[key]
        if v is None:
            return
        if not isinstance(v, want) or isinstance(v, bool):
            shape = {str: "a string", list: "a list", dict: "a mapping"}[want]
            raise self.err(at, f"{key} must be {shape} (containerlab.dev/manual/nodes/#{key})")
        if want is list:
            for i, item in enumerate(v):
                if not isinstance(item, str) or not item.strip():
                    raise self.err((*at, i), f"each {key} entry is a non-empty string")

    def _str(self, res: Resolver, n: str, key: str) -> tuple[str, FieldPath] | None:
        got = res.value(n, key)
        if got is None:
            return None
        v, at = got
        if not isinstance(v, str):
            raise self.err(at, f"{key} must be a string")
        return v, at

    def _node(self, res: Resolver, n: str, name: str, ifaces: list[str]) -> _Node:
        self._check_levels(res, n)
        k = res.kind(n)
        if k is None:
            raise self.err(("topology", "nodes", n), "no kind: set kind: linux or kind: frr on the node, its group "
                                                    "or in topology.defaults")
        kind_name, kind_at = k
        if kind_name not in KINDS:
            raise self.err(kind_at, f"node {n} has kind {kind_name!r}: only kinds linux and frr can run on the netns "
                                    "substrate (change its kind or remove the node)")
        kind = KINDS[kind_name]
        labels = self._labels(res, n)
        image = self._str(res, n, "image")
        spec = _Node(orig=n, name=name, kind=kind, router=False, image=image[0] if image else "")
        self._apply_labels(spec, labels)
        binds = self._binds(res, n)
        frr_image = "frr" in spec.image.lower().rsplit("/", 1)[-1].split(":")[0]
        if kind == "frr":
            spec.router = True
            if spec.role is Role.HOST:
                raise self.err(kind_at, f"node {n} runs FRR (kind frr) but is labelled a host; drop the label")
        elif spec.role is not None:  # the label decides
            spec.router = spec.role is not Role.HOST
        else:  # kind linux: a router when it runs FRR
            spec.router = bool(binds) or frr_image
        if binds and not spec.router:
            raise self.err(binds[0][2], f"node {n} is labelled a host but binds FRR files; drop the label or the binds")
        self._frr(res, n, spec, binds)
        spec.ifmap = {i: names.map_interface(i) for i in ifaces}
        mapped = [m for o, m in spec.ifmap.items() if o != m]
        if len(set(spec.ifmap.values())) != len(spec.ifmap) or set(mapped) & set(ifaces):
            raise self.err(("topology", "nodes", n), f"interface names of {n} map onto each other ({', '.join(ifaces)}); rename them")
        if mapped:
            self.notes.append(f"{n}: interfaces renamed: " + ", ".join(f"{o} -> {m}" for o, m in spec.ifmap.items() if o != m))
            spec.files = {f: _rename_interfaces(t, spec.ifmap) for f, t in spec.files.items()}
        for item, at in res.merged_list(n, "exec"):
            try:
                shlex.split(item)
            except ValueError as e:
                raise self.err(at, f"cannot split {item!r} into words ({e}); exec runs no shell: balance the quotes") from None
            spec.exec.append((item, self.src.line(at)))
        for key, (v, at) in res.merged_map(n, "sysctls").items():
            k2 = key.replace("/", ".")
            if not k2.startswith("net."):
                raise self.err(at, "only net.* sysctls can be set in a netns node (the rest of /proc/sys is the host's)")
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise self.err(at, "a sysctl value is a string or a number")
            spec.sysctls[k2] = str(v)
        node_def = res.nodes.get(n) or {}
        for key, attr in (("mgmt-ipv4", "mgmt4"), ("mgmt-ipv6", "mgmt6")):
            if key in node_def:
                v = node_def[key]
                try:
                    ipaddress.ip_address(str(v).split("%")[0])
                except ValueError:
                    raise self.err(("topology", "nodes", n, key), f"{v!r} is not an IP address") from None
                setattr(spec, attr, str(v))
        return spec

    def _labels(self, res: Resolver, n: str) -> dict[str, tuple[Any, FieldPath]]:
        labels = res.merged_map(n, "labels")
        for _k, (v, at) in labels.items():
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise self.err(at, "a label value is a string or a number")
        return labels

    def _apply_labels(self, spec: _Node, labels: dict[str, tuple[Any, FieldPath]]) -> None:
        if export.LABEL_ROLE in labels:
            v, at = labels[export.LABEL_ROLE]
            try:
                spec.role = Role(str(v))
            except ValueError:
                raise self.err(at, f"{export.LABEL_ROLE} is P, PE or host (got {v!r})") from None
        spec.labelled = str(labels.get(export.LABEL_EXPORTED, ("", ()))[0]) == "true"
        if export.LABEL_NODE_ID in labels:
            v, at = labels[export.LABEL_NODE_ID]
            try:
                spec.node_id = int(v)
            except (TypeError, ValueError):
                spec.node_id = 0
            if not 1 <= spec.node_id <= MAX_ROUTERS:
                raise self.err(at, f"{export.LABEL_NODE_ID} is a router number 1..{MAX_ROUTERS} (got {v!r})")
        if export.LABEL_MANAGED in labels:
            v, at = labels[export.LABEL_MANAGED]
            if str(v) not in ("true", "false"):
                raise self.err(at, f"{export.LABEL_MANAGED} is true or false (got {v!r})")
            spec.managed = str(v) == "true"

    def _binds(self, res: Resolver, n: str) -> list[tuple[str, Path, FieldPath]]:
        """FRR binds of a node, by destination (the most specific level wins): (file name or '' for
        the directory, source path, field)."""
        by_dst: dict[str, tuple[str, Path, FieldPath]] = {}
        for item, at in res.merged_list(n, "binds"):
            parts = item.split(":")
            if len(parts) == 1:
                raise self.err(at, f"bind {item!r} has no source: write SOURCE:DESTINATION")
            if len(parts) > 3:
                raise self.err(at, f"cannot read bind {item!r}: write SOURCE:DESTINATION[:MODE]")
            src_raw, dst = parts[0], parts[1].rstrip("/") or "/"
            for var in LAB_DIR_VARS:
                if var in src_raw:
                    raise self.err(at, f"{var} names Containerlab's lab directory, which a netns lab does not have; "
                                       "bind a file next to the topology file")
            src_raw = src_raw.replace("__clabNodeName__", n)
            srcp = self._path(src_raw, at)
            if dst == FRR_DIR:
                fname = ""
            elif dst.startswith(FRR_DIR + "/") and "/" not in dst[len(FRR_DIR) + 1:]:
                fname = dst[len(FRR_DIR) + 1:]
                if fname != "daemons" and fname not in FRR_FILE_NAMES:
                    raise self.err(at, f"{dst}: only FRR's own files can be bound into /etc/frr (frr.conf, daemons, "
                                       "vtysh.conf, <daemon>.conf)")
            else:
                raise self.err(at, f"bind to {dst}: only FRR files under /etc/frr are supported (netns nodes share the "
                                   "host's other files read-only); remove it")
            if not srcp.exists():
                raise self.err(at, f"bind source {src_raw} not found (looked for {srcp}); create it or fix the path")
            by_dst[dst] = (fname, srcp, at)
        return list(by_dst.values())

    def _read_text(self, p: Path, at: FieldPath) -> str:
        try:
            return read_regular_file(p).decode()
        except UnicodeDecodeError:
            raise self.err(at, f"{p} is not UTF-8 text") from None
        except ValueError as e:
            raise self.err(at, f"{p} is {e}; bind a regular file of at most {MAX_FILE_BYTES // 1024} KiB") from None
        except OSError as e:
            raise self.err(at, f"cannot read {p}: {e.strerror}") from None

    def _path(self, raw: str, at: FieldPath) -> Path:
        """A path of the file resolved as Containerlab does (``~``, relative to the topology file)."""
        try:
            p = Path(raw).expanduser()
            p = p if p.is_absolute() else self.src.dir / p
            p.exists()  # a NUL byte or the like fails here, not later
        except (RuntimeError, ValueError, OSError) as e:
            raise self.err(at, f"cannot use the path {raw!r}: {e}") from None
        return p

    def _frr(self, res: Resolver, n: str, spec: _Node, binds: list[tuple[str, Path, FieldPath]]) -> None:
        extras = res.value(n, "extras")
        listed: list[str] = []
        listed_at: FieldPath = ("topology", "nodes", n)
        if extras is not None:
            ex, at = extras
            for key in ex:
                if key != "frr":
                    raise self.err((*at, key), f"extras.{key} is not supported; only extras.frr.daemons (kind frr)")
            f = ex.get("frr")
            if f is not None:
                if spec.kind != "frr":
                    raise self.err((*at, "frr"), "extras.frr is read by kind frr only; on kind linux bind a daemons file")
                if not isinstance(f, dict) or set(f) - {"daemons"}:
                    raise self.err((*at, "frr"), "extras.frr has one field, daemons: [ospfd, bgpd, ...]")
                d = f.get("daemons") or []
                listed_at = (*at, "frr", "daemons")
                if not isinstance(d, list) or not all(isinstance(x, str) for x in d):
                    raise self.err(listed_at, "a list of daemon names, e.g. [ospfd, bgpd]")
                listed = d
        sc = self._str(res, n, "startup-config")
        if not spec.router:
            if sc is not None:
                raise self.err(sc[1], "startup-config of a host has no effect; remove it (exec commands configure hosts)")
            return
        files: dict[str, str] = {}
        daemons_text: tuple[str, FieldPath, Path] | None = None
        for fname, p, at in binds:
            if spec.kind == "frr":
                raise self.err(at, "kind frr writes /etc/frr itself: give frr.conf as startup-config and the daemons "
                                   "as extras.frr.daemons instead of binds")
            if fname == "":
                if not p.is_dir():
                    raise self.err(at, f"{p} is bound on /etc/frr but is not a directory")
                skipped = []
                for f in sorted(p.iterdir()):
                    if f.name == "daemons":
                        daemons_text = (self._read_text(f, at), at, f)
                    elif f.name in FRR_FILE_NAMES:
                        files[f.name] = self._read_text(f, at)
                        spec.origins[f.name] = str(f)
                    else:
                        skipped.append(f.name)
                if skipped:  # one note per directory, bounded: a directory may hold thousands of files
                    shown = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
                    self.notes.append(f"{n}: {len(skipped)} file(s) of {p} not read (not FRR's files): {shown}")
                continue
            if p.is_dir():
                raise self.err(at, f"{p} is a directory; bind a file on /etc/frr/{fname}")
            if fname == "daemons":
                daemons_text = (self._read_text(p, at), at, p)
            else:
                files[fname] = self._read_text(p, at)
                spec.origins[fname] = str(p)
        if spec.kind == "frr":
            try:
                spec.daemons, lacking = frrfiles.clab_frr_daemons(listed)
            except ValueError as e:
                raise self.err(listed_at, str(e)) from None
            if lacking:
                self.note(f"kind frr without extras.frr.daemons starts every daemon, but this FRR lacks "
                          f"{', '.join(lacking)} (started the others)", n)
            if sc is None:
                files["frr.conf"] = frrfiles.CLAB_FRR_DEFAULT_CONF
            else:
                files["frr.conf"], spec.origins["frr.conf"] = self._startup_config(n, *sc)
        else:
            if sc is not None:
                raise self.err(sc[1], "kind linux ignores startup-config (Containerlab does not read it for linux "
                                      "nodes): bind the file on /etc/frr/frr.conf, or use kind frr")
            if daemons_text is None:
                spec.daemons = frr_daemons.ordered([])
            else:
                text, at, p = daemons_text
                try:
                    spec.daemons, ignored = frrfiles.parse_daemons_file(text)
                except frrfiles.DaemonsFileError as e:
                    raise ClabError(f"{p}:{e.line}: {e} (bound by {field_name(at)}, {self.src.path}:{self.src.line(at)})") from None
                opts = [v for v in ignored if v.endswith("_options")]
                if opts and not spec.labelled:
                    self.note("the *_options lines of the daemons file are not used (every daemon starts with "
                              "-d -A 127.0.0.1)", n)
            if not any(f != "vtysh.conf" for f in files):
                files["frr.conf"] = ""  # FRR's image has no configuration: the router starts empty
        for fname, text in files.items():
            if "{{" in text and fname == "frr.conf" and spec.kind == "frr" and sc is not None:
                raise self.err(sc[1], "a templated startup-config ({{ ... }}) is not supported; give the rendered file")
        spec.files = files

    def _startup_config(self, n: str, value: str, at: FieldPath) -> tuple[str, str]:
        """The startup-config's text and where it came from."""
        if "\n" in value:  # an embedded configuration (Containerlab: a value with a line break)
            return value, f"{field_name(at)} at {self.src.path}:{self.src.line(at)}"
        if re.match(r"^[a-z][a-z0-9+.-]*://", value):
            raise self.err(at, "a startup-config URL cannot be fetched (no downloads): save the file next to the topology")
        p = self._path(value.replace("__clabNodeName__", n), at)
        if not p.exists():
            raise self.err(at, f"startup-config {value} not found (looked for {p}); create it or fix the path")
        return self._read_text(p, at), str(p)

    # -- topology ------------------------------------------------------------------------------

    def _assemble(self, lab: str, specs: dict[str, _Node], links: list) -> ClabImport:
        hosts = {s.name for s in specs.values() if not s.router}
        by_name = {s.name: s for s in specs.values()}
        link_rows = []
        touches_host: set[str] = set()
        for (a, ai), (b, bi), metric, _at in links:
            sa, sb = specs[a], specs[b]
            link_rows.append({"endpoints": [f"{sa.name}:{sa.ifmap[ai]}", f"{sb.name}:{sb.ifmap[bi]}"], "metric": metric})
            if sb.name in hosts:
                touches_host.add(sa.name)
            if sa.name in hosts:
                touches_host.add(sb.name)
        rows = []
        for s in specs.values():
            role = s.role or (Role.HOST if not s.router else Role.PE if s.name in touches_host else Role.P)
            row: dict[str, Any] = {"name": s.name, "role": role}
            if s.router:
                row["daemons"] = s.daemons
                row["frr_files"] = s.files
                if s.node_id is not None:
                    row["node_id"] = s.node_id
            else:
                row["managed"] = True if s.managed is None else s.managed
            row["exec"] = [c for c, _ in s.exec]
            row["sysctls"] = s.sysctls
            row["source"] = {
                "file": str(self.src.path), "name": s.orig, "kind": s.kind, "image": s.image, "mgmt_ipv4": s.mgmt4,
                "mgmt_ipv6": s.mgmt6, "interfaces": {m: o for o, m in s.ifmap.items() if o != m},
                "exec_lines": [line for _, line in s.exec], "files": s.origins,
            }
            rows.append(row)
        rows = _own_export(rows, by_name, link_rows, lab, self)
        try:
            topo = Topology.build(lab[:64], rows, link_rows)
        except TopologyError as e:
            raise self.err(("topology",), f"{e}") from None
        notes = self.notes + [f"{msg}: {', '.join(nodes)}" for msg, nodes in self._per_node.items()]
        return ClabImport(topology=topo, notes=notes, source=self.src.path)


def _rename_interfaces(text: str, ifmap: dict[str, str]) -> str:
    """``text`` with every whole-word mention of a renamed interface replaced by its new name."""
    for old, new in ifmap.items():
        if old != new:
            text = re.sub(rf"(?<!\S){re.escape(old)}(?!\S)", new, text)
    return text


def _own_export(rows: list[dict[str, Any]], specs: dict[str, _Node], link_rows: list, lab: str, imp: _Importer) -> list[dict[str, Any]]:
    """Recognise what :func:`substrate.export.to_containerlab` wrote for the substrate's own set-up
    on labelled nodes and drop it again (see module docstring)."""
    labelled = {r["name"] for r in rows if specs[r["name"]].labelled}
    if not labelled:
        return rows

    def build(rs: list[dict[str, Any]]) -> Topology:
        try:
            return Topology.build(lab[:64], rs, link_rows)
        except TopologyError as e:
            raise imp.err(("topology",), f"{e}") from None

    def strip_prefix(cmds: list[str], prefix: list[str]) -> list[str] | None:
        return cmds[len(prefix):] if cmds[: len(prefix)] == prefix else None

    def strip_sysctls(r: dict[str, Any], topo: Topology) -> None:
        dflt = {k: str(v) for k, v in export.default_sysctls(topo, r["name"]).items()}
        r["sysctls"] = {k: v for k, v in r["sysctls"].items() if dflt.get(k) != v}

    # hosts first: whether a host is a base host changes its router's rendered configuration
    rows = [dict(r) for r in rows]
    for r in rows:
        if r["name"] in labelled and r["role"] is Role.HOST and specs[r["name"]].managed is None:
            r["managed"] = False
    topo = build(rows)
    for r in rows:
        if r["name"] in labelled and r["role"] is Role.HOST:
            rest = strip_prefix(r["exec"], export.default_exec(topo, r["name"])) if not r["managed"] else r["exec"]
            if rest is None:
                r["managed"] = True  # its addresses are its own exec commands
            else:
                r["exec"] = rest
            strip_sysctls(r, topo)
    topo = build(rows)
    for r in rows:
        if r["name"] not in labelled or r["role"] is Role.HOST:
            continue
        files = dict(r["frr_files"])
        if r["role"] is Role.EXTERNAL:  # another AS's router: its frr.conf is its own (no underlay to recognise)
            if files.get("vtysh.conf") == frr.VTYSH_CONF:
                files.pop("vtysh.conf")
                r["frr_files"] = files
            continue
        if files.get("frr.conf") == frr.render_router(topo, r["name"]) and set(files) <= {"frr.conf", "vtysh.conf"}:
            files.pop("frr.conf")
            if files.get("vtysh.conf") == frr.VTYSH_CONF:
                files.pop("vtysh.conf")
            r["frr_files"] = files
            if r["daemons"] == frr_daemons.BASE_DAEMONS:
                r["daemons"] = None
    topo = build(rows)
    for r in rows:
        if r["name"] in labelled and r["role"] is not Role.HOST:
            rest = strip_prefix(r["exec"], export.default_exec(topo, r["name"]))
            if rest is not None:
                r["exec"] = rest
            strip_sysctls(r, topo)
    return rows
