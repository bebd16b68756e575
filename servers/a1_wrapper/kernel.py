"""A1's kernel commands (``ip route|rule|sr``, ``nft``): running one with a truthful outcome, and
the nftables ruleset written as the A1 commands that re-create it.

Outcome of one kernel command (``servers.a1_wrapper.apply.DeviceRun``), decided from the tool's
exit status and, where that does not tell (:func:`exit_status_tells`), a read-back of the state
the command acts on, taken in the same process run just before and after it (a digest of ``ip
route show table all`` without routing-protocol routes, ``ip rule show``, ``ip sr tunsrc show``
or ``nft -s list ruleset``):

- ``rejected``: the tool failed (its message), or it succeeded but a delete (``del``,
  ``delete``, ``destroy``, ``flush``) changed nothing -- there was nothing to remove;
- ``applied``: the state changed;
- ``unchanged``: it succeeded and the state already was so (``ip route replace`` of the same
  route, ``nft add table`` of an existing table), or an add found the identical object already
  there: a route (``File exists``), a policy rule, an nftables rule in that chain. Rules are not
  sent again in that case (the kernel would keep a second copy of a default rule, nftables of
  any rule), so applying a device's own configuration back changes nothing. A route is compared
  by its attributes (:func:`route_units`: defaults and word order do not matter); an nftables
  rule written in words nft prints otherwise is found after it was added (nft lists both alike:
  :func:`appended_duplicate`) and the copy removed.

Agent text never reaches a shell: the command's words are positional parameters of a fixed
script (``"$@"``), never parsed by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from substrate.devstate import rule_protocol

#: Protocol routes that come and go with the routing protocols, left out of the route digest.
_PROTO_ROUTES = r" proto (isis|bgp|ospf|ospf6|rip|ripng|eigrp|babel|openfabric|nhrp|ldp|sharp|pbr|18[6-9]|19[0-8]) "
#: Run as ``bash -c SCRIPT anibench KIND CMD ARGS...``: the command between two digests of the
#: state it acts on, then one marker line on stderr.
KERNEL_SCRIPT = r"""
kind=$1; shift
state() {
  case "$kind" in
    nft) nft -s list ruleset ;;
    route) ip -4 route show table all; ip -6 route show table all ;;
    rule) ip -4 rule show; ip -6 rule show ;;
    *) ip sr tunsrc show ;;
  esac 2>&1 | grep -v -E 'PROTO' | md5sum
}
before=$(state)
"$@"
rc=$?
after=$(state)
if [ "$before" = "$after" ]; then s=same; else s=changed; fi
printf '\n@anibench-kernel-state %s\n' "$s" >&2
exit $rc
""".replace("PROTO", _PROTO_ROUTES)
MARKER = "@anibench-kernel-state "
DELETE_VERBS = frozenset({"del", "delete", "destroy", "flush"})


def kind_of(argv: list[str]) -> str:
    """``nft``, ``route``, ``rule`` or ``sr`` for an accepted kernel command."""
    if argv[0] == "nft":
        return "nft"
    words = [w for w in argv[1:] if not w.startswith("-")]
    obj = words[0] if words else ""
    return "rule" if obj in ("rule", "ru") else "sr" if obj == "sr" else "route"


def verb_of(argv: list[str]) -> str:
    """The command's verb (``add``, ``del``, ``flush``, ...): the word after the object for
    ``ip`` (``ip -6 route flush``), the first word for ``nft`` (``nft flush chain ...``)."""
    words = [w for w in argv[1:] if not w.startswith("-")]
    k = 0 if argv[0] == "nft" else 1
    return words[k] if len(words) > k else ""


def family_of(argv: list[str]) -> int:
    """4 or 6 for an ``ip`` command (``ip rule``/``ip route`` without -6 act on IPv4)."""
    if "-6" in argv:
        return 6
    if "-4" in argv:
        return 4
    return 6 if any(":" in w for w in argv[3:]) else 4


def exit_status_tells(argv: list[str]) -> bool:
    """The exit status alone says whether an ``ip route|rule`` command changed the kernel: ``add``
    and ``append`` create exactly one object or fail (File exists ...), ``del`` removes exactly
    one or fails (No such process ...). Other verbs (replace, change, flush) and nft and sr
    commands may succeed without changing anything, so they run between two read-backs."""
    return kind_of(argv) in ("route", "rule") and verb_of(argv) in ("add", "append", "del", "delete")


def split_marker(stderr: str) -> tuple[str, str | None]:
    """(the command's own stderr, ``same``/``changed`` or None when the script did not finish)."""
    head, sep, tail = stderr.rpartition("\n" + MARKER)
    if not sep:
        return stderr, None
    return head, tail.strip() or None


# -- canonical forms ---------------------------------------------------------------------------

_RULE_ORDER = ("priority", "not", "from", "to", "iif", "oif", "ipproto", "tos", "fwmark", "sport", "dport", "lookup", "action",
               "protocol")
_RULE_ALIASES = {"pref": "priority", "preference": "priority", "prio": "priority", "table": "lookup", "dsfield": "tos",
                 "proto": "protocol"}


def canonical_rule(words: list[str]) -> str:
    """``ip rule add`` arguments in substrate.devstate.rule_args order (the form
    get_running_config prints), so that equal rules compare equal."""
    parts: dict[str, str] = {}
    i = 0
    while i < len(words):
        w = _RULE_ALIASES.get(words[i], words[i])
        if w == "not":
            parts["not"] = "not"
        elif w in ("blackhole", "unreachable", "prohibit"):
            parts["action"] = w
        elif i + 1 < len(words):
            if w == "protocol":  # as devstate prints it: a name where iproute2 has one, no "unspec"
                proto = rule_protocol(words[i + 1])
                if proto:
                    parts[w] = f"{w} {proto}"
            elif w == "fwmark":
                parts[w] = f"fwmark {_mark(words[i + 1])}"
            elif not (w in ("from", "to") and words[i + 1] == "all"):
                parts[w] = f"{w} {words[i + 1]}"
            i += 1
        i += 1
    return " ".join(parts[k] for k in _RULE_ORDER if k in parts)


def _mark(value: str) -> str:
    """A firewall mark (and mask) as ``ip rule`` prints it: hex, the full mask left out."""
    mark, _, mask = value.partition("/")
    try:
        text = f"{int(mark, 0):#x}"
        return text if not mask or int(mask, 0) == 0xFFFFFFFF else f"{text}/{int(mask, 0):#x}"
    except ValueError:
        return value


def rule_present(args: list[str], state: Any, family: int) -> bool:
    """A policy rule identical to the one ``ip rule add ARGS`` would create is in ``state``;
    without a priority (the kernel would pick a free one and keep a second copy) any priority
    matches."""
    mine = canonical_rule(args)
    rules = rules_of(state, family)
    if mine in rules:
        return True
    if mine.startswith("priority "):
        return False
    return any(r.split(" ", 2)[2:] == [mine] for r in rules if r.startswith("priority "))


def canonical_nft_rule(text: str) -> str:
    """An nftables rule's text with quotes, counter values and spacing normalised (braces and the
    commas inside them set apart), so that a rule as ``nft list`` prints it and as an A1 command
    compares equal."""
    text = _stateless(text).replace('"', "")
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch in "{}":
            depth += 1 if ch == "{" else -1
            out.append(f" {ch} ")
        elif ch == "," and depth > 0:
            out.append(" , ")
        else:
            out.append(ch)
    return " ".join("".join(out).split())


def _stateless(text: str) -> str:
    return re.sub(r"counter packets \d+ bytes \d+", "counter", text)


# -- the nftables ruleset ----------------------------------------------------------------------


@dataclass
class NftChain:
    name: str
    spec: list[str] = field(default_factory=list)  # "type filter hook forward priority filter", "policy accept"
    rules: list[str] = field(default_factory=list)


@dataclass
class NftSet:
    name: str
    spec: list[str] = field(default_factory=list)  # "type ipv6_addr", "flags interval"
    elements: list[str] = field(default_factory=list)


@dataclass
class NftTable:
    family: str
    name: str
    chains: list[NftChain] = field(default_factory=list)
    sets: list[NftSet] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # lines of objects A1 has no form for


def parse_ruleset(text: str) -> list[NftTable]:
    """The tables, chains (with their hook line and rules) and sets of ``nft list ruleset``
    output. Lines of other objects (maps, flowtables, named counters, ...) are kept verbatim in
    ``NftTable.other``."""
    tables: list[NftTable] = []
    table: NftTable | None = None
    block: NftChain | NftSet | None = None
    other_depth = 0
    pending_elements: list[str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if pending_elements is not None:  # a multi-line `elements = { ... }`
            pending_elements.append(line)
            if line.endswith("}"):
                assert isinstance(block, NftSet)
                block.elements += _elements(" ".join(pending_elements))
                pending_elements = None
            continue
        if other_depth:
            assert table is not None
            table.other.append(line)
            other_depth += line.count("{") - line.count("}")
            continue
        m = re.fullmatch(r"table (\S+) (\S+) \{", line)
        if m and table is None:
            table = NftTable(m.group(1), m.group(2))
            tables.append(table)
            continue
        if table is None:
            continue
        if block is None:
            m = re.fullmatch(r"(chain|set) (\S+) \{", line)
            if m:
                block = NftChain(m.group(2)) if m.group(1) == "chain" else NftSet(m.group(2))
                (table.chains if isinstance(block, NftChain) else table.sets).append(block)  # type: ignore[arg-type]
            elif line == "}":
                table = None
            else:
                table.other.append(line)
                other_depth = line.count("{") - line.count("}")
            continue
        if line == "}":
            block = None
            continue
        if isinstance(block, NftChain):
            if re.match(r"type \S+ hook ", line) or line.startswith("policy "):
                block.spec += [p.strip() for p in line.split(";") if p.strip()]
            else:
                block.rules.append(line)
        else:
            if line.startswith("elements = "):
                if line.endswith("}"):
                    block.elements += _elements(line)
                else:
                    pending_elements = [line]
            else:
                block.spec += [p.strip() for p in line.split(";") if p.strip()]
    return tables


def _elements(text: str) -> list[str]:
    body = text.split("{", 1)[1].rsplit("}", 1)[0]
    return [e.strip() for e in body.split(",") if e.strip()]


def chain_rules(text: str) -> dict[tuple[str, str, str], list[str]]:
    """(family, table, chain) -> its rules in canonical form (:func:`canonical_nft_rule`)."""
    out: dict[tuple[str, str, str], list[str]] = {}
    for t in parse_ruleset(text):
        for c in t.chains:
            out[(t.family, t.name, c.name)] = [canonical_nft_rule(r) for r in c.rules]
    return out


def ruleset_commands(text: str) -> list[str]:
    """The ``nft`` commands that re-create a ruleset: tables, then chains (so that jumps find
    their targets), then sets and their elements, then rules in order. Objects A1 has no form
    for come out as ``!`` comment lines, verbatim."""
    tables = parse_ruleset(text)
    out = [f"nft add table {t.family} {t.name}" for t in tables]
    for t in tables:
        for c in t.chains:
            spec = f" {{ {' ; '.join(_unquote(s) for s in c.spec)} ; }}" if c.spec else ""
            out.append(f"nft add chain {t.family} {t.name} {c.name}{spec}")
    for t in tables:
        for s in t.sets:
            out.append(f"nft add set {t.family} {t.name} {s.name} {{ {' ; '.join(s.spec)} ; }}")
            if s.elements:
                out.append(f"nft add element {t.family} {t.name} {s.name} {{ {', '.join(s.elements)} }}")
    for t in tables:
        for c in t.chains:
            out += [f"nft add rule {t.family} {t.name} {c.name} {_unquote(_stateless(r))}" for r in c.rules]
        out += [f"! nft table {t.family} {t.name}: {line}" for line in t.other]
    return out


def _unquote(text: str) -> str:
    return text.replace('"', "")


def rule_target(argv: list[str]) -> tuple[tuple[str, str, str], str] | None:
    """For ``nft add rule FAMILY TABLE CHAIN RULE...`` (appending, no position): the chain and
    the rule in canonical form; None for any other command."""
    if len(argv) < 7 or argv[1:3] != ["add", "rule"]:
        return None
    rest = argv[6:]
    if rest and rest[0] in ("position", "index", "handle"):
        return None
    return (argv[3], argv[4], argv[5]), canonical_nft_rule(" ".join(rest))


#: Words that end an ``encap ...`` part of a route (everything else after ``encap`` is its own,
#: a seg6local ``table`` included, as iproute2 parses it).
_AFTER_ENCAP = frozenset({"dev", "via", "src", "onlink", "scope", "mtu", "metric", "preference", "priority", "proto",
                          "nexthop", "pref"})  # fmt: skip
_ROUTE_TYPES = frozenset({"blackhole", "unreachable", "prohibit", "throw", "unicast", "local"})
_TABLE_NAMES = {"254": "main", "255": "local", "253": "default"}
_PROTO_NUMBERS = {"boot": "3", "static": "4", "kernel": "2", "zebra": "11", "ra": "9", "dhcp": "16"}


def route_units(words: list[str], family: int) -> frozenset[str] | None:
    """The attributes of a route, as ``ip route add`` arguments (an agent's, or the canonical
    form :func:`substrate.devstate.route_args` writes), in a form where the same route compares
    equal whatever the order of its words and the defaults left out: IPv6 metric 1024, the main
    table, ``dev lo`` of an IPv6 blackhole/unreachable/prohibit route, protocol ``boot``.
    None for what this does not model (multipath, unknown words): such routes are not compared."""
    units: set[str] = set()
    i = 0
    if words and words[0] in _ROUTE_TYPES:
        if words[0] != "unicast":
            units.add(f"type {words[0]}")
        i = 1
    if i >= len(words):
        return None
    dst = "::/0" if words[i] == "default" and family == 6 else "0.0.0.0/0" if words[i] == "default" else words[i]
    units.add(f"dst {dst if '/' in dst else dst + ('/128' if family == 6 else '/32')}")
    i += 1
    while i < len(words):
        w = words[i]
        if w == "onlink":
            units.add(w)
            i += 1
            continue
        if w == "encap":
            j = i + 1
            while j < len(words) and words[j] not in _AFTER_ENCAP:
                j += 1
            units.add("encap " + " ".join(sorted(words[i + 1 : j])))
            i = j
            continue
        if i + 1 >= len(words) or w == "nexthop" or w.startswith("?"):
            return None
        v = words[i + 1]
        if w == "via" and v in ("inet", "inet6") and i + 2 < len(words):
            i, v = i + 1, words[i + 2]
        key = {"preference": "metric", "priority": "metric", "ro": "", "r": ""}.get(w, w)
        if key == "table":
            v = _TABLE_NAMES.get(v, v)
        if key == "proto":
            v = _PROTO_NUMBERS.get(v, v)
        units.add(f"{key} {v}")
        i += 2
    defaults = {"table main", "proto 3", "pref medium"} | ({"metric 1024"} if family == 6 else {"metric 0"})
    if family == 6 and any(u in units for u in ("type blackhole", "type unreachable", "type prohibit")):
        defaults.add("dev lo")
    if family == 6 and not any(u.startswith("metric ") for u in units):
        units.add("metric 1024")
    if family == 6 and "dev lo" in defaults and not any(u.startswith("dev ") for u in units):
        units.add("dev lo")
    return frozenset(u for u in units if u not in {"table main", "proto 3", "metric 0", "pref medium"})


def route_present(args: list[str], state: Any, family: int) -> bool:
    """A route identical to the one ``ip route add ARGS`` would create is in ``state`` (compared
    by :func:`route_units`, or word for word when they cannot be)."""
    routes = routes_of(state, family)
    if " ".join(args) in routes:
        return True
    mine = route_units(args, family)
    return mine is not None and any(route_units(r.split(), family) == mine for r in routes)


def appended_duplicate(listing: str) -> str | None:
    """From ``nft -a list chain FAMILY TABLE CHAIN``: the handle of the chain's last rule when
    an earlier rule of the chain is identical to it (as nft prints both: nft is the judge of
    what a rule's words mean -- ``mark 16`` and ``meta mark 0x10`` are one rule), else None."""
    rules: list[tuple[str, str]] = []
    for line in listing.splitlines():
        m = re.fullmatch(r"\s*(.*\S)\s+# handle (\d+)", line)
        if m and not re.match(r"(table|chain|set|map|flowtable) ", m.group(1)):
            rules.append((canonical_nft_rule(m.group(1)), m.group(2)))
    if len(rules) > 1 and rules[-1][0] in {r for r, _ in rules[:-1]}:
        return rules[-1][1]
    return None


def routes_of(state: Any, family: int) -> list[str]:
    return list(state.routes6 if family == 6 else state.routes4)


def rules_of(state: Any, family: int) -> list[str]:
    return list(state.rules6 if family == 6 else state.rules4)
