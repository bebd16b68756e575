"""Device state: capture, compare and restore what services put on a node.

A :class:`DeviceState` is the part of a node's state that services and agents change and that a
reset or a rollback must put back exactly:

- kernel routes of every table that are not derived from addresses (proto ``kernel``) and not
  installed by FRR (zebra/IS-IS/BGP/static protocols: FRR re-installs those from its config),
  including SRv6 ``seg6`` encapsulation and ``seg6local`` behaviours with their counters flag;
- policy-routing rules (``ip rule``, both families);
- interface addresses (not link-local), interface admin state and MTU, virtual devices;
- the nftables ruleset (counter values normalised away when comparing);
- a few sysctls (forwarding, SRv6, netfilter hooks for SRv6 decapsulation: :data:`SYSCTLS`) and the SRv6 encapsulation source (``ip sr tunsrc``);
- FRR's running configuration (routers).

Each item is kept in canonical ``ip`` command syntax, so the same string is both the comparison
key and the command that re-creates it. :func:`restore` computes the difference between the
current and the target state and applies only that (one ``ip -batch`` per family, one ``nft -f``,
``frr-reload.py`` only when FRR's configuration differs), then captures again and reports
anything it could not put back. Used by lab reset (scenario baseline) and by the A1 server's
snapshot/rollback.
"""

from __future__ import annotations

import ipaddress
import json
import re
import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from substrate.errors import SubstrateError
from substrate.routes import route_key
from substrate.topology import Role

if TYPE_CHECKING:
    from substrate.lab import Lab

#: Route protocols whose routes FRR owns (RTPROT_* numbers and iproute2 names): zebra 11,
#: bgp 186, isis 187, ospf 188, rip 189, ripng 190, nhrp 191, eigrp 192, ldp 193, sharp 194,
#: pbr 195, static 196, openfabric 197, srte 198 (FRR lib/route_types / zebra/rt_netlink.h).
FRR_PROTOCOLS = frozenset(
    {"zebra", "bgp", "isis", "ospf", "rip", "ripng", "nhrp", "eigrp", "ldp", "sharp", "pbr", "static",
     "openfabric", "srte"} | {str(n) for n in (11, *range(186, 199))}
)
_SKIP_TYPES = frozenset({"local", "broadcast", "anycast", "multicast"})
_SEP = "\n@@ANIBENCH@@ "

#: Sysctls (paths under /proc/sys) that services depend on and a restore puts back.
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/*/forwarding",
    "net/ipv4/conf/*/rp_filter",
    "net/ipv4/icmp_echo_ignore_all",
    "net/ipv6/conf/*/forwarding",
    "net/ipv6/conf/*/seg6_enabled",
    "net/ipv6/conf/*/disable_ipv6",
    "net/ipv6/conf/*/keep_addr_on_down",
    "net/ipv6/icmp/echo_ignore_all",
    "net/netfilter/nf_hooks_lwtunnel",
)
#: One command in the node, few processes (capture runs on every reset, for every node): one
#: ``ip -batch`` per family for routes, rules and addresses, then links, nftables, sysctls, the
#: SRv6 tunnel source and (routers) FRR's running configuration.
_CAPTURE_SCRIPT = r"""
s() { printf '\n@@ANIBENCH@@ %s\n' "$1"; }
s ip6; printf 'route show table all\nrule show\naddr show\nlink show\nneigh show nud permanent\n' | ip -6 -s -d -j -batch -
s ip4; printf 'route show table all\nrule show\naddr show\nneigh show nud permanent\n' | ip -4 -s -d -j -batch -
s nft; nft list ruleset 2>&1
s sysctl; cd /proc/sys && for k in SYSCTL_PATHS; do [ -e "$k" ] && read -r v < "$k" && echo "$k:$v"; done; cd /
s tunsrc; ip sr tunsrc show 2>/dev/null
""".replace("SYSCTL_PATHS", " ".join(SYSCTLS))
_FRR_SECTION = "s frr; vtysh -c 'show running-config' 2>&1\n"


class SnapshotError(SubstrateError):
    """A device's state could not be captured or represented."""


class LinkState(BaseModel):
    """Interface facts a restore checks: kind (veth, bridge, ...), admin state, MTU."""

    kind: str = ""
    up: bool
    mtu: int


class DeviceState(BaseModel):
    """Restorable state of one node (see module docstring). JSON-serialisable, versioned."""

    schema_version: int = 1
    node: str
    taken_at: float = Field(default_factory=time.time)
    routes4: list[str] = Field(default_factory=list, description="IPv4 routes as `route add` arguments.")
    routes6: list[str] = Field(default_factory=list, description="IPv6 routes as `route add` arguments.")
    rules4: list[str] = Field(default_factory=list, description="IPv4 rules as `rule add` arguments.")
    rules6: list[str] = Field(default_factory=list, description="IPv6 rules as `rule add` arguments.")
    addresses: list[str] = Field(default_factory=list, description="`addr add ADDR/LEN dev IF` arguments.")
    links: dict[str, LinkState] = Field(default_factory=dict)
    nft: str = Field(default="", description="`nft list ruleset` output.")
    sysctls: dict[str, str] = Field(default_factory=dict, description="Values of SYSCTLS (path -> value; globs expanded).")
    neighbors: list[str] = Field(
        default_factory=list, description="Permanent neighbour entries as `neigh replace` arguments (an agent's "
        "static ARP/ND entry outlives its run otherwise).")
    tunsrc: str = ""
    frr_config: str | None = Field(default=None, description="FRR running configuration (routers), vtysh's merged view.")
    frr_daemons: dict[str, str] | None = Field(
        default=None,
        description="Each FRR daemon's own running configuration, read from its vty socket (fast; see "
        "substrate.vty). When both states have it, FRR equality is judged on it.",
    )

    def fingerprint(self) -> dict[str, Any]:
        """What equality is judged on: everything but timestamps and counter values (FRR is
        compared by :meth:`frr_same`)."""
        d = self.model_dump(exclude={"taken_at", "schema_version", "frr_config", "frr_daemons"})
        d["nft"] = normalize_nft(self.nft)
        for k in ("routes4", "routes6", "addresses", "neighbors"):
            d[k] = sorted(d[k])
        return d

    def frr_same(self, other: DeviceState) -> bool:
        """FRR configurations are equal: the daemons' configurations merged (as vtysh merges
        them) when both states read the daemons, else vtysh's merged configuration (None, when
        FRR could not be read, equals only None)."""
        if self.frr_daemons is not None and other.frr_daemons is not None:
            return canonical_frr(self.frr_daemons) == canonical_frr(other.frr_daemons)
        return self.frr_config == other.frr_config

    def same_as(self, other: DeviceState) -> bool:
        """True when both states are equal for every restorable item."""
        return self.fingerprint() == other.fingerprint() and self.frr_same(other)

    def diff(self, target: DeviceState) -> list[str]:
        """Human-readable differences, as ``+ item`` (in target, missing here) / ``- item``."""
        out: list[str] = []
        a, b = self.fingerprint(), target.fingerprint()
        for key in ("routes4", "routes6", "rules4", "rules6", "addresses", "neighbors"):
            have, want = set(a[key]), set(b[key])
            out += [f"+ {key}: {x}" for x in sorted(want - have)]
            out += [f"- {key}: {x}" for x in sorted(have - want)]
        for name in sorted(set(self.links) | set(target.links)):
            x, y = self.links.get(name), target.links.get(name)
            if x != y:
                out.append(f"~ link {name}: {_link_text(x)} -> {_link_text(y)}")
        if a["nft"] != b["nft"]:
            out.append("~ nftables ruleset differs")
        for k in sorted(set(self.sysctls) | set(target.sysctls)):
            if self.sysctls.get(k) != target.sysctls.get(k):
                out.append(f"~ sysctl {k}: {self.sysctls.get(k)} -> {target.sysctls.get(k)}")
        if self.tunsrc != target.tunsrc:
            out.append(f"~ sr tunsrc {self.tunsrc!r} -> {target.tunsrc!r}")
        if not self.frr_same(target):
            out.append("~ FRR running configuration differs")
        return out


_FRR_NOISE = frozenset({"!", "exit", "end", "exit-address-family"})


def canonical_frr(daemons: dict[str, str]) -> list[tuple[str, tuple[str, ...]]]:
    """The daemons' own running configurations merged into one canonical form: stanzas (a
    top-level line and its indented lines) from every daemon, the lines of stanzas with the same
    head united, sorted. vtysh shows the same union; a daemon's copy of a line the others also
    carry (vtysh pushes e.g. ``description`` or ``log`` to every daemon at start-up, while
    frr-reload sends them to one) does not make two equivalent configurations differ."""
    merged: dict[str, set[str]] = {}
    for text in daemons.values():
        head = ""
        for raw in text.splitlines():
            line = raw.rstrip()
            if not line.strip() or line.strip() in _FRR_NOISE:
                continue
            if not line.startswith(" "):
                head = line
                merged.setdefault(head, set())
            else:
                merged.setdefault(head, set()).add(line.strip())
    return sorted((h, tuple(sorted(body))) for h, body in merged.items())


def _link_text(x: LinkState | None) -> str:
    return "absent" if x is None else f"{x.kind or 'dev'} {'up' if x.up else 'down'} mtu {x.mtu}"


def normalize_nft(text: str) -> str:
    """nftables ruleset text with counter values and quota usage removed (they change with traffic)."""
    text = re.sub(r"counter packets \d+ bytes \d+", "counter", text)
    text = re.sub(r"(quota (?:over )?\d+ \w+) used \d+ \w+", r"\1", text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def normalize_frr(text: str) -> str:
    """FRR running-config without the banner lines vtysh prints before ``frr version``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("frr version"):
            return "\n".join(lines[i:]).strip() + "\n"
    return text.strip() + "\n"


# -- canonical forms -------------------------------------------------------------------------


def _dst(route: dict[str, Any], family: int) -> str:
    dst = route.get("dst", "default")
    if dst == "default":
        return "0.0.0.0/0" if family == 4 else "::/0"
    return dst if "/" in dst else f"{dst}/{32 if family == 4 else 128}"


def _gw(nh: dict[str, Any]) -> str:
    if "gateway" in nh:
        return f"via {nh['gateway']}"
    via = nh.get("via")
    if isinstance(via, dict):
        fam = "inet6" if via.get("family") == "inet6" else "inet"
        return f"via {fam} {via['host']}"
    return ""


def _encap(route: dict[str, Any]) -> str:
    enc = route.get("encap")
    if enc is None:
        return ""
    if enc == "seg6":
        return f"encap seg6 mode {route['mode']} segs {','.join(route['segs'])}"
    if enc == "seg6local":
        parts = ["encap seg6local action", route["action"]]
        for key in ("table", "vrftable", "nh4", "nh6", "iif", "oif"):
            if key in route:
                parts += [key, str(route[key])]
        if route.get("flavors"):
            parts += ["flavors", ",".join(route["flavors"])]
            for key in ("lblen", "nflen"):
                if key in route:
                    parts += [key, str(route[key])]
        if "stats64" in route:
            parts.append("count")
        return " ".join(parts)
    raise SnapshotError(f"cannot represent route with encap {enc!r}: {route}")


def route_args(route: dict[str, Any], family: int, table: str = "main") -> str | None:
    """Canonical ``route add`` arguments of one ``ip -s -d -j route show table T`` entry, or None
    when the route is not restorable state (address-derived, FRR-owned, local-table bookkeeping).

    Routes are read one table at a time because with ``table all`` iproute2's JSON gives the
    route's table and a seg6local End.DT6 ``table`` parameter the same key."""
    rtype = route.get("type", "unicast")
    proto = str(route.get("protocol", "boot"))
    if rtype in _SKIP_TYPES or proto in FRR_PROTOCOLS or proto == "kernel":
        return None
    parts = [] if rtype == "unicast" else [rtype]
    parts.append(_dst(route, family))
    # key attributes first (table, metric, proto): `route del` needs exactly these, and putting the
    # route's table before `encap` keeps it apart from a seg6local End.DT6 `table` parameter
    if table != "main":
        parts.append(f"table {table}")
    if "metric" in route:
        parts.append(f"metric {route['metric']}")
    if proto != "boot":
        parts.append(f"proto {proto}")
    enc = _encap(route)
    if enc:
        parts.append(enc)
    if "nexthops" in route:
        for nh in route["nexthops"]:
            seg = ["nexthop", _gw(nh), f"dev {nh['dev']}" if "dev" in nh else ""]
            if nh.get("weight", 1) != 1:
                seg.append(f"weight {nh['weight']}")
            parts.append(" ".join(x for x in seg if x))
    else:
        gw = _gw(route)
        if gw:
            parts.append(gw)
        if "dev" in route:
            parts.append(f"dev {route['dev']}")
    if "prefsrc" in route:
        parts.append(f"src {route['prefsrc']}")
    scope = route.get("scope")
    if scope and scope not in ("global", "universe") and not (scope == "link" and "gateway" not in route and rtype == "unicast"):
        parts.append(f"scope {scope}")
    return " ".join(parts)


def route_del_args(args: str) -> str:
    """The ``route del`` arguments of a route in canonical form (see :func:`substrate.routes.route_key`)."""
    return route_key(args)


def rule_args(rule: dict[str, Any]) -> str:
    """Canonical ``rule add`` arguments of one ``ip -j rule`` entry. The three default rules
    (local 0, main 32766, default 32767) are state like any other: ``ip rule flush`` removes
    main and default, which cuts the node's own traffic off while tenant traffic still flows."""
    prio = rule.get("priority")
    table = str(rule.get("table", ""))
    parts = [f"priority {prio}"]
    if rule.get("not"):
        parts.append("not")
    if rule.get("src", "all") != "all":
        parts.append(f"from {rule['src']}/{rule['srclen']}" if "srclen" in rule else f"from {rule['src']}")
    if rule.get("dst", "all") != "all":
        parts.append(f"to {rule['dst']}/{rule['dstlen']}" if "dstlen" in rule else f"to {rule['dst']}")
    for key, word in (("iif", "iif"), ("oif", "oif"), ("ipproto", "ipproto"), ("tos", "tos")):
        if key in rule:
            parts.append(f"{word} {rule[key]}")
    if "fwmark" in rule:
        parts.append(f"fwmark {rule['fwmark']}" + (f"/{rule['fwmask']}" if "fwmask" in rule else ""))
    for key in ("sport", "dport"):
        if key in rule:
            parts.append(f"{key} {rule[key]}")
    action = rule.get("action")
    if action in ("blackhole", "unreachable", "prohibit"):
        parts.append(action)
    elif table:
        parts.append(f"lookup {table}")
    return " ".join(parts)


# -- capture ---------------------------------------------------------------------------------


def _sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for chunk in text.split(_SEP)[1:]:
        name, _, body = chunk.partition("\n")
        out[name.strip()] = body
    return out


def _json(text: str) -> list[dict[str, Any]]:
    text = text.strip()
    return json.loads(text) if text else []


def _json_seq(text: str) -> list[list[Any]]:
    """The JSON documents ``ip -j -batch`` printed one after another, with every object as a list
    of (key, value) pairs: iproute2 gives a seg6local End.DT6 ``table`` parameter and the route's
    own ``table`` the same key, and only the order tells them apart."""
    dec = json.JSONDecoder(object_pairs_hook=lambda pairs: pairs)
    out, i, text = [], 0, text.strip()
    while i < len(text):
        doc, end = dec.raw_decode(text, i)
        out.append(doc)
        i = end
        while i < len(text) and text[i].isspace():
            i += 1
    return out


def _to_dict(v: Any) -> Any:
    if isinstance(v, list) and v and all(isinstance(x, tuple) and len(x) == 2 for x in v):
        return {k: _to_dict(x) for k, x in v}
    if isinstance(v, list):
        return [_to_dict(x) for x in v]
    return v


def _route_dict(pairs: list[tuple[str, Any]]) -> tuple[dict[str, Any], str]:
    """A route entry as a dict whose ``table`` is the seg6local parameter (if any), and the
    route's own table: the ``table`` key that comes after ``dev`` (or the only one when the
    route is not a seg6local with a table parameter)."""
    d: dict[str, Any] = {}
    route_table = "main"
    seen_dev = False
    for k, v in pairs:
        if k == "dev":
            seen_dev = True
        if k == "table":
            if d.get("encap") == "seg6local" and not seen_dev and "table" not in d:
                d["table"] = v
            else:
                route_table = str(v)
            continue
        d[k] = _to_dict(v)
    return d, route_table


def parse_capture(node: str, text: str, with_frr: bool) -> DeviceState:
    """Build a DeviceState from the capture script's output.

    Raises:
        SnapshotError: a section is missing or unreadable.
    """
    sec = _sections(text)
    try:
        state = DeviceState(node=node)
        addrs: list[tuple[str, list[dict[str, Any]]]] = []
        for fam in (4, 6):
            docs = _json_seq(sec[f"ip{fam}"])
            routes_doc, rules_doc, addr_doc = docs[:3]
            if fam == 6:
                links_doc = [_to_dict(x) for x in docs[3]]
            for n in (_to_dict(x) for x in docs[-1]):
                if n.get("lladdr") and n.get("dst") and n.get("dev"):
                    state.neighbors.append(f"{n['dst']} dev {n['dev']} lladdr {n['lladdr']} nud permanent")
            routes = []
            for pairs in routes_doc:
                route, table = _route_dict(pairs)
                if table != "local":
                    routes.append(route_args(route, fam, table))
            setattr(state, f"routes{fam}", sorted({r for r in routes if r}))
            setattr(state, f"rules{fam}", [rule_args(_to_dict(r)) for r in rules_doc])
            for iface in (_to_dict(i) for i in addr_doc):
                addrs.append((iface["ifname"], iface.get("addr_info", [])))
        for ifname, infos in addrs:
            for ai in infos:
                if ai.get("scope") == "link" or ai.get("dynamic") or ai.get("local") in ("127.0.0.1", "::1"):
                    continue
                state.addresses.append(f"{ai['local']}/{ai['prefixlen']} dev {ifname}")
        state.addresses.sort()
        for link in links_doc:
            kind = (link.get("linkinfo") or {}).get("info_kind", "")
            state.links[link["ifname"]] = LinkState(kind=kind, up="UP" in link.get("flags", []), mtu=link.get("mtu", 0))
        state.nft = sec["nft"].strip()
        for line in sec["sysctl"].split():
            k, _, v = line.partition(":")
            state.sysctls[k] = v
        m = re.search(r"tunsrc addr (\S+)", sec.get("tunsrc", ""))
        state.tunsrc = m.group(1) if m and m.group(1) != "::" else ""
        if with_frr:
            frr_text = sec.get("frr", "")
            state.frr_config = normalize_frr(frr_text) if "frr version" in frr_text else None
        return state
    except (KeyError, ValueError, IndexError, TypeError) as e:
        raise SnapshotError(f"{node}: cannot parse device state ({type(e).__name__}: {e})") from None


def capture(lab: Lab, node: str, *, frr: bool | str = True, timeout_s: float = 20.0) -> DeviceState:
    """Capture one node's restorable state: one command inside the node for the kernel, the
    FRR daemons' vty sockets for their configurations.

    Args:
        frr: ``True`` (or ``"full"``): FRR's merged running configuration through vtysh and
            each daemon's own; ``"fast"``: each daemon's own only (no vtysh: what reset needs
            to tell whether FRR changed, at a fraction of the cost); ``False``: the kernel state
            only, so it works on a node whose FRR is frozen.
        timeout_s: deadline of the capture command.

    Raises:
        NodeNotFoundError, SnapshotError.
    """
    router = lab.state(node).role is not Role.HOST
    full = router and frr in (True, "full")
    script = _CAPTURE_SCRIPT + (_FRR_SECTION if full else "")
    r = lab.sh(node, script, timeout_s=timeout_s)
    if r.timed_out:
        raise SnapshotError(f"{node}: state capture timed out after {timeout_s:g} s (node frozen?)")
    state = parse_capture(node, r.stdout, with_frr=full)
    if router and frr:
        state.frr_daemons = lab.frr_daemon_configs(node, timeout_s=min(5.0, timeout_s))
    return state


def capture_many(lab: Lab, nodes: list[str] | None = None) -> dict[str, DeviceState]:
    """Capture several nodes in parallel (default: every node)."""
    names = nodes if nodes is not None else lab.node_names()
    return dict(zip(names, lab.map(lambda n: capture(lab, n), names), strict=True))


# -- restore ---------------------------------------------------------------------------------


class RestoreReport(BaseModel):
    """What :func:`restore` did on one node."""

    node: str
    changed: bool = Field(description="Anything had to be changed.")
    actions: list[str] = Field(default_factory=list, description="What was applied, in order.")
    residual: list[str] = Field(default_factory=list, description="Differences left after the restore (empty = exact).")
    seconds: float = 0.0


def _batch(lab: Lab, node: str, family: int, lines: list[str], *, deleting: bool = False) -> list[str]:
    """Run ``ip -F -force -batch``; error lines returned. When ``deleting``, "No such process"
    (the object is already gone, e.g. a route removed with its device) is not an error."""
    if not lines:
        return []
    r = lab.exec(node, ["ip", f"-{family}", "-force", "-batch", "-"], input="\n".join(lines) + "\n", timeout_s=20)
    if r.ok:
        return []
    errs = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("Command failed")]
    if deleting:
        errs = [ln for ln in errs if "No such process" not in ln and "No such file or directory" not in ln]
    return [f"ip -{family} batch: {' | '.join(errs)[:500]}"] if errs else []


def restore(lab: Lab, target: DeviceState, current: DeviceState | None = None, *, verify: bool = True) -> RestoreReport:
    """Make ``target.node`` equal to ``target`` again, changing only what differs.

    Order: FRR configuration (``frr-reload.py --reload``, FRR's own tool for moving a running
    config to a target file; zebra then adds or removes the addresses it owns), then, against a
    fresh capture, virtual links and link states, addresses, nftables, rules, routes, sysctls. A deleted veth cannot be re-created from one node (its peer is elsewhere): it
    is reported in ``residual`` for the lab-level repair.

    Args:
        lab: the lab.
        target: the state to return to (from :func:`capture`).
        current: the node's present state if already captured (saves one capture).
        verify: capture again afterwards and report residual differences.

    Raises:
        NodeNotFoundError, SnapshotError (capture failed).
    """
    t0 = time.monotonic()
    node = target.node
    mode: bool | str = "fast" if target.frr_daemons is not None else True
    cur = current or capture(lab, node, frr=mode)
    rep = RestoreReport(node=node, changed=False)
    if cur.same_as(target):
        rep.seconds = time.monotonic() - t0
        return rep
    rep.changed = True
    errors: list[str] = []
    # FRR first: zebra owns the addresses its configuration names, and removes them from the
    # kernel itself; the kernel diff is then taken against what FRR left
    if target.frr_config is not None and not cur.frr_same(target) and (cur.frr_config is not None or cur.frr_daemons):
        rep.actions.append("frr-reload to target running-config")
        errors += restore_frr(lab, node, target.frr_config)
        cur = capture(lab, node, frr=mode)
    link_lines: list[str] = []
    for name, want in target.links.items():
        have = cur.links.get(name)
        if have is None:
            if want.kind in ("bridge",):
                link_lines += [f"link add {name} type {want.kind}"]
                have = LinkState(kind=want.kind, up=False, mtu=want.mtu)
            else:
                errors.append(f"link {name} ({want.kind or 'device'}) is missing and cannot be re-created on one node")
                continue
        if have.mtu != want.mtu:
            link_lines.append(f"link set {name} mtu {want.mtu}")
        if have.up != want.up:
            link_lines.append(f"link set {name} {'up' if want.up else 'down'}")
    deleted = [n for n, have in cur.links.items() if n not in target.links and have.kind in ("bridge", "dummy", "vxlan", "tun", "veth")]
    link_lines += [f"link del {name}" for name in deleted]
    addr_add = sorted(set(target.addresses) - set(cur.addresses))
    addr_del = [a for a in sorted(set(cur.addresses) - set(target.addresses)) if a.split()[-1] not in deleted]
    # an interface that comes (back) up gets the addresses FRR configures on it from zebra itself
    # (zebra installs configured addresses when the interface goes up); adding them too races
    # zebra, whose install then fails with EEXIST and leaves zebra, hence IS-IS, without the
    # address: wait for zebra's instead
    woken = {n for n, want in target.links.items() if want.up and not (cur.links.get(n) and cur.links[n].up)}
    zebra_owned = frr_interface_addresses(target.frr_config or "") if cur.frr_daemons or cur.frr_config else set()
    from_zebra = [a for a in addr_add if a.split()[-1] in woken and a in zebra_owned]
    link_lines += [f"addr del {a}" for a in addr_del] + [f"addr replace {a}" for a in addr_add if a not in from_zebra]
    # sysctls of existing interfaces first (an address cannot be put back on an interface whose
    # IPv6 is disabled); those of interfaces re-created below, after them
    changed_sysctls = {k: v for k, v in target.sysctls.items() if v and cur.sysctls.get(k) != v}
    late = {k: v for k, v in changed_sysctls.items() if _sysctl_iface(k) not in (None, "all", "default", *cur.links)}
    errors += _write_sysctls(lab, node, {k: v for k, v in changed_sysctls.items() if k not in late}, rep)
    if link_lines:
        rep.actions += link_lines
        r = lab.exec(node, ["ip", "-force", "-batch", "-"], input="\n".join(link_lines) + "\n", timeout_s=20)
        if not r.ok:
            errors.append(f"links/addresses: {r.stderr.strip()[:500]}")
    if from_zebra:
        rep.actions += [f"zebra: addr {a}" for a in from_zebra]
        missing = _wait_addresses(lab, node, from_zebra, timeout_s=5.0)
        if missing:  # zebra did not (FRR down or not configured after all): add them ourselves
            lines = [f"addr replace {a}" for a in missing]
            rep.actions += lines
            r = lab.exec(node, ["ip", "-force", "-batch", "-"], input="\n".join(lines) + "\n", timeout_s=20)
            if not r.ok:
                errors.append(f"addresses: {r.stderr.strip()[:500]}")
    if normalize_nft(cur.nft) != normalize_nft(target.nft):
        rep.actions.append("nft: replace ruleset")
        r = lab.exec(node, ["nft", "-f", "-"], input="flush ruleset\n" + target.nft + "\n", timeout_s=20)
        if not r.ok:
            errors.append(f"nft: {r.stderr.strip()[:500]}")
    for fam in (4, 6):
        have, want = getattr(cur, f"rules{fam}"), getattr(target, f"rules{fam}")
        dels = [x for x in have if x not in want]
        adds = [x for x in want if x not in have]
        rep.actions += [f"-{fam} rule del {x}" for x in dels] + [f"-{fam} rule add {x}" for x in adds]
        errors += _batch(lab, node, fam, [f"rule del {x}" for x in dels], deleting=True)
        errors += _batch(lab, node, fam, [f"rule add {x}" for x in adds])
        have_r, want_r = set(getattr(cur, f"routes{fam}")), set(getattr(target, f"routes{fam}"))
        dels = [f"route del {route_del_args(x)}" for x in sorted(have_r - want_r)]
        adds = [f"route replace {x}" for x in sorted(want_r - have_r)]
        rep.actions += [f"-{fam} {x}" for x in dels + adds]
        errors += _batch(lab, node, fam, dels, deleting=True)
        errors += _batch(lab, node, fam, adds)
        have_n = {x for x in cur.neighbors if (":" in x.split()[0]) == (fam == 6)}
        want_n = {x for x in target.neighbors if (":" in x.split()[0]) == (fam == 6)}
        dels = [f"neigh del {' '.join(x.split()[:3])}" for x in sorted(have_n - want_n)]
        adds = [f"neigh replace {x}" for x in sorted(want_n - have_n)]
        rep.actions += [f"-{fam} {x}" for x in dels + adds]
        errors += _batch(lab, node, fam, dels, deleting=True)
        errors += _batch(lab, node, fam, adds)
    errors += _write_sysctls(lab, node, late, rep)
    if cur.tunsrc != target.tunsrc:
        rep.actions.append(f"sr tunsrc {target.tunsrc or '::'}")
        lab.exec(node, ["ip", "sr", "tunsrc", "set", target.tunsrc or "::"])
    if target.frr_config is not None and not cur.frr_same(target):
        # still different (FRR was down at capture, or the links it configures were missing)
        rep.actions.append("frr-reload to target running-config")
        errors += restore_frr(lab, node, target.frr_config)
    if verify:
        after = capture(lab, node, frr=mode)
        if target.frr_config is not None and not after.frr_same(target):
            # frr-reload could not get there (zebra refuses to undo some states, e.g. an IPv4
            # address configured on two ports): restart FRR from the target configuration, as
            # an operator would, then put the kernel state back against a fresh capture
            rep.actions.append("FRR restarted from the target configuration")
            errors = restart_frr(lab, node, target.frr_config)
            sub = restore(lab, target.model_copy(update={"frr_config": None, "frr_daemons": None}), verify=False)
            rep.actions += sub.actions
            errors += sub.residual
            after = capture(lab, node, frr=mode)
        rep.residual = errors + after.diff(target) if errors or not after.same_as(target) else []
    else:
        rep.residual = errors
    rep.seconds = time.monotonic() - t0
    return rep


def restart_frr(lab: Lab, node: str, config: str) -> list[str]:
    """Replace ``node``'s frr.conf with ``config`` and restart its FRR daemons (``vtysh -b``
    loads it). Returns error lines (empty on success)."""
    from substrate import frr

    daemons = lab.state(node).daemons
    kill = "; ".join(f'kill -9 "$(cat /run/frr/{d}.pid 2>/dev/null)" 2>/dev/null; rm -f /run/frr/{d}.pid' for d in daemons)
    r = lab.sh(node, f"cat > /etc/frr/frr.conf && chown frr:frr /etc/frr/frr.conf; {kill}; true", input=config)
    if not r.ok:
        return [f"frr restart: {r.summary()}"]
    r = lab.sh(node, frr.start_script(daemons), timeout_s=60)
    return [] if r.ok else [f"frr restart: {r.summary()}"]


def frr_interface_addresses(config: str) -> set[str]:
    """Addresses an FRR configuration puts on interfaces (zebra's ``ip address`` / ``ipv6
    address`` under ``interface IF``), as :attr:`DeviceState.addresses` entries ``ADDR/LEN dev IF``
    with the address in the kernel's canonical text form."""
    out: set[str] = set()
    ifname: str | None = None
    for line in config.splitlines():
        words = line.split()
        if not words:
            continue
        if not line.startswith(" "):
            ifname = words[1] if words[0] == "interface" and len(words) == 2 else None
        elif ifname and len(words) == 3 and words[0] in ("ip", "ipv6") and words[1] == "address":
            try:
                iface = ipaddress.ip_interface(words[2])
            except ValueError:
                continue
            out.add(f"{iface.ip}/{iface.network.prefixlen} dev {ifname}")
    return out


def _wait_addresses(lab: Lab, node: str, wanted: list[str], timeout_s: float) -> list[str]:
    """Poll ``node`` until every ``ADDR/LEN dev IF`` of ``wanted`` is on its interface, for at
    most ``timeout_s`` seconds; returns those still missing."""
    deadline = time.monotonic() + timeout_s
    missing = list(wanted)
    while missing:
        r = lab.exec(node, ["ip", "-j", "addr", "show"], timeout_s=5)
        have = set()
        if r.ok:
            for iface in json.loads(r.stdout or "[]"):
                for ai in iface.get("addr_info", []):
                    have.add(f"{ai.get('local')}/{ai.get('prefixlen')} dev {iface.get('ifname')}")
        missing = [a for a in missing if a not in have]
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return missing


def _sysctl_iface(key: str) -> str | None:
    """The interface of a per-interface sysctl path (``net/ipv6/conf/eth1/forwarding`` -> eth1)."""
    parts = key.split("/")
    return parts[3] if len(parts) == 5 and parts[2] == "conf" else None


def _write_sysctls(lab: Lab, node: str, values: dict[str, str], rep: RestoreReport) -> list[str]:
    """Write ``values`` (path under /proc/sys -> value) in order; error lines returned."""
    if not values:
        return []
    rep.actions += [f"sysctl {k}={v}" for k, v in values.items()]
    r = lab.sh(node, "rc=0; " + "; ".join(f"echo {v} > /proc/sys/{k} || rc=1" for k, v in values.items()) + "; exit $rc")
    return [] if r.ok else [f"sysctl: {r.stderr.strip()[:300]}"]


def restore_frr(lab: Lab, node: str, config: str) -> list[str]:
    """Move FRR's running configuration of ``node`` to ``config`` with ``frr-reload.py --reload``.

    Returns error lines (empty on success).
    """
    path = "/tmp/anibench-frr-target.conf"
    r = lab.sh(node, f"cat > {path} && /usr/lib/frr/frr-reload.py --reload --stdout {path}; rc=$?; rm -f {path}; exit $rc",
               input=config, timeout_s=60)
    return [] if r.ok else [f"frr-reload: {(r.stderr or r.stdout).strip()[-500:]}"]
