"""The noisy agent's catalog of operator mistakes (issue 19, item 2).

Ten kinds, from NetConfArena's failure taxonomy and the examples of the draft: each is a pure
rendering of one change the scripted operator planned into the mistaken change an operator
could have made instead. Two shapes of change exist:

- device levels (A0 shell, A1 commands, A2 NETCONF): one PE's :class:`ConfigDelta` --
  :func:`device_mistake`;
- intent levels (A3-T change sets, A4, A3-R records): one op of the change set --
  :func:`intent_mistake`.

The other task classes (issue 36):

- service tickets (steering, firewall, floating IP): the ticket itself first
  (:func:`ticket_mistake`: a value the request fixed replaced, the wrong device, the new items
  written over the old ones, the rule set put in another tenant's chain), so that every level
  carries the same mistake; else the device levels' per-device deltas (:func:`device_mistake`,
  nft-aware: a removed rule kept, the new IPv4 half left out) and the intent levels' change set
  (:func:`intent_mistake`: left unapplied or uncommitted, another site or tenant's site deleted);
- troubleshooting repairs at A0/A1/A2 (:func:`fix_mistake`, placed by :meth:`Mistakes.one` as
  the repairs are found); at A3-R/A4 the operator makes no change (the reconciler repairs), so
  no kind is expressible there.

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
#: (task class, level) pairs where the noisy agent changes nothing, so no kind is expressible,
#: with the reason (bench/sensitivity.py skips them instead of spending a run to find out).
CLASS_INEXPRESSIBLE: dict[tuple[str, str], str] = {
    ("troubleshooting", lv): "the operator makes no change: it waits for the reconciler's repair" for lv in ("A3-R", "A4")}
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
        if any(m.kind == self.kind for m in self.made):  # placed already (on the ticket, :func:`ticket_mistake`)
            return [None] * n
        ok = [i for i in range(n) if can(i, self.kind)]
        out: list[str | None] = [None] * n
        if ok:
            out[self.rng.choice(ok)] = self.kind
        else:
            self.inexpressible.append(self.kind)
        return out

    def one(self, can: Callable[[str], bool]) -> str | None:
        """The kind (or None) for the next change of a run whose changes are not known in
        advance (a troubleshooting repair follows what is read): drawn mode, one draw kept where
        ``can(kind)``; forced mode, ``kind`` at the first change that can express it. Call
        :meth:`finish` after the last change."""
        if self.kind is None:
            k = self.draw()
            return k if k is not None and can(k) else None
        if any(m.kind == self.kind for m in self.made) or not can(self.kind):
            return None
        return self.kind

    def finish(self) -> None:
        """After the last change of :meth:`one`: a forced kind no change could express is
        recorded inexpressible."""
        if self.kind is not None and not any(m.kind == self.kind for m in self.made) and self.kind not in self.inexpressible:
            self.inexpressible.append(self.kind)

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
    #: node -> nftables table (``"inet tenant_fw"``) -> its ``nft -f`` text as read (None: none)
    nft_now: dict[str, dict[str, str | None]] = field(default_factory=dict)


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


def _nft_rules(table: str, text: str | None) -> dict[str, list[str]]:
    """Chain -> rule lines (normalized) of one table's ``nft -f`` text."""
    from substrate.netconf.device import parse_nft

    fam, name = table.split()
    t = parse_nft(text or "").get((fam, name)) or {"chains": []}
    return {c["name"]: [" ".join(r.split()) for r in c["rules"]] for c in t["chains"]}


def _nft_kept(table: str, new: str | None, now: str | None) -> str | None:
    """``new`` (the table's text after the change) with every rule the change removes from
    ``now`` (the device's table) put back at its place: the clean-up forgotten. ``new`` itself
    when nothing is removed."""
    from substrate.netconf.device import parse_nft, render_nft_table

    if now is None:
        return new
    fam, name = table.split()
    cur = _nft_rules(table, now)
    t = parse_nft(new or "").get((fam, name))
    if t is None:  # the change deletes the table: it stays as it was
        return now
    changed = False
    for c in t["chains"]:
        rules = [" ".join(r.split()) for r in c["rules"]]
        for i, r in enumerate(cur.get(c["name"], [])):
            if r not in rules:
                rules.insert(min(i, len(rules)), r)
                changed = True
        c["rules"] = rules
    return render_nft_table(fam, name, t) + "\n" if changed else new


def _nft_one_family(table: str, new: str | None, now: str | None) -> str | None:
    """``new`` without the IPv4 rules (``ip saddr``/``ip daddr``) it adds to ``now``: a rule set
    written for IPv6 only. None when the change adds no IPv4 rule."""
    from substrate.netconf.device import parse_nft, render_nft_table

    if new is None:
        return None
    fam, name = table.split()
    cur = {r for rs in _nft_rules(table, now).values() for r in rs}
    t = parse_nft(new).get((fam, name))
    if t is None:
        return None
    cut = False
    for c in t["chains"]:
        keep = [r for r in c["rules"] if " ".join(r.split()) in cur or not re.search(r"\bip [sd]addr\b", r)]
        cut |= len(keep) != len(c["rules"])
        c["rules"] = keep
    return render_nft_table(fam, name, t) + "\n" if cut else None


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
        # else an nftables change written for one family only: its new IPv4 lines left out
        for t, text in d.nft.items():
            cut = _nft_one_family(t, text, env.nft_now.get(pe, {}).get(t))
            if cut is not None:
                d.nft[t] = cut
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
        nft = {t: _nft_kept(t, text, env.nft_now.get(pe, {}).get(t)) for t, text in d.nft.items()}
        if not d.removals and kept == d.frr and nft == d.nft:
            return None
        d.removals, d.frr, d.nft = [], kept, nft
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
    if op.get("service_class", "tenant_site") != "tenant_site" and kind not in ("uncommitted", "other_tenant", "overbroad_delete", "wrong_table"):
        return None  # a service op's own values are the ticket's (:func:`ticket_mistake`)
    touched = {o.get("id") for o in ops}
    named = {str(v) for o in ops for v in (o.get("spec") or {}).values() if isinstance(v, str)}
    untouched = [s["site"] for s in sites if s["site"] not in touched and s["site"] not in named]
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


# -- service tickets (steering, firewall, floating IP): the request itself, at every level ---------------

#: The service classes whose tickets :func:`ticket_mistake` renders.
SERVICE_CLASSES = ("steering_policy", "firewall_rule_set", "floating_ip")


def _natural(name: str) -> tuple[str, int]:
    m = re.fullmatch(r"([a-z]+)(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


def ticket_mistake(kind: str, req: dict[str, Any], sites: list[dict[str, str]],
                   others: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """``kind`` made in a service ticket (request.yaml of :mod:`harness.service_tasks`, left
    unchanged: a copy is returned) before the operator plans it, so that every level carries
    the same mistake: the device levels plan their device changes from it, the intent levels
    their change set (:func:`harness.agents.scripted.service_ops`). None where the ticket cannot
    carry it (then a device- or intent-level rendering may: :func:`device_mistake`,
    :func:`intent_mistake`). ``sites``: the tenant's sites (sites.csv rows); ``others``: other
    tenants' sites (``{"id", "tenant"}``).

    ====================  =====================================================================
    kind                  steering / firewall / floating IP
    ====================  =====================================================================
    spec_deviation        the waypoint's number typo'd (r5 -> r6) / the protected port replaced
                          by another / the new address typo'd (an added floating IP)
    wrong_device          the ingress PE replaced by another PE of the tenant (a new policy), the
                          waypoint by another PE of the tenant (a changed one) / the protected
                          site by one on another PE / the site the address goes to by another
                          IPv4 site (on another PE where there is one)
    overwrite_shared_key  firewall: the new items written over the first items of the rule set
                          (the list positions they share) instead of after them
    overbroad_delete      firewall: the rule set's existing items deleted with the change
    wrong_table           firewall: the rule set written into another tenant's chain
    ====================  =====================================================================

    Source: NetConfArena's failure taxonomy (specification deviation, wrong device) and the
    draft's examples (overwriting a line that shares a key, over-broad delete), issue 19 item 2.
    """
    cls, action = req.get("service_class"), req.get("action")
    r = copy.deepcopy(req)
    by = {s["site"]: s for s in sites}
    pes = sorted({s["pe"] for s in sites}, key=_natural)
    if cls == "steering_policy":
        ing, dst_pe = r["ingress_pe"], by.get(r["dst_site"], {}).get("pe")
        if kind == "spec_deviation":
            # the waypoint's number fat-fingered (r5 -> r6), never onto a router the policy names
            name, num = _natural(r["waypoint"])
            taken = {ing, dst_pe, r["waypoint"], r.get("was_waypoint")}
            alt = [f"{name}{n}" for n in (num + 1, num - 1, num + 2) if n > 0 and f"{name}{n}" not in taken]
            if num >= 0 and alt:
                r["waypoint"] = alt[0]
                return r
        if kind == "wrong_device":
            if action == "create":
                alt = [p for p in pes if p not in (ing, dst_pe, r["waypoint"])]
                if alt:
                    r["ingress_pe"] = alt[0]
                    return r
            else:
                alt = [p for p in pes if p not in (ing, dst_pe, r["waypoint"], r.get("was_waypoint"))]
                if alt:
                    r["waypoint"] = alt[0]
                    return r
        return None
    if cls == "firewall_rule_set":
        from substrate.scenario.layers.firewall import PORTS

        rules = r["rules"]
        if len(rules) < 2:
            return None
        new, old = rules[-2:], rules[:-2]
        dst, port = new[0]["dst_site"], int(new[0]["port"])
        if kind == "spec_deviation":
            used = {int(x["port"]) for x in rules if x["dst_site"] == dst}
            alt = [p for p in PORTS if p not in used]
            if alt:
                for x in new:
                    x["port"] = alt[0]
                return r
        if kind == "wrong_device":
            alt = [s["site"] for s in sites if s["pe"] != by.get(dst, {}).get("pe") and s["site"] not in
                   {x.get("src_site") for x in new} and (s["site"], port) not in {(x["dst_site"], int(x["port"])) for x in old}]
            if alt:
                for x in new:
                    x["dst_site"] = alt[0]
                return r
        if kind == "overwrite_shared_key" and len(old) >= 2:
            r["rules"] = new + old[2:]
            return r
        if kind == "overbroad_delete" and old:
            r["rules"] = new
            return r
        if kind == "wrong_table":
            other = next((o["tenant"] for o in others or [] if o.get("tenant") and o["tenant"] != r["tenant"]), None)
            if other:
                r["tenant"], r["rule_set"] = other, f"fw-{other}"
                return r
        return None
    if cls == "floating_ip":
        to = by.get(r["to_site"], {})
        if kind == "spec_deviation" and action == "add":
            r["address"] = typo_address(r["address"])
            return r
        if kind == "wrong_device":  # another CE: on another PE where the tenant has one
            alt = sorted((s for s in sites if s.get("prefix4") and s["site"] not in (r["to_site"], r.get("from_site"))),
                         key=lambda s: s["pe"] == to.get("pe"))
            alt = [s["site"] for s in alt]
            if alt:
                r["to_site"] = alt[0]
                return r
        return None
    return None


def typo_address(address: str) -> str:
    """An IPv4 address with one digit changed, within its /24 (bit 5 of the last octet flipped:
    ``198.51.100.10`` -> ``198.51.100.42``): a fat-fingered host number."""
    a = ipaddress.IPv4Address(address)
    return str(ipaddress.IPv4Address(int(a) ^ 32))


# -- troubleshooting: the repair the operator applies -------------------------------------------------


@dataclass
class FixEnv:
    """What a repair's rendering may use: the level, the routers it may confuse the device with
    (the tenant's PEs, the report's routers), and per device the IPv6 policy rules read
    (``ip -6 -j rule show``)."""

    level: str
    routers: list[str]
    rules6: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: the ticket's tenant's CE ports per device (never "another tenant's")
    own_ports: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class FixMistake:
    """A repair made wrong: its kernel commands, FRR lines, links brought up, the device it goes
    to, and whether it is committed (A2)."""

    kernel: list[str]
    frr: list[str]
    links_up: list[str]
    device: str
    commit: bool = True


_TABLE_REF = re.compile(r"\b(table|lookup) (\d+)\b")
_ADDR4 = re.compile(r"\b(dnat to|nh4) (\d+\.\d+\.\d+\.\d+)\b")


def fix_mistake(kind: str, kernel: list[str], frr: list[str], links_up: list[str], device: str,
                env: FixEnv) -> FixMistake | None:
    """``kind`` made in one repair of the troubleshooting operator
    (:class:`harness.agents.troubleshoot.Fix`: ``ip``/``nft`` commands, FRR lines in
    configuration mode with ``interface X`` first, ports brought up), or None where this repair
    cannot carry it:

    - spec_deviation: a prefix typo'd (:func:`typo`), else a NAT target or End.DX4 next hop
      typo'd (:func:`typo_address`);
    - wrong_device: the repair sent to another router of ``env.routers``;
    - wrong_config_mode: an interface line given at the configuration level (ahead of its
      ``interface`` line), else a tenant route or SID given without its ``table`` (main table);
    - wrong_family: a policy rule added under the other family's flag;
    - overwrite_shared_key: not expressible (a repair restores an object; it creates no second
      entry that could share a key with another);
    - forgotten_cleanup: the repair's deletions dropped where it also adds (a rule replaced:
      the wrong one kept);
    - overbroad_delete: an nft rule delete turned into a flush of its chain; a tenant-table
      repair preceded by a flush of that table;
    - wrong_table: a table id replaced by the next one;
    - uncommitted: A2 only (the edit left in the candidate);
    - other_tenant: another tenant's circuit rule (priority 1000, another table) deleted on
      the device beside the repair.

    Source: issue 19 item 2's list of kinds (NetConfArena's taxonomy and the draft's examples)."""
    k, f = list(kernel), list(frr)
    if kind == "spec_deviation":
        if _sub_first(k, _typo_line):
            return FixMistake(k, f, links_up, device)
        if _sub_first(k, lambda x: _ADDR4.sub(lambda m: f"{m.group(1)} {typo_address(m.group(2))}", x, count=1)):
            return FixMistake(k, f, links_up, device)
        return None
    if kind == "wrong_device":
        other = next((r for r in env.routers if r != device), None)
        return FixMistake(k, f, links_up, other) if other and (k or f or links_up) else None
    if kind == "wrong_config_mode":
        if len(f) >= 2 and f[0].startswith("interface "):
            return FixMistake(k, [f[1], f[0], *f[2:]], links_up, device)
        if _sub_first(k, lambda x: re.sub(r" table \d+(?= |$)", "", x) if x.startswith("ip ") and " route " in x else None):
            return FixMistake(k, f, links_up, device)
        return None
    if kind == "wrong_family":
        present = set(k)
        if _sub_first(k, lambda x: (y if (y := x.replace("ip -6 rule", "ip -4 rule", 1)) not in present else None)
                      if x.startswith("ip -6 rule add") else None):
            return FixMistake(k, f, links_up, device)
        return None
    if kind == "overwrite_shared_key":
        return None
    if kind == "forgotten_cleanup":
        kept = [x for x in k if not re.search(r"\b(del|delete)\b", x)]
        return FixMistake(kept, f, links_up, device) if kept and kept != k else None
    if kind == "overbroad_delete":
        for i, x in enumerate(k):
            m = re.fullmatch(r"nft delete rule (\S+) (\S+) (\S+) handle \d+", x)
            if m:
                k[i] = f"nft flush chain {m.group(1)} {m.group(2)} {m.group(3)}"
                return FixMistake(k, f, links_up, device)
        t = next((m.group(2) for x in k if x.startswith("ip ") and (m := _TABLE_REF.search(x))), None)
        if t is not None and t != "main":
            return FixMistake([f"ip -6 route flush table {t}", *k], f, links_up, device)
        return None
    if kind == "wrong_table":
        if _sub_first(k, lambda x: _TABLE_REF.sub(lambda m: f"{m.group(1)} {int(m.group(2)) + 1}", x, count=1)
                      if x.startswith("ip ") else None):
            return FixMistake(k, f, links_up, device)
        return None
    if kind == "uncommitted":
        return FixMistake(k, f, links_up, device, commit=False) if env.level == "A2" and k else None
    if kind == "other_tenant":
        mine = {m.group(2) for x in k if (m := _TABLE_REF.search(x))}
        for r in env.rules6.get(device, []):
            tbl = str(r.get("table", ""))
            if r.get("iif") and tbl.isdigit() and tbl not in mine and r.get("priority") == 1000 \
                    and r["iif"] not in env.own_ports.get(device, set()):
                return FixMistake([*k, f"ip -6 rule del priority 1000 iif {r['iif']} lookup {tbl}"], f, links_up, device)
        return None
    raise ValueError(f"unknown mistake kind {kind!r}; known: {', '.join(KINDS)}")
