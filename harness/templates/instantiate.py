"""Instantiation of a template on a live scenario: NetConfArena's Algorithm 1.

Input: template ``T``, value registry ``V`` (:class:`~harness.templates.registry.ValueRegistry`
of the scenario, with the devices' capabilities ``C``), seed ``s``. The parameters are resolved
in rounds: each round resolves every parameter whose dependencies are resolved (Algorithm 1
lines 7-23); a round that resolves none raises "unresolved dependency". ``Resolve`` draws,
with a :class:`random.Random` seeded by (template, scenario seed, instance), one value of the
parameter's domain that satisfies its ``where`` and differs from its ``distinct_from`` values; a
domain left empty by earlier draws makes the search back up and draw other values of the
earlier parameters (bounded: :data:`MAX_DRAWS`); a template no combination satisfies is
refused, naming the parameter and the reason. The artifacts are
then rendered (line 25): the prompt and request file, the customer-side setup, the hidden test
cases, the damage checks (every baseline invariant the task does not change), and the
reference solutions per level.

A template whose requirements (layers, capabilities) the scenario lacks is refused before any
parameter is drawn.
"""

from __future__ import annotations

import contextlib
import fnmatch
import random
from collections.abc import Iterator
from typing import Any

import jinja2
from pydantic import BaseModel, Field

from harness.templates.check import dependencies, device_check_problems
from harness.templates.registry import ValueRegistry
from harness.templates.render import expression, render
from harness.templates.schema import LEVELS, InstantiationRefused, Parameter, Template
from substrate.scenario.model import Invariant, Scenario

#: Instances per template (NetConfArena section V-A3: five per template, fixed seeds).
DEFAULT_INSTANCES = 5


class Instance(BaseModel):
    """A resolved template: parameter values and every rendered artifact."""

    template: str
    family: str
    instance: int
    seed: str = Field(description="The seed string of the draw (template, scenario seed, instance).")
    parameters: dict[str, Any]
    shown: dict[str, Any] = Field(description="The parameters the agent is shown (request.yaml): all but hidden ones.")
    prompt: str
    setup: list[dict[str, Any]]
    test_cases: list[Invariant]
    damage_checks: list[Invariant]
    reference: dict[str, dict[str, list[str]] | str] = Field(
        description="Level -> device -> commands, or 'cannot express: reason' (hidden from the agent).")


def failure(e: BaseException) -> str:
    """What went wrong evaluating a template expression: Jinja's message, or the Python error
    an expression raised (``ZeroDivisionError: division by zero``)."""
    return str(e) if isinstance(e, jinja2.TemplateError) else f"{type(e).__name__}: {e}"


def _candidates(name: str, p: Parameter, ctx: dict[str, Any]) -> list[Any]:
    if p.choice is not None:
        return list(p.choice)
    if p.range is not None:
        return list(range(p.range[0], p.range[1] + 1, p.step))
    if p.derive is not None:
        return [expression(p.derive, ctx)]
    vals = expression(p.values or "[]", ctx)
    if not isinstance(vals, (list, tuple)):
        raise InstantiationRefused(ctx["__template__"], name, f"values {p.values!r} gave a {type(vals).__name__}, not a list")
    return list(vals)


def domain(template: str, name: str, p: Parameter, resolved: dict[str, Any], reg: ValueRegistry,
           budget: list[int] | None = None) -> list[Any]:
    """The values parameter ``name`` may take given the ``resolved`` ones: its domain, kept to
    the candidates that satisfy its ``where`` and differ from its ``distinct_from`` values.
    ``budget`` (one int, decremented in place) bounds the candidates checked against ``where``
    over a whole search (:data:`MAX_CHECKS`).

    Raises:
        InstantiationRefused: the domain is empty, or no candidate satisfies the constraints
            (the message says which and gives the domain's size), or an expression failed, or
            the budget is spent.
    """
    ctx = {**reg.globals(), **resolved, "__template__": template}
    try:
        cands = _candidates(name, p, ctx)
    except InstantiationRefused:
        raise
    except Exception as e:  # noqa: BLE001 - any error of the template's expression is the template's
        raise InstantiationRefused(template, name, f"its domain could not be evaluated: {failure(e)}") from None
    if not cands:
        raise InstantiationRefused(template, name, f"the domain {p.values or p.choice or p.range!r} is empty on this scenario")
    kept = cands
    if p.where is not None and budget is not None:
        budget[0] -= len(cands)
        if budget[0] < 0:
            raise SearchExhausted(template, name, f"more than {MAX_CHECKS} candidates checked against the constraints "
                                                  f"(this domain has {len(cands)}): the search would not end in time; "
                                                  "narrow the domains")
    if p.where is not None:
        try:
            kept = [c for c in cands if expression(p.where, {**ctx, name: c})]
        except Exception as e:  # noqa: BLE001
            raise InstantiationRefused(template, name, f"its constraint {p.where!r} could not be evaluated: {failure(e)}") from None
        if not kept:
            raise InstantiationRefused(template, name, f"none of the {len(cands)} value(s) of its domain satisfies {p.where!r}")
    if p.distinct_from:
        try:
            others = [expression(d, ctx) for d in p.distinct_from]
        except Exception as e:  # noqa: BLE001
            raise InstantiationRefused(template, name, f"its distinct_from could not be evaluated: {failure(e)}") from None
        before = len(kept)
        kept = [c for c in kept if c not in others]
        if not kept:
            raise InstantiationRefused(template, name, f"each of the {before} value(s) left equals one of "
                                                       f"{', '.join(p.distinct_from)} (distinctness)")
    return kept


def resolve(template: str, name: str, p: Parameter, resolved: dict[str, Any], reg: ValueRegistry,
            rng: random.Random) -> Any:
    """Draw parameter ``name`` (Algorithm 1, ``Resolve``): one value of :func:`domain`.

    Raises:
        InstantiationRefused: see :func:`domain`.
    """
    return rng.choice(domain(template, name, p, resolved, reg))


def check_requirements(t: Template, sc: Scenario, reg: ValueRegistry) -> None:
    """Raises InstantiationRefused when the scenario lacks a layer or the devices a capability."""
    missing = [x for x in t.requires.layers if x not in sc.layers]
    if missing:
        raise InstantiationRefused(t.id, None, f"the scenario has no {', '.join(missing)} layer (it has {', '.join(sc.layers)})")
    lacking = [c for c in t.requires.capabilities if not reg.has(c)]
    if lacking:
        raise InstantiationRefused(t.id, None, f"the devices lack {', '.join(lacking)}")


#: Most values Algorithm 1 draws for one instance while backing up (a bound on the search).
MAX_DRAWS = 10_000
#: Most candidates checked against a ``where`` for one instance (each domain is checked again
#: at every draw of an earlier parameter: two ranges of 2^20 would take hours).
MAX_CHECKS = 2_000_000


class SearchExhausted(InstantiationRefused):
    """The search for an instance checked :data:`MAX_CHECKS` candidates without an end."""


def resolution_order(t: Template) -> list[str]:
    """The parameters in the order Algorithm 1 resolves them (lines 7-23): rounds of those
    whose dependencies are resolved, each round in the template's order.

    Raises:
        InstantiationRefused: a round resolves nothing (unresolved dependency).
    """
    names = set(t.parameters)
    order: list[str] = []
    pending = list(t.parameters.items())
    while pending:
        nxt, r = [], 0
        for name, spec in pending:
            if dependencies(name, spec, names) <= set(order):
                order.append(name)
                r += 1
            else:
                nxt.append((name, spec))
        if r == 0:
            raise InstantiationRefused(t.id, nxt[0][0], "unresolved dependency: "
                                       + "; ".join(f"{n} needs {', '.join(sorted(dependencies(n, s, names) - set(order)))}"
                                                   for n, s in nxt))
        pending = nxt
    return order


def resolve_all(t: Template, reg: ValueRegistry, seed: str, *, max_draws: int = MAX_DRAWS) -> dict[str, Any]:
    """Algorithm 1 lines 3-23: every parameter in :func:`resolution_order`, each drawn from its
    :func:`domain` with one ``random.Random(seed)``. When a parameter's domain is left empty by
    the values drawn before it, the search backs up: the latest parameter draws another of its
    values not yet tried (depth first), at most ``max_draws`` values in all. The first draws are
    Algorithm 1's own, so an instance that needs no backing up is what the plain draw gives.

    Raises:
        InstantiationRefused: no combination of values satisfies the constraints (the first
            refusal met: the parameter and why), or ``max_draws`` were drawn without finding one.
    """
    rng = random.Random(seed)
    order = resolution_order(t)
    first: list[InstantiationRefused] = []
    draws = 0
    budget = [MAX_CHECKS]

    def search(k: int, resolved: dict[str, Any]) -> dict[str, Any] | None:
        nonlocal draws
        if k == len(order):
            return resolved
        name = order[k]
        try:
            left = domain(t.id, name, t.parameters[name], resolved, reg, budget)
        except SearchExhausted:
            raise
        except InstantiationRefused as e:
            first.append(e)
            return None
        while left:
            if draws >= max_draws:
                why = first[0].reason if first else "no value fits"
                raise InstantiationRefused(t.id, first[0].parameter if first else name,
                                           f"{why} (and no other combination found within {max_draws} draws)")
            draws += 1
            value = left.pop(rng.choice(range(len(left))))  # the same draw as rng.choice(left)
            got = search(k + 1, {**resolved, name: value})
            if got is not None:
                return got
        return None

    got = search(0, {})
    if got is None:
        raise first[0]
    return got


def reference_context(parameters: dict[str, Any]) -> dict[str, Any]:
    """What a reference solution is rendered with: the shown parameters and the pure helper
    ``usid`` (no scenario: the scripted operator renders it from the ticket alone)."""
    return {**parameters, "usid": ValueRegistry.usid}


def render_reference(t: Template, shown: dict[str, Any]) -> dict[str, dict[str, list[str]] | str]:
    """Every level's reference solution, rendered: device -> command lines (a command string
    that renders to several lines gives several commands; blank ones are dropped), or
    ``cannot express: reason`` (a level not written says so)."""
    ctx = reference_context(shown)
    out: dict[str, dict[str, list[str]] | str] = {}
    for level in LEVELS:
        why = t.cannot(level)
        if why is not None:
            out[level] = f"cannot express: {why}"
            continue
        sol = t.reference[level]
        assert isinstance(sol, dict)
        devices: dict[str, list[str]] = {}
        with _field(t, f"reference.{level}"):
            for dev, cmds in sol.items():
                d = str(render(dev, ctx))
                lines = [ln for c in cmds for ln in str(render(c, ctx)).splitlines() if ln.strip()]
                devices.setdefault(d, []).extend(lines)
        out[level] = devices
    return out


@contextlib.contextmanager
def _field(t: Template, field: str) -> Iterator[None]:
    """Turn an error rendering ``field`` of ``t`` into InstantiationRefused naming the field."""
    try:
        yield
    except InstantiationRefused:
        raise
    except Exception as e:  # noqa: BLE001 - any error of the template's expressions is the template's
        raise InstantiationRefused(t.id, None, f"rendering failed: {failure(e)}", field=field) from None


def _test_cases(t: Template, ctx: dict[str, Any]) -> list[Invariant]:
    """The rendered hidden test cases.

    Raises:
        InstantiationRefused: a field failed to render; no test case is left (every ``each``
            gave no element: a do-nothing agent would pass a task of zero test cases); two
            rendered test cases have one id (one verdict would stand for both).
    """
    out: list[Invariant] = []
    where: dict[str, int] = {}
    for i, tc in enumerate(t.test_cases):
        with _field(t, f"test_cases.{i}"):
            items = [None] if tc.each is None else list(expression(tc.each, ctx))
            for it in items:
                c = ctx if tc.each is None else {**ctx, tc.as_: it}
                inv = Invariant(id=f"template/{t.id}/{render(tc.id, c)}", kind=tc.kind, service=f"template/{t.id}",
                                params=render(tc.params, c), description=str(render(tc.description, c)))
                for loc, msg in device_check_problems(tc.kind, inv.params):
                    raise InstantiationRefused(t.id, None, f"{'.'.join(map(str, loc))}: {msg} (as rendered)",
                                               field=f"test_cases.{i}")
                if inv.id in where:
                    raise InstantiationRefused(t.id, None, f"test case id {inv.id!r} rendered twice (also by test_cases."
                                                           f"{where[inv.id]}): put the element in the id", field=f"test_cases.{i}")
                where[inv.id] = i
                out.append(inv)
    if not out:
        raise InstantiationRefused(t.id, None, "every test case's each gave no element: an instance with no test case "
                                               "would pass whatever the agent did", field="test_cases")
    return out


#: The rendered list a whole-state check of a router holds, per kind (template ``expects``).
_EXPECTED_LIST = {"local_sids": "sids", "policy_rules": "rules"}


def _with_expected(t: Template, ctx: dict[str, Any], damage: list[Invariant]) -> list[Invariant]:
    """``damage`` with the lines of the template's ``expects`` added to the router checks they
    name (``device/<node>/sids``: the SID routes the task binds; ``device/<node>/rules/6``: its
    rules), which stay damage checks: the task's own additions pass, any other SID or rule on
    that router fails as before (issue 36).

    Raises:
        InstantiationRefused: an ``expects`` id names no damage check of a kind that holds
            such lines (:data:`_EXPECTED_LIST`), or a line fails to render.
    """
    if not t.expects:
        return damage
    by_id = {i.id: n for n, i in enumerate(damage)}
    out = list(damage)
    for key, lines in t.expects.items():
        with _field(t, f"expects.{key}"):
            iid = str(render(key, ctx))
            add = [str(render(x, ctx)).strip() for x in lines]
        n = by_id.get(iid)
        field = _EXPECTED_LIST.get(out[n].kind) if n is not None else None
        if n is None or field is None:
            raise InstantiationRefused(t.id, None, f"expects {iid!r}: no damage check of kind "
                                                   f"{' or '.join(_EXPECTED_LIST)} has that id", field="expects")
        inv = out[n]
        out[n] = inv.model_copy(update={"params": {**inv.params, field: [*inv.params[field], *add]},
                                        "description": f"{inv.description} (and what the task adds: {len(add)})"})
    return out


def instantiate(t: Template, sc: Scenario, instance: int, *, registry: ValueRegistry | None = None) -> Instance:
    """Instance ``instance`` of ``t`` on scenario ``sc`` (Algorithm 1; module docstring). Pure
    and deterministic: the same template, scenario and instance give the same instance.

    Raises:
        InstantiationRefused: requirements missing, or a parameter cannot be satisfied (named),
            or a field fails to render or leaves no test case or no damage check (named).
    """
    reg = registry or ValueRegistry(sc)
    check_requirements(t, sc, reg)
    seed = f"template/{t.id}/{sc.seed}/{instance}"
    params = resolve_all(t, reg, seed)
    shown = {k: v for k, v in params.items() if not t.parameters[k].hidden}
    ctx = {**reg.globals(), **params}
    with _field(t, "prompt"):
        prompt = str(render(t.prompt, ctx)).strip()
    if not prompt:
        raise InstantiationRefused(t.id, None, "the prompt renders to no text: the agent would get no ticket", field="prompt")
    setup = []
    for i, s in enumerate(t.setup):
        with _field(t, f"setup.{i}"):
            setup.append({"node": str(render(s.node, ctx)), "sh": str(render(s.sh, ctx)), "why": s.why, "daemons": list(s.daemons)})
    tests = _test_cases(t, ctx)
    patterns = []
    for i, p in enumerate(t.invalidates):
        with _field(t, f"invalidates.{i}"):
            patterns.append(str(render(p, ctx)))
    reference = render_reference(t, shown)
    damage = [i for i in sc.invariants if not any(fnmatch.fnmatchcase(i.id, p) for p in patterns)]
    if sc.invariants and not damage:
        raise InstantiationRefused(t.id, None, f"the patterns {patterns} match every one of the scenario's "
                                               f"{len(sc.invariants)} baseline invariants: no damage check would be left "
                                               "(name the invariants the task changes)", field="invalidates")
    damage = _with_expected(t, ctx, damage)
    return Instance(template=t.id, family=t.family, instance=instance, seed=seed, parameters=params, shown=shown,
                    prompt=prompt, setup=setup, test_cases=tests, damage_checks=damage, reference=reference)
