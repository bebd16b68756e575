"""Static checks of a parsed template: what pydantic cannot see in the Jinja strings.

- every Jinja string parses;
- every name an expression uses is a parameter, a registry function
  (:attr:`harness.templates.registry.ValueRegistry.FUNCTIONS`) or a name the place binds
  (``each``'s ``as``);
- the parameters' dependencies have no cycle (Algorithm 1 would stop with "unresolved
  dependency"), and no parameter's domain (``values``, ``derive``, ``distinct_from``) names the
  parameter itself (only ``where`` binds it: the candidate);
- every test case's ``kind`` is an observer check kind (substrate.scenario.observer: its own,
  the service classes' and the device checks), and test case ids are distinct;
- a reference solution uses only parameters the agent is shown (not ``hidden`` ones): the
  scripted operator derives it from the ticket alone;
- a parameter's name is an identifier and not :data:`RESERVED` (a registry function, a Jinja
  built-in, a name the harness binds);
- a device check's ``params`` (``output_check``, ``json_value``:
  substrate.scenario.device_checks) use only the kind's keys, name a node and a command or argv,
  and an ``output_check`` has a predicate (``contains``, ``absent`` or ``matches``): a misspelt
  key would leave a check that passes whatever the agent did.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import jinja2

from harness.templates.registry import ValueRegistry
from harness.templates.render import names_in

if TYPE_CHECKING:
    from harness.templates.schema import Parameter, Template

#: Jinja built-in names allowed in expressions besides parameters and registry functions.
JINJA_NAMES = frozenset({"range", "dict", "lipsum", "cycler", "joiner", "namespace", "loop", "true", "false", "none",
                         "True", "False", "None"})
#: Names a parameter may not take: the registry functions, the Jinja built-ins and what the
#: harness binds itself (``__template__`` while drawing; ``usid`` in references; a test case's
#: default ``as``, ``item``; Jinja's ``self``, ``varargs``, ``kwargs``).
RESERVED = frozenset(ValueRegistry.FUNCTIONS) | JINJA_NAMES | {"__template__", "usid", "item", "self", "varargs", "kwargs"}
#: A parameter's name: an identifier that Jinja reads as a name (no leading underscore).
PARAM_RE = r"[A-Za-z][A-Za-z0-9_]*"


def check_kinds() -> frozenset[str]:
    """Every observer check kind a test case may name (substrate.scenario.observer.observe's
    lookup: its own checks, the service classes' and the device checks)."""
    from substrate.scenario import observer

    return frozenset(observer.CHECKS) | frozenset(observer.class_checks()) | frozenset(observer._device_checks())


#: The params of the device checks (substrate.scenario.device_checks): allowed keys, and the
#: keys of which an output_check needs one (without, it passes on any output of the command).
DEVICE_CHECK_KEYS = {
    "output_check": frozenset({"node", "command", "argv", "contains", "absent", "matches", "status", "settle_s"}),
    "json_value": frozenset({"node", "command", "argv", "path", "op", "value", "settle_s"}),
}
OUTPUT_PREDICATES = ("contains", "absent", "matches")


def device_check_problems(kind: str, params: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """Problems of a device check's ``params`` (module docstring), as (location under the test
    case, message); empty for other kinds. Used on the file's params and again on each rendered
    test case's (a predicate that renders to an empty list is none)."""
    from substrate.scenario.device_checks import OPS

    keys = DEVICE_CHECK_KEYS.get(kind)
    if keys is None:
        return []
    out: list[tuple[tuple[Any, ...], str]] = []
    for k in sorted(set(params) - keys):
        out.append((("params", k), f"unknown key {k!r} of {kind}; known: {', '.join(sorted(keys))}"))
    if "node" not in params:
        out.append((("params",), f"{kind} needs node"))
    if ("command" in params) == ("argv" in params):
        out.append((("params",), f"{kind} needs exactly one of command (vtysh) and argv"))
    if kind == "output_check" and not any(params.get(k) not in (None, [], "") for k in OUTPUT_PREDICATES):
        out.append((("params",), "output_check needs a predicate (contains, absent or matches): without one it passes "
                                 "on any output"))
    for k in OUTPUT_PREDICATES if kind == "output_check" else ():
        v = params.get(k)
        if v is not None and not isinstance(v, list) and not (isinstance(v, str) and v.strip().startswith("{{")):
            out.append((("params", k), f"{k} is a list of strings, got {type(v).__name__} {v!r}"))
    if kind == "json_value":
        if "path" not in params:
            out.append((("params",), "json_value needs path"))
        op = params.get("op", "eq")
        if isinstance(op, str) and "{" not in op and op not in OPS:
            out.append((("params", "op"), f"unknown op {op!r}; known: {', '.join(OPS)}"))
    return out


def _names_or_empty(expr: str) -> set[str]:
    try:
        return names_in(expr, is_expression=True)
    except jinja2.TemplateSyntaxError:
        return set()  # reported by the name check


def dependencies(name: str, p: Parameter, params: set[str]) -> set[str]:
    """The parameters ``p`` needs resolved first (its expressions' names, and ``depends_on``).

    Raises:
        jinja2.TemplateSyntaxError.
    """
    used: set[str] = set(p.depends_on)
    for expr in (p.values, p.derive, p.where, *p.distinct_from):
        if expr is not None:
            used |= names_in(expr, is_expression=True)
    return (used & params) - {name}


def check_template(t: Template) -> list[tuple[tuple[Any, ...], str]]:
    """Problems of ``t`` as (location, message); empty when it is sound (module docstring)."""
    problems: list[tuple[tuple[Any, ...], str]] = []
    params = set(t.parameters)
    known = params | set(ValueRegistry.FUNCTIONS) | JINJA_NAMES
    deps: dict[str, set[str]] = {}

    def names(loc: tuple[Any, ...], value: Any, *, expr: bool = False, extra: frozenset[str] = frozenset()) -> set[str]:
        try:
            used = names_in(value, is_expression=expr)
        except jinja2.TemplateSyntaxError as e:
            problems.append((loc, f"Jinja syntax error: {e.message}"))
            return set()
        unknown = sorted(used - known - extra)
        if unknown:
            problems.append((loc, f"unknown name(s) {', '.join(unknown)}: not a parameter ({', '.join(sorted(params))}) "
                                  f"nor a registry function"))
        return used

    for name, p in t.parameters.items():
        if name in RESERVED or not re.fullmatch(PARAM_RE, name):
            why = (f"a registry function's name (the parameter would hide {name}())" if name in ValueRegistry.FUNCTIONS else
                   "a Jinja built-in name" if name in JINJA_NAMES else
                   "reserved for the harness" if name in RESERVED else f"not a name expressions can use ({PARAM_RE})")
            problems.append((("parameters", name), f"parameter name {name!r} is {why}"))
        for field in ("values", "derive", "where"):
            v = getattr(p, field)
            if v is not None:
                names(("parameters", name, field), v, expr=True, extra=frozenset({name}) if field == "where" else frozenset())
        for i, d in enumerate(p.distinct_from):
            names(("parameters", name, "distinct_from", i), d, expr=True)
        selfref = [f for f in ("values", "derive") if getattr(p, f) is not None and name in _names_or_empty(getattr(p, f))]
        selfref += [f"distinct_from.{i}" for i, d in enumerate(p.distinct_from) if name in _names_or_empty(d)]
        if name in p.depends_on:
            selfref.append("depends_on")
        for f in selfref:
            problems.append((("parameters", name, *f.split(".")), f"dependency cycle: {name} depends on itself"))
        unknown_dep = [d for d in p.depends_on if d not in params]
        if unknown_dep:
            problems.append((("parameters", name, "depends_on"), f"unknown parameter(s) {', '.join(unknown_dep)}"))
        try:
            deps[name] = dependencies(name, p, params)
        except jinja2.TemplateSyntaxError:
            deps[name] = set()
    # a cycle: Kahn's algorithm leaves some parameters unresolved
    left, done = dict(deps), set()
    while left:
        ready = [n for n, d in left.items() if d <= done]
        if not ready:
            cyc = sorted(left)
            problems.append((("parameters", cyc[0]), f"dependency cycle among {', '.join(cyc)}"))
            break
        for n in ready:
            done.add(n)
            del left[n]
    names(("prompt",), t.prompt)
    for i, s in enumerate(t.setup):
        names(("setup", i), s.model_dump())
    kinds = check_kinds()
    seen: dict[str, int] = {}
    for i, tc in enumerate(t.test_cases):
        if tc.kind not in kinds:
            problems.append((("test_cases", i, "kind"), f"unknown check kind {tc.kind!r}; known: {', '.join(sorted(kinds))}"))
        if tc.id in seen:
            problems.append((("test_cases", i, "id"), f"duplicate test case id {tc.id!r} (also test_cases.{seen[tc.id]})"))
        seen.setdefault(tc.id, i)
        problems += [(("test_cases", i, *loc), msg) for loc, msg in device_check_problems(tc.kind, tc.params)]
        bound: frozenset[str] = frozenset()
        if tc.each is not None:
            names(("test_cases", i, "each"), tc.each, expr=True)
            bound = frozenset({tc.as_})
        names(("test_cases", i, "params"), tc.params, extra=bound)
        names(("test_cases", i, "id"), tc.id, extra=bound)
        names(("test_cases", i, "description"), tc.description, extra=bound)
    for i, pat in enumerate(t.invalidates):
        names(("invalidates", i), pat)
    for key, lines in t.expects.items():
        names(("expects", key), key)
        names(("expects", key), lines)
    hidden = {n for n, p in t.parameters.items() if p.hidden}
    for level, sol in t.reference.items():
        if isinstance(sol, dict):
            used = names(("reference", level), sol)
            scenario_bound = (used & set(ValueRegistry.FUNCTIONS)) - {"usid"}
            if scenario_bound:
                problems.append((("reference", level), f"uses registry function(s) {', '.join(sorted(scenario_bound))}: a "
                                                       "reference solution is rendered from the ticket's parameters alone "
                                                       "(draw the value as a parameter)"))
            if used & hidden:
                problems.append((("reference", level), f"uses hidden parameter(s) {', '.join(sorted(used & hidden))}: a "
                                                       "reference solution may use only what the ticket shows"))
    return problems
