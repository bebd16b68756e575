"""A router's configuration as YANG instance data, and commits of a candidate to the device.

Reading (:func:`running`): the kernel state comes from :func:`substrate.devstate.capture` (routes,
rules, nftables, the SRv6 source), translated into ``anibench-kernel``; FRR's state comes from
the daemons themselves, over their vty sockets while the kernel is captured: isisd and staticd
answer ``show configuration running xml`` in frr-isisd / frr-staticd terms (FRR's own
northbound), and the interface lines zebra keeps in its CLI form (description, addresses,
shutdown) are read from its running configuration. Every read goes to the device, so a change
made out-of-band (a shell, another writer) shows up; only the conversion to canonical YANG data
is reused when the device reads the same as last time.

Writing (:func:`commit`): the change is the difference between the candidate and the running
data it was edited from (``base``); it is applied to what the device has *now* (a three-way
merge, so out-of-band changes elsewhere survive), reading only the parts of the device the
change touches. FRR lines go through one ``vtysh`` session; the kernel part through
:func:`substrate.devstate.restore` against a target state, which changes only what differs. The
commit is atomic per device: when anything fails -- FRR refuses a line, a kernel change fails,
or the device does not show the requested change afterwards -- FRR and the kernel parts read
before the commit are restored and the error says why.
"""

from __future__ import annotations

import ipaddress
import re
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from substrate.devstate import (
    DeviceState,
    canonical_frr,
    capture,
    normalize_frr,
    normalize_nft,
    restore,
    restore_frr,
)
from substrate.netconf import data
from substrate.netconf.data import Flat, RpcError
from substrate.netconf.schema import SchemaError

if TYPE_CHECKING:
    from substrate.lab import Lab

K = "/anibench-kernel:kernel"
IF = "/frr-interface:lib/interface"
ISIS = "/frr-isisd:isis/instance"
STATIC = "/frr-routing:routing/control-plane-protocols/control-plane-protocol"
MAIN = 254
_TABLE_NAMES = {"main": 254, "default": 253, "local": 255}
_RULE_TABLE = {254: "main", 253: "default", 255: "local"}
_KEY_RE = re.compile(r"\[([a-z0-9-]+)=(?:'([^']*)'|\"([^\"]*)\")\]")


def q(v: object) -> str:
    """A value quoted for a path predicate."""
    s = str(v)
    return f'"{s}"' if "'" in s else f"'{s}'"


def keys(step: str) -> dict[str, str]:
    """The key values of one path step (``route[destination='x'][metric='1']``)."""
    return {m.group(1): m.group(2) if m.group(2) is not None else m.group(3) for m in _KEY_RE.finditer(step)}


#: One step of a data path: names and bracketed predicates, whose quoted values may hold ``/``,
#: ``[`` and ``]``.
_STEP_RE = re.compile(r"""(?:[^/\['"]|\[(?:'[^']*'|"[^"]*"|[^\]'"])*\])+""")


def split_path(path: str) -> list[str]:
    """A data path's steps, respecting quotes inside predicates
    (``/m:a/b[k='x/y']/c`` -> ``["m:a", "b[k='x/y']", "c"]``)."""
    return _STEP_RE.findall(path)


# -- kernel: routes ---------------------------------------------------------------------------


@dataclass
class Route:
    """One kernel route in the model's terms (see anibench-kernel ``route``)."""

    table: int
    destination: str
    metric: int
    type: str = "unicast"
    protocol: str | None = None
    gateway: str | None = None
    device: str | None = None
    source: str | None = None
    scope: str | None = None
    seg6: dict | None = None
    seg6local: dict | None = None
    other: str | None = None

    @property
    def family(self) -> int:
        return 6 if ":" in self.destination else 4

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.table, self.destination, self.metric)

    def args(self) -> str:
        """Canonical ``ip route add`` arguments (the order of :func:`substrate.devstate.route_args`)."""
        p = [] if self.type == "unicast" else [self.type]
        p.append(self.destination)
        if self.table != MAIN:
            p.append(f"table {self.table}")
        if self.family == 6 or self.metric:
            p.append(f"metric {self.metric}")
        if self.protocol and self.protocol != "boot":
            p.append(f"proto {self.protocol}")
        if self.seg6:
            p.append(f"encap seg6 mode {self.seg6['mode']} segs {','.join(self.seg6['segment'])}")
        if self.seg6local:
            s = self.seg6local
            part = ["encap seg6local action", s["action"]]
            for k in ("table", "nh4", "nh6", "iif", "oif"):
                if s.get(k):
                    part += [k, str(s[k])]
            if s.get("flavor"):
                part += ["flavors", ",".join(s["flavor"])]
                if s.get("locator-block-length"):
                    part += ["lblen", str(s["locator-block-length"])]
                if s.get("node-function-length"):
                    part += ["nflen", str(s["node-function-length"])]
            if s.get("count") is not None:
                part.append("count")
            p.append(" ".join(part))
        if self.other:
            p.append(self.other)
        else:
            if self.gateway:
                p.append(f"via {self.gateway}")
            if self.device:
                p.append(f"dev {self.device}")
        if self.source:
            p.append(f"src {self.source}")
        if self.scope:
            p.append(f"scope {self.scope}")
        return " ".join(p)

    def flat(self) -> Flat:
        base = f"{K}/table[id={q(self.table)}]/route[destination={q(self.destination)}][metric={q(self.metric)}]"
        out: Flat = {f"{K}/table[id={q(self.table)}]": "", base: ""}
        for k in ("type", "protocol", "gateway", "device", "source", "scope", "other"):
            v = getattr(self, k)
            if v is not None and not (k == "type" and v == "unicast"):
                out[f"{base}/{k}"] = str(v)
        if self.seg6:
            out[f"{base}/seg6/mode"] = self.seg6["mode"]
            for s in self.seg6["segment"]:
                out[f"{base}/seg6/segment[.={q(s)}]"] = s
        if self.seg6local:
            for k, v in self.seg6local.items():
                if k == "flavor":
                    for f in v:
                        out[f"{base}/seg6local/flavor[.={q(f)}]"] = f
                elif v is not None:
                    out[f"{base}/seg6local/{k}"] = str(v)
        return out


_SEG6LOCAL_PARAMS = {"table", "vrftable", "nh4", "nh6", "iif", "oif", "flavors", "lblen", "nflen"}


def parse_route(args: str, table: int = MAIN) -> Route:
    """A canonical route string (devstate) as a :class:`Route`; attributes the model does not
    break out go to ``other``."""
    t = args.split()
    i = 0
    r = Route(table=table, destination="", metric=0)
    if t[0] in ("unicast", "unreachable", "blackhole", "prohibit", "throw"):
        r.type, i = t[0], 1
    r.destination = t[i]
    i += 1
    r.metric = 1024 if ":" in r.destination else 0
    while i < len(t):
        w = t[i]
        if w == "table" and i + 1 < len(t):
            r.table = _TABLE_NAMES.get(t[i + 1]) or int(t[i + 1])
            i += 2
        elif w == "metric":
            r.metric = int(t[i + 1])
            i += 2
        elif w == "proto":
            r.protocol = t[i + 1]
            i += 2
        elif w == "encap" and t[i + 1] == "seg6":
            r.seg6 = {"mode": t[i + 3], "segment": t[i + 5].split(",")}
            i += 6
        elif w == "encap" and t[i + 1] == "seg6local":
            s: dict = {"action": t[i + 3]}
            i += 4
            while i < len(t) and (t[i] in _SEG6LOCAL_PARAMS or t[i] == "count"):
                if t[i] == "count":
                    s["count"] = ""
                    i += 1
                    continue
                k, v = t[i], t[i + 1]
                if k == "flavors":
                    s["flavor"] = v.split(",")
                elif k == "lblen":
                    s["locator-block-length"] = int(v)
                elif k == "nflen":
                    s["node-function-length"] = int(v)
                elif k == "vrftable":
                    raise ValueError("vrftable")
                else:
                    s[k] = v
                i += 2
            r.seg6local = s
        elif w == "via" and i + 1 < len(t) and t[i + 1] not in ("inet", "inet6"):
            r.gateway = t[i + 1]
            i += 2
        elif w == "dev" and r.other is None:
            r.device = t[i + 1]
            i += 2
        elif w == "src":
            r.source = t[i + 1]
            i += 2
        elif w == "scope":
            r.scope = t[i + 1]
            i += 2
        else:  # several next hops, `via inet ...`: kept verbatim up to src/scope
            rest = []
            while i < len(t) and t[i] not in ("src", "scope"):
                rest.append(t[i])
                i += 1
            r.other = " ".join(rest)
            r.gateway = r.device = None
    return r


def routes_from_flat(flat: Flat) -> dict[tuple[int, str, int], Route]:
    """Every route of the kernel part of ``flat``."""
    out: dict[tuple[int, str, int], Route] = {}
    for path, value in flat.items():
        if not path.startswith(f"{K}/table["):
            continue
        steps = split_path(path)
        if len(steps) < 3 or not steps[2].startswith("route["):
            continue
        tid = int(keys(steps[1])["id"])
        kv = keys(steps[2])
        key = (tid, kv["destination"], int(kv["metric"]))
        r = out.get(key)
        if r is None:
            r = out[key] = Route(table=tid, destination=kv["destination"], metric=int(kv["metric"]))
        rest = steps[3:]
        if not rest:
            continue
        leaf = rest[0]
        if leaf == "seg6":
            r.seg6 = r.seg6 or {"mode": "", "segment": []}
            if rest[1] == "mode":
                r.seg6["mode"] = value
            else:
                r.seg6["segment"].append(value)
        elif leaf == "seg6local":
            r.seg6local = r.seg6local or {}
            name = rest[1].split("[", 1)[0]
            if name == "flavor":
                r.seg6local.setdefault("flavor", []).append(value)
            else:
                r.seg6local[name] = value
        elif leaf in ("type", "protocol", "gateway", "device", "source", "scope", "other"):
            setattr(r, leaf, value)
    return out


# -- kernel: rules ------------------------------------------------------------------------------


@dataclass
class Rule:
    """One policy-routing rule in the model's terms."""

    family: int
    priority: int
    src: str = "all"
    dst: str = "all"
    iif: str = "all"
    fwmark: str = "all"
    oif: str | None = None
    invert: bool = False
    action: str = "lookup"
    table: str | None = None
    other: str | None = None

    @property
    def key(self) -> tuple:
        return (self.family, self.priority, self.src, self.dst, self.iif, self.fwmark)

    def args(self) -> str:
        """Canonical ``rule add`` arguments (the order of :func:`substrate.devstate.rule_args`)."""
        p = [f"priority {self.priority}"]
        if self.invert:
            p.append("not")
        if self.src != "all":
            p.append(f"from {self.src}")
        if self.dst != "all":
            p.append(f"to {self.dst}")
        if self.iif != "all":
            p.append(f"iif {self.iif}")
        if self.oif:
            p.append(f"oif {self.oif}")
        if self.other:
            p.append(self.other)
        if self.fwmark != "all":
            p.append(f"fwmark {self.fwmark}")
        p.append(self.action if self.action != "lookup" else f"lookup {self.table}")
        return " ".join(p)

    def flat(self) -> Flat:
        fam = f"ipv{self.family}"
        base = (f"{K}/rule[family={q(fam)}][priority={q(self.priority)}][from={q(self.src)}][to={q(self.dst)}]"
                f"[iif={q(self.iif)}][fwmark={q(self.fwmark)}]")
        out: Flat = {base: ""}
        if self.oif:
            out[f"{base}/oif"] = self.oif
        if self.invert:
            out[f"{base}/not"] = ""
        if self.action != "lookup":
            out[f"{base}/action"] = self.action
        if self.table is not None and self.action == "lookup":
            out[f"{base}/table"] = self.table
        if self.other:
            out[f"{base}/other"] = self.other
        return out


def parse_rule(args: str, family: int) -> Rule:
    """A canonical rule string (devstate) as a :class:`Rule`."""
    t = args.split()
    r = Rule(family=family, priority=int(t[1]))
    i, other = 2, []
    while i < len(t):
        w = t[i]
        if w == "not":
            r.invert, i = True, i + 1
        elif w in ("from", "to", "iif", "oif", "fwmark", "lookup") and i + 1 < len(t):
            v = t[i + 1]
            if w == "from":
                r.src = v
            elif w == "to":
                r.dst = v
            elif w == "iif":
                r.iif = v
            elif w == "oif":
                r.oif = v
            elif w == "fwmark":
                r.fwmark = v
            else:
                r.table = v
            i += 2
        elif w in ("blackhole", "unreachable", "prohibit"):
            r.action, i = w, i + 1
        else:
            other += t[i:i + 2]
            i += 2
    r.other = " ".join(other) or None
    return r


def rules_from_flat(flat: Flat) -> dict[tuple, Rule]:
    out: dict[tuple, Rule] = {}
    for path, value in flat.items():
        if not path.startswith(f"{K}/rule["):
            continue
        steps = split_path(path)
        kv = keys(steps[1])
        key = (int(kv["family"][-1]), int(kv["priority"]), kv["from"], kv["to"], kv["iif"], kv["fwmark"])
        r = out.get(key)
        if r is None:
            r = out[key] = Rule(family=key[0], priority=key[1], src=key[2], dst=key[3], iif=key[4], fwmark=key[5])
        if len(steps) > 2:
            leaf = steps[2]
            if leaf == "not":
                r.invert = True
            elif leaf == "oif":
                r.oif = value
            elif leaf == "action":
                r.action = value
            elif leaf == "table":
                r.table = value
            elif leaf == "other":
                r.other = value
    return out


# -- kernel: nftables ---------------------------------------------------------------------------

_BASE_CHAIN = re.compile(
    r"type (\w+) hook (\w+)(?: device \"?([^\s\";]+)\"?)? priority ([\w+-]+); (?:policy (\w+);)?")


def parse_nft(text: str) -> dict[tuple[str, str], dict]:
    """``nft list ruleset`` text as {(family, name): {"chains": [...], "other": [...]}} with
    counter values removed."""
    out: dict[tuple[str, str], dict] = {}
    lines = normalize_nft(text).splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"table (\w+) (\S+) \{$", lines[i].strip())
        if not m:
            i += 1
            continue
        tbl: dict = {"chains": [], "other": []}
        out[(m.group(1), m.group(2))] = tbl
        i += 1
        while i < len(lines) and lines[i].strip() != "}":
            s = lines[i].strip()
            cm = re.match(r"chain (\S+) \{$", s)
            if cm:
                chain: dict = {"name": cm.group(1), "rules": []}
                i += 1
                while i < len(lines) and lines[i].strip() != "}":
                    body = lines[i].strip()
                    bm = _BASE_CHAIN.fullmatch(body)
                    if bm and "type" not in chain:
                        chain.update(type=bm.group(1), hook=bm.group(2), device=bm.group(3), priority=bm.group(4),
                                     policy=bm.group(5) or "accept")
                    elif body:
                        chain["rules"].append(body)
                    i += 1
                tbl["chains"].append(chain)
            elif s.endswith("{"):
                block = [s]
                depth = 1
                i += 1
                while i < len(lines) and depth:
                    b = lines[i].strip()
                    depth += b.count("{") - b.count("}")
                    block.append(b)
                    i += 1
                tbl["other"].append("\n".join(block))
                continue
            i += 1
        i += 1
    return out


def nft_flat(tables: dict[tuple[str, str], dict]) -> Flat:
    out: Flat = {}
    for (fam, name), t in tables.items():
        base = f"{K}/nftables/table[family={q(fam)}][name={q(name)}]"
        out[base] = ""
        for c in t["chains"]:
            cb = f"{base}/chain[name={q(c['name'])}]"
            out[cb] = ""
            if c.get("type"):
                out[f"{cb}/type"] = c["type"]
                out[f"{cb}/hook"] = c["hook"]
                if c.get("device"):
                    out[f"{cb}/device"] = c["device"]
                out[f"{cb}/priority"] = c["priority"]
                out[f"{cb}/policy"] = c.get("policy") or "accept"
            for r in c["rules"]:
                out[f"{cb}/rule[.={q(r)}]"] = r
        for o in t["other"]:
            out[f"{base}/other[.={q(o)}]"] = o
    return out


def nft_from_flat(flat: Flat) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    for path, value in flat.items():
        if not path.startswith(f"{K}/nftables/table["):
            continue
        steps = split_path(path)
        kv = keys(steps[2])
        t = out.setdefault((kv["family"], kv["name"]), {"chains": [], "other": []})
        if len(steps) == 3:
            continue
        if steps[3].startswith("other["):
            t["other"].append(value)
            continue
        cname = keys(steps[3])["name"]
        chain = next((c for c in t["chains"] if c["name"] == cname), None)
        if chain is None:
            chain = {"name": cname, "rules": []}
            t["chains"].append(chain)
        if len(steps) > 4:
            leaf = steps[4].split("[", 1)[0]
            if leaf == "rule":
                chain["rules"].append(value)
            else:
                chain[leaf] = value
    return out


def render_nft_table(fam: str, name: str, t: dict) -> str:
    """One table in ``nft -f`` syntax."""
    lines = [f"table {fam} {name} {{"]
    for c in t["chains"]:
        lines.append(f"\tchain {c['name']} {{")
        if c.get("type"):
            dev = f' device "{c["device"]}"' if c.get("device") else ""
            lines.append(f"\t\ttype {c['type']} hook {c['hook']}{dev} priority {c['priority']}; "
                         f"policy {c.get('policy') or 'accept'};")
        lines += [f"\t\t{r}" for r in c["rules"]]
        lines.append("\t}")
    for o in t["other"]:
        lines += ["\t" + x for x in o.splitlines()]
    lines.append("}")
    return "\n".join(lines)


# -- reading ------------------------------------------------------------------------------------


def kernel_flat(state: DeviceState) -> Flat:
    """The kernel part of a device state as ``anibench-kernel`` data."""
    out: Flat = {}
    if state.tunsrc:
        out[f"{K}/srv6-encapsulation-source"] = state.tunsrc
    for fam in (4, 6):
        for args in getattr(state, f"routes{fam}"):
            try:
                out.update(parse_route(args).flat())
            except (ValueError, IndexError):
                continue  # a form the model cannot hold (vrftable: no VRFs on this kernel)
    for fam in (4, 6):
        for args in getattr(state, f"rules{fam}"):
            out.update(parse_rule(args, fam).flat())
    out.update(nft_flat(parse_nft(state.nft)))
    return out


#: FRR daemons that answer in YANG terms (``show configuration running xml``).
NORTHBOUND = ("isisd", "staticd")
#: Threads that read FRR's daemons while the kernel state is captured (see :func:`read`).
_READERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="netconf-read")


def read_frr(lab: Lab, node: str, *, timeout_s: float = 5.0) -> tuple[dict[str, str], dict[str, str]]:
    """Each FRR daemon's own running configuration (CLI text, as
    :meth:`substrate.lab.Lab.frr_daemon_configs`) and, for :data:`NORTHBOUND` daemons, their
    configuration as YANG data (XML): one vty session per daemon. A daemon that does not answer
    is left out of both."""
    from substrate.vty import VtyError

    confs: dict[str, str] = {}
    xmls: dict[str, str] = {}
    for d in lab.state(node).daemons:
        cmds = ["show running-config"] + (["show configuration running xml"] if d in NORTHBOUND else [])
        try:
            got = lab.vty(node, d, *cmds, timeout_s=timeout_s)
        except VtyError:
            continue
        if got[0][1] == 0:
            confs[d] = got[0][0]
        if len(got) > 1 and got[1][1] == 0:
            xmls[d] = got[1][0]
    return confs, xmls


#: The sections of :func:`substrate.devstate.capture`'s script that hold each part a partial read
#: asks for: one ``ip -batch`` prints the routes, rules, addresses, links and neighbours of both
#: families and the SRv6 source (IPv6 rules are a section of their own).
_PART_SECTIONS = {"ip6": ("ip", "rule6"), "ip4": ("ip", "rule6"), "tunsrc": ("ip",), "nft": ("nft",)}
#: Stand-ins for the sections a partial read leaves out: as many empty JSON documents as the
#: section prints (:data:`substrate.devstate._IP_DOCS` for ``ip``), nothing for the others.
_EMPTY_SECTION = {"ip": "[] [] [] [] [] [] []", "rule6": "[]", "tc": "[]"}


def capture_parts(lab: Lab, node: str, parts: Iterable[str]) -> DeviceState:
    """The kernel state of ``node`` with only the sections holding ``parts`` read (``ip6``:
    IPv6 routes of every table, rules, addresses, links, neighbours; ``ip4``: the same for IPv4;
    ``nft``; ``tunsrc``: the SRv6 encapsulation source); the other sections are empty in the
    result (per-interface sysctls and netlink settings too). It is
    :func:`substrate.devstate.capture`'s own script and parser with the sections left out
    replaced by empty stand-ins: fewer processes in the node, the same canonical items. Both
    address families come in one ``ip`` process, so a part of one family reads the other too.

    Raises:
        NodeNotFoundError, SnapshotError.
    """
    from substrate.devstate import (
        _CAPTURE_SCRIPT,
        _SEP,
        SnapshotError,
        host_sections,
        parse_capture,
    )

    want = {sec for p in parts for sec in _PART_SECTIONS.get(p, (p,))}
    lines, stand_ins = [], []
    for line in _CAPTURE_SCRIPT.strip().splitlines():
        head = line.split(";", 1)[0].split()
        if len(head) == 2 and head[0] == "s" and head[1] not in want:
            stand_ins.append(f"{_SEP}{head[1]}\n{_EMPTY_SECTION.get(head[1], '')}\n")
        else:
            lines.append(line)
    text = ""
    if len(lines) > 1:  # more than the section-marker function: something to read in the node
        r = lab.sh(node, "\n".join(lines) + "\n", timeout_s=20)
        if r.timed_out:
            raise SnapshotError(f"{node}: state capture timed out (node frozen?)")
        text = r.stdout
    return parse_capture(node, text + "".join(stand_ins) + host_sections(lab, node, nft="nft" in want) + f"{_SEP}sysctl\n", with_frr=False)


def read(lab: Lab, node: str, *, frr: bool = True,
         parts: Iterable[str] | None = None) -> tuple[DeviceState, dict[str, str]]:
    """The device's state now: the kernel part (:func:`substrate.devstate.capture`, one command
    in the node; only the sections ``parts`` when given: :func:`capture_parts`) and, for a
    router when ``frr``, its FRR daemons (:func:`read_frr`, over their vty sockets, at the same
    time in another thread). The state carries ``frr_daemons`` as a ``capture(frr="fast")``
    would; the second item is the northbound XML per daemon.

    Raises:
        NodeNotFoundError, SnapshotError: the device could not be read.
    """
    from substrate.topology import Role

    fut = _READERS.submit(read_frr, lab, node) if frr and lab.state(node).role is not Role.HOST else None
    try:
        if parts is None:
            state = capture(lab, node, frr=False)
        elif parts:
            state = capture_parts(lab, node, parts)
        else:
            state = DeviceState(node=node)
    finally:
        got = fut.result() if fut is not None else None
    xmls: dict[str, str] = {}
    if got is not None:
        state.frr_daemons, xmls = got
    return state, xmls


#: Namespaces of FRR's library-level policy configuration (prefix-lists, access-lists,
#: route-maps), which every daemon's northbound XML carries once bgpd's policy exists; A2 serves
#: no model of them, and one unknown element made libyang's strict parse drop the daemon's
#: whole data (IS-IS vanished from a border PE's running datastore).
POLICY_NAMESPACES = ("http://frrouting.org/yang/filter", "http://frrouting.org/yang/route-map")


def _without_policy(xml: str) -> str:
    """``xml`` (top-level elements, as a daemon answers) without the elements in
    :data:`POLICY_NAMESPACES`."""
    if not any(ns in xml for ns in POLICY_NAMESPACES):
        return xml
    root = data.parse_xml(f"<top>{xml}</top>")
    from lxml import etree

    keep = [el for el in root if etree.QName(el).namespace not in POLICY_NAMESPACES]
    return "".join(etree.tostring(el, encoding="unicode") for el in keep)


def frr_flat(state: DeviceState, northbound: dict[str, str]) -> Flat:
    """FRR's part: interfaces (description, addresses, shutdown) from the daemons' CLI
    configuration (``state.frr_daemons``); IS-IS and static routes from isisd's and staticd's
    own YANG data (``northbound``: daemon -> XML, see :func:`read_frr`)."""
    out: Flat = {}
    daemons = state.frr_daemons or {}
    for head, body in canonical_frr(daemons) if daemons else []:
        w = head.split()
        if len(w) != 2 or w[0] != "interface":
            continue
        base = f"{IF}[name={q(w[1])}]"
        entry: Flat = {}
        for line in body:
            lw = line.split()
            if lw[0] == "description":
                entry[f"{base}/description"] = line.split(None, 1)[1] if len(lw) > 1 else ""
            elif lw[0] in ("ip", "ipv6") and len(lw) == 3 and lw[1] == "address":
                try:
                    ifc = ipaddress.ip_interface(lw[2])
                except ValueError:
                    continue
                a = f"{base}/anibench-kernel:address[ip={q(ifc.ip)}]"
                entry[a] = ""
                entry[f"{a}/prefix-length"] = str(ifc.network.prefixlen)
            elif lw == ["shutdown"]:
                entry[f"{base}/frr-zebra:zebra/shutdown"] = "true"
        out[base] = ""
        out.update(entry)
    for daemon in NORTHBOUND:
        if daemon not in daemons or daemon not in northbound:
            continue
        try:
            got = data.to_flat(_without_policy(northbound[daemon]))
        except SchemaError:
            continue
        for k, v in got.items():
            if k.endswith("/description") and k in out:
                continue
            out.setdefault(k, v)
    return out


#: The last canonical conversion per device: (lab, node) -> (the raw data it came from, result).
_CANONICAL: dict[tuple[str, str], tuple[tuple[tuple[str, str], ...], Flat]] = {}
_CANONICAL_LOCK = threading.Lock()


def canonical(lab: Lab, node: str, raw: Flat) -> Flat:
    """``raw`` (paths and values as read from the device) through libyang: every path and value
    in its canonical form, as edits produce them. The last result per device is kept: a device
    read again unchanged (the usual case between an edit-config and its commit, or between two
    reads) is not converted again.

    Raises:
        SchemaError: the data does not fit the schema.
    """
    key = tuple(raw.items())
    with _CANONICAL_LOCK:
        hit = _CANONICAL.get((lab.name, node))
    if hit is not None and hit[0] == key:
        return dict(hit[1])
    flat = data.to_flat(data.to_xml(_ordered(raw)))
    with _CANONICAL_LOCK:
        _CANONICAL[(lab.name, node)] = (key, flat)
    return dict(flat)


def running(lab: Lab, node: str) -> tuple[Flat, DeviceState]:
    """The device's configuration now, as flat data, with the device state it was read from
    (kernel and FRR daemons: :func:`read`).

    Raises:
        NodeNotFoundError, SnapshotError: the device could not be read.
    """
    st, xmls = read(lab, node)
    raw = frr_flat(st, xmls)
    raw.update(kernel_flat(st))
    return canonical(lab, node, raw), st


def _ordered(flat: Flat) -> Flat:
    """Top-level modules in a fixed order (interfaces, IS-IS, static, kernel)."""
    order = ("/frr-interface:", "/frr-isisd:", "/frr-routing:", "/anibench-kernel:")
    return dict(sorted(flat.items(), key=lambda kv: next((i for i, o in enumerate(order) if kv[0].startswith(o)), 9)))


def operational(lab: Lab, node: str) -> str:
    """FRR's operational data (interface and IS-IS adjacency state) as XML, from zebra and isisd
    (``show yang operational-data``); empty when the daemons do not answer."""
    parts = []
    for daemon in ("zebra", "isisd"):
        try:
            parts.append(lab.vty(node, daemon, "show yang operational-data /frr-interface:lib format xml",
                                 timeout_s=5)[0][0])
        except Exception:  # noqa: BLE001
            continue
    return "\n".join(parts)


# -- writing: FRR ---------------------------------------------------------------------------------

_LEVELS = ("level-1", "level-2")


def _group(flat: Flat, prefix: str) -> dict[str, Flat]:
    """Entries of list ``prefix`` grouped by entry (entry path -> {relative path: value})."""
    out: dict[str, Flat] = {}
    for k, v in flat.items():
        if not k.startswith(prefix + "["):
            continue
        steps = split_path("x" + k[len(prefix):])
        entry = prefix + steps[0][1:]
        out.setdefault(entry, {})["/".join(steps[1:])] = v
    return out


#: Interface IS-IS commands whose FRR 8.4 form puts the level before the value
#: (``isis metric level-1 50``; ``isis metric 50 level-1`` is an unknown command), checked on
#: this substrate's isisd; the others take the value first (``isis priority 64 level-1``).
_LEVEL_FIRST = ("isis hello-interval", "isis hello-multiplier", "isis metric")


def _level_cli(word: str, rel: str, value: str | None) -> str:
    lvl = rel.rsplit("/", 1)[-1]
    if value is None:
        return f"no {word} {lvl}"
    return f"{word} {lvl} {value}" if word in _LEVEL_FIRST else f"{word} {value} {lvl}"


def _isis_if_cli(rel: str, old: str | None, new: str | None, tag: str) -> str:
    """One interface IS-IS leaf change as FRR CLI.

    Raises:
        RpcError: operation-not-supported for leaves this device cannot set from NETCONF.
    """
    r = rel.removeprefix("frr-isisd:isis/")
    if r in ("ipv6-routing", "ipv4-routing"):
        fam = "ipv6" if r.startswith("ipv6") else "ip"
        return f"{fam} router isis {tag}" if new == "true" else f"no {fam} router isis {tag}"
    if r == "area-tag":
        return ""
    if r == "passive":
        return "isis passive" if new == "true" else "no isis passive"
    if r == "network-type":
        return "isis network point-to-point" if new == "point-to-point" else "no isis network point-to-point"
    if r == "circuit-type":
        v = {"level-2": "level-2-only"}.get(new or "", new)
        return f"isis circuit-type {v}" if new else "no isis circuit-type"
    for prefix, word in (("hello/interval/", "isis hello-interval"), ("hello/multiplier/", "isis hello-multiplier"),
                         ("metric/", "isis metric"), ("priority/", "isis priority"),
                         ("csnp-interval/", "isis csnp-interval"), ("psnp-interval/", "isis psnp-interval")):
        if r.startswith(prefix) and r.rsplit("/", 1)[-1] in _LEVELS:
            return _level_cli(word, r, new)
    raise RpcError("operation-not-supported", f"IS-IS interface leaf {r} cannot be changed through NETCONF on this "
                   "device (supported: ipv4-routing, ipv6-routing, passive, network-type, circuit-type, hello, "
                   "metric, priority, csnp/psnp-interval)")


def _isis_instance_cli(rel: str, old: str | None, new: str | None) -> str:
    r = rel
    if r.startswith("area-address["):
        v = new if new is not None else old
        return f"net {v}" if new is not None else f"no net {v}"
    if r == "is-type":
        v = {"level-2": "level-2-only"}.get(new or "", new)
        return f"is-type {v}" if new else "no is-type"
    if r == "metric-style":
        return f"metric-style {new}" if new else "no metric-style"
    if r == "dynamic-hostname":
        return "no hostname dynamic" if new == "false" else "hostname dynamic"
    if r == "overload":
        return "set-overload-bit" if new == "true" else "no set-overload-bit"
    if r == "log-adjacency-changes":
        return "log-adjacency-changes" if new == "true" else "no log-adjacency-changes"
    if r == "lsp/mtu":
        return f"lsp-mtu {new}" if new else "no lsp-mtu"
    for prefix, word in (("lsp/timers/level-1/", None), ("lsp/timers/level-2/", None)):
        if r.startswith(prefix):
            lvl = prefix.split("/")[2]
            leaf = r.rsplit("/", 1)[-1]
            cmd = {"generation-interval": "lsp-gen-interval", "refresh-interval": "lsp-refresh-interval",
                   "maximum-lifetime": "max-lsp-lifetime"}.get(leaf)
            if cmd:
                return f"{cmd} {lvl} {new}" if new else f"no {cmd} {lvl}"
    if r.startswith("spf/minimum-interval/"):
        lvl = r.rsplit("/", 1)[-1]
        return f"spf-interval {lvl} {new}" if new else f"no spf-interval {lvl}"
    raise RpcError("operation-not-supported", f"IS-IS instance leaf {r} cannot be changed through NETCONF on this "
                   "device (supported: area-address, is-type, metric-style, dynamic-hostname, overload, "
                   "log-adjacency-changes, lsp mtu and timers, spf minimum-interval)")


def _static_line(entry: str, rel: str) -> str | None:
    """``ip[v6] route ...`` of one static next hop (entry: a route-list path; rel: its nexthop)."""
    rk = keys(split_path(entry)[-1])
    steps = split_path(rel)
    if len(steps) < 3 or not steps[0].startswith("path-list[") or not steps[2].startswith("nexthop["):
        return None
    pk, nk = keys(steps[0]), keys(steps[2])
    fam = "ipv6" if "ipv6" in rk["afi-safi"] else "ip"
    words = [fam, "route", rk["prefix"]]
    if nk["nh-type"] == "blackhole":
        words.append("blackhole")
    else:
        if nk.get("gateway"):
            words.append(nk["gateway"])
        if nk.get("interface"):
            words.append(nk["interface"])
    if pk.get("distance") and pk["distance"] != "1":
        words.append(pk["distance"])
    if pk.get("table-id") and pk["table-id"] != "0":
        words += ["table", pk["table-id"]]
    return " ".join(words)


def frr_lines(old: Flat, new: Flat) -> list[str]:
    """FRR configuration lines (for one vtysh session in configuration mode) turning the FRR part
    of ``old`` into that of ``new``.

    Raises:
        RpcError: operation-not-supported for a change the device cannot make.
    """
    lines: list[str] = []
    oi, ni = _group(old, IF), _group(new, IF)
    for entry in sorted(set(oi) | set(ni)):
        o, n = oi.get(entry, {}), ni.get(entry, {})
        if o == n:
            continue
        name = keys(split_path(entry)[-1])["name"]
        body: list[str] = []
        tag = n.get("frr-isisd:isis/area-tag") or o.get("frr-isisd:isis/area-tag") or ""
        for rel in sorted(set(o) | set(n), key=lambda r: (r.startswith("frr-isisd"), r)):
            ov, nv = o.get(rel), n.get(rel)
            if ov == nv or rel == "":
                continue
            if rel == "description":
                body.append(f"description {nv}" if nv is not None else "no description")
            elif rel.startswith("anibench-kernel:address["):
                if rel.endswith("/prefix-length"):
                    continue
                ip = keys(rel)["ip"]
                fam = "ipv6" if ":" in ip else "ip"
                plen_o, plen_n = o.get(rel + "/prefix-length"), n.get(rel + "/prefix-length")
                if ov is not None and plen_o:
                    body.append(f"no {fam} address {ip}/{plen_o}")
                if nv is not None and plen_n:
                    body.append(f"{fam} address {ip}/{plen_n}")
            elif rel.startswith("anibench-kernel:address"):
                continue
            elif rel == "frr-zebra:zebra/shutdown":
                body.append("shutdown" if nv == "true" else "no shutdown")
            elif rel == "frr-isisd:isis":
                if nv is None:  # the whole IS-IS presence container removed
                    body += [f"no ipv6 router isis {tag}", f"no ip router isis {tag}"]
            elif rel.startswith("frr-isisd:isis/"):
                if "frr-isisd:isis" not in n and nv is None:
                    continue  # removed with the container
                cli = _isis_if_cli(rel, ov, nv, tag)
                if cli:
                    body.append(cli)
            else:
                raise RpcError("operation-not-supported", f"interface {name}: {rel} cannot be changed through NETCONF "
                               "on this device (supported: description, address, frr-zebra shutdown, frr-isisd isis)")
        # an address whose prefix length alone changed
        for rel in sorted(set(o) | set(n)):
            if rel.startswith("anibench-kernel:address[") and rel.endswith("/prefix-length") and rel[:-14] in o \
                    and rel[:-14] in n and o.get(rel) != n.get(rel):
                ip = keys(rel)["ip"]
                fam = "ipv6" if ":" in ip else "ip"
                body += [f"no {fam} address {ip}/{o[rel]}", f"{fam} address {ip}/{n[rel]}"]
        if body:
            lines += [f"interface {name}", *body, "exit"]
    oi, ni = _group(old, ISIS), _group(new, ISIS)
    for entry in sorted(set(oi) | set(ni)):
        o, n = oi.get(entry, {}), ni.get(entry, {})
        tag = keys(split_path(entry)[-1])["area-tag"]
        if not n:
            lines.append(f"no router isis {tag}")
            continue
        body = []
        for rel in sorted(set(o) | set(n)):
            if rel == "" or o.get(rel) == n.get(rel):
                continue
            body.append(_isis_instance_cli(rel, o.get(rel), n.get(rel)))
        if body:
            lines += [f"router isis {tag}", *body, "exit"]
    oi, ni = _group(old, STATIC), _group(new, STATIC)
    for entry in sorted(set(oi) | set(ni)):
        o, n = oi.get(entry, {}), ni.get(entry, {})
        ro, rn = _static_routes(entry, o), _static_routes(entry, n)
        lines += [f"no {x}" for x in sorted(ro - rn)] + sorted(rn - ro)
    return lines


def _static_routes(proto_entry: str, rel: Flat) -> set[str]:
    out = set()
    for k in rel:
        steps = split_path(k)
        if len(steps) >= 5 and steps[0] == "frr-staticd:staticd" and steps[1].startswith("route-list[") \
                and steps[-1].startswith("nexthop[") and steps[-2] == "frr-nexthops":
            line = _static_line(f"{proto_entry}/frr-staticd:staticd/{steps[1]}", "/".join(steps[2:]))
            if line:
                out.add(line)
    return out


# -- writing: the commit ------------------------------------------------------------------------


@dataclass
class CommitReport:
    """What a commit did on one device."""

    node: str
    frr: list[str] = field(default_factory=list)
    kernel: list[str] = field(default_factory=list)
    seconds: float = 0.0


_PRED = r"""\[(?:'[^']*'|"[^"]*"|[^\]'"])*\]"""
#: The kernel item a path belongs to: a route, a rule, an nftables table, the SRv6 source.
_ENTRY_RE = re.compile(rf"{re.escape(K)}/(?:table{_PRED}/route(?:{_PRED})+|rule(?:{_PRED})+|"
                       rf"nftables/table(?:{_PRED})+|srv6-encapsulation-source$)")


def _route_key(args: str) -> tuple[int, str, int] | None:
    try:
        return parse_route(args).key
    except (ValueError, IndexError):
        return None  # a form the model cannot hold: never touched by a commit


@dataclass
class KernelDelta:
    """The kernel part of a change, item by item: what each item the change touches becomes.

    ``routes``: route key (table, destination, metric) -> the ``ip route`` arguments it becomes
    (an empty list: removed); ``rules``: rule key (:attr:`Rule.key`) -> ``ip rule`` arguments
    (several rules may share a key); ``nft``: (family, table name) -> the table (as
    :func:`parse_nft` gives it) or None (removed); ``tunsrc``: the SRv6 encapsulation source it
    becomes (``""``: none), None when untouched.
    """

    routes: dict[tuple[int, str, int], list[str]] = field(default_factory=dict)
    rules: dict[tuple, list[str]] = field(default_factory=dict)
    nft: dict[tuple[str, str], dict | None] = field(default_factory=dict)
    tunsrc: str | None = None

    def __bool__(self) -> bool:
        return bool(self.routes or self.rules or self.nft or self.tunsrc is not None)

    @classmethod
    def between(cls, base: Flat, cand: Flat) -> KernelDelta:
        """The kernel items that differ between two datastore contents, as ``cand`` has them
        (only the entries holding a changed path are parsed)."""
        entries = {m.group(0) for p in _changed(base, cand) if (m := _ENTRY_RE.match(p))}
        base = {k: v for k, v in base.items() if (m := _ENTRY_RE.match(k)) and m.group(0) in entries}
        cand = {k: v for k, v in cand.items() if (m := _ENTRY_RE.match(k)) and m.group(0) in entries}
        rb, rc = routes_from_flat(base), routes_from_flat(cand)
        routes = {k: [rc[k].args()] if k in rc else [] for k in rb.keys() | rc.keys()
                  if k not in rb or k not in rc or rb[k].args() != rc[k].args()}
        ub, uc = rules_from_flat(base), rules_from_flat(cand)
        rules = {k: [uc[k].args()] if k in uc else [] for k in ub.keys() | uc.keys()
                 if k not in ub or k not in uc or ub[k].args() != uc[k].args()}
        nb, nc = nft_from_flat(base), nft_from_flat(cand)
        nft = {k: nc.get(k) for k in nb.keys() | nc.keys() if nb.get(k) != nc.get(k)}
        src = f"{K}/srv6-encapsulation-source"
        return cls(routes=routes, rules=rules, nft=nft,
                   tunsrc=cand.get(src, "") if base.get(src) != cand.get(src) else None)

    def parts(self) -> set[str]:
        """The sections of the kernel state (see :func:`capture_parts`) that hold the touched
        items: ``ip6``/``ip4`` for routes and rules of that family, ``nft``, ``tunsrc``."""
        fams = {6 if ":" in k[1] else 4 for k in self.routes} | {k[0] for k in self.rules}
        out = {f"ip{f}" for f in fams}
        if self.nft:
            out.add("nft")
        if self.tunsrc is not None:
            out.add("tunsrc")
        return out

    def applied_to(self, state: DeviceState) -> DeviceState:
        """``state``'s kernel part with every touched item replaced by what it becomes (the
        rest as in ``state``; FRR fields left out: FRR is committed apart)."""
        t = state.model_copy(deep=True, update={"frr_config": None, "frr_daemons": None})
        for fam in (4, 6):
            kept = [a for a in getattr(t, f"routes{fam}") if _route_key(a) not in self.routes]
            kept += [a for k, v in self.routes.items() if (6 if ":" in k[1] else 4) == fam for a in v]
            setattr(t, f"routes{fam}", sorted(set(kept)))
            rules = [a for a in getattr(t, f"rules{fam}") if parse_rule(a, fam).key not in self.rules]
            rules += [a for k, v in self.rules.items() if k[0] == fam for a in v]
            setattr(t, f"rules{fam}", rules)
        if self.nft:
            tables = parse_nft(t.nft)
            for k, v in self.nft.items():
                if v is None:
                    tables.pop(k, None)
                else:
                    tables[k] = v
            t.nft = "\n".join(render_nft_table(f, n, tb) for (f, n), tb in tables.items())
        if self.tunsrc is not None:
            t.tunsrc = self.tunsrc
        return t

    def touched_in(self, state: DeviceState) -> DeviceState:
        """A state holding only the items of ``state`` this delta touches (for a targeted
        read-back: :func:`kernel_flat` of it is small)."""
        t = DeviceState(node=state.node, taken_at=state.taken_at)
        for fam in (4, 6):
            setattr(t, f"routes{fam}", [a for a in getattr(state, f"routes{fam}") if _route_key(a) in self.routes])
            setattr(t, f"rules{fam}", [a for a in getattr(state, f"rules{fam}")
                                       if parse_rule(a, fam).key in self.rules])
        if self.nft:
            tables = parse_nft(state.nft)
            t.nft = "\n".join(render_nft_table(f, n, tables[(f, n)]) for f, n in self.nft if (f, n) in tables)
        if self.tunsrc is not None:
            t.tunsrc = state.tunsrc
        return t


def _changed(base: Flat, cand: Flat) -> dict[str, str | None]:
    """Entries the change sets (value) or removes (None)."""
    out: dict[str, str | None] = {k: None for k in base if k not in cand}
    out.update({k: v for k, v in cand.items() if base.get(k) != v})
    return out


def _not_shown(change: dict[str, str | None], have: Flat) -> list[str]:
    """Paths of ``change`` that ``have`` does not show as requested."""
    return [p for p, v in change.items() if have.get(p) != v and not (v is None and p not in have)]


def commit(lab: Lab, node: str, base: Flat, cand: Flat) -> CommitReport:
    """Apply the change ``base`` -> ``cand`` to ``node``, atomically.

    ``base`` is the running data the candidate was edited from (read in full at the first
    edit); the change is what differs between it and the candidate. The commit reads only what
    the change touches, at once: the kernel sections holding the touched items
    (:meth:`KernelDelta.parts`: e.g. the IPv6 routes and rules, one ``ip -batch``) and, when
    the change has FRR paths, the FRR daemons. It merges the change into that (``base`` stands
    for the parts it does not touch), validates the result against the models, applies the FRR
    lines (one vtysh session) and the touched kernel items
    (:func:`substrate.devstate.restore` against the target: only what differs is changed),
    reads the same parts back and checks that every requested path shows. On any failure the
    device is put back: FRR by ``frr-reload`` to the configuration it had (read through vtysh
    before applying, only when the change has FRR lines), the kernel sections read at the start
    by a restore to what they held (the inverse of what was applied, plus anything else that
    moved in those sections meanwhile).

    Returns:
        What was changed (FRR lines, kernel actions).

    Raises:
        RpcError: ``invalid-value`` & co. when the merged result breaks the schema (nothing was
            changed); ``operation-not-supported`` for a change the device cannot make (nothing was
            changed); ``operation-failed`` when applying failed or did not take (the device was
            restored to its pre-commit state; the message says so, and why).
    """
    t0 = time.monotonic()
    rep = CommitReport(node=node)
    change = _changed(base, cand)
    if not change:
        return rep
    delta = KernelDelta.between(base, cand)
    parts = delta.parts()
    kernel_change = {p: v for p, v in change.items() if p.startswith(K)}
    frr_change = {p: v for p, v in change.items() if not p.startswith(K)}
    if frr_change:  # FRR moves kernel routes (addresses, interface states): a rollback restores both families
        parts |= {"ip4", "ip6"}
    before, xmls = read(lab, node, frr=bool(frr_change), parts=parts)
    cur = dict(base)
    if frr_change:  # FRR as it is now; the kernel items the change touches are set by the merge
        cur = {k: v for k, v in base.items() if k.startswith(K)}
        cur.update(data.to_flat(data.to_xml(_ordered(frr_flat(before, xmls)))))
    target = data.merge3(base, cand, cur)
    try:
        data.validate(target)
    except SchemaError as e:
        raise data.from_schema_error(e) from None
    rep.frr = frr_lines(cur, target)
    frr_before = None
    if rep.frr:  # what frr-reload returns to if anything fails (vtysh's merged view)
        r = lab.vtysh(node, "show running-config", timeout_s=30)
        if not r.ok or "frr version" not in r.stdout:
            raise RpcError("operation-failed", f"cannot read FRR's configuration before the commit: {r.summary()}; "
                           "nothing was changed")
        frr_before = normalize_frr(r.stdout)
    kernel_before = before.model_copy(update={"frr_config": None, "frr_daemons": None})
    try:
        if rep.frr:
            argv = ["vtysh", "-c", "configure terminal"]
            for ln in rep.frr:
                argv += ["-c", ln]
            r = lab.exec(node, argv, timeout_s=30)
            if not r.ok:
                raise RpcError("operation-failed", "FRR refused the change: " + (r.stdout + r.stderr).strip()[-400:])
        if delta:
            kr = restore(lab, delta.applied_to(before), current=kernel_before, verify=False)
            rep.kernel = kr.actions
            if kr.residual:
                raise RpcError("operation-failed",
                               "the kernel refused part of the change: " + "; ".join(kr.residual)[:400])
        # read back what was touched: the kernel sections when kernel items changed, FRR when lines were sent
        after, xmls = read(lab, node, frr=bool(rep.frr), parts=parts) if delta or rep.frr else (before, xmls)
        frr_now = data.to_flat(data.to_xml(_ordered(frr_flat(after, xmls)))) if rep.frr else cur
        missing = _not_shown(frr_change, frr_now)
        if kernel_change:
            missing += _not_shown(kernel_change, data.to_flat(data.to_xml(kernel_flat(delta.touched_in(after)))))
        if missing:
            raise RpcError("operation-failed", f"the device does not show {len(missing)} requested change(s) after "
                           f"applying them, e.g. {missing[0]}", path=missing[0])
    except BaseException as e:
        residual = _put_back(lab, node, kernel_before, parts, frr_before)
        how = "restored to its pre-commit state" if not residual else (
            "NOT fully restored: " + "; ".join(residual)[:300])
        if isinstance(e, RpcError):
            raise RpcError(e.tag, f"{e.message}; nothing was committed: the device was {how}", path=e.path) from None
        raise
    rep.seconds = time.monotonic() - t0
    return rep


def _put_back(lab: Lab, node: str, kernel_before: DeviceState, parts: set[str], frr_before: str | None) -> list[str]:
    """Undo a commit that failed part-way: FRR to ``frr_before`` (frr-reload; None: FRR was not
    touched), then the kernel sections ``parts`` to ``kernel_before`` (read from them before the
    commit). Returns what could not be put back (empty when exact)."""
    residual = restore_frr(lab, node, frr_before) if frr_before is not None else []
    if parts:
        now = capture_parts(lab, node, parts)
        residual += restore(lab, kernel_before, current=now, verify=False).residual
        after = capture_parts(lab, node, parts)
        if not after.same_as(kernel_before):
            residual += after.diff(kernel_before)
    return residual


def restore_state(lab: Lab, state: DeviceState) -> list[str]:
    """Put ``state`` back on its node (confirmed-commit rollback, cancel-commit). Returns what
    could not be restored (empty when exact)."""
    return restore(lab, state).residual


# -- edit-config payloads (what a NETCONF client sends for a route, a rule, an address) ----------

KERNEL_NS = "urn:anibench:yang:kernel"


def _x(tag: str, text: object) -> str:
    from xml.sax.saxutils import escape

    return f"<{tag}>{escape(str(text))}</{tag}>"


def _op(operation: str | None) -> str:
    return f' xmlns:nc="{data.NC_NS}" nc:operation="{operation}"' if operation else ""


def route_xml(r: Route, operation: str | None = None) -> str:
    """``<table><id/><route>...</route></table>`` for an edit-config inside ``<kernel>``; with an
    ``operation`` (delete/remove) only the keys are sent."""
    body = _x("destination", r.destination) + _x("metric", r.metric)
    if operation not in ("delete", "remove"):  # merge, replace, create: the whole route
        for k in ("type", "protocol", "gateway", "device", "source", "scope", "other"):
            v = getattr(r, k)
            if v is not None and not (k == "type" and v == "unicast"):
                body += _x(k, v)
        if r.seg6:
            body += "<seg6>" + _x("mode", r.seg6["mode"]) + "".join(_x("segment", s) for s in r.seg6["segment"]) + "</seg6>"
        if r.seg6local:
            inner = ""
            for k, v in r.seg6local.items():
                if k == "flavor":
                    inner += "".join(_x("flavor", f) for f in v)
                elif k == "count":
                    inner += "<count/>"
                elif v is not None:
                    inner += _x(k, v)
            body += f"<seg6local>{inner}</seg6local>"
    return f"<table>{_x('id', r.table)}<route{_op(operation)}>{body}</route></table>"


def rule_xml(r: Rule, operation: str | None = None) -> str:
    """``<rule>...</rule>`` for an edit-config inside ``<kernel>``."""
    body = (_x("family", f"ipv{r.family}") + _x("priority", r.priority) + _x("from", r.src) + _x("to", r.dst)
            + _x("iif", r.iif) + _x("fwmark", r.fwmark))
    if operation not in ("delete", "remove"):
        if r.oif:
            body += _x("oif", r.oif)
        if r.invert:
            body += "<not/>"
        if r.action != "lookup":
            body += _x("action", r.action)
        elif r.table is not None:
            body += _x("table", r.table)
        if r.other:
            body += _x("other", r.other)
    return f"<rule{_op(operation)}>{body}</rule>"


def address_xml(ifname: str, address: str, operation: str | None = None) -> str:
    """``<lib><interface>`` with one ``anibench-kernel:address`` (``address``: ``ADDR/LEN``)."""
    ifc = ipaddress.ip_interface(address)
    plen = "" if operation in ("delete", "remove") else _x("prefix-length", ifc.network.prefixlen)
    return (f'<lib xmlns="http://frrouting.org/yang/interface"><interface>{_x("name", ifname)}'
            f'<address xmlns="{KERNEL_NS}"{_op(operation)}>{_x("ip", ifc.ip)}{plen}</address></interface></lib>')
