"""Device state: capture, compare and restore everything a command can change on a node.

A :class:`DeviceState` is a node's full state as the kernel and FRR hold it, normalised so that
two captures of an unchanged node are equal and any change a command makes shows:

- routes of every table of both families (``ip -N -s -d -j route show table all``), split into
  the routes services and agents add (:attr:`~DeviceState.routes4`/``routes6``), the routes the
  kernel derives from addresses and links (``proto kernel``, local-table entries:
  :attr:`~DeviceState.kernel_routes`) and the routes FRR installs (:attr:`~DeviceState.frr_routes`,
  *dynamic*: they follow the network, see below); every attribute is kept (metrics, preference,
  source prefix, nexthop flags, SRv6 encapsulation and ``seg6local`` behaviours with their counters
  flag); an attribute this module does not know is kept as a ``?key=value`` marker, so it still
  counts as a difference even though no command re-creates it;
- policy-routing rules in kernel order (rules of equal priority are evaluated in list order);
- every address with its flags (``noprefixroute``, ``nodad``, deprecated, ...), link-local and
  loopback addresses included, IPv4 addresses in order per interface (primary first);
- every interface's settable attributes (admin state, MTU, MAC, txqueuelen, group, alias, ARP /
  multicast / promiscuous flags, address generation mode, master, offload sizes, kind-specific
  data such as bridge parameters);
- permanent and no-ARP neighbour entries and proxy entries; nexthop objects not owned by zebra;
- the nftables ruleset (counter values, quota usage and set-element expiry normalised away);
- every writable sysctl under ``/proc/sys/net`` (read-only entries, such as connection counts,
  are not state a command can change);
- queueing disciplines (``tc qdisc``), the SRv6 encapsulation source and HMAC keys;
- FRR (routers): each daemon's running configuration from its vty socket, hence also the set
  of daemons running, and vtysh's merged running configuration (the ``frr-reload`` target).

Everything but the FRR routes is *configuration-like*: it changes only when a command changes it,
so two captures compare equal at any time (:meth:`DeviceState.same_as`). The FRR routes are
*dynamic*: they follow IS-IS and move during convergence (a link that just came back, a fault);
they are compared only when asked (``dynamic=True``, what lab reset does once the underlay has
converged), with nexthops sorted and zebra's nexthop-object ids left out (they are renumbered
whenever zebra restarts).

Each item is kept in canonical command syntax (``ip route``, ``ip rule``, ``ip addr``, ...), so
the same string is both the comparison key and the command that re-creates it. :func:`restore`
computes the difference between the current and the target state and applies only that, in an
order that works (FRR configuration, links, sysctls, addresses, derived routes, routes, rules,
neighbours, nexthops, nftables, SRv6, qdiscs), then captures again and repeats (up to
:data:`RESTORE_PASSES` times: some repairs undo others, e.g. bouncing an address removes the
routes through it); what is still different is reported as residual. Used by lab reset (scenario
baseline), the A1 server's snapshot/rollback and A3-T's rollback.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import re
import shlex
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from substrate.dataplane import own_device
from substrate.errors import SubstrateError
from substrate.routes import route_key
from substrate.topology import Role

if TYPE_CHECKING:
    from substrate.lab import Lab

#: Version of the DeviceState schema (a baseline recorded with another version is refused).
SCHEMA_VERSION = 4  # 4: net_objects (address labels, static multicast addresses, MPTCP)
#: Route protocol numbers whose routes FRR owns (RTPROT_*, FRR zebra/rt_netlink.h): zebra 11,
#: bgp 186, isis 187, ospf 188, rip 189, ripng 190, nhrp 191, eigrp 192, ldp 193, sharp 194,
#: pbr 195, static 196, openfabric 197, srte 198. (RTPROT_STATIC 4, which iproute2 also calls
#: ``static``, is not FRR's: such a route is an agent's and is restored like any other.)
FRR_PROTOCOLS = frozenset({"11", *(str(n) for n in range(186, 199))})
#: The sysctls services depend on (what the A1 running configuration shows); every writable one
#: is captured and restored.
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
#: How many capture-and-repair passes :func:`restore` makes at most.
RESTORE_PASSES = 4
_SEP = "\n@@ANIBENCH@@ "
#: One command in the node, few processes (capture runs on every reset, for every node: each
#: process started in it costs 2-5 ms of CPU, so commands of one program share one ``-batch``).
#: Numeric output (``-N``) everywhere: names of protocols are ambiguous (``static`` is both 4 and
#: FRR's 196 in Debian's rt_protos.d).
_CAPTURE_SCRIPT = r"""
s() { printf '\n@@ANIBENCH@@ %s\n' "$1"; }
s ip; ip -N -s -d -j -force -batch - 2>/dev/null <<< $'route show table all root ::/0\nroute show table all root 0.0.0.0/0\nrule show\naddr show\nneigh show\nneigh show proxy\nlink show\nnexthop show\nsr tunsrc show\nsr hmac show\naddrlabel list\nmaddr show\nmptcp endpoint show\nmptcp limits show\n'
s rule6; ip -6 -N -d -j rule show
s tc; tc -j qdisc show 2>/dev/null
s xt; for f in ip ip6; do t=; read -r t < /proc/net/${f}_tables_names && [ -n "$t" ] && echo "@$f" && ${f}tables-legacy-save; done 2>/dev/null
s xfrm; ip -force -batch - 2>&1 <<< $'xfrm policy getdefault\nxfrm policy\n'; ip xfrm state 2>&1
"""
#: The capture's sections read from the host process rather than by the script (no process in the
#: node: :mod:`substrate.nsread`, :func:`host_sections`). The sysctls stay in the script: read from
#: Python (``nsread``-style, through setns) they cost as much CPU as grep does, but under the
#: GIL: an A/B on the 62-node lab gave 1.83 s wall for all nodes against 1.55 s with grep.
HOST_SECTIONS = ("nft",)
#: Every writable sysctl under /proc/sys/net, one file at a time (the full capture).
_SYSCTL_FULL = "s sysctl; grep -r . /proc/sys/net 2>/dev/null\n"
#: The sysctls outside per-interface directories (the fast capture: netlink gives those in bulk,
#: see substrate.netlink); ``all`` and ``default`` are files only.
_SYSCTL_FAST = """s sysctl; shopt -s extglob nullglob
eval 'grep -r . /proc/sys/net/!(ipv4|ipv6) /proc/sys/net/ipv[46]/!(conf|neigh) /proc/sys/net/ipv[46]/conf/@(all|default) /proc/sys/net/ipv[46]/neigh/default /proc/sys/net/ipv6/conf/!(all|default)/stable_secret 2>/dev/null'
"""
#: The script without its xfrm section: what a capture runs when netlink says the node holds no
#: IPsec state (:func:`substrate.netlink.xfrm_empty`; the section is then the kernel's default).
_CAPTURE_SCRIPT_NO_XFRM = "".join(ln for ln in _CAPTURE_SCRIPT.splitlines(keepends=True) if not ln.startswith("s xfrm;"))
#: (The xfrm section's listings end ``ip -batch``: iproute2 6.1's ``xfrm state`` and ``xfrm policy``
#: listings exit the program, so a batch holds at most one, last; a policy listed after the states
#: was never seen.)
#: The documents of the ``ip`` section, in order (nexthop and SRv6 ones are told apart by content:
#: a kernel without nexthop objects prints nothing for that line; after the SRv6 source and HMAC
#: keys come the other per-namespace objects, :func:`net_objects`, and the MPTCP limits' line).
_IP_DOCS = ("routes6", "routes4", "rules4", "addr", "neigh", "proxy", "link")
#: Added to the capture when the read-only sysctls of this kernel are not known yet (once per process).
_READONLY_SECTION = "s ro; find /proc/sys/net -type f ! -perm -u=w 2>/dev/null\n"
_FRR_SECTION = "s frr; vtysh -c 'show running-config' 2>&1\n"

_RTN = {"0": "unspec", "1": "unicast", "2": "local", "3": "broadcast", "4": "anycast", "5": "multicast", "6": "blackhole",
        "7": "unreachable", "8": "prohibit", "9": "throw", "10": "nat", "11": "xresolve"}  # fmt: skip
_TABLES = {"254": "main", "255": "local", "253": "default", "0": "unspec"}
_SCOPES = {"0": "global", "200": "site", "253": "link", "254": "host", "255": "nowhere"}
#: iproute2 names some callers (and older captures) use, to numbers.
_PROTO_NUM = {"unspec": "0", "redirect": "1", "kernel": "2", "boot": "3", "static": "4", "ra": "9", "dhcp": "16",
              "zebra": "11", "bgp": "186", "isis": "187", "ospf": "188", "rip": "189", "ripng": "190", "nhrp": "191",
              "eigrp": "192", "ldp": "193", "sharp": "194", "pbr": "195", "openfabric": "197", "srte": "198"}  # fmt: skip
_SCOPE_NUM = {v: k for k, v in _SCOPES.items()} | {"universe": "0"}
_RTN_NUM = {v: k for k, v in _RTN.items()}
_TABLE_NUM = {v: k for k, v in _TABLES.items()}

#: Route keys read into the canonical form (anything else becomes a ``?key=value`` marker).
_ROUTE_KEYS = frozenset({
    "type", "dst", "src", "table", "metric", "protocol", "scope", "tos", "dsfield", "prefsrc", "gateway", "via", "dev",
    "encap", "mode", "segs", "action", "nh4", "nh6", "iif", "oif", "flavors", "lblen", "nflen", "vrftable", "stats64",
    "nexthops", "nhid", "nh_info", "flags", "pref", "metrics", "expires", "cache", "uid", "rt_offload", "rt_trap",
    "rt_offload_failed", "weight",
})  # fmt: skip
_METRIC_WORDS = {"mtu": "mtu", "advmss": "advmss", "window": "window", "rtt": "rtt", "rttvar": "rttvar",
                 "ssthresh": "ssthresh", "cwnd": "cwnd", "initcwnd": "initcwnd", "initrwnd": "initrwnd",
                 "hoplimit": "hoplimit", "reordering": "reordering", "quickack": "quickack", "rto_min": "rto_min",
                 "fastopen_no_cookie": "fastopen_no_cookie", "congestion": "congctl"}  # fmt: skip
#: Rule actions as ``ip -N rule`` prints them (numbers: FR_ACT_* of linux/fib_rules.h) -> their names.
_FR_ACT = {"1": "to_tbl", "2": "goto", "3": "nop", "6": "blackhole", "7": "unreachable", "8": "prohibit"}
_RULE_KEYS = frozenset({"priority", "not", "src", "srclen", "dst", "dstlen", "iif", "oif", "fwmark", "fwmask", "tos",
                        "dsfield", "ipproto", "sport", "dport", "table", "action", "protocol", "flags", "l3mdev",
                        "suppress_prefixlen", "suppress_ifgroup", "target", "uid_start", "uid_end", "realms",
                        "flow_from", "flow_to"})  # fmt: skip
_ADDR_FLAGS = ("nodad", "home", "mngtmpaddr", "noprefixroute", "autojoin")
_ADDR_KEYS = frozenset({"family", "local", "address", "prefixlen", "broadcast", "anycast", "scope", "label",
                        "valid_life_time", "preferred_life_time", "secondary", "tentative", "deprecated", "dadfailed",
                        "dynamic", "optimistic", "permanent", "stable-privacy", "metric", *_ADDR_FLAGS})  # fmt: skip
#: Interface flags a command sets (``ip link set``): the rest (LOWER_UP, NO-CARRIER, ...) follow the peer.
_LINK_FLAGS = {"NOARP": "arp", "PROMISC": "promisc", "ALLMULTI": "allmulticast", "MULTICAST": "multicast", "DYNAMIC": "dynamic"}
#: Link keys that are not state a command on the node sets (counters, indexes, the peer's view, driver limits).
_LINK_IGNORED = frozenset({
    "ifindex", "link_index", "link_netnsid", "operstate", "qdisc", "stats", "stats64", "promiscuity", "allmulti",
    "num_tx_queues", "num_rx_queues", "min_mtu", "max_mtu", "link_type", "parentbus", "parentdev", "event",
    "ifname", "addr_info", "tso_max_size", "tso_max_segs", "flags", "linkinfo", "mtu", "address", "txqlen", "group",
    "ifalias", "inet6_addr_gen_mode", "master", "proto_down", "gso_max_size", "gso_max_segs", "gro_max_size",
    "linkmode", "perm_address", "gso_ipv4_max_size", "gro_ipv4_max_size", "link",
})  # fmt: skip
#: Kind-specific data derived from other state or moving by itself (bridge ids follow the ports'
#: and the bridge's MAC; timers and topology-change state move).
_VOLATILE_INFO = re.compile(r".*_timer$|^topology_change.*|^(root|bridge)_id$|^root_(port|path_cost)$|^designated_.*")
_NEIGH_KEEP = frozenset({"PERMANENT", "NOARP"})
#: Device kinds whose carrier is their own state, not a peer's.
_OWN_CARRIER = frozenset({"bridge"})


class SnapshotError(SubstrateError):
    """A device's state could not be captured or represented."""


class LinkState(BaseModel):
    """An interface's settable attributes (what ``ip link set`` changes; see module docstring)."""

    kind: str = ""
    up: bool
    mtu: int
    address: str = Field(default="", description="MAC address (not kept for a bridge: see carrier).")
    carrier: bool | None = Field(
        default=None, description="Carrier of a device whose carrier is its own (a bridge: a port-less bridge has "
        "carrier until its MAC is set by hand, and its MAC is random, hence not compared); None for devices whose "
        "carrier follows a peer (veth).")
    txqlen: int | None = None
    group: str = ""
    alias: str = ""
    flags: list[str] = Field(default_factory=list, description="Settable flags set (NOARP, PROMISC, ALLMULTI, MULTICAST, DYNAMIC).")
    addrgenmode: str = ""
    master: str = ""
    linkmode: str = ""
    protodown: bool = False
    offload: dict[str, int] = Field(default_factory=dict, description="gso_max_size, gso_max_segs, gro_max_size, ...")
    info: dict[str, Any] = Field(default_factory=dict, description="Kind-specific data (bridge parameters), timers left out.")
    extra: dict[str, Any] = Field(default_factory=dict, description="Attributes this module does not restore (compared only).")


class DeviceState(BaseModel):
    """Full state of one node (see module docstring). JSON-serialisable, versioned."""

    schema_version: int = SCHEMA_VERSION
    node: str
    taken_at: float = Field(default_factory=time.time)
    routes4: list[str] = Field(default_factory=list, description="IPv4 routes outside FRR and the kernel's own, as `route add` arguments.")
    routes6: list[str] = Field(default_factory=list, description="IPv6 routes outside FRR and the kernel's own, as `route add` arguments.")
    kernel_routes: list[str] = Field(
        default_factory=list, description="Routes the kernel derives from addresses and links (proto kernel, local "
        "table), as `-4|-6 route add` arguments: a flush removes them and they do not come back by themselves.")
    frr_routes: list[str] = Field(
        default_factory=list, description="Routes FRR installed (dynamic: compared only with dynamic=True), as "
        "`-4|-6 ROUTE` with nexthops sorted.")
    rules4: list[str] = Field(default_factory=list, description="IPv4 rules as `rule add` arguments, in kernel order.")
    rules6: list[str] = Field(default_factory=list, description="IPv6 rules as `rule add` arguments, in kernel order.")
    addresses: list[str] = Field(default_factory=list, description="Global addresses: `ADDR/LEN dev IF [attributes]`.")
    host_addresses: list[str] = Field(
        default_factory=list, description="Link-local and loopback addresses (the kernel makes them; a flush removes them).")
    links: dict[str, LinkState] = Field(default_factory=dict)
    nft: str = Field(default="", description="`nft list ruleset` output.")
    xtables: str = Field(
        default="", description="Legacy x_tables rules (iptables-legacy, ip6tables-legacy: invisible to nft), as "
        "`@ip`/`@ip6` then the save output without comments and counters; empty tables with ACCEPT policies left out.")
    net_objects: list[str] = Field(
        default_factory=list, description="Other per-namespace network objects a command can add, as the `ip` "
        "arguments that add them: IPv6 address labels (`addrlabel add prefix P label L`: source address "
        "selection, RFC 6724), static link-layer multicast addresses (`maddr add ADDR dev IF`), MPTCP endpoints "
        "and limits (`mptcp endpoint add ...`, `mptcp limits set ...`).")
    xfrm: str = Field(
        default="", description="IPsec (XFRM) states, policies and default policies (`ip xfrm`), empty when there are "
        "none and every default policy accepts.")
    sysctls: dict[str, str] = Field(
        default_factory=dict, description="Writable sysctls under /proc/sys/net outside per-interface directories "
        "(path -> value; conf/all and conf/default included).")
    iface_sysctls: dict[str, str] = Field(
        default_factory=dict, description="Writable sysctls of per-interface directories (conf/IF, neigh/IF): read in "
        "a full capture only (what a restore writes back); compared through link_settings and neigh_settings.")
    link_settings: dict[str, str] = Field(
        default_factory=dict, description="Per interface, its IPv4/IPv6 settings (every conf/IF sysctl) and IPv6 "
        "token as one comparable string (substrate.netlink).")
    neigh_settings: dict[str, str] = Field(
        default_factory=dict, description="Per neighbour table and interface, its parameters (every neigh/IF sysctl) "
        "as one comparable string (substrate.netlink).")
    neighbors: list[str] = Field(
        default_factory=list, description="Permanent and no-ARP neighbour entries (`neigh replace` arguments) and proxy "
        "entries (`proxy ADDR dev IF`).")
    nexthops: list[str] = Field(default_factory=list, description="Nexthop objects not owned by zebra, as `nexthop add` arguments.")
    qdiscs: list[str] = Field(default_factory=list, description="Queueing disciplines: `dev IF PARENT KIND handle H {options}`.")
    tunsrc: str = ""
    hmac: list[str] = Field(default_factory=list, description="SRv6 HMAC keys: `KEYID ALGO SECRET`.")
    frr_config: str | None = Field(default=None, description="FRR running configuration (routers), vtysh's merged view.")
    frr_daemons: dict[str, str] | None = Field(
        default=None,
        description="Each FRR daemon's own running configuration, read from its vty socket (fast; see "
        "substrate.vty). When both states have it, FRR equality is judged on it (daemon set included).",
    )

    def fingerprint(self, *, dynamic: bool = False) -> dict[str, Any]:
        """What equality is judged on: everything but timestamps and counter values, with sets
        sorted and ordered lists (rules, IPv4 addresses per interface) in order; FRR's
        configuration is compared by :meth:`frr_same`; FRR routes only when ``dynamic``."""
        d = self.model_dump(exclude={"taken_at", "schema_version", "frr_config", "frr_daemons", "frr_routes", "iface_sysctls"})
        d["nft"] = normalize_nft(self.nft)
        for k in ("routes4", "routes6", "kernel_routes", "neighbors", "nexthops", "qdiscs", "hmac", "host_addresses", "net_objects"):
            d[k] = sorted(d[k])
        d["addresses"] = address_order(self.addresses)
        if dynamic:
            d["frr_routes"] = sorted(self.frr_routes)
        return d

    @property
    def frr_read(self) -> bool:
        """FRR was read: a router captured with ``frr`` (a kernel-only capture, ``frr=False``, and
        a host's have neither ``frr_daemons`` nor ``frr_config``)."""
        return self.frr_daemons is not None or self.frr_config is not None

    def frr_same(self, other: DeviceState) -> bool:
        """FRR configurations are equal: the same daemons answer and each daemon's own running
        configuration equals the other state's copy of it (:func:`frr_daemons_differ`), when both
        states read the daemons, else vtysh's merged configuration (None, when FRR could not be
        read, equals only None). When one of the two states did not read FRR at all
        (:attr:`frr_read`), FRR is not compared: a kernel-only state says nothing of FRR.

        Each daemon is compared on its own, not in vtysh's merged view: a prefix-list or
        route-map lives in every daemon that has the command (vtysh sends it to zebra, isisd
        and bgpd alike), and the merged view still shows zebra's copy when bgpd lost its own --
        the one bgpd filters with."""
        if not self.frr_read or not other.frr_read:
            return True
        if self.frr_daemons is not None and other.frr_daemons is not None:
            return not frr_daemons_differ(self.frr_daemons, other.frr_daemons)
        return self.frr_config == other.frr_config

    def same_as(self, other: DeviceState, *, dynamic: bool = False) -> bool:
        """True when both states are equal for every configuration-like item (and the FRR routes
        too when ``dynamic``)."""
        return self.fingerprint(dynamic=dynamic) == other.fingerprint(dynamic=dynamic) and self.frr_same(other)

    def diff(self, target: DeviceState, *, dynamic: bool = False) -> list[str]:
        """Human-readable differences, as ``+ item`` (in target, missing here) / ``- item`` /
        ``~ item: here -> target``. Empty exactly when :meth:`same_as` holds."""
        out: list[str] = []
        a, b = self.fingerprint(dynamic=dynamic), target.fingerprint(dynamic=dynamic)
        keys = ["routes4", "routes6", "kernel_routes", "addresses", "host_addresses", "neighbors", "nexthops", "qdiscs", "hmac",
                "net_objects"]
        for key in [*keys, *(["frr_routes"] if dynamic else [])]:
            have, want = set(a[key]), set(b[key])
            out += [f"+ {key}: {x}" for x in sorted(want - have)]
            out += [f"- {key}: {x}" for x in sorted(have - want)]
            if have == want and a[key] != b[key]:
                out.append(f"~ {key}: order differs")
        for key in ("rules4", "rules6"):
            have, want = a[key], b[key]
            out += [f"+ {key}: {x}" for x in want if x not in have]
            out += [f"- {key}: {x}" for x in have if x not in want]
            if sorted(have) == sorted(want) and have != want:
                out.append(f"~ {key}: order differs: {have} -> {want}")
        for name in sorted(set(self.links) | set(target.links)):
            x, y = self.links.get(name), target.links.get(name)
            if x != y:
                out.append(f"~ link {name}: {_link_text(x, y)}")
        if a["nft"] != b["nft"]:
            out.append("~ nftables ruleset differs")
        if a["xtables"] != b["xtables"]:
            out.append(f"~ legacy iptables rules differ: {a['xtables'][:200]!r} -> {b['xtables'][:200]!r}")
        if a["xfrm"] != b["xfrm"]:
            out.append(f"~ xfrm (IPsec) state differs: {a['xfrm'][:200]!r} -> {b['xfrm'][:200]!r}")
        for k in sorted(set(a["sysctls"]) | set(b["sysctls"])):
            if a["sysctls"].get(k) != b["sysctls"].get(k):
                out.append(f"~ sysctl {k}: {a['sysctls'].get(k)} -> {b['sysctls'].get(k)}")
        for what, mine, theirs in (("conf", self.link_settings, target.link_settings),
                                   ("neigh", self.neigh_settings, target.neigh_settings)):
            for k in sorted(set(mine) | set(theirs)):
                if mine.get(k) != theirs.get(k):
                    dev = k.split("/")[-1]
                    mine_v, theirs_v = self.iface_sysctls, target.iface_sysctls
                    keys = [x for x in sorted(set(mine_v) & set(theirs_v))
                            if _sysctl_iface(x) == dev and x.split("/")[2] == what and mine_v[x] != theirs_v[x]]
                    detail = ", ".join(f"{x}: {mine_v[x]} -> {theirs_v[x]}" for x in keys[:8])
                    out.append(f"~ sysctls {what}/{k}: " + (detail or ("absent" if k not in mine else "only here" if k not in theirs
                                                                       else "values differ (netlink)")))
        if self.tunsrc != target.tunsrc:
            out.append(f"~ sr tunsrc {self.tunsrc!r} -> {target.tunsrc!r}")
        if not self.frr_same(target):
            mine, theirs = sorted(self.frr_daemons or {}), sorted(target.frr_daemons or {})
            out.append("~ FRR running configuration differs" +
                       (f" (daemons {', '.join(mine) or 'none'} -> {', '.join(theirs) or 'none'})" if mine != theirs else ""))
            if self.frr_daemons is not None and target.frr_daemons is not None:
                for d in frr_daemons_differ(self.frr_daemons, target.frr_daemons):
                    if d in self.frr_daemons and d in target.frr_daemons:
                        have, want = daemon_config_lines(self.frr_daemons[d]), daemon_config_lines(target.frr_daemons[d])
                        lines = [f"+ {' > '.join(x)}" for x in sorted(want - have)] + [f"- {' > '.join(x)}" for x in sorted(have - want)]
                        more = f" (and {len(lines) - 8} more)" if len(lines) > 8 else ""
                        out.append(f"~ FRR {d}'s own configuration: {'; '.join(lines[:8])}{more}")
        return out


def address_order(addresses: Iterable[str]) -> list[str]:
    """Addresses in comparison order: IPv6 sorted (a set), IPv4 grouped by interface in their
    kernel order (the first is the primary: it sources the node's packets)."""
    v6 = sorted(a for a in addresses if ":" in a.split()[0])
    v4: dict[str, list[str]] = {}
    for a in addresses:
        if ":" not in a.split()[0]:
            v4.setdefault(_addr_dev(a), []).append(a)
    return v6 + [a for dev in sorted(v4) for a in v4[dev]]


#: Lines of an FRR configuration that only close or separate stanzas (no state of their own).
FRR_NOISE = frozenset({"!", "exit", "end", "exit-address-family", "exit-vrf", "exit-vni"})
_FRR_NOISE = FRR_NOISE


def canonical_frr(daemons: dict[str, str]) -> list[tuple[str, tuple[str, ...]]]:
    """See :func:`_canonical_frr` (cached: reset compares the same baseline texts again and again)."""
    return _canonical_frr(tuple(daemons.values()))


@functools.lru_cache(maxsize=1024)
def _canonical_frr(texts: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """The daemons' own running configurations merged into one canonical form: stanzas (a
    top-level line and its indented lines) from every daemon, the lines of stanzas with the same
    head united, sorted. vtysh shows the same union; a daemon's copy of a line the others also
    carry (vtysh pushes e.g. ``description`` or ``log`` to every daemon at start-up, while
    frr-reload sends them to one) does not make two equivalent configurations differ."""
    merged: dict[str, set[str]] = {}
    for text in texts:
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


def frr_negate(line: str) -> str:
    """The FRR command undoing ``line`` (``no X`` for ``X``, ``X`` for ``no X``; a
    ``description`` is undone by ``no description``, which takes no text in FRR 8.4's lib/if.c)."""
    if line.startswith("no "):
        return line[3:]
    return "no description" if line.split(" ", 1)[0] == "description" else f"no {line}"


#: One node of a daemon's configuration tree: each line to the lines nested under it (in order).
_Tree = dict[str, "_Tree"]


def _daemon_tree(text: str) -> _Tree:
    """A daemon's ``show running-config`` as a tree: a line's children are the deeper-indented
    lines after it (FRR indents each nested node one more space: ``router bgp`` >
    ``address-family ipv6 unicast`` > ``neighbor X activate``); separators and closing lines
    (:data:`FRR_NOISE`) are left out."""
    root: _Tree = {}
    stack: list[tuple[int, _Tree]] = [(-1, root)]
    for raw in text.splitlines():
        line = raw.rstrip()
        body = line.strip()
        if not body or body in FRR_NOISE:
            continue
        indent = len(line) - len(line.lstrip(" "))
        while stack[-1][0] >= indent:
            stack.pop()
        child: _Tree = stack[-1][1].setdefault(body, {})
        stack.append((indent, child))
    return root


@functools.lru_cache(maxsize=1024)
def daemon_config_lines(text: str) -> frozenset[tuple[str, ...]]:
    """A daemon's own running configuration as the set of its lines, each with the lines it is
    nested in (``("router bgp 64500", "address-family ipv6 unicast", "neighbor X activate")``):
    equal for two configurations exactly when they hold the same lines in the same places,
    whatever their order (cached: reset compares the same baseline texts again and again)."""
    return _tree_lines(_daemon_tree(text))


def frr_daemons_differ(have: dict[str, str], want: dict[str, str]) -> list[str]:
    """The daemons whose own running configuration differs between ``have`` and ``want`` (daemon
    name -> its ``show running-config``, as :meth:`substrate.lab.Lab.frr_daemon_configs` reads
    them), a daemon present in only one of them included; sorted."""
    return sorted(d for d in set(have) | set(want)
                  if d not in have or d not in want or daemon_config_lines(have[d]) != daemon_config_lines(want[d]))


def frr_daemon_delta(have: str, want: str) -> list[str]:
    """The commands, for one daemon's vty session, that turn its own running configuration
    ``have`` into ``want`` (both its ``show running-config``): ``configure terminal``, then per
    level of the configuration tree the lines gone (``no LINE``; a stanza gone as ``no HEAD``,
    except an interface's, or a nested one's, whose lines are undone one by one: FRR deletes
    neither an interface that exists nor e.g. an address family that way), then the lines
    missing, each after the lines it is nested in; ``end``. Removals come first: changing a
    single-valued line (a description, a timer) is its old value's ``no`` then the new value.

    After a line that may have entered a node (a line under a stanza, or one added), ``end`` and
    ``configure terminal`` return to the configuration node: a stanza head sent alone (a
    route-map entry without match lines) enters its node silently. FRR has changes this cannot
    make in one go (``no neighbor X remote-as`` deletes the neighbor's other lines too):
    :func:`restore` captures again and repeats, then falls back to ``frr-reload`` and a restart.
    """
    ops: list[tuple[tuple[str, ...], str, bool]] = []  # (context, line, may enter a node)

    def undo(ctx: tuple[str, ...], line: str, sub: _Tree) -> None:
        if sub and (ctx or line.split(" ", 1)[0] == "interface"):
            for child, grand in sub.items():
                undo((*ctx, line), child, grand)
        else:
            ops.append((ctx, frr_negate(line), bool(ctx)))

    def add(ctx: tuple[str, ...], line: str, sub: _Tree) -> None:
        ops.append((ctx, line, True))
        for child, grand in sub.items():
            add((*ctx, line), child, grand)

    def walk(h: _Tree, w: _Tree, ctx: tuple[str, ...]) -> None:
        for line, sub in h.items():
            if line not in w:
                undo(ctx, line, sub)
        for line, sub in w.items():
            if line not in h:
                add(ctx, line, sub)
            elif _tree_lines(h[line]) != _tree_lines(sub):
                walk(h[line], sub, (*ctx, line))

    walk(_daemon_tree(have), _daemon_tree(want), ())
    if not ops:
        return []
    out = ["configure terminal"]
    for k, (ctx, line, enters) in enumerate(ops):
        out += [*ctx, line]
        if enters and k < len(ops) - 1:
            out += ["end", "configure terminal"]
    return [*out, "end"]


def _frr_path(tree: _Tree, head: str, line: str) -> tuple[str, ...] | None:
    """Where FRR line ``line`` of stanza ``head`` ("" for a top-level line) sits in a daemon's
    configuration tree (:func:`_daemon_tree`): the lines it is nested in, then itself; found at
    any depth under ``head`` (first match, depth first), None when the daemon does not hold it."""
    if not head:
        return (line,) if line in tree else None
    if head not in tree:
        return None

    def find(t: _Tree, ctx: tuple[str, ...]) -> tuple[str, ...] | None:
        for ln, sub in t.items():
            if ln == line:
                return (*ctx, ln)
            if (got := find(sub, (*ctx, ln))) is not None:
                return got
        return None

    return find(tree[head], (head,))


def frr_subtree(text: str, head: str, line: str) -> str:
    """The part of one daemon's ``show running-config`` ``text`` that is FRR line ``line`` of
    stanza ``head`` ("" for a top-level line; a stanza's line is found at any depth under it, as
    :class:`substrate.journal.FrrView` flattens nesting): the lines it is nested in, itself and
    every line nested under it, as configuration text indented as FRR shows it (one space per
    level), which :func:`frr_daemon_delta` takes. "" when the daemon does not hold the line."""
    tree = _daemon_tree(text)
    path = _frr_path(tree, head, line)
    if path is None:
        return ""
    node = tree
    for ln in path:
        node = node[ln]
    out = [" " * i + ln for i, ln in enumerate(path)]

    def emit(t: _Tree, depth: int) -> None:
        for ln, sub in t.items():
            out.append(" " * depth + ln)
            emit(sub, depth + 1)

    emit(node, len(path))
    return "\n".join(out) + "\n"


def frr_nested(text: str, head: str, line: str) -> bool:
    """Whether FRR line ``line`` of stanza ``head`` has lines nested under it in one daemon's
    ``show running-config`` ``text`` (a stanza head with its lines, ``address-family`` under
    ``router bgp``): negating it deletes them too (``no route-map X permit 10``)."""
    tree = _daemon_tree(text)
    path = _frr_path(tree, head, line)
    if path is None:
        return False
    node = tree
    for ln in path:
        node = node[ln]
    return bool(node)


def _tree_lines(tree: _Tree) -> frozenset[tuple[str, ...]]:
    """:func:`daemon_config_lines` of a subtree."""
    out: set[tuple[str, ...]] = set()

    def walk(t: _Tree, ctx: tuple[str, ...]) -> None:
        for line, sub in t.items():
            out.add((*ctx, line))
            walk(sub, (*ctx, line))

    walk(tree, ())
    return frozenset(out)


def _link_text(x: LinkState | None, y: LinkState | None) -> str:
    if x is None or y is None:
        def one(s: LinkState | None) -> str:
            return "absent" if s is None else f"{s.kind or 'dev'} {'up' if s.up else 'down'} mtu {s.mtu}"

        return f"{one(x)} -> {one(y)}"
    dx, dy = x.model_dump(), y.model_dump()
    return ", ".join(f"{k} {dx[k]!r} -> {dy[k]!r}" for k in dx if dx[k] != dy[k])


def normalize_nft(text: str) -> str:
    """nftables ruleset text without what changes with traffic: counter values, quota usage,
    set-element expiry."""
    text = re.sub(r"counter packets \d+ bytes \d+", "counter", text)
    text = re.sub(r"(quota (?:over )?\d+ \w+) used \d+ \w+", r"\1", text)
    text = re.sub(r" expires \S+", "", text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def normalize_frr(text: str) -> str:
    """FRR running-config without the banner lines vtysh prints before ``frr version``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("frr version"):
            return "\n".join(lines[i:]).strip() + "\n"
    return text.strip() + "\n"


# -- canonical forms -------------------------------------------------------------------------


def _num(v: Any, names: dict[str, str]) -> str:
    """A numeric iproute2 field as its number (names some callers use are mapped back)."""
    s = str(v)
    return s if s.isdigit() else names.get(s, s)


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


def _marker(key: str, value: Any) -> str:
    return f"?{key}={json.dumps(value, sort_keys=True, separators=(',', ':'))}"


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
    return _marker("encap", enc)


def _natural_scope(rtype: str, has_gateway: bool, family: int) -> str:
    """The scope ``ip route add`` gives a route when none is named (iproute2 ip/iproute.c)."""
    if family == 6:
        return "0"
    if rtype in ("2", "10"):
        return "254"
    if rtype in ("3", "5", "4"):
        return "253"
    if rtype in ("1", "0") and not has_gateway:
        return "253"
    return "0"


def _nexthop_text(nh: dict[str, Any]) -> str:
    seg = ["nexthop"]
    if nh.get("encap"):
        seg.append(_encap(nh))
    seg += [_gw(nh), f"dev {nh['dev']}" if "dev" in nh else ""]
    if nh.get("weight", 1) != 1:
        seg.append(f"weight {nh['weight']}")
    if "onlink" in (nh.get("flags") or []):
        seg.append("onlink")
    return " ".join(x for x in seg if x)


def _route_class(route: dict[str, Any]) -> str:
    """Who owns a route: ``frr`` (FRR's protocol numbers), ``kernel`` (protocol kernel: derived
    from addresses and links) or ``service`` (anyone else: services, agents)."""
    proto = _num(route.get("protocol", "3"), _PROTO_NUM)
    return "frr" if proto in FRR_PROTOCOLS else "kernel" if proto == "2" else "service"


def route_args(route: dict[str, Any], family: int, table: str = "main", *, owned: str = "service") -> str | None:
    """Canonical arguments of one ``ip -N -s -d -j route show table T`` entry, or None when the
    route is not of the ``owned`` class: ``"service"`` (routes services and agents add),
    ``"kernel"`` (derived from addresses and links: protocol kernel), ``"frr"`` (FRR's protocols;
    nexthops sorted, zebra's nexthop-object id left out).

    Key attributes come first (type, destination, source prefix, table, metric, protocol, TOS):
    ``route del`` needs exactly these (:func:`substrate.routes.route_key`), and putting the
    route's table before ``encap`` keeps it apart from a seg6local End.DT6 ``table`` parameter.
    Routes are read one table at a time (``table all`` output is split by its table key) because
    iproute2's JSON gives both tables the same key."""
    rtype = _num(route.get("type", "1"), _RTN_NUM)
    proto = _num(route.get("protocol", "3"), _PROTO_NUM)
    cls = "frr" if proto in FRR_PROTOCOLS else "kernel" if proto == "2" else "service"
    if cls != owned:
        return None
    table = _TABLES.get(_num(table, _TABLE_NUM), table)
    parts = [] if rtype == "1" else [_RTN.get(rtype, rtype)]
    parts.append(_dst(route, family))
    if route.get("src"):
        parts.append(f"from {route['src']}")
    if table != "main":
        parts.append(f"table {table}")
    if "metric" in route:
        parts.append(f"metric {route['metric']}")
    if proto != "3":
        parts.append(f"proto {_PROTO_NAMES.get(proto, proto)}")
    for key in ("tos", "dsfield"):
        if key in route:
            parts.append(f"tos {route[key]}")
    enc = _encap(route)
    if enc:
        parts.append(enc)
    if "nhid" in route and cls != "frr":
        parts.append(f"nhid {route['nhid']}")
    elif "nexthops" in route:
        hops = [_nexthop_text(nh) for nh in route["nexthops"]]
        parts += sorted(hops) if cls == "frr" else hops
    else:
        gw = _gw(route)
        if gw:
            parts.append(gw)
        if "dev" in route:
            parts.append(f"dev {route['dev']}")
        if "onlink" in (route.get("flags") or []):
            parts.append("onlink")
    if "prefsrc" in route:
        parts.append(f"src {route['prefsrc']}")
    scope = _num(route.get("scope", "0"), _SCOPE_NUM)
    if scope != _natural_scope(rtype, bool(_gw(route)), family):
        parts.append(f"scope {_SCOPES.get(scope, scope)}")
    if route.get("pref", "medium") != "medium":
        parts.append(f"pref {route['pref']}")
    for m in route.get("metrics") or []:
        for k, v in (m.items() if isinstance(m, dict) else []):
            if k == "ecn":
                parts.append("features ecn")
            elif k in _METRIC_WORDS:
                parts.append(f"{_METRIC_WORDS[k]} {v}" if v is not None else _METRIC_WORDS[k])
            else:
                parts.append(_marker(f"metric.{k}", v))
    if "expires" in route:
        parts.append("?expires")
    parts += [_marker(k, route[k]) for k in sorted(route) if k not in _ROUTE_KEYS]
    return " ".join(parts)


#: Protocol numbers written as names in canonical routes (unambiguous ones only).
_PROTO_NAMES = {"2": "kernel"}


def rule_protocol(value: Any) -> str:
    """A policy rule's protocol as :func:`rule_args` prints it (``kernel`` for 2, else its number;
    iproute2 names such as ``boot`` are read as their number), or "" for unspec (0)."""
    proto = _num(value, _PROTO_NUM)
    return "" if proto == "0" else _PROTO_NAMES.get(proto, proto)


def route_del_args(args: str) -> str:
    """The ``route del`` arguments of a route in canonical form (see :func:`substrate.routes.route_key`)."""
    return route_key(args)


def rule_args(rule: dict[str, Any]) -> str:
    """Canonical ``rule add`` arguments of one ``ip -N -d -j rule`` entry. The three default rules
    (local 0, main 32766, default 32767, protocol kernel) are state like any other: ``ip rule
    flush`` removes main and default, which cuts the node's own traffic off while tenant traffic
    still flows."""
    parts = [f"priority {rule.get('priority')}"]
    if "not" in rule:
        parts.append("not")
    if rule.get("src", "all") != "all":
        parts.append(f"from {rule['src']}/{rule['srclen']}" if "srclen" in rule else f"from {rule['src']}")
    if rule.get("dst", "all") != "all":
        parts.append(f"to {rule['dst']}/{rule['dstlen']}" if "dstlen" in rule else f"to {rule['dst']}")
    for key, word in (("iif", "iif"), ("oif", "oif"), ("ipproto", "ipproto"), ("tos", "tos"), ("dsfield", "tos"),
                      ("l3mdev", "l3mdev"), ("realms", "realms")):
        if key in rule:
            value = rule[key]
            # `ip -N` prints a protocol as ``ipproto-6``, which `ip rule` does not read back
            # (issue 36: a reset could not delete an agent's ``ipproto tcp`` rule)
            if key == "ipproto" and isinstance(value, str) and value.startswith("ipproto-"):
                value = value[len("ipproto-"):]
            parts.append(word if value is None else f"{word} {value}")
    if "fwmark" in rule:
        parts.append(f"fwmark {rule['fwmark']}" + (f"/{rule['fwmask']}" if "fwmask" in rule else ""))
    for key in ("sport", "dport"):
        if key in rule:
            parts.append(f"{key} {rule[key]}")
    if "uid_start" in rule:
        parts.append(f"uidrange {rule['uid_start']}-{rule.get('uid_end', rule['uid_start'])}")
    if "suppress_prefixlen" in rule:
        parts.append(f"suppress_prefixlength {rule['suppress_prefixlen']}")
    if "suppress_ifgroup" in rule:
        parts.append(f"suppress_ifgroup {rule['suppress_ifgroup']}")
    action = rule.get("action")
    action = _FR_ACT.get(str(action), action) if action is not None else None  # `ip -N` prints 8 for prohibit
    table = _num(rule.get("table", ""), _TABLE_NUM)
    if action in ("blackhole", "unreachable", "prohibit", "nop"):
        parts.append(action)
    elif action == "goto" or "target" in rule:
        parts.append(f"goto {rule.get('target')}")
    elif table:
        parts.append(f"lookup {_TABLES.get(table, table)}")
    proto = rule_protocol(rule.get("protocol", "0"))
    if proto:
        parts.append(f"protocol {proto}")
    parts += [_marker(k, rule[k]) for k in sorted(rule) if k not in _RULE_KEYS]
    return " ".join(parts)


def _natural_addr_scope(ip: str) -> str:
    if ip.startswith("127.") or ip == "::1":
        return "254"
    if ip.lower().startswith("fe8") or ip.lower().startswith("fe9") or ip.lower().startswith("fea") or ip.lower().startswith("feb"):
        return "253"
    return "0"


def _natural_broadcast(ip: str, prefixlen: int) -> str | None:
    """The broadcast address ``ip addr add ... brd +`` (and zebra) give an IPv4 address."""
    if ":" in ip or prefixlen > 30:
        return None
    return str(ipaddress.ip_interface(f"{ip}/{prefixlen}").network.broadcast_address)


def addr_args(ifname: str, ai: dict[str, Any]) -> str:
    """Canonical ``addr add`` arguments of one ``ip -N -d -j addr`` entry: ``ADDR/LEN dev IF``
    followed by what differs from a plain ``addr add`` (peer, a broadcast other than the
    network's, scope, label, flags,
    ``preferred_lft 0`` for a deprecated address); lifetimes other than forever and unknown
    attributes become ``?`` markers."""
    if "address" in ai and ai.get("address") != ai.get("local"):
        parts = [f"{ai['local']} peer {ai['address']}/{ai['prefixlen']} dev {ifname}"]
    else:
        parts = [f"{ai['local']}/{ai['prefixlen']} dev {ifname}"]
    if ai.get("broadcast") and ai["broadcast"] != _natural_broadcast(str(ai["local"]), int(ai["prefixlen"])):
        parts.append(f"brd {ai['broadcast']}")
    scope = _num(ai.get("scope", "0"), _SCOPE_NUM)
    if scope != _natural_addr_scope(str(ai["local"])):
        parts.append(f"scope {_SCOPES.get(scope, scope)}")
    if ai.get("label") and ai["label"] != ifname:
        parts.append(f"label {ai['label']}")
    parts += [f for f in _ADDR_FLAGS if ai.get(f)]
    if ai.get("deprecated") or ai.get("preferred_life_time") == 0:
        parts.append("preferred_lft 0")
    forever = 4294967295
    if ai.get("valid_life_time", forever) != forever or ai.get("preferred_life_time", forever) not in (forever, 0):
        parts.append("?lifetime=finite")
    if ai.get("dadfailed"):
        parts.append("?dadfailed")
    parts += [_marker(k, ai[k]) for k in sorted(ai) if k not in _ADDR_KEYS]
    return " ".join(parts)


def _addr_dev(args: str) -> str:
    words = args.split()
    return words[words.index("dev") + 1] if "dev" in words else ""


def _addr_del(args: str) -> str:
    """``addr del`` arguments of a canonical address (address, peer, device)."""
    words = args.split()
    return " ".join(words[: words.index("dev") + 2])


def _addr_add(args: str) -> str:
    """``addr add`` arguments of a canonical address (markers dropped; the kernel default
    lifetimes are forever)."""
    return " ".join(w for w in args.split() if not w.startswith("?"))


def _link_state(link: dict[str, Any]) -> LinkState:
    info = link.get("linkinfo") or {}
    data = {k: v for k, v in (info.get("info_data") or {}).items() if not _VOLATILE_INFO.match(k)}
    extra = {k: v for k, v in link.items() if k not in _LINK_IGNORED}
    if info.get("info_slave_kind"):
        extra["slave_kind"] = info["info_slave_kind"]
    kind = info.get("info_kind", "")
    own_carrier = kind in _OWN_CARRIER
    return LinkState(
        kind=kind, up="UP" in link.get("flags", []), mtu=link.get("mtu", 0),
        address="" if own_carrier else link.get("address", ""),
        carrier=("LOWER_UP" in link.get("flags", [])) if own_carrier else None,
        txqlen=link.get("txqlen"), group=str(link.get("group", "")),
        alias=link.get("ifalias", ""), flags=sorted(f for f in link.get("flags", []) if f in _LINK_FLAGS),
        addrgenmode=link.get("inet6_addr_gen_mode", ""), master=link.get("master", ""), linkmode=link.get("linkmode", ""),
        protodown=bool(link.get("proto_down")), info=data, extra=extra,
        offload={k: link[k] for k in ("gso_max_size", "gso_max_segs", "gro_max_size", "gso_ipv4_max_size", "gro_ipv4_max_size")
                 if k in link},
    )  # fmt: skip


def _multicast(address: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(address).is_multicast
    return False


def _neigh_args(n: dict[str, Any]) -> str | None:
    if "proxy" in n:
        return f"proxy {n['dst']} dev {n['dev']}"
    state = set(n.get("state") or [])
    if not state & _NEIGH_KEEP or not n.get("dst") or not n.get("dev"):
        return None
    if "PERMANENT" not in state and _multicast(n["dst"]):
        # the kernel's own: ndisc and ARP map a multicast address to its MAC by rule (RFC 2464
        # section 7, RFC 1112 section 6.4) in a no-ARP entry made on first use and collected later
        return None
    parts = [f"{n['dst']} dev {n['dev']}"]
    if n.get("lladdr"):
        parts.append(f"lladdr {n['lladdr']}")
    parts.append("nud permanent" if "PERMANENT" in state else "nud noarp")
    if "router" in n:
        parts.append("router")
    if "extern_learn" in n:
        parts.append("extern_learn")
    return " ".join(parts)


def _nexthop_args(nh: dict[str, Any]) -> str | None:
    """Canonical ``nexthop add`` arguments of an ``ip -N -d -j nexthop`` object, or None for
    zebra's own (protocol 11: zebra manages them with the routes that use them)."""
    proto = _num(nh.get("protocol", "0"), _PROTO_NUM)
    if proto == "11":
        return None
    parts = [f"id {nh['id']}"]
    if nh.get("group"):
        parts.append("group " + "/".join(f"{g['id']}" + (f",{g['weight']}" if g.get("weight", 1) != 1 else "") for g in nh["group"]))
    if nh.get("encap"):
        parts.append(_encap(nh))
    gw = _gw(nh)
    if gw:
        parts.append(gw)
    if nh.get("dev"):
        parts.append(f"dev {nh['dev']}")
    if "blackhole" in nh:
        parts.append("blackhole")
    if "fdb" in nh:
        parts.append("fdb")
    if "onlink" in (nh.get("flags") or []):
        parts.append("onlink")
    if proto not in ("0", "3"):
        parts.append(f"proto {proto}")
    return " ".join(parts)


def _qdisc_args(q: dict[str, Any]) -> str:
    if q.get("root"):
        where = "root"
    elif q.get("parent") in ("ffff:fff1",) or q.get("kind") in ("ingress", "clsact"):
        where = "ingress" if q.get("kind") == "ingress" else "clsact"
    else:
        where = f"parent {q.get('parent')}"
    opts = json.dumps(q.get("options") or {}, sort_keys=True, separators=(",", ":"))
    return f"dev {q.get('dev')} {where} {q.get('kind')} handle {q.get('handle')} {opts}"


def _default_qdisc(args: str) -> bool:
    """The qdisc a device gets by itself (a ``noqueue`` root)."""
    words = args.split()
    return len(words) > 3 and words[2] == "root" and words[3] == "noqueue"


# -- capture ---------------------------------------------------------------------------------


def _sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for chunk in text.split(_SEP)[1:]:
        name, _, body = chunk.partition("\n")
        out[name.strip()] = body
    return out


#: ``ip xfrm policy getdefault`` when every default policy accepts (the kernel's default).
_XFRM_DEFAULT = "Default policies:\n in:  accept\n fwd: accept\n out: accept"


def normalize_xfrm(text: str) -> str:
    """The capture's xfrm section: empty when there is no state or policy and every default
    policy accepts."""
    text = "\n".join(ln.rstrip() for ln in text.strip().splitlines() if ln.strip())
    return "" if text == _XFRM_DEFAULT else text


def _split_objs(text: str) -> tuple[str, str]:
    """The capture's ``ip`` section as (its JSON documents, ``ip mptcp limits show``'s line): the
    batch ends with that command, which prints text even under ``-j`` (iproute2 6.1); each JSON
    document is one line."""
    lines = text.strip().splitlines()
    docs = [ln for ln in lines if ln.lstrip().startswith(("[", "{"))]
    return "\n".join(docs), "\n".join(ln for ln in lines if ln.strip() and not ln.lstrip().startswith(("[", "{")))


def net_objects(docs: list[Any], mptcp_limits: str) -> list[str]:
    """:attr:`DeviceState.net_objects` from the ``ip -j`` addrlabel, maddr and mptcp endpoint
    listings (in that order, the last documents of the capture's ``ip`` section; a kernel
    without MPTCP prints no third) and ``ip mptcp limits show``. Only static multicast link
    addresses count: the others are joined and left by the kernel and by sockets (IS-IS's,
    neighbour discovery's)."""
    out = [f"addrlabel add prefix {x['address']}/{x['prefixlen']} label {x['label']}" for x in (docs[0] if docs else [])]
    for iface in docs[1] if len(docs) > 1 else []:
        out += [f"maddr add {m['link']} dev {iface['ifname']}" for m in iface.get("maddr", [])
                if m.get("features") == "static" and "link" in m]  # fmt: skip
    for e in docs[2] if len(docs) > 2 else []:
        flags = [f for f in ("signal", "subflow", "backup", "fullmesh") if e.get(f)]
        out.append(" ".join(["mptcp endpoint add", str(e["address"]), *([f"port {e['port']}"] if e.get("port") else []),
                             "id", str(e["id"]), *flags, *([f"dev {e['dev']}"] if e.get("dev") else [])]))  # fmt: skip
    words = mptcp_limits.split()
    if words:
        limits = dict(zip(words[::2], words[1::2], strict=False))
        out.append(f"mptcp limits set subflow {limits.get('subflows', '0')} add_addr_accepted {limits.get('add_addr_accepted', '0')}")
    return sorted(out)


def normalize_xtables(text: str) -> str:
    """The capture's legacy x_tables section without comments and counters, and without tables
    that hold no rule and no chain of their own and accept by default (what a table looks like
    once used and flushed: the kernel keeps it registered)."""
    out: list[str] = []
    table: list[str] = []
    fam = ""

    def close() -> None:
        if any(ln.startswith("-A ") or (ln.startswith(":") and not ln.split()[1:2] == ["ACCEPT"]) for ln in table):
            out.extend(table)

    for raw in text.splitlines():
        ln = re.sub(r"\s*\[\d+:\d+\]$", "", raw.strip())
        if not ln or ln.startswith("#"):
            continue
        if ln.startswith("@"):
            fam = ln
            continue
        if ln.startswith("*"):
            table = [fam, ln]
        elif ln == "COMMIT":
            table.append(ln)
            close()
            table = []
        else:
            table.append(ln)
    return "\n".join(out)


def _json(text: str) -> Any:
    text = text.strip()
    return json.loads(text) if text else []


def _route_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A route object of ``ip -j route`` as a dict. iproute2 gives a seg6local End.DT6 ``table``
    parameter and the route's own ``table`` the same key; the route's is the one after ``dev``
    (or the only one when the route is not a seg6local with a table parameter), kept as
    ``#table``."""
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k == "table" and ("dev" in d or d.get("encap") != "seg6local" or "table" in d):
            d["#table"] = v
        else:
            d[k] = v
    return d


_ROUTE_DECODER = json.JSONDecoder(object_pairs_hook=_route_object)
_DECODER = json.JSONDecoder()


def _json_seq(text: str, route_docs: Iterable[int] = ()) -> list[Any]:
    """The JSON documents ``ip -j -batch`` printed one after another; those at the positions
    ``route_docs`` are routes (see :func:`_route_object`)."""
    routes = set(route_docs)
    out, i, text = [], 0, text.strip()
    while i < len(text):
        doc, end = (_ROUTE_DECODER if len(out) in routes else _DECODER).raw_decode(text, i)
        out.append(doc)
        i = end
        while i < len(text) and text[i].isspace():
            i += 1
    return out


def _route_dict(route: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A route object (:func:`_route_object`) without its own table, and that table."""
    d = dict(route)
    return d, str(d.pop("#table", "254"))


#: Read-only sysctls of the running kernel, with interface names replaced by ``*`` (learnt from
#: the first capture of the process: the same for every node and lab).
_READONLY: set[str] | None = None


def _sysctl_pattern(key: str) -> str:
    if "/conf/" not in key and "/neigh/" not in key:
        return key
    parts = key.split("/")
    if len(parts) >= 5 and parts[2] in ("conf", "neigh"):
        parts[3] = "*"
    return "/".join(parts)


def _learn_readonly(find_output: str) -> None:
    global _READONLY
    _READONLY = {_sysctl_pattern(ln.strip()[10:]) for ln in find_output.splitlines() if ln.startswith("/proc/sys/")}


def _sysctls(text: str) -> dict[str, str]:
    """``grep -r . /proc/sys/net`` output as {path under /proc/sys: value}, without the
    read-only entries (counters and limits no command in the node can change)."""
    ro = _READONLY or set()
    out: dict[str, str] = {}
    for line in text.splitlines():
        path, sep, value = line.partition(":")
        if not sep or not path.startswith("/proc/sys/"):
            continue
        key = path[10:]
        if _sysctl_pattern(key) in ro:
            continue
        out[key] = f"{out[key]}\n{value}" if key in out else value
    return out


def parse_capture(node: str, text: str, with_frr: bool, *, router: bool = True) -> DeviceState:
    """Build a DeviceState from the capture script's output. On a node without FRR
    (``router`` false) a route with an FRR protocol number is an ordinary route someone added.

    Raises:
        SnapshotError: a section is missing or unreadable.
    """
    sec = _sections(text)
    try:
        state = DeviceState(node=node)
        addrs: list[tuple[str, list[dict[str, Any]]]] = []
        kernel: list[str] = []
        frr: list[str] = []
        docs_text, mptcp_limits = _split_objs(sec["ip"])
        docs = _json_seq(docs_text, route_docs=(0, 1))
        named = dict(zip(_IP_DOCS, docs, strict=False))
        if len(docs) < len(_IP_DOCS):
            raise ValueError(f"ip printed {len(docs)} documents, {len(_IP_DOCS)} expected")
        for n in [*named["neigh"], *named["proxy"]]:
            args = _neigh_args(n)
            if args:
                state.neighbors.append(args)
        for fam in (6, 4):
            routes = []
            for obj in named[f"routes{fam}"]:
                route, table = _route_dict(obj)
                cls = _route_class(route)
                if cls == "frr" and not router:
                    cls = "service"  # no FRR here: someone added it
                args = route_args(route, fam, table, owned=_route_class(route))
                if cls == "service":
                    routes.append(args)
                elif cls == "kernel":
                    kernel.append(f"-{fam} {args}")
                else:
                    frr.append(f"-{fam} {args}")
            setattr(state, f"routes{fam}", sorted({r for r in routes if r}))
        state.rules4 = [rule_args(r) for r in named["rules4"]]
        state.rules6 = [rule_args(r) for r in _json(sec["rule6"])]
        for iface in named["addr"]:
            addrs.append((iface["ifname"], iface.get("addr_info", [])))
        state.kernel_routes = sorted(set(kernel))
        state.frr_routes = sorted(set(frr))
        for ifname, infos in addrs:
            for ai in infos:
                args = addr_args(ifname, ai)
                local = str(ai.get("local", ""))
                host = _natural_addr_scope(local) != "0"
                (state.host_addresses if host else state.addresses).append(args)
        state.host_addresses.sort()
        for link in named["link"]:
            state.links[link["ifname"]] = _link_state(link)
        extra = docs[len(_IP_DOCS):]
        # the SRv6 source is always printed (one object): it and the HMAC keys after it end the
        # nexthop and SRv6 documents; the per-namespace object listings follow
        k = next((i for i, d in enumerate(extra) if isinstance(d, list) and len(d) == 1 and isinstance(d[0], dict)
                  and "tunsrc" in d[0]), None)  # fmt: skip
        if k is None and extra:
            raise ValueError("ip printed no SRv6 tunnel source (ip sr tunsrc show)")
        srv6, objs = (extra[: k + 2], extra[k + 2 :]) if k is not None else ([], [])
        for doc in srv6:
            for x in doc:
                if "tunsrc" in x:
                    state.tunsrc = "" if x["tunsrc"] == "::" else str(x["tunsrc"])
                elif "hmac" in x:
                    state.hmac.append(f"{x['hmac']} {x.get('algo')} {x.get('secret', '')}")
                elif "id" in x:
                    args = _nexthop_args(x)
                    if args:
                        state.nexthops.append(args)
        state.nft = sec["nft"].strip()
        state.xtables = normalize_xtables(sec.get("xt", ""))
        state.xfrm = normalize_xfrm(sec.get("xfrm", ""))
        state.net_objects = net_objects(objs, mptcp_limits)
        if "ro" in sec:
            _learn_readonly(sec["ro"])
        values = _sysctls(sec["sysctl"])
        state.sysctls = {k: v for k, v in values.items() if not _per_interface(k)}
        # the eBPF data plane's own devices are not the node's configuration (substrate.dataplane)
        state.iface_sysctls = {k: v for k, v in values.items() if _per_interface(k) and not own_device(_sysctl_iface(k) or "")}
        state.qdiscs = sorted(_qdisc_args(q) for q in _json(sec.get("tc", "")) if not own_device(str(q.get("dev", ""))))
        if with_frr:
            frr_text = sec.get("frr", "")
            state.frr_config = normalize_frr(frr_text) if "frr version" in frr_text else None
        return state
    except (KeyError, ValueError, IndexError, TypeError) as e:
        raise SnapshotError(f"{node}: cannot parse device state ({type(e).__name__}: {e})") from None


def capture(lab: Lab, node: str, *, frr: bool | str = True, sysctls: str = "full", timeout_s: float = 60.0,
            prelude: str = "") -> DeviceState:
    """Capture one node's state: one command inside the node for most of the kernel, reads from
    the host process in the node's network namespace for its nftables ruleset
    (:func:`host_sections`) and IPsec state (:func:`substrate.netlink.xfrm_empty`), two netlink
    dumps for per-interface settings, the FRR daemons' vty sockets for their configurations.

    Args:
        frr: ``True`` (or ``"full"``): FRR's merged running configuration through vtysh and
            each daemon's own; ``"fast"``: each daemon's own only (no vtysh: what reset needs
            to tell whether FRR changed, at a fraction of the cost); ``False``: the kernel state
            only, so it works on a node whose FRR is frozen.
        sysctls: ``"full"``: every writable sysctl file (a state to restore to later: a
            baseline, a snapshot); ``"fast"``: per-interface ones compared through netlink only
            (enough to tell whether the node changed; :func:`restore` reads the files of an
            interface whose settings changed).
        timeout_s: deadline of the capture command.
        prelude: shell run in the node before the capture, in the same command (lab reset
            revives the node this way); its output ends before the first section.

    Raises:
        NodeNotFoundError, SnapshotError.
    """
    return capture_with_prelude(lab, node, frr=frr, sysctls=sysctls, timeout_s=timeout_s, prelude=prelude)[0]


def capture_with_prelude(lab: Lab, node: str, *, frr: bool | str = True, sysctls: str = "full", timeout_s: float = 60.0,
                         prelude: str = "") -> tuple[DeviceState, str]:
    """:func:`capture`, also returning what ``prelude`` printed."""
    from substrate import netlink

    router = lab.state(node).role is not Role.HOST
    full = router and frr in (True, "full")
    try:  # three netlink requests instead of an ip process in the node, when nobody configured IPsec
        no_ipsec = netlink.xfrm_empty(f"/run/netns/{lab.state(node).netns}")
    except netlink.NetlinkError:
        no_ipsec = False  # the script reads it, and says why it cannot
    script = (prelude + (_CAPTURE_SCRIPT_NO_XFRM if no_ipsec else _CAPTURE_SCRIPT)
              + (_SYSCTL_FULL if sysctls == "full" else _SYSCTL_FAST) + (_READONLY_SECTION if _READONLY is None else "") + (_FRR_SECTION if full else ""))
    r = lab.sh(node, script, timeout_s=timeout_s, max_output=16 << 20)
    if r.timed_out:
        ps = lab.exec(node, ["ps", "-eo", "pid,stat,etime,args"], timeout_s=5)
        raise SnapshotError(f"{node}: state capture timed out after {timeout_s:g} s (node frozen?); its processes: "
                            + " | ".join(ln.strip() for ln in ps.stdout.splitlines()[1:])[:800])
    head, _, _ = r.stdout.partition(_SEP)
    text = r.stdout + host_sections(lab, node) + (f"{_SEP}xfrm\n{_XFRM_DEFAULT}\n" if no_ipsec else "")
    state = parse_capture(node, text, with_frr=full, router=router)
    try:
        link_settings, neigh_settings = netlink.settings(f"/run/netns/{lab.state(node).netns}")
        state.link_settings = {k: v for k, v in link_settings.items() if not own_device(k.split("/")[-1])}
        state.neigh_settings = {k: v for k, v in neigh_settings.items() if not own_device(k.split("/")[-1])}
    except netlink.NetlinkError as e:
        raise SnapshotError(f"{node}: {e}") from None
    if router and frr:
        state.frr_daemons = lab.frr_daemon_configs(node, timeout_s=min(5.0, timeout_s))
    return state, head


def host_sections(lab: Lab, node: str, *, nft: bool = True) -> str:
    """The capture's :data:`HOST_SECTIONS` as the script would print them (to append to its
    output before :func:`parse_capture`), read from the host process in the node's network
    namespace (:mod:`substrate.nsread`): the nftables ruleset (``nft list ruleset 2>&1``; empty
    when ``nft`` is false).

    Raises:
        SnapshotError: the node's namespace could not be read (or libnftables is missing).
    """
    from substrate import nsread

    try:
        ruleset = nsread.nft_ruleset(f"/run/netns/{lab.state(node).netns}") if nft else ""
    except nsread.NamespaceReadError as e:
        raise SnapshotError(f"{node}: {e}") from None
    return f"{_SEP}nft\n{ruleset}"


def capture_frr_routes(lab: Lab, node: str, *, timeout_s: float = 10.0) -> list[str]:
    """The routes FRR installed on ``node`` (:attr:`DeviceState.frr_routes`), read alone: what
    a reset polls while the underlay settles.

    Raises:
        SnapshotError: the routing table could not be read.
    """
    r = lab.exec(node, ["ip", "-N", "-d", "-j", "-batch", "-"], input="route show table all root ::/0\nroute show table all root 0.0.0.0/0\n",
                 timeout_s=timeout_s, max_output=16 << 20)
    if not r.ok:
        raise SnapshotError(f"{node}: cannot read the routing tables: {r.summary()}")
    try:
        docs = _json_seq(r.stdout, route_docs=(0, 1))
        out = set()
        for fam, doc in zip((6, 4), docs, strict=True):
            for obj in doc:
                route, table = _route_dict(obj)
                f = route_args(route, fam, table, owned="frr")
                if f:
                    out.add(f"-{fam} {f}")
        return sorted(out)
    except (ValueError, TypeError, KeyError) as e:
        raise SnapshotError(f"{node}: cannot parse the routing tables ({e})") from None


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
    final: DeviceState | None = Field(default=None, exclude=True, description="The node's last capture (not serialised).")


def _batch(lab: Lab, node: str, argv: list[str], lines: list[str], *, deleting: bool = False) -> list[str]:
    """Run a batch command (``ip -force -batch -``, ``tc -force -batch -``); error lines returned.
    When ``deleting``, an object already gone ("No such process", "No such file", "Cannot find")
    is not an error."""
    if not lines:
        return []
    r = lab.exec(node, argv, input="\n".join(lines) + "\n", timeout_s=20)
    if r.ok:
        return []
    errs = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("Command failed")]
    if deleting:
        gone = ("No such process", "No such file or directory", "Cannot find", "does not exist", "Nexthop id does not exist")
        errs = [ln for ln in errs if not any(g in ln for g in gone)]
    return [f"{' '.join(argv[:2])} batch: {' | '.join(errs)[:500]}"] if errs else []


def _ip(lab: Lab, node: str, lines: list[str], family: int | None = None, *, deleting: bool = False) -> list[str]:
    argv = ["ip", *([f"-{family}"] if family else []), "-force", "-batch", "-"]
    return _batch(lab, node, argv, lines, deleting=deleting)


def restore(lab: Lab, target: DeviceState, current: DeviceState | None = None, *, verify: bool = True) -> RestoreReport:
    """Make ``target.node`` equal to ``target`` again, changing only what differs.

    Order: FRR configuration (``frr-reload.py --reload``, FRR's own tool for moving a running
    config to a target file; zebra then adds or removes the addresses it owns), then against a
    fresh capture the kernel state (:func:`_apply_kernel`). With ``verify``, the node is captured
    again and what still differs is repaired again, up to :data:`RESTORE_PASSES` passes; if FRR
    cannot be moved to the target by frr-reload, FRR is restarted from it. A deleted veth cannot
    be re-created from one node (its peer is elsewhere): it is reported in ``residual`` for the
    lab-level repair. FRR routes (dynamic) are not restored here: see lab reset.

    Args:
        lab: the lab.
        target: the state to return to (from :func:`capture`).
        current: the node's present state if already captured (saves one capture).
        verify: capture again afterwards, repeat, and report residual differences.

    Raises:
        NodeNotFoundError, SnapshotError (capture failed).
    """
    t0 = time.monotonic()
    node = target.node
    mode: bool | str = "fast" if target.frr_daemons is not None else (target.frr_config is not None)
    cur = current or capture(lab, node, frr=mode, sysctls="fast")
    rep = RestoreReport(node=node, changed=False)
    rep.final = cur
    if cur.same_as(target):
        rep.seconds = time.monotonic() - t0
        return rep
    rep.changed = True
    errors: list[str] = []
    # FRR's ways back, each tried when the one before did not get there: each differing daemon's
    # own configuration delta on its vty socket (fast: one session per daemon); frr-reload.py
    # (FRR's own tool: zebra refuses some deltas, e.g. an IPv4 address configured on two ports);
    # an FRR restart (a daemon missing), as an operator would. The delta is tried twice (a line
    # it removes can take others with it, which the second pass puts back), and once more after
    # frr-reload: frr-reload works on vtysh's merged view, blind to a daemon that alone differs
    frr_steps = ["delta", "delta", "reload", "delta", "restart"] if cur.frr_daemons is not None and \
        target.frr_daemons is not None and sorted(cur.frr_daemons) == sorted(target.frr_daemons) else ["reload", "restart"]  # fmt: skip
    for _attempt in range(RESTORE_PASSES if verify else 1):
        errors = []
        fresh = False  # cur was captured after the last change made: it serves as the verification
        # FRR first: zebra owns the addresses its configuration names, and removes them from the
        # kernel itself; the kernel diff is then taken against what FRR left
        if target.frr_config is not None and not cur.frr_same(target) and (cur.frr_config is not None or cur.frr_daemons) \
                and frr_steps:  # fmt: skip
            step = frr_steps.pop(0)
            if step == "delta":
                errors += _frr_daemon_restore(lab, node, cur.frr_daemons or {}, target.frr_daemons or {}, rep)
            elif step == "reload":
                rep.actions.append("frr-reload to target running-config")
                errors += restore_frr(lab, node, target.frr_config)
            else:
                rep.actions.append("FRR restarted from the target configuration")
                errors += restart_frr(lab, node, target.frr_config)
            cur = capture(lab, node, frr=mode, sysctls="fast")
            fresh = True
        if not cur.same_as(target):
            errors += _apply_kernel(lab, cur, target, rep)
            fresh = False
        if not verify:
            break
        if not fresh:
            cur = capture(lab, node, frr=mode, sysctls="fast")
        if cur.same_as(target):
            errors = []
            break
    rep.residual = errors + cur.diff(target) if verify and (errors or not cur.same_as(target)) else errors
    rep.final = cur if verify else None
    rep.seconds = time.monotonic() - t0
    return rep


def _frr_daemon_restore(lab: Lab, node: str, have: dict[str, str], want: dict[str, str], rep: RestoreReport) -> list[str]:
    """Send each daemon whose own configuration differs (:func:`frr_daemons_differ`) its delta
    (:func:`frr_daemon_delta`) on its vty socket, one session per daemon, to that daemon only.
    Actions are recorded as ``frr DAEMON: LINE`` (without the mode changes); returns error
    lines (a command the daemon refused, a daemon that did not answer)."""
    from substrate.vty import VtyError

    errors: list[str] = []
    for d in frr_daemons_differ(have, want):
        cmds = frr_daemon_delta(have.get(d, ""), want.get(d, ""))
        if not cmds:
            continue
        rep.actions += [f"frr {d}: {x}" for x in cmds if x not in ("configure terminal", "end")]
        try:
            answers = lab.vty(node, d, *cmds, timeout_s=10)
        except VtyError as e:
            errors.append(f"frr {d}: {e}")
            continue
        errors += [f"frr {d}: {cmd!r} refused: {out.strip()[:200]}" for cmd, (out, status) in zip(cmds, answers, strict=True)
                   if status != 0]
    return errors


def _order_sysctls(keys: Iterable[str]) -> list[str]:
    """Global and ``all``/``default`` sysctls before per-interface ones (writing ``all`` changes
    every interface's value; ``ip_forward`` changes every ``forwarding``)."""
    def rank(k: str) -> tuple[int, str]:
        if k in ("net/ipv4/ip_forward",):
            return 0, k
        iface = _sysctl_iface(k)
        return (1 if iface in ("all",) else 2 if iface == "default" else 3 if iface is None else 4), k

    return sorted(keys, key=rank)


def _apply_kernel(lab: Lab, cur: DeviceState, target: DeviceState, rep: RestoreReport) -> list[str]:  # noqa: C901
    """One repair pass of the kernel state of ``cur`` towards ``target``; error lines returned."""
    node = target.node
    errors: list[str] = []
    # -- links: remove what the target lacks, create missing virtual devices, set attributes
    link_lines: list[str] = []
    deleted = [n for n in cur.links if n not in target.links]
    if deleted:  # (deleting one end of a veth pair deletes the other: "Cannot find device" is fine)
        rep.actions += [f"link del {name}" for name in deleted]
        errors += _ip(lab, node, [f"link del {name}" for name in deleted], deleting=True)
    created: set[str] = set()
    for name, want in target.links.items():
        have = cur.links.get(name)
        if have is not None and have.kind == "bridge" == want.kind and (have.info != want.info or have.carrier != want.carrier):
            # bridge parameters or a MAC set by hand (the carrier shows it): re-create the device
            link_lines.append(f"link del {name}")
            have = None
        if have is None:
            if want.kind == "bridge":
                link_lines.append(f"link add {name} type bridge")
                created.add(name)
                have = LinkState(kind=want.kind, up=False, mtu=0, info=want.info, carrier=want.carrier)
            else:
                errors.append(f"link {name} ({want.kind or 'device'}) is missing and cannot be re-created on one node")
                continue
        link_lines += _link_set_lines(name, have, want)
    if link_lines:
        rep.actions += link_lines
        errors += _ip(lab, node, link_lines)
    # -- sysctls (after links: a re-created device starts with defaults; before addresses: an
    # address cannot go back on an interface whose IPv6 is disabled)
    existing = set(target.links) & (set(cur.links) | created)
    # an interface whose settings (netlink) differ, or re-created: its files say which to write
    moved = {i for i in existing if i in created or cur.link_settings.get(i) != target.link_settings.get(i)}
    moved |= {k.split("/")[-1] for k in set(cur.neigh_settings) | set(target.neigh_settings)
              if cur.neigh_settings.get(k) != target.neigh_settings.get(k) and k.split("/")[-1] in existing}
    values = dict(cur.sysctls)
    if moved:
        have_files = {i for i in moved if i not in created and any(_sysctl_iface(k) == i for k in cur.iface_sysctls)}
        values |= {k: v for k, v in cur.iface_sysctls.items() if _sysctl_iface(k) in have_files}
        values |= _interface_sysctls(lab, node, moved - have_files)
        lacking = sorted(i for i in moved if not any(_sysctl_iface(k) == i for k in target.iface_sysctls))
        errors += [f"the settings of {i} differ, and the target state holds no sysctl values for it (a fast capture)"
                   for i in lacking]
    want = target.sysctls | {k: v for k, v in target.iface_sysctls.items() if _sysctl_iface(k) in moved}
    changed = {k: v for k, v in want.items() if values.get(k) != v}
    errors += _write_sysctls(lab, node, {k: changed[k] for k in _order_sysctls(changed)}, rep)
    # -- addresses
    n_before = len(rep.actions)
    errors += _apply_addresses(lab, cur, target, rep, skip_devs=set(deleted))
    # -- kernel-derived routes: the kernel re-derives them when links, sysctls or addresses
    # change, so they are repaired only in a pass where those were already right (else the next
    # pass sees what the kernel derived)
    if not link_lines and not deleted and not changed and not moved and len(rep.actions) == n_before:
        errors += _apply_kernel_routes(lab, cur, target, rep)
    # -- routes, rules, neighbours, nexthops
    for fam in (4, 6):
        have_r, want_r = set(getattr(cur, f"routes{fam}")), set(getattr(target, f"routes{fam}"))
        dels = [f"route del {route_del_args(x)}{_dev_of(x)}" for x in sorted(have_r - want_r)]
        adds = [f"route replace {_strip_markers(x)}" for x in sorted(want_r - have_r)]
        rep.actions += [f"-{fam} {x}" for x in dels + adds]
        errors += _ip(lab, node, dels, fam, deleting=True)
        errors += _ip(lab, node, adds, fam)
        errors += _apply_rules(lab, node, fam, getattr(cur, f"rules{fam}"), getattr(target, f"rules{fam}"), rep)
    have_n, want_n = set(cur.neighbors), set(target.neighbors)
    dels = [f"neigh del {neigh_key(x)}" for x in sorted(have_n - want_n)]
    adds = [f"neigh {'add' if x.startswith('proxy ') else 'replace'} {x}" for x in sorted(want_n - have_n)]
    rep.actions += dels + adds
    errors += _ip(lab, node, dels, deleting=True)
    errors += _ip(lab, node, adds)
    have_h, want_h = set(cur.nexthops), set(target.nexthops)
    dels = [f"nexthop del {x.split()[0]} {x.split()[1]}" for x in sorted(have_h - want_h)]
    adds = [f"nexthop replace {x}" for x in sorted(want_h - have_h, key=lambda x: "group" in x)]
    rep.actions += dels + adds
    errors += _ip(lab, node, dels, deleting=True)
    errors += _ip(lab, node, adds)
    # -- nftables, SRv6, qdiscs
    if normalize_nft(cur.nft) != normalize_nft(target.nft):
        rep.actions.append("nft: replace ruleset")
        r = lab.exec(node, ["nft", "-f", "-"], input="flush ruleset\n" + target.nft + "\n", timeout_s=20)
        if not r.ok:
            errors.append(f"nft: {r.stderr.strip()[:500]}")
    if cur.tunsrc != target.tunsrc:
        rep.actions.append(f"sr tunsrc {target.tunsrc or '::'}")
        errors += _ip(lab, node, [f"sr tunsrc set {target.tunsrc or '::'}"])
    errors += _apply_hmac(lab, node, cur.hmac, target.hmac, rep)
    errors += _apply_qdiscs(lab, node, cur.qdiscs, target.qdiscs, rep)
    errors += _apply_xtables_xfrm(lab, node, cur, target, rep)
    errors += _apply_net_objects(lab, node, cur.net_objects, target.net_objects, rep)
    return errors


def _strip_markers(args: str) -> str:
    return " ".join(w for w in args.split() if not w.startswith("?"))


#: The ``ip link set DEV ATTR VALUE`` attributes :func:`link_attrs` reads (one word each, a value
#: of one word: what a reconciler's repair sets and its journal undoes).
LINK_ATTRS = ("address", "txqueuelen", "group", "arp", "promisc", "allmulticast", "multicast", "dynamic", "addrgenmode",
              "protodown", "master")  # fmt: skip


def link_attrs(ln: LinkState) -> dict[str, str]:
    """An interface's :data:`LINK_ATTRS` as ``ip link set`` takes them (``master`` ``""`` for
    none, ``nomaster`` to set it so; ``arp off`` for the NOARP flag), from its capture. Absent:
    what the capture does not keep (a bridge's MAC)."""
    out = {word: ("off" if flag in ln.flags else "on") if flag == "NOARP" else ("on" if flag in ln.flags else "off")
           for flag, word in _LINK_FLAGS.items()}  # fmt: skip
    out.update({"protodown": "on" if ln.protodown else "off", "master": ln.master})
    out.update({k: v for k, v in (("group", ln.group), ("addrgenmode", ln.addrgenmode)) if v})
    if ln.address:
        out["address"] = ln.address
    if ln.txqlen is not None:
        out["txqueuelen"] = str(ln.txqlen)
    return out


def _link_set_lines(name: str, have: LinkState, want: LinkState) -> list[str]:
    """``ip link set`` lines turning ``have`` into ``want`` (admin state last)."""
    attrs: list[str] = []
    if want.address and have.address != want.address and name != "lo":
        attrs.append(f"address {want.address}")
    if want.mtu and have.mtu != want.mtu:
        attrs.append(f"mtu {want.mtu}")
    if want.txqlen is not None and have.txqlen != want.txqlen:
        attrs.append(f"txqueuelen {want.txqlen}")
    if want.group and have.group != want.group:
        attrs.append(f"group {want.group}")
    if want.linkmode and have.linkmode != want.linkmode:
        attrs.append(f"mode {want.linkmode.lower()}")
    for flag, word in _LINK_FLAGS.items():
        if (flag in have.flags) != (flag in want.flags):
            on = flag in want.flags
            attrs.append(f"{word} {('off' if on else 'on') if flag == 'NOARP' else ('on' if on else 'off')}")
    if want.addrgenmode and have.addrgenmode != want.addrgenmode:
        attrs.append(f"addrgenmode {want.addrgenmode}")
    if have.protodown != want.protodown:
        attrs.append(f"protodown {'on' if want.protodown else 'off'}")
    if have.master != want.master:
        attrs.append(f"master {want.master}" if want.master else "nomaster")
    for k, v in want.offload.items():
        if have.offload.get(k) != v:
            attrs.append(f"{k} {v}")
    lines = [f"link set {name} {' '.join(attrs)}"] if attrs else []
    if have.alias != want.alias:
        lines.append(f"link set {name} alias {shlex.quote(want.alias)}" if want.alias else f"link set {name} alias ''")
    if have.up != want.up:
        lines.append(f"link set {name} {'up' if want.up else 'down'}")
    return lines


def _apply_addresses(lab: Lab, cur: DeviceState, target: DeviceState, rep: RestoreReport, skip_devs: set[str]) -> list[str]:
    """Addresses: extra ones removed, missing or changed ones added; on an interface whose IPv4
    addresses are in another order, all of them are re-added in the target's order."""
    node = target.node
    have_all = [*cur.addresses, *cur.host_addresses]
    want_all = [*target.addresses, *target.host_addresses]
    dels = [a for a in have_all if a not in want_all and _addr_dev(a) not in skip_devs]
    adds = [a for a in want_all if a not in have_all]

    def v4(addrs: list[str], dev: str) -> list[str]:
        return [a for a in addrs if _addr_dev(a) == dev and ":" not in a.split()[0]]

    for dev in sorted({_addr_dev(a) for a in want_all}):
        h, w = v4(have_all, dev), v4(want_all, dev)
        kept = [a for a in h if a in w]
        if kept != [a for a in w if a in kept] or (kept and [a for a in w if a in h] != w[: len(kept)]):
            # order differs (the primary changed): put the interface's IPv4 addresses back in order
            dels += [a for a in h if a not in dels]
            adds = [a for a in adds if a not in w] + w
    # an interface that comes (back) up gets the addresses FRR configures on it from zebra itself
    # (zebra installs configured addresses when the interface goes up); adding them too races
    # zebra, whose install then fails with EEXIST and leaves zebra, hence IS-IS, without the
    # address: wait for zebra's instead
    woken = {n for n, want in target.links.items() if want.up and not (cur.links.get(n) and cur.links[n].up)}
    zebra_owned = frr_interface_addresses(target.frr_config or "") if cur.frr_daemons or cur.frr_config else set()
    from_zebra = [a for a in adds if _addr_dev(a) in woken and a in zebra_owned]
    # and the kernel gives it its link-local address itself (adding it too races the kernel)
    adds = [a for a in adds if not (_addr_dev(a) in woken and _natural_addr_scope(a.split()[0].split("/")[0]) == "253")]
    lines = [f"addr del {_addr_del(a)}" for a in dels] + [f"addr add {_addr_add(a)}" for a in adds if a not in from_zebra]
    rep.actions += lines
    errors = _ip(lab, node, [f"addr del {_addr_del(a)}" for a in dels], deleting=True)
    errors += _ip(lab, node, [f"addr add {_addr_add(a)}" for a in adds if a not in from_zebra])
    if from_zebra:
        rep.actions += [f"zebra: addr {a}" for a in from_zebra]
        missing = _wait_addresses(lab, node, from_zebra, timeout_s=5.0)
        if missing:  # zebra did not (FRR down or not configured after all): add them ourselves
            lines = [f"addr replace {_addr_add(a)}" for a in missing]
            rep.actions += lines
            errors += _ip(lab, node, lines)
    return [e for e in errors if "File exists" not in e]


def _apply_kernel_routes(lab: Lab, cur: DeviceState, target: DeviceState, rep: RestoreReport) -> list[str]:
    """Routes the kernel derives from addresses and links. Missing ones are added back as they
    were; an IPv6 local-table route of metric 0 cannot be (user routes get metric 1024), so the
    address it comes from is removed and added again instead."""
    node = target.node
    have, want = set(cur.kernel_routes), set(target.kernel_routes)
    errors: list[str] = []
    dels = [x for x in sorted(have - want)]
    bounce: set[str] = set()
    adds: list[str] = []
    for x in sorted(want - have):
        fam, args = x.split(" ", 1)
        words = args.split()
        if fam == "-6" and "table local" in args and "metric 0" in args:
            owner = _owner_address(words, [*target.addresses, *target.host_addresses])
            if owner:
                bounce.add(owner)
                continue
        adds.append(x)
    for fam in ("-4", "-6"):
        # `prepend`, not `replace` or `add`: fe80::/64 and ff00::/8 exist once per device with the
        # same metric; a replace of one would take the others' place, an add is refused (EEXIST)
        d = [f"route del {route_del_args(x.split(' ', 1)[1])}" + _dev_of(x) for x in dels if x.startswith(fam)]
        a = [f"route prepend {_strip_markers(x.split(' ', 1)[1])}" for x in adds if x.startswith(fam)]
        rep.actions += [f"{fam} {x}" for x in d + a]
        errors += _ip(lab, node, d, int(fam[1]), deleting=True)
        errors += [e for e in _ip(lab, node, a, int(fam[1])) if "File exists" not in e]
    if bounce:
        lines = [f"addr del {_addr_del(a)}" for a in sorted(bounce)] + [f"addr add {_addr_add(a)}" for a in sorted(bounce)]
        rep.actions += [f"{x} (re-derive its local routes)" for x in lines]
        errors += _ip(lab, node, lines)
    return errors


def _dev_of(route: str) -> str:
    """`` dev IF`` of a single-nexthop canonical route (a route deletion names the device: the same
    prefix exists once per device for kernel routes), else empty."""
    words = route.split()
    return f" dev {words[words.index('dev') + 1]}" if words.count("dev") == 1 else ""


def _owner_address(route_words: list[str], addresses: list[str]) -> str | None:
    """The address a local-table IPv6 route (``local A`` or ``anycast P``) is derived from."""
    kind = route_words[0]
    dst = route_words[1].split("/")[0]
    dev = route_words[route_words.index("dev") + 1] if "dev" in route_words else ""
    for a in addresses:
        if _addr_dev(a) != dev or ":" not in a.split()[0]:
            continue
        iface = ipaddress.ip_interface(a.split()[0])
        if kind == "local" and str(iface.ip) == dst:
            return a
        if kind == "anycast" and str(iface.network.network_address) == dst:
            return a
    return None


def _apply_rules(lab: Lab, node: str, fam: int, have: list[str], want: list[str], rep: RestoreReport) -> list[str]:
    """Rules: extra ones removed, missing ones added; where rules of one priority are in
    another order (first match wins among them), that priority's rules are re-added in order."""
    def prio(x: str) -> str:
        return x.split()[1]

    groups = sorted({prio(x) for x in have + want}, key=int)
    dels: list[str] = []
    adds: list[str] = []
    for p in groups:
        h = [x for x in have if prio(x) == p]
        w = [x for x in want if prio(x) == p]
        if h == w:
            continue
        kept = [x for x in h if x in w]
        if kept == w[: len(kept)] and all(x in w for x in kept):
            dels += [x for x in h if x not in w]
            adds += w[len(kept):]
        else:  # order differs: the whole priority group again, in the target's order
            dels += h
            adds += w
    rep.actions += [f"-{fam} rule del {x}" for x in dels] + [f"-{fam} rule add {x}" for x in adds]
    errors = _ip(lab, node, [f"rule del {_strip_markers(x)}" for x in dels], fam, deleting=True)
    errors += _ip(lab, node, [f"rule add {_strip_markers(x)}" for x in adds], fam)
    return errors


def neigh_key(args: str) -> str:
    """The key of a static neighbour entry (:attr:`DeviceState.neighbors`' ``neigh replace``
    arguments): ``ADDR dev IF``, or ``proxy ADDR dev IF`` for a proxy entry."""
    words = args.split()
    if words[0] == "proxy":
        return " ".join(words[:4])
    return " ".join(words[:3])


def _apply_hmac(lab: Lab, node: str, have: list[str], want: list[str], rep: RestoreReport) -> list[str]:
    if set(have) == set(want):
        return []
    script = []
    for x in sorted(set(have) - set(want)):
        script.append(f"echo | ip sr hmac set {x.split()[0]} {x.split()[1]}")
    for x in sorted(set(want) - set(have)):
        kid, algo, secret = x.split(" ", 2)
        script.append(f"printf '%s\\n' {shlex.quote(secret)} | ip sr hmac set {kid} {algo}")
    rep.actions += [f"sr hmac {x.split()[0]}" for x in sorted(set(have) ^ set(want))]
    r = lab.sh(node, " && ".join(script) + " >/dev/null")
    return [] if r.ok else [f"sr hmac: {r.stderr.strip()[:300]}"]


#: Empties every legacy x_tables table of a node (rules, chains, policies back to ACCEPT).
_XT_FLUSH = """for f in ip ip6; do
  t=; read -r t < /proc/net/${f}_tables_names 2>/dev/null || continue
  for t in $(cat /proc/net/${f}_tables_names); do
    ${f}tables-legacy -t $t -F && ${f}tables-legacy -t $t -X || exit 1
    for c in $(${f}tables-legacy -t $t -S | sed -n 's/^-P \\([^ ]*\\) .*/\\1/p'); do ${f}tables-legacy -t $t -P $c ACCEPT || exit 1; done
  done
done
"""


def _apply_net_objects(lab: Lab, node: str, have: list[str], want: list[str], rep: RestoreReport) -> list[str]:
    """Address labels, static multicast addresses and MPTCP endpoints back to ``want`` (those
    not wanted deleted, the missing added), MPTCP limits set to the wanted values."""
    extra, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
    if not extra and not missing:
        return []
    lines = []
    for x in extra:
        if x.startswith("mptcp endpoint add "):
            lines.append(f"mptcp endpoint delete id {x.split(' id ')[1].split()[0]}")
        elif not x.startswith("mptcp limits"):
            lines.append(x.replace(" add ", " del ", 1))
    lines += missing
    rep.actions += [f"- {x}" for x in extra if not x.startswith("mptcp limits")] + [f"+ {x}" for x in missing]
    return _ip(lab, node, lines)


def _apply_xtables_xfrm(lab: Lab, node: str, cur: DeviceState, target: DeviceState, rep: RestoreReport) -> list[str]:
    """Legacy x_tables and XFRM back to ``target``: emptied, then the target's x_tables rules
    restored per family (``*tables-legacy-restore``); XFRM states and policies are not re-created
    (no scenario has any: a target with some is left to the restore's residual)."""
    errors: list[str] = []
    if cur.xtables != target.xtables:
        rep.actions.append("legacy iptables: flush" + (", restore" if target.xtables else ""))
        r = lab.sh(node, _XT_FLUSH, timeout_s=20)
        if not r.ok:
            errors.append(f"legacy iptables: {r.stderr.strip()[:300]}")
        for fam, body in re.findall(r"^@(ip6?)\n(.*?)(?=^@|\Z)", target.xtables + "\n", re.M | re.S):
            r = lab.exec(node, [f"{fam}tables-legacy-restore"], input=body, timeout_s=20)
            if not r.ok:
                errors.append(f"{fam}tables-legacy-restore: {r.stderr.strip()[:300]}")
    if cur.xfrm != target.xfrm:
        rep.actions.append("xfrm: flush states and policies, default policies accept")
        r = lab.sh(node, "ip xfrm state flush && ip xfrm policy flush && ip xfrm policy setdefault in accept fwd accept out accept",
                   timeout_s=20)  # fmt: skip (one command per line: ip -batch loses xfrm commands after a listing)
        if not r.ok:
            errors.append(f"xfrm: {r.stderr.strip()[:300]}")
    return errors


def _apply_qdiscs(lab: Lab, node: str, have: list[str], want: list[str], rep: RestoreReport) -> list[str]:
    """Queueing disciplines back to the target's: an extra root qdisc is deleted (the device
    falls back to its default), an extra ingress/clsact too. A non-default qdisc of the target
    cannot be re-created from its JSON form: reported."""
    if sorted(have) == sorted(want):
        return []
    lines: list[str] = []
    errors: list[str] = []
    for x in sorted(set(have) - set(want)):
        words = x.split()
        dev, where = words[1], words[2]
        if where == "root" and not _default_qdisc(x):
            lines.append(f"qdisc del dev {dev} root")
        elif where in ("ingress", "clsact"):
            lines.append(f"qdisc del dev {dev} {where}")
    adds: list[str] = []
    for x in sorted(set(want) - set(have)):
        if _default_qdisc(x):
            continue
        line = _tbf_line(x)
        if line is None:
            errors.append(f"qdisc {x} is missing and cannot be re-created from its description")
        else:
            adds.append(line)
    rep.actions += [f"tc {x}" for x in [*lines, *adds]]
    errors += _batch(lab, node, ["tc", "-force", "-batch", "-"], sorted(set(lines)), deleting=True)
    return errors + (_batch(lab, node, ["tc", "-batch", "-"], adds) if adds else [])


def _tbf_line(args: str) -> str | None:
    """The ``tc -batch`` line re-creating a root token-bucket qdisc from its captured form
    (``dev IF root tbf handle H {"rate": bytes/s, "burst": bytes, "lat": us}``), burst and latency
    in the KiB and ms a service writes them in (tc rounds what it reports); None for another kind."""
    w = args.split(" ", 6)
    if len(w) < 7 or w[2] != "root" or w[3] != "tbf":
        return None
    try:
        o = json.loads(w[6])
        rate, burst, lat = int(o["rate"]), int(o["burst"]), int(o["lat"])
    except (ValueError, KeyError, TypeError):
        return None
    handle = f"handle {w[5]} " if w[4] == "handle" and w[5] not in ("", "None") else ""
    return f"qdisc replace dev {w[1]} root {handle}tbf rate {rate}bps burst {max(1, round(burst / 1024))}kb latency {max(1, round(lat / 1000))}ms"


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
    """The interface of a per-interface sysctl path (``net/ipv6/conf/eth1/forwarding`` -> eth1,
    ``net/ipv4/neigh/eth1/...`` -> eth1)."""
    parts = key.split("/")
    return parts[3] if len(parts) >= 5 and parts[2] in ("conf", "neigh") else None


@functools.lru_cache(maxsize=65536)
def _per_interface(key: str) -> bool:
    """A sysctl of one interface's directory (``conf/eth1``, ``neigh/eth1``; not ``all``/``default``)
    that netlink reports (the IPv6 stable secret is not in the devconf array: it is read as a file,
    readable only once set -- and it cannot be unset)."""
    return _sysctl_iface(key) not in (None, "all", "default") and not key.endswith("/stable_secret")


def _interface_sysctls(lab: Lab, node: str, ifnames: Iterable[str]) -> dict[str, str]:
    """The sysctl files of the given interfaces (``conf`` and ``neigh`` of both families)."""
    paths = [f"/proc/sys/net/ipv{v}/{d}/{shlex.quote(i)}" for i in sorted(ifnames) for v in (4, 6) for d in ("conf", "neigh")]
    if not paths:
        return {}
    r = lab.sh(node, f"grep -r . {' '.join(paths)} 2>/dev/null; true", max_output=16 << 20)
    return _sysctls(r.stdout)


def _write_sysctls(lab: Lab, node: str, values: dict[str, str], rep: RestoreReport) -> list[str]:
    """Write ``values`` (path under /proc/sys -> value) in order; error lines returned."""
    if not values:
        return []
    rep.actions += [f"sysctl {k}={v}" for k, v in values.items()]
    script = "rc=0\n" + "\n".join(f"printf '%s\\n' {shlex.quote(v)} > /proc/sys/{shlex.quote(k)} || rc=1"
                                  for k, v in values.items()) + "\nexit $rc\n"
    r = lab.sh(node, script)
    return [] if r.ok else [f"sysctl: {r.stderr.strip()[:300]}"]


def restore_frr(lab: Lab, node: str, config: str) -> list[str]:
    """Move FRR's running configuration of ``node`` to ``config`` with ``frr-reload.py --reload``.

    Returns error lines (empty on success).
    """
    path = "/tmp/anibench-frr-target.conf"
    r = lab.sh(node, f"cat > {path} && /usr/lib/frr/frr-reload.py --reload --stdout {path}; rc=$?; rm -f {path}; exit $rc",
               input=config, timeout_s=60)
    return [] if r.ok else [f"frr-reload: {(r.stderr or r.stdout).strip()[-500:]}"]


# -- FRR and the kernel ------------------------------------------------------------------------


def _route_projection(args: str) -> tuple[str, frozenset[tuple[str, str]]]:
    """(destination, {(gateway, device)}) of a canonical route (``-4|-6`` prefix allowed)."""
    words = args.split()
    if words[0] in ("-4", "-6"):
        words = words[1:]
    dst = words[1] if words[0] in _RTN_NUM and words[0] != "unicast" else words[0]
    if words[0] in ("blackhole", "unreachable", "prohibit"):
        return dst, frozenset()  # no nexthop (the kernel shows ``dev lo``; zebra lists none)
    hops: set[tuple[str, str]] = set()
    gw = ""
    for i, w in enumerate(words):
        if w == "via":
            gw = words[i + 2] if words[i + 1] in ("inet", "inet6") else words[i + 1]
        elif w == "dev":
            hops.add((gw, words[i + 1]))
            gw = ""
    return dst, frozenset(hops)


class FibDesync(BaseModel):
    """Where a router's kernel FRR routes disagree with zebra's view (:func:`fib_desync`)."""

    failed: list[str] = Field(default_factory=list, description="Routes zebra failed to install.")
    missing: list[str] = Field(default_factory=list, description="Routes zebra installed that the kernel lacks.")
    nexthops: list[str] = Field(default_factory=list, description="Routes whose kernel nexthops differ from zebra's.")
    regroup: dict[int, list[tuple[str, str]]] = Field(
        default_factory=dict, description="For those routes: zebra's nexthop-group id -> the (gateway, device) "
        "nexthops zebra installed in it (what the kernel's group must hold).")
    unknown: list[str] = Field(
        default_factory=list, description="Kernel routes with an FRR protocol that zebra does not know (put there by "
        "someone else), as canonical `-4|-6 ROUTE`.")

    def restart_needed(self, *, strict: bool) -> list[str]:
        """Why FRR must be restarted: zebra failed to install routes (it will not retry), and,
        when ``strict`` (the underlay has converged, so nothing is in flight), any route zebra
        installed that the kernel lacks or holds with other nexthops (once
        :func:`repair_nexthop_groups` could not fix them)."""
        return self.failed + (self.missing + self.nexthops if strict else [])

    def __bool__(self) -> bool:
        return bool(self.failed or self.missing or self.nexthops or self.unknown)


def repair_nexthop_groups(lab: Lab, node: str, desync: FibDesync) -> list[str]:
    """Put zebra's nexthops back into the kernel's nexthop groups zebra's routes use.

    When a link goes down, the kernel drops the nexthops through it from every group; when it
    comes back, zebra 8.4 re-uses its groups as installed without re-installing them, so the
    routes keep fewer paths than zebra (and the baseline) have -- after every link flap, the
    ``link_down`` fault included. Each such group is replaced (``ip nexthop replace id G group
    ...``, protocol zebra) by the kernel nexthops matching zebra's (gateway, device) pairs.

    Returns:
        What could not be repaired this way (a nexthop zebra wants that the kernel lacks).
    """
    if not desync.regroup:
        return []
    r = lab.exec(node, ["ip", "-N", "-j", "nexthop", "show"], timeout_s=10)
    try:
        have = json.loads(r.stdout or "[]") if r.ok else []
    except ValueError:
        have = []
    single = {(str(n.get("gateway", "")), str(n.get("dev", ""))): n["id"] for n in have
              if "group" not in n and str(n.get("protocol")) == "11"}
    kinds = {n["id"]: ("group" if "group" in n else "single") for n in have}
    lines, unfixable = [], []
    for gid, hops in sorted(desync.regroup.items()):
        ids = [single.get(h) for h in sorted(hops)]
        if None in ids or not ids:
            unfixable.append(f"nexthop group {gid}: the kernel lacks a nexthop of {sorted(hops)}")
        elif kinds.get(gid) == "group":
            lines.append(f"nexthop replace id {gid} group {'/'.join(str(i) for i in ids)} proto zebra")
        elif kinds.get(gid) == "single" and len(hops) == 1:
            gw, dev = sorted(hops)[0]
            lines.append(f"nexthop replace id {gid}" + (f" via {gw}" if gw else "") + f" dev {dev} proto zebra")
        else:
            unfixable.append(f"nexthop group {gid} is not in the kernel as zebra has it")
    errors = _ip(lab, node, lines)
    return unfixable + errors


def fib_desync(lab: Lab, node: str, state: DeviceState) -> FibDesync:
    """Compare the kernel's FRR routes of ``node`` (``state.frr_routes``) with what zebra says it
    installed (``show ip route json`` / ``show ipv6 route json`` on zebra's vty). Zebra re-installs
    a route deleted under it, but not the routes ``ip nexthop flush`` removed (it marks them
    failed), and it ignores a route someone else adds with its protocol number. Empty when they
    agree or FRR does not answer."""
    from substrate.vty import VtyError

    kernel: dict[str, frozenset[tuple[str, str]]] = {}
    canonical: dict[str, str] = {}
    others: list[str] = []  # a second route of the same destination: zebra installs one, at metric 20
    for r in state.frr_routes:
        if " table " in r:
            continue
        dst, hops = _route_projection(r)
        if dst in canonical:
            ours = _metric(canonical[dst]) == ZEBRA_METRIC or _metric(r) != ZEBRA_METRIC
            others.append(r if ours else canonical[dst])
            if ours:
                continue
        kernel[dst] = hops
        canonical[dst] = r
    zebra: dict[str, frozenset[tuple[str, str]]] = {}
    groups: dict[str, int] = {}
    out = FibDesync()
    try:
        answers = lab.vty(node, "zebra", "show ip route json", "show ipv6 route json", timeout_s=5)
    except VtyError:
        return out
    for text, status in answers:
        if status != 0:
            return FibDesync()
        for prefix, entries in json.loads(text or "{}").items():
            for e in entries:
                if e.get("protocol") in ("connected", "kernel", "local") or not e.get("selected"):
                    continue
                if e.get("failed"):
                    out.failed.append(f"zebra failed to install {prefix} ({e.get('protocol')})")
                    zebra[prefix] = kernel.get(prefix, frozenset())
                    continue
                if not e.get("installed"):  # queued for the kernel: zebra knows it, the kernel may lag
                    zebra[prefix] = kernel.get(prefix, frozenset())
                    continue
                zebra[prefix] = frozenset((nh.get("ip", ""), nh.get("interfaceName", "")) for nh in e.get("nexthops", [])
                                          if nh.get("fib") and not nh.get("blackhole") and nh.get("interfaceName"))
                if e.get("installedNexthopGroupId"):
                    groups[prefix] = int(e["installedNexthopGroupId"])
    for prefix, hops in sorted(zebra.items()):
        if prefix not in kernel:
            out.missing.append(f"{prefix} installed by zebra is missing from the kernel")
        elif kernel[prefix] != hops:
            out.nexthops.append(f"{prefix}: kernel nexthops {sorted(kernel[prefix])} != zebra's {sorted(hops)}")
            if prefix in groups and hops:
                out.regroup[groups[prefix]] = sorted(hops)
    out.unknown = [canonical[p] for p in sorted(set(kernel) - set(zebra))] + sorted(others)
    return out


#: Between two reads of zebra's routes before a kernel route of an FRR protocol is called not
#: zebra's (seconds: zebra may be between its RIB and the kernel; reset and reconciler read twice).
ZEBRA_SETTLE_S = 0.2
#: The metric zebra gives every route it installs in the kernel (FRR zebra/rt_netlink.c,
#: ROUTE_INSTALLATION_METRIC): a route of an FRR protocol at another metric is not zebra's.
ZEBRA_METRIC = 20


def _metric(route: str) -> int | None:
    words = route.split()
    with contextlib.suppress(ValueError, IndexError):
        return int(words[words.index("metric") + 1])
    return None
