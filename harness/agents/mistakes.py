"""The noisy agent's catalog of operator mistakes (issue 19, item 2).

Ten kinds, from NetConfArena's failure taxonomy and the examples of the draft: each is a pure
rendering of one change the scripted operator planned into the mistaken change an operator
could have made instead. Two shapes of change exist:

- device levels (A0 shell, A1 commands, A2 NETCONF): one PE's :class:`ConfigDelta` --
  :func:`device_mistake`;
- intent levels (A3-T change sets, A4, A3-R records): one op of the change set --
  :func:`intent_mistake`.

A rendering returns ``None`` where the change cannot carry that kind (nothing to clean up in an
onboarding, no commit step at A0): the agent then makes no mistake there, and a forced kind is
put where it can be expressed (:meth:`Mistakes.choose`). Which kinds each level can express:

=====================  ==========================  ============================================
kind                   device levels (A0, A1, A2)  intent levels (A3-T, A4, A3-R)
=====================  ==========================  ============================================
spec_deviation         a site prefix typo'd in a   the op's prefix6 typo'd
                       route (added or removed)
wrong_device           the PE's change sent to     the site created or moved onto another PE
                       another PE of the tenant    of the tenant (same port)
wrong_config_mode      an interface-mode address   not expressible: a change set or record has
                       line given at the config    no configuration modes
                       level; else a tenant route
                       without its ``table``
                       (global context, not the
                       tenant's)
wrong_family           a rule (else a route; A2:   the site's IPv4 prefix left out (IPv6
                       rules only) under the other only); not where the tenant has no IPv4
                       family's flag
overwrite_shared_key   a new SID bound to a local  a created site takes the id of an existing
                       function another service    site of the tenant (A3-R write_record
                       on the PE already uses      overwrites it; A3-T/A4 refuse a create of a
                       (``route replace`` takes    known id)
                       it over)
forgotten_cleanup      the PE's removals dropped   the change set's delete dropped
overbroad_delete       the tenant table flushed    another site of the tenant deleted too
                       before the change (where
                       a rule leads into it)
wrong_table            one line's table id         the created or moved site put in another
                       replaced by another         tenant's VPN (``tenant``)
                       tenant's (or T+1)
uncommitted            A2: the PE's edit left in   A3-T/A4: planned, never applied; A3-R:
                       the candidate, never        records edited, never committed
                       committed; A0/A1: not
                       expressible (no commit
                       step: a command takes
                       effect at once)
other_tenant           another tenant's circuit    another tenant's site deleted
                       rule on the PE deleted
=====================  ==========================  ============================================
"""

from __future__ import annotations

import copy
import ipaddress
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from substrate.scenario.apply import ConfigDelta

KINDS = ("spec_deviation", "wrong_device", "wrong_config_mode", "wrong_family", "overwrite_shared_key",
         "forgotten_cleanup", "overbroad_delete", "wrong_table", "uncommitted", "other_tenant")
#: Levels working on device deltas, and on change-set ops.
DEVICE_LEVELS = ("A0", "A1", "A2")
INTENT_LEVELS = ("A3-T", "A4", "A3-R")
#: (kind, level) pairs no change of that level can carry, with the reason.
INEXPRESSIBLE: dict[tuple[str, str], str] = {
    **{("wrong_config_mode", lv): "a change set or record has no configuration modes" for lv in INTENT_LEVELS},
    ("uncommitted", "A0"): "a shell command takes effect at once: no commit or save step",
    ("uncommitted", "A1"): "apply_config takes effect at once: no commit or save step",
}
#: Kinds whose intent rendering needs other tenants' sites (read from the level's tools).
NEEDS_OTHERS = frozenset({"wrong_table", "other_tenant"})
#: The file of a run directory the noisy agent writes its mistakes to (:meth:`Mistakes.to_json`).
MISTAKES_FILE = "mistakes.json"

_PREFIX = re.compile(r"(fd10:[0-9a-f:]*::/64|\d+\.\d+\.\d+\.\d+/24)")
_ADDRESS_LINE = re.compile(r"^(no )?(ip|ipv6) address \S+$")


def typo(prefix: str) -> str:
    """``prefix`` with one digit changed (a fat finger): bit 8 above the prefix length flipped,
    ``fd10:0:0:6::/64`` -> ``fd10:0:0:106::/64``, ``10.0.4.0/24`` -> ``10.1.4.0/24``. Not the
    lowest bit: that gives the adjacent prefix, which the address plan has mostly handed out
    already, so an A3-T planner refused it as a clash and the mistake never reached the network.
    Raises ValueError on a non-prefix."""
    net = ipaddress.ip_network(prefix)
    flip = 1 << (net.max_prefixlen - net.prefixlen + 8)
    return str(ipaddress.ip_network((int(net.network_address) ^ flip, net.prefixlen)))


@dataclass
class Made:
    """One mistake made: its kind, where (a PE, or an op's site id), and whether the level's
    tool refused it (the agent then redid the change without it: the network never carried it)."""

    kind: str
    where: str
    refused: bool = False


@dataclass
class Mistakes:
    """Operator mistakes for one run: drawn per change with probability ``rate`` from one of
    :data:`KINDS`, seeded by the run seed; or, with ``kind``, exactly one mistake of that kind,
    at a place drawn (same seed) among the changes that can express it.

    Raises:
        ValueError: ``kind`` is not one of :data:`KINDS`.
    """

    rate: float
    seed: int
    kind: str | None = None
    made: list[Made] = field(default_factory=list)
    #: forced kinds no change of the run could express
    inexpressible: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"unknown mistake kind {self.kind!r}; known: {', '.join(KINDS)}")
        self.rng = random.Random(f"noisy/{self.seed}" + (f"/{self.kind}" if self.kind else ""))

    def draw(self) -> str | None:
        """A kind for the next change (None: no mistake), drawn with probability ``rate``."""
        if self.rate <= 0 or self.rng.random() >= self.rate:
            return None
        return self.rng.choice(KINDS)

    def choose(self, n: int, can: Callable[[int, str], bool]) -> list[str | None]:
        """The kind (or None) for each of ``n`` changes; ``can(i, kind)`` says whether change
        ``i`` can express ``kind``. Drawn mode: one draw per change, kept where expressible.
        Forced mode: ``kind`` at one expressible change (drawn), else recorded inexpressible."""
        if self.kind is None:
            return [k if k is not None and can(i, k) else None for i, k in ((i, self.draw()) for i in range(n))]
        ok = [i for i in range(n) if can(i, self.kind)]
        out: list[str | None] = [None] * n
        if ok:
            out[self.rng.choice(ok)] = self.kind
        else:
            self.inexpressible.append(self.kind)
        return out

    def needs_others(self) -> bool:
        """Whether the intent renderings may need other tenants' sites."""
        return (self.kind in NEEDS_OTHERS) if self.kind else self.rate > 0

    def record(self, kind: str, where: str) -> None:
        self.made.append(Made(kind, where))

    def refused(self, since: int) -> None:
        """Mark the mistakes made since index ``since`` as refused by the tool."""
        for m in self.made[since:]:
            m.refused = True

    def note(self) -> str:
        """The mistakes as one line (``kind@where``, ``!`` when refused), for the agent's note."""
        return ",".join(f"{m.kind}@{m.where}{'!' if m.refused else ''}" for m in self.made)

    def to_json(self) -> dict[str, Any]:
        """What the noisy agent writes to :data:`MISTAKES_FILE` in its run directory."""
        return {"rate": self.rate, "kind": self.kind, "inexpressible": self.inexpressible,
                "made": [{"kind": m.kind, "where": m.where, "refused": m.refused} for m in self.made]}


# -- device levels --------------------------------------------------------------------------------


@dataclass
class DeviceEnv:
    """What a device-level rendering may use: the level, the tenant's PEs, its table, and per
    PE what the operator read off it (``rules6``: ``ip -6 -j rule show``; ``used``: local SID
    functions in use; ``new``: functions this change allocates)."""

    level: str
    pes: list[str]
    table: int
    rules6: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    used: dict[str, set[int]] = field(default_factory=dict)


@dataclass
class DeviceMistake:
    """A rendered device-level mistake: the delta to send, the device to send it to, and
    whether the change is committed (A2)."""

    delta: ConfigDelta
    target: str
    commit: bool = True


def _sub_first(lines: list[str], fn: Callable[[str], str | None]) -> bool:
    """Replace the first line ``fn`` changes (``fn`` returns the new line or None) in place."""
    for i, x in enumerate(lines):
        y = fn(x)
        if y is not None and y != x:
            lines[i] = y
            return True
    return False


def _typo_line(line: str) -> str | None:
    m = _PREFIX.search(line)
    return None if not m else line.replace(m.group(1), typo(m.group(1)), 1)


def _flip_family(line: str, present: set[str], rules_only: bool) -> str | None:
    fam, _, rest = line.partition(" ")
    if fam not in ("-6", "-4") or (rules_only and not rest.startswith("rule ")):
        return None
    flipped = ("-4 " if fam == "-6" else "-6 ") + rest
    return None if flipped in present else flipped


def _function_of(sid: str) -> int:
    return (int(ipaddress.IPv6Network(sid).network_address) >> 64) & 0xFFFF


def device_mistake(kind: str, delta: ConfigDelta, pe: str, env: DeviceEnv) -> DeviceMistake | None:
    """``kind`` rendered into ``delta`` (planned for ``pe``; left unchanged: a copy is returned),
    or None where this change cannot carry it (module docstring's table)."""
    if (kind, env.level) in INEXPRESSIBLE:
        return None
    d = copy.deepcopy(delta)
    t = env.table
    if kind == "spec_deviation":
        ok = _sub_first(d.additions, _typo_line) or _sub_first(d.removals, _typo_line)
        return DeviceMistake(d, pe) if ok else None
    if kind == "wrong_device":
        other = next((p for p in env.pes if p != pe), None)
        return DeviceMistake(d, other) if other else None
    if kind == "wrong_config_mode":
        # an interface-mode line (``ipv6 address ...`` under ``interface X``) given at the
        # configuration level, ahead of its stanza
        for i, x in enumerate(d.frr):
            if _ADDRESS_LINE.match(x.strip()) and i > 0:
                d.frr = [x] + d.frr[:i] + d.frr[i + 1:]
                return DeviceMistake(d, pe)
        # a tenant route given in the global context (the main table), not the tenant's
        drop = re.compile(rf" table {t}(?= |$)")
        ok = _sub_first(d.additions, lambda x: drop.sub("", x) if " route " in f" {x} " and "seg6local" not in x else None)
        ok = ok or _sub_first(d.removals, lambda x: drop.sub("", x) if " route del " in f" {x} " else None)
        return DeviceMistake(d, pe) if ok else None
    if kind == "wrong_family":
        present = set(d.additions) | set(d.removals)
        # A2's kernel model has no family leaf for a route (the prefix says it): only a rule
        # can be written under the wrong family there
        for rules_only in ((True,) if env.level == "A2" else (True, False)):
            for lines in (d.additions, d.removals):
                if _sub_first(lines, lambda x: _flip_family(x, present, rules_only)):
                    return DeviceMistake(d, pe)
        return None
    if kind == "overwrite_shared_key":
        taken = sorted(env.used.get(pe, set()))
        if not taken:
            return None

        def reuse(x: str) -> str | None:
            if "encap seg6local" not in x or not x.startswith("-6 route "):
                return None
            sid = x.split()[3]
            fn = _function_of(sid)
            if fn in taken:
                return None
            groups = ipaddress.IPv6Address(sid.split("/")[0]).exploded.split(":")
            groups[3] = f"{taken[0]:x}"
            return x.replace(sid, f"{ipaddress.IPv6Address(':'.join(groups))}/64", 1)

        return DeviceMistake(d, pe) if _sub_first(d.additions, reuse) else None
    if kind == "forgotten_cleanup":
        kept = [x for x in d.frr if not x.strip().startswith("no ")]
        if not d.removals and kept == d.frr:
            return None
        d.removals, d.frr = [], kept
        return DeviceMistake(d, pe)
    if kind == "overbroad_delete":
        # only where the table is live (a rule leads into it): flushing the empty table of a PE
        # the tenant is new to deletes nothing (sensitivity sweep: 2 such "misses" on r1)
        if not any(str(r.get("table", "")) == str(t) for r in env.rules6.get(pe, [])):
            return None
        d.removals.insert(0, f"-6 route flush table {t}")
        return DeviceMistake(d, pe)
    if kind == "wrong_table":
        others = sorted({int(r["table"]) for r in env.rules6.get(pe, []) if str(r.get("table", "")).isdigit()
                         and int(r["table"]) not in (t, 254, 255, 253)})
        wrong = others[0] if others else t + 1
        pat = re.compile(rf"\b(table|lookup) {t}(?= |$)")
        ok = _sub_first(d.additions, lambda x: pat.sub(rf"\1 {wrong}", x)) or \
            _sub_first(d.removals, lambda x: pat.sub(rf"\1 {wrong}", x))
        return DeviceMistake(d, pe) if ok else None
    if kind == "uncommitted":
        return DeviceMistake(d, pe, commit=False) if env.level == "A2" else None
    if kind == "other_tenant":
        for r in env.rules6.get(pe, []):
            tbl = str(r.get("table", ""))
            if r.get("iif") and tbl.isdigit() and int(tbl) != t and r.get("priority") == 1000:
                d.removals.append(f"-6 rule del priority 1000 iif {r['iif']} lookup {tbl}")
                return DeviceMistake(d, pe)
        return None
    raise ValueError(f"unknown mistake kind {kind!r}; known: {', '.join(KINDS)}")


# -- intent levels --------------------------------------------------------------------------------


@dataclass
class IntentMistake:
    """A rendered intent-level mistake: the ops that replace the op, and whether the change set
    is left unapplied (A3-T/A4) or uncommitted (A3-R)."""

    ops: list[dict[str, Any]]
    unapplied: bool = False


def intent_mistake(kind: str, i: int, ops: list[dict[str, Any]], sites: list[dict[str, str]],
                   others: list[dict[str, Any]], level: str, tenant: str | None = None) -> IntentMistake | None:
    """``kind`` rendered into op ``i`` of ``ops`` (the ticket's change set; left unchanged), or
    None where it cannot carry it. ``sites``: the tenant's sites (sites.csv rows); ``others``:
    other tenants' sites (``{"id", "tenant"}``), read from the level's tools when needed;
    ``tenant``: the ticket's tenant. The kinds that touch another tenant's object
    (``wrong_table``, ``other_tenant``) pick a site or tenant of ``others`` that is neither the
    ticket's tenant nor the op's own: a list that holds the ticket's own sites (a service
    ticket's, whose reader knows no sites.csv tenant) made them no-ops before (a firewall
    change "put in" its own tenant), which the sensitivity bench counted as misses."""
    if (kind, level) in INEXPRESSIBLE:
        return None
    mine = {tenant, spec_tenant} if (spec_tenant := (ops[i].get("spec") or {}).get("tenant")) else {tenant}
    others = [o for o in others if o.get("tenant") and o["tenant"] not in mine]
    op = copy.deepcopy(ops[i])
    spec = op.get("spec") or {}
    touched = {o.get("id") for o in ops}
    untouched = [s["site"] for s in sites if s["site"] not in touched]
    if kind == "spec_deviation":
        if "prefix6" not in spec:
            return None
        spec["prefix6"] = typo(spec["prefix6"])
        return IntentMistake([op])
    if kind == "wrong_device":
        other = next((s["pe"] for s in sites if op["op"] != "delete" and s["pe"] != spec.get("pe")), None)
        if other is None:
            return None
        spec["pe"] = other
        return IntentMistake([op])
    if kind == "wrong_family":
        if not spec.get("prefix4"):
            return None
        del spec["prefix4"]
        return IntentMistake([op])
    if kind == "overwrite_shared_key":
        if op["op"] != "create" or not untouched:
            return None
        op["id"] = untouched[0]
        return IntentMistake([op])
    if kind == "forgotten_cleanup":
        return IntentMistake([]) if op["op"] == "delete" else None
    if kind == "overbroad_delete":
        if not untouched:
            return None
        return IntentMistake([{"op": "delete", "service_class": "tenant_site", "id": untouched[0]}, op])
    if kind == "wrong_table":
        wrong = next((o["tenant"] for o in others), None)
        if op["op"] == "delete" or wrong is None:
            return None
        spec["tenant"] = wrong
        return IntentMistake([op])
    if kind == "uncommitted":
        return IntentMistake([op], unapplied=True)
    if kind == "other_tenant":
        if not others:
            return None
        return IntentMistake([op, {"op": "delete", "service_class": "tenant_site", "id": others[0]["id"]}])
    if kind == "wrong_config_mode":
        return None
    raise ValueError(f"unknown mistake kind {kind!r}; known: {', '.join(KINDS)}")


def noisy_ops(ops: list[dict[str, Any]], sites: list[dict[str, str]], others: list[dict[str, Any]], level: str,
              mistakes: Mistakes, tenant: str | None = None) -> tuple[list[dict[str, Any]], bool]:
    """``ops`` with ``mistakes`` made in them; returns the ops and whether the change set is to
    be left unapplied/uncommitted. Records each mistake made (``where``: the op's id).
    ``tenant``: the ticket's tenant (:func:`intent_mistake`)."""
    kinds = mistakes.choose(len(ops), lambda i, k: intent_mistake(k, i, ops, sites, others, level, tenant) is not None)
    out: list[dict[str, Any]] = []
    unapplied = False
    for i, (op, kind) in enumerate(zip(ops, kinds, strict=True)):
        m = intent_mistake(kind, i, ops, sites, others, level, tenant) if kind else None
        if m is None:
            out.append(op)
            continue
        mistakes.record(kind, str(op.get("id")))
        out += m.ops
        unapplied |= m.unapplied
    return out, unapplied
