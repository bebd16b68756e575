"""Instantiation of a template on a live scenario: NetConfArena's Algorithm 1.

Input: template ``T``, value registry ``V`` (:class:`~harness.templates.registry.ValueRegistry`
of the scenario, with the devices' capabilities ``C``), seed ``s``. The parameters are resolved
in rounds: each round resolves every parameter whose dependencies are resolved (Algorithm 1
lines 7-23); a round that resolves none raises "unresolved dependency". ``Resolve`` draws,
with a :class:`random.Random` seeded by (template, scenario seed, instance), one value of the
parameter's domain that satisfies its ``where`` and differs from its ``distinct_from`` values; a
domain left empty refuses the instance, naming the parameter and the reason. The artifacts are
then rendered (line 25): the prompt and request file, the customer-side setup, the hidden test
cases, the damage checks (every baseline invariant the task does not change), and the
reference solutions per level.

A template whose requirements (layers, capabilities) the scenario lacks is refused before any
parameter is drawn.
"""

from __future__ import annotations

import fnmatch
import random
from typing import Any

import jinja2
from pydantic import BaseModel, Field

from harness.templates.check import dependencies
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


def resolve(template: str, name: str, p: Parameter, resolved: dict[str, Any], reg: ValueRegistry,
            rng: random.Random) -> Any:
    """Draw parameter ``name`` (Algorithm 1, ``Resolve``).

    Raises:
        InstantiationRefused: the domain is empty, or no candidate satisfies the constraints
            (the message says which and gives the domain's size).
    """
    ctx = {**reg.globals(), **resolved, "__template__": template}
    try:
        cands = _candidates(name, p, ctx)
    except jinja2.TemplateError as e:
        raise InstantiationRefused(template, name, f"its domain could not be evaluated: {e}") from None
    if not cands:
        raise InstantiationRefused(template, name, f"the domain {p.values or p.choice or p.range!r} is empty on this scenario")
    kept = cands
    if p.where is not None:
        try:
            kept = [c for c in cands if expression(p.where, {**ctx, name: c})]
        except jinja2.TemplateError as e:
            raise InstantiationRefused(template, name, f"its constraint {p.where!r} could not be evaluated: {e}") from None
        if not kept:
            raise InstantiationRefused(template, name, f"none of the {len(cands)} value(s) of its domain satisfies {p.where!r}")
    if p.distinct_from:
        others = [expression(d, ctx) for d in p.distinct_from]
        before = len(kept)
        kept = [c for c in kept if c not in others]
        if not kept:
            raise InstantiationRefused(template, name, f"each of the {before} value(s) left equals one of "
                                                       f"{', '.join(p.distinct_from)} (distinctness)")
    return rng.choice(kept)


def check_requirements(t: Template, sc: Scenario, reg: ValueRegistry) -> None:
    """Raises InstantiationRefused when the scenario lacks a layer or the devices a capability."""
    missing = [x for x in t.requires.layers if x not in sc.layers]
    if missing:
        raise InstantiationRefused(t.id, None, f"the scenario has no {', '.join(missing)} layer (it has {', '.join(sc.layers)})")
    lacking = [c for c in t.requires.capabilities if not reg.has(c)]
    if lacking:
        raise InstantiationRefused(t.id, None, f"the devices lack {', '.join(lacking)}")


def resolve_all(t: Template, reg: ValueRegistry, seed: str) -> dict[str, Any]:
    """Algorithm 1 lines 3-23: every parameter, in rounds of those whose dependencies are resolved.

    Raises:
        InstantiationRefused: a parameter cannot be drawn, or a round resolves nothing
            (unresolved dependency).
    """
    rng = random.Random(seed)
    names = set(t.parameters)
    resolved: dict[str, Any] = {}
    pending = list(t.parameters.items())
    while pending:
        nxt, r = [], 0
        for name, spec in pending:
            if dependencies(name, spec, names) <= resolved.keys():
                resolved[name] = resolve(t.id, name, spec, resolved, reg, rng)
                r += 1
            else:
                nxt.append((name, spec))
        if r == 0:
            raise InstantiationRefused(t.id, nxt[0][0], "unresolved dependency: "
                                       + "; ".join(f"{n} needs {', '.join(sorted(dependencies(n, s, names) - resolved.keys()))}"
                                                   for n, s in nxt))
        pending = nxt
    return resolved


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
        for dev, cmds in sol.items():
            d = str(render(dev, ctx))
            lines = [ln for c in cmds for ln in str(render(c, ctx)).splitlines() if ln.strip()]
            devices.setdefault(d, []).extend(lines)
        out[level] = devices
    return out


def _test_cases(t: Template, ctx: dict[str, Any]) -> list[Invariant]:
    out: list[Invariant] = []
    for tc in t.test_cases:
        items = [None] if tc.each is None else list(expression(tc.each, ctx))
        for it in items:
            c = ctx if tc.each is None else {**ctx, tc.as_: it}
            out.append(Invariant(id=f"template/{t.id}/{render(tc.id, c)}", kind=tc.kind, service=f"template/{t.id}",
                                 params=render(tc.params, c), description=str(render(tc.description, c))))
    return out


def instantiate(t: Template, sc: Scenario, instance: int, *, registry: ValueRegistry | None = None) -> Instance:
    """Instance ``instance`` of ``t`` on scenario ``sc`` (Algorithm 1; module docstring). Pure
    and deterministic: the same template, scenario and instance give the same instance.

    Raises:
        InstantiationRefused: requirements missing, or a parameter cannot be satisfied (named).
    """
    reg = registry or ValueRegistry(sc)
    check_requirements(t, sc, reg)
    seed = f"template/{t.id}/{sc.seed}/{instance}"
    params = resolve_all(t, reg, seed)
    shown = {k: v for k, v in params.items() if not t.parameters[k].hidden}
    ctx = {**reg.globals(), **params}
    try:
        prompt = str(render(t.prompt, ctx)).strip()
        setup = [{"node": str(render(s.node, ctx)), "sh": str(render(s.sh, ctx)), "why": s.why, "daemons": list(s.daemons)}
                 for s in t.setup]
        tests = _test_cases(t, ctx)
        patterns = [str(render(p, ctx)) for p in t.invalidates]
        reference = render_reference(t, shown)
    except jinja2.TemplateError as e:
        raise InstantiationRefused(t.id, None, f"rendering failed: {e}") from None
    damage = [i for i in sc.invariants if not any(fnmatch.fnmatchcase(i.id, p) for p in patterns)]
    return Instance(template=t.id, family=t.family, instance=instance, seed=seed, parameters=params, shown=shown,
                    prompt=prompt, setup=setup, test_cases=tests, damage_checks=damage, reference=reference)
