"""Task classes and task variants (draft section 4.3; NetConfArena section IV).

A task class is a prompt template plus a file structure, with identical wording across its
variants; a variant fixes the concrete request, drawn from a seed and placed in a generated
brownfield so that it interacts with existing state (busy PEs, adjacent prefixes, tenants that
share devices, tables and SID spaces). Each variant carries:

- the HAI request: ``prompt`` (the class's fixed text) and ``files`` (``request.yaml`` with the
  concrete change, ``sites.csv`` with the tenant's current sites, ``design.md`` describing how
  tenant services are built here);
- ``setup``: what happens on the customer side before the agent starts (a new CE is configured;
  a moved site's old CE is unplugged) -- done by the harness, out of band;
- ``changes``: the intended change of the service inventory, as site operations; applying them
  to the scenario gives the expected post-task inventory, whose invariants are the hidden test
  cases (new or changed services) and the damage checks (pre-existing services);
- reference solutions per ANI level are derived from the same change (see harness.agents).

Classes live in a registry (:data:`TASK_CLASSES`, name -> :class:`TaskClass`; add one with
:func:`register_task`). The site-change classes (:data:`SITE_TASK_CLASSES`): ``onboarding`` (a
new site for an existing tenant), ``change-set`` (two additions, two moves, one removal on one
live tenant: the draft's pilot task, section 7.1), ``decommissioning`` (remove a site, leaving
the tenant's other sites and every other tenant intact).
"""

from __future__ import annotations

import csv
import io
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, Field, model_serializer

from harness.errors import AnibenchError
from substrate.scenario import Invariant, Scenario, render_scenario, scenario_invariants
from substrate.scenario.layers.addressing import Ipam
from substrate.scenario.layers.base import registry
from substrate.scenario.layers.l3vpn import ce_addr, ce_iface
from substrate.scenario.model import Site, SpareCircuit

#: The classes that change a tenant's VPN sites (the first three registered).
SITE_TASK_CLASSES = ("onboarding", "change-set", "decommissioning")

DESIGN_MD = """\
# How tenant services are built in this network

- Routers: `r<N>`; PE routers connect customer sites (CE hosts `c<N>`). IS-IS (level 2) is the
  underlay. Router r<N> owns the SRv6 uSID locator `fcbb:bb00:<N>::/48` (block fcbb:bb00::/32,
  16-bit node id written with N's decimal digits, RFC 9800) and its loopback is `fd00::<N>`.
- Each tenant (L3VPN) has one routing table, with the same id on every PE where it has sites.
  Traffic from a site enters its table by policy routing: `ip -6 rule add priority 1000 iif <CE
  port> lookup <table>` (and the same with `ip -4` when the site has IPv4). On every such PE the
  table ends in `unreachable ::/0 metric 4278198272` (and `unreachable 0.0.0.0/0` for IPv4)
  and the PE has `ip -6 rule add priority 900 to fcbb:bb00::/32 lookup main`.
- A site has an IPv6 /64 and optionally an IPv4 /24 on its attachment link: the PE port holds
  `::1` / `.1`, the CE `::2` / `.2`. The site's PE routes the prefix in the tenant table out of
  the port (`<prefix> table <T> dev <port>`).
- Each PE hosting a tenant has one End.DT6 SID for it, `fcbb:bb00:<N>:<F>::/64` with a local
  function F from 0xe000..0xefff (`ip -6 route add <SID> encap seg6local action End.DT6 table <T>
  count dev sr0`); each IPv4 site has an End.DX4 SID on its PE (`... action End.DX4 nh4 <CE
  IPv4> count dev sr0`). Function ids are shared by every service on the PE: never reuse one.
- Remote sites are reached with H.Encaps.Red: in the tenant table of every other PE of the
  tenant, `<site prefix6> table <T> metric 1024 encap seg6 mode encap.red segs
  fcbb:bb00:<site PE>:<DT6 F>:: dev sr0`, and for IPv4 `<site prefix4> table <T> encap seg6
  mode encap.red segs fcbb:bb00:<site PE>:<DX4 F>:: dev sr0`.
- Tables, SID functions and prefixes are shared resources: other tenants' prefixes may be
  adjacent to or even equal to this tenant's (on other PEs). Do not touch other tenants.
"""

PROMPTS = {
    "onboarding": (
        "You operate a multi-tenant SRv6 provider network. Ticket: onboard a new site for an existing "
        "tenant. request.yaml gives the tenant, the new site's attachment circuit (PE router and port) and "
        "its prefixes; sites.csv lists the tenant's current sites; design.md describes how tenant services "
        "are built in this network. The customer's CE is already configured and cabled. Configure the "
        "provider side so that the new site and every other site of the tenant reach each other (IPv6, and "
        "IPv4 where both ends have it), without disturbing any other service. Check your work, then call submit."
    ),
    "change-set": (
        "You operate a multi-tenant SRv6 provider network. Ticket: apply a change set to a live tenant. "
        "request.yaml lists sites to add (new attachment circuits), sites to move (the customer has already "
        "re-cabled them to the given PE port) and sites to remove; sites.csv lists the tenant's current sites; "
        "design.md describes how tenant services are built in this network. Customer CEs are configured. "
        "Afterwards every remaining site of the tenant must reach every other (IPv6, and IPv4 where both ends "
        "have it), removed sites must be gone from the network, and no other service may be disturbed. "
        "Check your work, then call submit."
    ),
    "decommissioning": (
        "You operate a multi-tenant SRv6 provider network. Ticket: decommission a tenant site. request.yaml "
        "names the site; sites.csv lists the tenant's current sites; design.md describes how tenant services "
        "are built in this network. Remove everything the provider network holds for that site, so that it "
        "is unreachable from the tenant's other sites, and leave the tenant's other sites and every other "
        "service intact. Check your work, then call submit."
    ),
}


class SetupStep(BaseModel):
    """A customer-side action the harness performs before the agent starts."""

    node: str
    argv: list[str]
    why: str = ""
    daemons: list[str] = Field(
        default_factory=list, exclude_if=lambda v: not v,  # absent from a variant's digest when empty
        description="FRR daemons the step starts in its node for this run (a customer edge's bgpd): spared, like "
        "the node's own daemons, when the harness kills what the agent left running (substrate.scenario.deploy."
        "kill_strays); the next reset removes them with everything else that is not the node's baseline.")


class SiteAdd(BaseModel):
    site: str
    pe: str
    pe_interface: str
    ce: str
    prefix6: str
    prefix4: str | None = None


class SiteMove(BaseModel):
    site: str
    pe: str
    pe_interface: str
    ce: str


class Changes(BaseModel):
    """The intended inventory change of a variant: site operations on one tenant."""

    tenant: str
    add: list[SiteAdd] = Field(default_factory=list)
    move: list[SiteMove] = Field(default_factory=list)
    remove: list[str] = Field(default_factory=list)


class TaskVariant(BaseModel):
    """One concrete task (see module docstring). JSON-serialisable; ``test_cases`` are hidden."""

    task_class: str
    variant: int
    seed: int
    scenario_seed: int
    fault_seed: int
    prompt: str
    files: dict[str, str]
    setup: list[SetupStep]
    changes: Changes | None = Field(default=None, description="Site operations (site-change classes only).")
    ops: list[dict] = Field(default_factory=list, description="The intended change as an A3-T change set "
                            "(service-change classes; hidden: the reference derives it from the HAI).")
    breakage: dict | None = Field(default=None, description="What the troubleshooting class broke (hidden).")
    test_cases: list[Invariant] = Field(description="Invariants of new or changed services (hidden from the agent).")
    damage_checks: list[Invariant] = Field(description="Baseline invariants of services the task must not change.")

    @model_serializer(mode="wrap")
    def _drop_unused(self, handler: Any) -> dict[str, Any]:
        """Fields a class does not use are left out of the dump, so that a site-change variant
        (and its input digest, :func:`harness.run.digests_of`) reads as before they existed."""
        d = handler(self)
        for k in ("ops", "breakage", "changes"):
            if k in d and not d[k]:
                del d[k]
        return d


def apply_changes(sc: Scenario, ch: Changes) -> Scenario:
    """The inventory after ``ch``: sites added (with SID functions allocated from the scenario's
    pools), moved (new PE, port and CE) and removed; the tenant's per-PE uDT6 SIDs follow.

    Raises:
        AnibenchError: unknown tenant or site.
    """
    new = sc.model_copy(deep=True)
    try:
        t = new.tenant(ch.tenant)
    except KeyError:
        raise AnibenchError(f"unknown tenant {ch.tenant!r}") from None
    ipam = Ipam.from_scenario(new)
    by_id = {s.id: s for s in t.sites}
    for sid in ch.remove:
        if sid not in by_id:
            raise AnibenchError(f"tenant {t.id} has no site {sid!r}")
    t.sites = [s for s in t.sites if s.id not in ch.remove]
    # instances bound to a removed site follow it as their classes say (e.g. a firewall rule
    # whose source it was goes with it)
    for sid in ch.remove:
        for c in registry():
            c.site_gone(new, sid)
    for mv in ch.move:
        s = next((x for x in t.sites if x.id == mv.site), None)
        if s is None:
            raise AnibenchError(f"tenant {t.id} has no site {mv.site!r} to move")
        dx4 = ipam.function(mv.pe) if s.prefix4 else None
        idx = t.sites.index(s)
        t.sites[idx] = s.model_copy(update={"pe": mv.pe, "pe_if": mv.pe_interface, "ce": mv.ce, "dx4_function": dx4})
    for add in ch.add:
        dx4 = ipam.function(add.pe) if add.prefix4 else None
        t.sites.append(Site(id=add.site, tenant=t.id, pe=add.pe, pe_if=add.pe_interface, ce=add.ce,
                            prefix6=add.prefix6, prefix4=add.prefix4, dx4_function=dx4))
    pes = {s.pe for s in t.sites}
    t.dt6_functions = {pe: fn for pe, fn in t.dt6_functions.items() if pe in pes}
    for pe in sorted(pes):
        if pe not in t.dt6_functions:
            t.dt6_functions[pe] = ipam.function(pe)
    used = {c.ce for c in [*ch.add, *ch.move]}
    new.spares = [sp for sp in new.spares if sp.ce not in used]
    new.node_config = render_scenario(new)
    new.invariants = scenario_invariants(new)
    return new


def _sites_csv(sc: Scenario, tenant: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["site", "pe", "pe_port", "ce", "prefix6", "prefix4"])
    for s in sc.tenant(tenant).sites:
        w.writerow([s.id, s.pe, s.pe_if, s.ce, s.prefix6, s.prefix4 or ""])
    return buf.getvalue()


def _ce_setup(ce: str, ce_if: str, prefix6: str, prefix4: str | None) -> list[SetupStep]:
    steps = [
        SetupStep(node=ce, argv=["ip", "link", "set", ce_if, "up"], why="customer CE port up"),
        SetupStep(node=ce, argv=["ip", "-6", "addr", "replace", ce_iface(prefix6, 2), "dev", ce_if], why="CE address"),
        SetupStep(node=ce, argv=["ip", "-6", "route", "replace", "default", "via", ce_addr(prefix6, 1), "dev", ce_if],
                  why="CE default route"),
    ]
    if prefix4:
        steps += [
            SetupStep(node=ce, argv=["ip", "-4", "addr", "replace", ce_iface(prefix4, 2), "dev", ce_if], why="CE address"),
            SetupStep(node=ce, argv=["ip", "-4", "route", "replace", "default", "via", ce_addr(prefix4, 1), "dev", ce_if],
                      why="CE default route"),
        ]
    return steps


def _entangled(sc: Scenario, site: str) -> bool:
    """A site whose attachment other services are bound to (each service class's ``pins_site``:
    a steering policy's destination, a firewall policy protecting it -- its chain is jumped to by
    CE port --, a floating IP, ...). Moving or removing it would change those services too;
    variants leave such sites alone so that every class's reference solution touches the
    tenant's VPN only."""
    return any(c.pins_site(sc, site) for c in registry())


def _pick_spare(rng: random.Random, sc: Scenario, avoid: set[str], prefer_pes: set[str]) -> SpareCircuit:
    free = [s for s in sc.spares if s.ce not in avoid]
    if not free:
        raise AnibenchError("the scenario has no spare attachment circuit left (raise l3vpn.spare_circuits)")
    # place the request where it interacts with existing state: prefer busy PEs
    busy = [s for s in free if s.pe in prefer_pes]
    return rng.choice(busy or free)


def _site_variant(task_class: str, sc: Scenario, variant: int, seed: int, rng: random.Random,
                  fault_seed: int | None) -> TaskVariant:
    """A variant of a site-change class (see :func:`make_variant`)."""
    ipam = Ipam.from_scenario(sc)
    busy_pes = {s.pe for s in sc.all_sites()}
    setup: list[SetupStep] = []
    if task_class == "onboarding":
        cands = [t for t in sc.tenants if t.sites]
        if not cands:
            raise AnibenchError("onboarding needs a tenant with at least one site")
        t = rng.choice(cands)
        spare = _pick_spare(rng, sc, set(), busy_pes)
        has4 = any(s.prefix4 for s in t.sites)
        add = SiteAdd(site=f"{t.id}s{_next_site_no(t)}", pe=spare.pe, pe_interface=spare.pe_if, ce=spare.ce,
                      prefix6=ipam.prefix6(), prefix4=ipam.prefix4() if has4 else None)
        changes = Changes(tenant=t.id, add=[add])
        request = {"tenant": t.id, "customer": t.name, "add_site": _add_doc(add)}
        setup += _ce_setup(add.ce, "eth1", add.prefix6, add.prefix4)
    elif task_class == "change-set":
        movable = lambda t: [s for s in t.sites if not _entangled(sc, s.id)]  # noqa: E731
        cands = [t for t in sc.tenants if len(movable(t)) >= 3 and len(t.sites) >= 4]
        if not cands or len(sc.spares) < 4:
            raise AnibenchError("change-set needs a tenant with >= 4 sites (3 free of other services) and 4 spare circuits")
        t = max(cands, key=lambda x: (len(x.sites), x.id))  # the live, large tenant (draft 7.1)
        free = movable(t)
        rng.shuffle(free)
        moved, removed = free[:2], free[2]
        has4 = any(s.prefix4 for s in t.sites)
        used: set[str] = set()
        adds, moves = [], []
        n = _next_site_no(t)
        for k in range(2):
            sp = _pick_spare(rng, sc, used, busy_pes)
            used.add(sp.ce)
            adds.append(SiteAdd(site=f"{t.id}s{n + k}", pe=sp.pe, pe_interface=sp.pe_if, ce=sp.ce,
                                prefix6=ipam.prefix6(), prefix4=ipam.prefix4() if has4 else None))
        for s in moved:
            # a prefix is attached once per PE (its connected route lives in the PE's main table):
            # never move a site onto a PE where another tenant attaches the same (reused) prefix,
            # which the request could not be met on without breaking that tenant
            clash = {o.pe for o in sc.all_sites() if o.prefix6 == s.prefix6 or (s.prefix4 and o.prefix4 == s.prefix4)}
            sp = _pick_spare(rng, sc, used | {x.ce for x in sc.spares if x.pe == s.pe or x.pe in clash}, busy_pes)
            used.add(sp.ce)
            moves.append(SiteMove(site=s.id, pe=sp.pe, pe_interface=sp.pe_if, ce=sp.ce))
        changes = Changes(tenant=t.id, add=adds, move=moves, remove=[removed.id])
        request = {
            "tenant": t.id, "customer": t.name,
            "add": [_add_doc(a) for a in adds],
            "move": [{"site": m.site, "to_pe": m.pe, "to_port": m.pe_interface, "ce": m.ce} for m in moves],
            "remove": [removed.id],
        }
        for a in adds:
            setup += _ce_setup(a.ce, "eth1", a.prefix6, a.prefix4)
        for m in moves:
            s = next(x for x in t.sites if x.id == m.site)
            setup.append(SetupStep(node=s.ce, argv=["ip", "link", "set", s.ce_if, "down"], why=f"{s.id}'s old CE unplugged"))
            setup += _ce_setup(m.ce, "eth1", s.prefix6, s.prefix4)
    else:
        cands = [(t, s) for t in sc.tenants if len(t.sites) >= 3 for s in t.sites if not _entangled(sc, s.id)]
        if not cands:
            raise AnibenchError("decommissioning needs a tenant with >= 3 sites, one free of other services")
        t, s = rng.choice(cands)
        changes = Changes(tenant=t.id, remove=[s.id])
        request = {"tenant": t.id, "customer": t.name, "remove_site": s.id, "pe": s.pe, "pe_port": s.pe_if}
    expected = apply_changes(sc, changes)
    test_cases, damage = split_checks(sc, expected, changes)
    files = {
        "request.yaml": yaml.safe_dump(request, sort_keys=False),
        "sites.csv": _sites_csv(sc, changes.tenant),
        "design.md": DESIGN_MD,
    }
    return TaskVariant(
        task_class=task_class, variant=variant, seed=seed, scenario_seed=sc.seed,
        fault_seed=fault_seed if fault_seed is not None else seed, prompt=PROMPTS[task_class], files=files,
        setup=setup, changes=changes, test_cases=test_cases, damage_checks=damage,
    )



# -- the registry of task classes -------------------------------------------------------------------


@dataclass(frozen=True)
class TaskClass:
    """A task class (draft section 4.3): a name, a fixed prompt, and how a variant is drawn.

    ``make(sc, variant, seed, rng, fault_seed)`` returns the :class:`TaskVariant` (pure: seeded
    by ``rng``, placed in ``sc``); it raises :class:`AnibenchError` when ``sc`` cannot host the
    task. ``inexpressible``: ANI level -> why the scripted reference solution cannot be stated
    at that level (``harness task validate`` and campaigns of the scripted/noisy agents skip
    such a level and say why). ``kind``: the family, shown by ``harness task list``
    (``site-change``, ``service-change``, ``troubleshooting``, ``template``, ...).
    """

    name: str
    prompt: str
    make: Callable[[Scenario, int, int, random.Random, int | None], TaskVariant]
    kind: str = "site-change"
    inexpressible: dict[str, str] = field(default_factory=dict)


#: Every task class, by name, in registration order.
TASK_CLASSES: dict[str, TaskClass] = {}


def register_task(tc: TaskClass) -> TaskClass:
    """Add ``tc`` to :data:`TASK_CLASSES`.

    Raises:
        AnibenchError: a class of that name is registered already.
    """
    if tc.name in TASK_CLASSES:
        raise AnibenchError(f"task class {tc.name!r} is registered twice")
    TASK_CLASSES[tc.name] = tc
    return tc


def task_class(name: str) -> TaskClass:
    """The registered class ``name``.

    Raises:
        AnibenchError: unknown name (the message lists the known ones).
    """
    try:
        return TASK_CLASSES[name]
    except KeyError:
        raise AnibenchError(f"unknown task class {name!r}; known: {', '.join(TASK_CLASSES)} "
                            "and the templates of harness task list") from None


def skipped_levels(name: str, levels: list[str]) -> dict[str, str]:
    """Of ``levels`` (ANI settings, ``A1+blocklist`` allowed), those at which class ``name``'s
    reference solution cannot be stated, each with the reason (:attr:`TaskClass.inexpressible`;
    a protocol template's: its levels marked ``cannot express`` or not written,
    :meth:`harness.templates.schema.Template.cannot`).

    Raises:
        AnibenchError: ``name`` is neither a class nor a template (a malformed template file:
            its error).
    """
    if name not in TASK_CLASSES:
        from harness.templates.schema import TemplateError
        from harness.templates.tasks import broken_templates, is_template, templates

        if is_template(name):
            if name in broken_templates():  # a file left out: its file, line and field
                raise TemplateError(broken_templates()[name])
            t = templates()[name]
            return {lv: f"cannot express: {why}" for lv in levels if (why := t.cannot(lv.split("+")[0])) is not None}
    inex = task_class(name).inexpressible
    return {lv: inex[lv.split("+")[0]] for lv in levels if lv.split("+")[0] in inex}


def variant_skips(variant: TaskVariant, levels: list[str]) -> dict[str, str]:
    """Of ``levels``, those at which this variant has no reference solution, with the reason:
    the class's (:func:`skipped_levels`) and the variant's own (a troubleshooting breakage whose
    repair a level cannot state: ``breakage["no_reference"]``)."""
    out = skipped_levels(variant.task_class, levels)
    own = (variant.breakage or {}).get("no_reference") or {}
    out.update({lv: own[lv.split("+")[0]] for lv in levels if lv.split("+")[0] in own and lv not in out})
    return out


def make_variant(task_class_name: str, sc: Scenario, variant: int, *, fault_seed: int | None = None) -> TaskVariant:
    """Draw variant ``variant`` of class ``task_class_name`` in scenario ``sc`` (pure; seeded by
    the scenario seed and the variant number).

    Raises:
        AnibenchError: unknown task class, or the scenario cannot host the task (no tenant with
            enough sites, no spare circuit, ...).
    """
    if task_class_name not in TASK_CLASSES:
        from harness.templates.tasks import is_template, make_template_variant

        if is_template(task_class_name):  # a protocol template (harness.templates)
            return make_template_variant(task_class_name, sc, variant, fault_seed=fault_seed)
    tc = task_class(task_class_name)
    seed = sc.seed * 1000 + variant
    rng = random.Random(f"task/{tc.name}/{seed}")
    return tc.make(sc, variant, seed, rng, fault_seed)


for _name in SITE_TASK_CLASSES:
    register_task(TaskClass(name=_name, prompt=PROMPTS[_name],
                            make=lambda sc, v, seed, rng, fs, _n=_name: _site_variant(_n, sc, v, seed, rng, fs)))

def _next_site_no(t) -> int:  # noqa: ANN001
    nums = [int(s.id.split("s")[-1]) for s in t.sites if s.id.split("s")[-1].isdigit()]
    return max(nums, default=0) + 1


def _add_doc(a: SiteAdd) -> dict:
    doc = {"site": a.site, "pe": a.pe, "pe_port": a.pe_interface, "ce": a.ce, "prefix6": a.prefix6}
    if a.prefix4:
        doc["prefix4"] = a.prefix4
    return doc


@dataclass(frozen=True)
class _Marks:
    """What identifies the task's change inside an invariant's parameters (exact values only).

    ``names``: CE names of added, moved and removed sites (old and new) and the tenant's uDT6
    SIDs that appear or disappear -- unique in the scenario, so matched anywhere. ``addresses``:
    those sites' CE addresses -- tenants may reuse address space (overlap), so an address names
    the changed site only where the packet is the task tenant's: from one of its CEs.
    ``own_ces``: every CE of the task's tenant, before and after.
    """

    names: frozenset[str]
    addresses: frozenset[str]
    own_ces: frozenset[str]

    def touch(self, inv: Invariant) -> bool:
        """Whether ``inv`` is about a changed site (a test case, never a damage check)."""
        p = inv.params
        values = [v for k, v in p.items() if k in ("src", "dst", "node", "sid", "ce", "dst_node") and isinstance(v, str)]
        if any(v in self.names for v in values):
            return True
        if p.get("src") in self.own_ces and p.get("dst") in self.addresses:
            return True
        # a fact about the tenant's sites as a whole (its tables: ``ces`` lists every site's CE)
        # changes with any of them
        if isinstance(p.get("ces"), list) and set(p["ces"]) & self.own_ces:
            return True
        # free-text lists (nft_rule contains, fib_has prefixes): whole tokens, names only
        words = {w for v in p.values() if isinstance(v, list) for item in v for w in str(item).split()}
        return bool(words & self.names)


def _changed_markers(before: Scenario, after: Scenario, ch: Changes) -> _Marks:
    """The :class:`_Marks` of a variant's change."""
    from substrate.scenario.layers.l3vpn import sid_of

    names: set[str] = set()
    addresses: set[str] = set()
    own: set[str] = set()
    changed = set(ch.remove) | {m.site for m in ch.move} | {a.site for a in ch.add}
    for sc in (before, after):
        t = sc.tenant(ch.tenant)
        for s in t.sites:
            own.add(s.ce)
            if s.id in changed:
                names.add(s.ce)
                addresses.add(ce_addr(s.prefix6, 2))
                if s.prefix4:
                    addresses.add(ce_addr(s.prefix4, 2))
                if s.dx4_function is not None:
                    names.add(sid_of(sc, s.pe, s.dx4_function))
    tb, ta = before.tenant(ch.tenant), after.tenant(ch.tenant)
    for pe in set(tb.dt6_functions) ^ set(ta.dt6_functions):
        t, sc = (tb, before) if pe in tb.dt6_functions else (ta, after)
        names.add(sid_of(sc, pe, t.dt6_functions[pe]))
    return _Marks(frozenset(names), frozenset(addresses), frozenset(own))


def _leftover_checks(before: Scenario, after: Scenario, ch: Changes) -> list[Invariant]:
    """What a change must not leave behind on the PEs (issue 19: leftover SIDs, routes and
    addresses on a PE a tenant has left were never seen to fail any check):

    - every attachment circuit the tenant no longer uses (a removed site's, a moved site's old
      one): no rule from its port into the tenant table, no site PE address on the port, and
      no route out of it in the table when the tenant has left that PE;
    - the End.DT6 SID of a PE the tenant left and the End.DX4 SID of a site removed or moved to
      another PE, unless the expected state keeps them: their binding gone from the PE (the
      function may serve another service since: only the old binding is checked);
    - every PE the tenant has left and where no other service still uses its table: the table
      holds nothing (where another service uses it, e.g. a floating IP's return route, what
      else the operator keeps there is not pinned).
    """
    from substrate.scenario.layers.l3vpn import sid_of

    own = f"l3vpn/{ch.tenant}"
    tb, ta = before.tenant(ch.tenant), after.tenant(ch.tenant)
    ces = sorted({s.ce for s in tb.sites} | {s.ce for s in ta.sites})
    out: list[Invariant] = []
    now = {(s.pe, s.pe_if) for s in ta.sites}
    for s in tb.sites:
        if (s.pe, s.pe_if) in now:
            continue
        addrs = [ce_iface(s.prefix6, 1)] + ([ce_iface(s.prefix4, 1)] if s.prefix4 else [])
        left = s.pe not in ta.dt6_functions
        out.append(Invariant(
            id=f"task/leftover/{s.id}/circuit/{s.pe}/{s.pe_if}", kind="route_absent", service=own,
            params={"node": s.pe, "table": tb.table, "prefixes": [p for p in (s.prefix6, s.prefix4) if p] if left else [],
                    "rules_iif": s.pe_if, "interface": s.pe_if, "addresses": addrs, "ces": ces},
            description=f"{s.id}'s old circuit {s.pe} {s.pe_if}: no rule into table {tb.table}, no PE address left",
        ))
    bindings: list[tuple[str, str, dict[str, Any]]] = []  # (PE, SID, its parameters)
    # only where no correct change can keep them: the End.DT6 of a PE the tenant left, the
    # End.DX4 of a site removed or moved to another PE (a site moved between ports of one PE
    # may keep its SID: which function serves it is the operator's choice)
    pe_after = {x.id: x.pe for x in ta.sites}
    for pe, fn in tb.dt6_functions.items():
        if pe not in ta.dt6_functions:
            bindings.append((pe, sid_of(before, pe, fn), {"action": "End.DT6", "table": tb.table}))
    for s in tb.sites:
        if s.dx4_function is not None and s.prefix4 and pe_after.get(s.id) != s.pe:
            bindings.append((s.pe, sid_of(before, s.pe, s.dx4_function), {"action": "End.DX4", "nh4": ce_addr(s.prefix4, 2)}))
    for pe, sid, params in sorted(bindings, key=lambda b: (b[0], b[1])):
        cfg = after.node_config.get(pe)
        line = next((x for x in (cfg.routes6 if cfg else []) if x.split()[0] == sid and "seg6local" in x), "")
        words = line.split()
        if line and all(k in words and words[words.index(k) + 1] == str(v) for k, v in params.items() if k != "action") \
                and params["action"] in words:
            continue  # the expected state keeps it
        out.append(Invariant(
            id=f"task/leftover/sid/{pe}/{sid}", kind="sid_unbound", service=own,
            params={"node": pe, "sid": sid, **params, "ces": ces},
            description=f"{pe}: {sid} ({params['action']}), which the change retires, is no longer bound so",
        ))
    for pe in sorted(set(tb.dt6_functions) - set(ta.dt6_functions)):
        cfg = after.node_config.get(pe)
        for fam in (6, 4):
            routes = [x for x in (getattr(cfg, f"routes{fam}") if cfg else []) if f" table {tb.table} " in f" {x} "
                      and "seg6local" not in x]
            if routes:
                # another service still uses the table here (a floating IP's return route): what
                # else of the tenant's a careful operator keeps in it is its choice, so only an
                # emptied table is pinned (the reference keeps the table whole: test_issue_19)
                continue
            out.append(Invariant(
                id=f"task/leftover/table/{pe}/{fam}", kind="table_routes", service=own,
                params={"node": pe, "table": tb.table, "family": fam, "routes": routes, "ces": ces},
                description=f"{pe}, which the tenant left: table {tb.table} holds exactly {len(routes)} IPv{fam} routes",
            ))
    return out


def split_checks(before: Scenario, after: Scenario, ch: Changes) -> tuple[list[Invariant], list[Invariant]]:
    """Split the checks of a variant.

    - test cases: invariants of the expected inventory about a changed site (exact CE names,
      SIDs, and the site's addresses as reached from the tenant's own CEs -- tenants may reuse
      addresses), plus explicit checks that removed sites are unreachable, over IPv6 and IPv4,
      from every remaining site of the tenant, and that nothing of them is left on the PEs
      (routes in the tenant's table, the rule of the old attachment circuit);
    - damage checks: every baseline invariant not about a changed site, whoever's service it is
      (it still holds after a correct change), and the expected inventory's new invariants that
      are not about a changed site either (facts the generator now samples, true before as after);
    - an ``nft_chain``, ``nft_tables``, ``policy_rules`` or ``local_sids`` invariant whose rendered state the change alters (the hairpin NAT
      of a site moving onto or off a floating IP's PE, an accept rule whose source site is
      removed) is a test case in its new form and no damage check in its old one.
    """
    import json

    marks = _changed_markers(before, after, ch)
    own = f"l3vpn/{ch.tenant}"

    def key(i: Invariant) -> tuple[str, str]:
        return i.id, json.dumps(i.params, sort_keys=True)

    before_keys = {key(i) for i in before.invariants}
    # anything about a changed site is the task's to make true, even when it reads the same
    # before and after (a moved site keeps its addresses; the customer has unplugged the old
    # CE, so doing nothing breaks it): a test case, never a damage check. Behaviour, not
    # bookkeeping: which free SID function an operator picks is theirs, so a new SID binding is
    # not a test case (its reachability is).
    tests = [i for i in after.invariants if i.kind != "sid_bound" and marks.touch(i)]
    # every ordered pair that involves an added or moved site, both ways and both families (the
    # baseline samples the pairs of large tenants; a typo'd encap route toward a changed site
    # broke exactly the pairs nobody probed: issue 19)
    from substrate.scenario.layers.l3vpn import reach_invariants

    changed = {a.site for a in ch.add} | {m.site for m in ch.move}
    ta_sites = after.tenant(ch.tenant).sites
    pairs = [(x, y) for x in ta_sites for y in ta_sites if x.id != y.id and (x.id in changed or y.id in changed)]
    have = {(i.kind, i.params.get("src"), i.params.get("dst"), i.params.get("family")) for i in tests}
    for i in reach_invariants(after, after.tenant(ch.tenant), pairs):
        if (i.kind, i.params["src"], i.params["dst"], i.params["family"]) not in have:
            tests.append(i.model_copy(update={"id": "task/pair/" + i.id.split("/reach/", 1)[1]}))
    # nftables state whose rendering the change alters (a moved site's hairpin NAT lines, the
    # accept rules of a removed source site) is the task's to make true: a test case, and its
    # old form no damage check (shared chains carry no CE names for the marks to find)
    before_by_id, after_by_id = {i.id: i for i in before.invariants}, {i.id: i for i in after.invariants}
    rerendered = {iid for iid in set(before_by_id) | set(after_by_id) if {"nft_chain", "nft_tables", "policy_rules", "local_sids", "port_state"} &
                  {x.kind for x in (before_by_id.get(iid), after_by_id.get(iid)) if x is not None}
                  and before_by_id.get(iid) != after_by_id.get(iid)}
    tests += [i for i in after.invariants if i.id in rerendered and i not in tests]
    damage = [i for i in before.invariants if not marks.touch(i) and i.id not in rerendered]
    damage += [i for i in after.invariants if key(i) not in before_keys and not marks.touch(i)
               and i.kind != "sid_bound" and i.id not in rerendered]
    gone = [s for s in before.tenant(ch.tenant).sites if s.id in ch.remove]
    remaining = after.tenant(ch.tenant).sites
    tb, ta = before.tenant(ch.tenant), after.tenant(ch.tenant)
    for g in gone:
        # decommissioned means removed: no route left for the site's prefixes in the tenant's
        # table on any PE that serves the tenant, and no rule for its old attachment circuit
        for pe in sorted({s.pe for s in tb.sites} | {s.pe for s in ta.sites}):
            tests.append(Invariant(
                id=f"task/removed/{g.id}/clean/{pe}", kind="route_absent", service=own,
                params={"node": pe, "table": tb.table, "prefixes": [p for p in (g.prefix6, g.prefix4) if p],
                        "rules_iif": g.pe_if if pe == g.pe and not any(s.pe == pe and s.pe_if == g.pe_if
                                                                       for s in ta.sites) else None},
                description=f"removed site {g.id}: nothing of it left on {pe} (routes in table {tb.table}"
                            + (f", rule for {g.pe_if})" if pe == g.pe else ")"),
            ))  # fmt: skip
    tests += _leftover_checks(before, after, ch)
    for g in gone:
        for r in remaining:
            for fam, prefix in ((6, g.prefix6), (4, g.prefix4)):
                if prefix is None or (fam == 4 and r.prefix4 is None):
                    continue
                tests.append(Invariant(
                    id=f"task/removed/{g.id}/from/{r.id}" + ("/v4" if fam == 4 else ""), kind="isolated", service=own,
                    params={"src": r.ce, "dst": ce_addr(prefix, 2), "family": fam, "dst_node": g.ce},
                    description=f"removed site {g.id} is unreachable from {r.id} (IPv{fam}; nothing arrives at its CE)",
                ))  # fmt: skip
    return tests, damage



# the other task classes register themselves (they import this module's definitions)
from harness import service_tasks as _service_tasks  # noqa: E402,F401
from harness import troubleshooting as _troubleshooting  # noqa: E402,F401
