"""A router's configuration as YANG instance data, and commits of a candidate to the device.

Reading (``running``): the kernel state comes from :func:`substrate.devstate.capture` (routes,
rules, nftables, the SRv6 source), translated into ``anibench-kernel``; FRR's state comes from
the daemons themselves: isisd and staticd answer ``show configuration running xml`` in
frr-isisd / frr-staticd terms (FRR's own northbound), and the interface lines zebra keeps in
its CLI form (description, addresses, shutdown) are read from its running configuration. Every
read goes to the device, so a change made out-of-band (a shell, another writer) shows up.

Writing (:func:`commit`): the change is the difference between the candidate and the running
data it was edited from (``base``); it is applied to what the device has *now* (a three-way
merge, so out-of-band changes elsewhere survive). FRR lines go through one ``vtysh`` session;
the kernel part through :func:`substrate.devstate.restore` against a target state. The commit is
atomic per device: the full device state is captured first, and when anything fails -- FRR
refuses a line, a kernel change fails, or the device does not show the requested change
afterwards -- the device is restored to that capture and the error says why.
"""

from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from substrate.devstate import DeviceState, canonical_frr, capture, normalize_nft, restore
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


def split_path(path: str) -> list[str]:
    """A data path's steps, respecting quotes inside predicates."""
    out, cur, quote, depth = [], "", "", 0
    for ch in path:
        if quote:
            cur += ch
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"" and depth:
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "/" and not depth:
            if cur:
                out.append(cur)
            cur = ""
            continue
        cur += ch
    if cur:
        out.append(cur)
    return out


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


def frr_flat(lab: Lab, node: str, state: DeviceState) -> Flat:
    """FRR's part: interfaces (description, addresses, shutdown) from the daemons' CLI
    configuration; IS-IS and static routes from isisd's and staticd's own YANG data."""
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
    for daemon in ("isisd", "staticd"):
        if daemon not in daemons:
            continue
        try:
            xml = lab.vty(node, daemon, "show configuration running xml", timeout_s=5)[0][0]
        except Exception:  # noqa: BLE001 - a daemon that does not answer contributes nothing
            continue
        try:
            got = data.to_flat(xml)
        except SchemaError:
            continue
        for k, v in got.items():
            if k.endswith("/description") and k in out:
                continue
            out.setdefault(k, v)
    return out


def running(lab: Lab, node: str, state: DeviceState | None = None) -> tuple[Flat, DeviceState]:
    """The device's configuration now, as flat data, with the device state it was read from.

    Raises:
        NodeNotFoundError, SnapshotError: the device could not be read.
    """
    st = state or capture(lab, node, frr="fast")
    flat = frr_flat(lab, node, st)
    flat.update(kernel_flat(st))
    # through libyang once: every path and value in its canonical form, as edits produce them
    return data.to_flat(data.to_xml(_ordered(flat))), st


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


def _level_cli(word: str, rel: str, value: str | None) -> str:
    lvl = rel.rsplit("/", 1)[-1]
    return f"{word} {value} {lvl}" if value is not None else f"no {word} {lvl}"


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


def kernel_target(cur: DeviceState, base: Flat, cand: Flat) -> DeviceState:
    """The kernel state after applying the change ``base`` -> ``cand`` to ``cur`` (only what the
    change touches differs from ``cur``). FRR fields are left out (FRR is committed apart)."""
    t = cur.model_copy(deep=True, update={"frr_config": None, "frr_daemons": None})
    rb, rc = routes_from_flat(base), routes_from_flat(cand)
    gone = {k for k in rb if k not in rc or rb[k].args() != rc[k].args()}
    new = [rc[k] for k in rc if k not in rb or rb[k].args() != rc[k].args()]
    for fam in (4, 6):
        have = getattr(t, f"routes{fam}")
        touched = gone | {r.key for r in new}
        kept = []
        for args in have:
            try:
                key = parse_route(args).key
            except (ValueError, IndexError):
                kept.append(args)
                continue
            if key not in touched:
                kept.append(args)
        kept += [r.args() for r in new if r.family == fam]
        setattr(t, f"routes{fam}", sorted(set(kept)))
    ub, uc = rules_from_flat(base), rules_from_flat(cand)
    gone_r = {k for k in ub if k not in uc or ub[k].args() != uc[k].args()}
    new_r = [uc[k] for k in uc if k not in ub or ub[k].args() != uc[k].args()]
    for fam in (4, 6):
        have = getattr(t, f"rules{fam}")
        touched = gone_r | {r.key for r in new_r}
        kept = [a for a in have if parse_rule(a, fam).key not in touched]
        kept += [r.args() for r in new_r if r.family == fam]
        setattr(t, f"rules{fam}", kept)
    nb, nc, nh = nft_from_flat(base), nft_from_flat(cand), parse_nft(cur.nft)
    changed = {k for k in set(nb) | set(nc) if nb.get(k) != nc.get(k)}
    if changed:
        for k in changed:
            if k in nc:
                nh[k] = nc[k]
            else:
                nh.pop(k, None)
        t.nft = "\n".join(render_nft_table(f, n, tb) for (f, n), tb in nh.items())
    src = f"{K}/srv6-encapsulation-source"
    if base.get(src) != cand.get(src):
        t.tunsrc = cand.get(src, "")
    return t


def _changed(base: Flat, cand: Flat) -> dict[str, str | None]:
    """Entries the change sets (value) or removes (None)."""
    out: dict[str, str | None] = {k: None for k in base if k not in cand}
    out.update({k: v for k, v in cand.items() if base.get(k) != v})
    return out


def commit(lab: Lab, node: str, base: Flat, cand: Flat) -> CommitReport:
    """Apply the change ``base`` -> ``cand`` to ``node``, atomically (see module docstring).

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
    snap = capture(lab, node)  # the full state (FRR merged config for a restore), before anything
    cur, _ = running(lab, node, snap)
    target = data.merge3(base, cand, cur)
    try:
        data.validate(target)
    except SchemaError as e:
        raise data.from_schema_error(e) from None
    rep.frr = frr_lines(cur, target)
    kt = kernel_target(snap, base, cand)
    cur_kernel = snap.model_copy(update={"frr_config": None, "frr_daemons": None})
    try:
        if rep.frr:
            argv = ["vtysh", "-c", "configure terminal"]
            for ln in rep.frr:
                argv += ["-c", ln]
            r = lab.exec(node, argv, timeout_s=30)
            if not r.ok:
                raise RpcError("operation-failed", "FRR refused the change: " + (r.stdout + r.stderr).strip()[-400:])
        kr = restore(lab, kt, current=cur_kernel, verify=False)
        rep.kernel = kr.actions
        if kr.residual:
            raise RpcError("operation-failed", "the kernel refused part of the change: " + "; ".join(kr.residual)[:400])
        after, _ = running(lab, node)
        missing = [p for p, v in change.items() if after.get(p) != v and not (v is None and p not in after)]
        if missing:
            raise RpcError("operation-failed", f"the device does not show {len(missing)} requested change(s) after "
                           f"applying them, e.g. {missing[0]}", path=missing[0])
    except BaseException as e:
        back = restore(lab, snap)
        how = "restored to its pre-commit state" if not back.residual else (
            "NOT fully restored: " + "; ".join(back.residual)[:300])
        if isinstance(e, RpcError):
            raise RpcError(e.tag, f"{e.message}; nothing was committed: the device was {how}", path=e.path) from None
        raise
    rep.seconds = time.monotonic() - t0
    return rep


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
