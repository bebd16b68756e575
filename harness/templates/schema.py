"""The template file format: one YAML file per protocol template (NetConfArena section IV-D and
Appendix C, Table I: intent, parameters with sampling rules and constraints, reference
configuration, test cases), parsed with pydantic. Errors name the file, the LINE and the field
(the YAML node marks are kept for that).

A template::

    id: isis-metric                 # unique; the task name (harness task validate isis-metric)
    family: isis                    # the task table's family column
    title: one line
    requires: {layers: [underlay], capabilities: [isisd]}
    parameters:                     # resolved by Algorithm 1 (harness.templates.instantiate)
      link: {values: "core_links()"}                 # a Jinja expression over the value registry
      metric: {range: [40, 60], step: 10}             # or choice: [..], or derive: "expr"
      far: {values: "routers()", where: "far.name != link.a", distinct_from: ["link.b"]}
    prompt: "Jinja text of the goal, with the parameters"
    setup: [{node: "...", sh: "...", daemons: [bgpd]}]  # customer-side steps before the agent starts
    test_cases: [{id, kind, params, description, each?, as?}]   # hidden; observer kinds
    invalidates: ["underlay/fib/*"]                  # baseline invariants the task changes
    reference:                      # per ANI level: device -> commands, or "cannot express: why"
      A0: {"{{ link.a }}": ["vtysh -c ..."]}         # shell lines
      A1: {"{{ link.a }}": ["interface {{ link.a_if }}", "isis metric {{ metric }}"]}
      A3-T: "cannot express: A3-T's catalog has no IS-IS service class"

Strings are Jinja templates (StrictUndefined: a name not defined is an error); a string that is
one expression (``"{{ x }}"``) renders to the native value (a list stays a list).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import AnibenchError

#: The ANI levels a reference solution can be written for (servers.registry's levels).
LEVELS = ("A0", "A1", "A2", "A3-T", "A3-R", "A4")
#: Levels every template must express (the scripted operator's shell and wrapper forms).
REQUIRED_LEVELS = ("A0", "A1")
CANNOT = "cannot express:"
ID_RE = r"[a-z0-9][a-z0-9-]{1,62}"
#: Bounds of a template file's YAML (the library's largest has ~170 nodes, 5 levels): nesting
#: depth, and nodes with every alias expanded (an alias bomb -- anchors nested in anchors --
#: grows exponentially; a recursive alias never ends).
MAX_DEPTH = 32
MAX_NODES = 10_000
#: Most values a ``range`` domain may have (Algorithm 1 lists the domain).
MAX_RANGE = 2**20


class TemplateError(AnibenchError):
    """A template file is malformed (message: ``FILE:LINE: field: what is wrong``)."""


class InstantiationRefused(AnibenchError):
    """A template cannot be instantiated on a scenario: the message names the parameter (or
    the ``field`` whose rendering failed, e.g. ``test_cases.2``; else the requirements) and why."""

    def __init__(self, template: str, parameter: str | None, reason: str, *, field: str | None = None):
        self.template, self.parameter, self.reason, self.field = template, parameter, reason, field
        where = f"parameter {parameter!r}" if parameter else field or "requirements"
        super().__init__(f"template {template}: {where}: {reason}")


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Parameter(_M):
    """One parameter: exactly one domain (``values``, ``choice``, ``range``, ``derive``), optional
    constraints. Dependencies are the other parameters its expressions name (plus
    ``depends_on``)."""

    values: str | None = Field(default=None, description="Jinja expression giving the candidate list (value registry).")
    choice: list[Any] | None = Field(default=None, description="A literal set of candidates.")
    range: tuple[int, int] | None = Field(default=None, description="Integers lo..hi inclusive.")
    step: int = Field(default=1, ge=1)
    derive: str | None = Field(default=None, description="Jinja expression: the value, computed from others.")
    where: str | None = Field(default=None, description="Jinja boolean expression every chosen value satisfies.")
    distinct_from: list[str] = Field(default_factory=list, description="Jinja expressions the value must differ from.")
    depends_on: list[str] = Field(default_factory=list)
    hidden: bool = Field(default=False, description="Not shown to the agent (request.yaml); references may not use it.")

    @model_validator(mode="after")
    def _one_domain(self) -> Parameter:
        given = [k for k in ("values", "choice", "range", "derive") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one domain of values, choice, range, derive (got {', '.join(given) or 'none'})")
        if self.range is not None and self.range[0] > self.range[1]:
            raise ValueError(f"range {list(self.range)} is empty (lo > hi)")
        if self.range is not None and (n := (self.range[1] - self.range[0]) // self.step + 1) > MAX_RANGE:
            raise ValueError(f"range {list(self.range)} with step {self.step} has {n} values; at most 2^20 ({MAX_RANGE}): "
                             "narrow it or raise the step")
        if self.choice is not None and not self.choice:
            raise ValueError("choice is empty")
        return self


class TestCase(_M):
    """A hidden test case: an observer check (``kind``: substrate.scenario.observer and
    substrate.scenario.device_checks), its ``params`` rendered with the parameters. ``each``
    (an expression giving a list) repeats it, the element bound to ``as``."""

    __test__ = False  # not a pytest class

    id: str
    kind: str
    params: dict[str, Any] = Field(default_factory=dict)
    description: str = ""
    each: str | None = None
    as_: str = Field(default="item", alias="as")


class SetupStep(_M):
    """A customer-side step the harness runs before the agent starts (a CE configured)."""

    node: str
    sh: str
    why: str = ""
    daemons: list[str] = Field(default_factory=list, description="FRR daemons the step starts (harness.tasks.SetupStep.daemons).")

    @field_validator("daemons")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        from substrate.frr_daemons import KNOWN_DAEMONS

        bad = [d for d in v if d not in KNOWN_DAEMONS]
        if bad:
            raise ValueError(f"unknown FRR daemon(s) {', '.join(bad)}; known: {', '.join(KNOWN_DAEMONS)}")
        return v


class Requires(_M):
    layers: list[str] = Field(default_factory=list, description="Scenario layers the template needs.")
    capabilities: list[str] = Field(default_factory=list, description="Device capabilities (harness.templates.registry).")


class Template(_M):
    """One protocol template (module docstring)."""

    id: str
    family: str
    title: str
    requires: Requires = Field(default_factory=Requires)
    parameters: dict[str, Parameter]
    prompt: str
    setup: list[SetupStep] = Field(default_factory=list)
    test_cases: list[TestCase] = Field(min_length=1)
    invalidates: list[str] = Field(default_factory=list, description="Baseline invariant ids (fnmatch patterns, Jinja) the task changes.")
    expects: dict[str, list[str]] = Field(default_factory=dict, description=(
        "A router's whole-state checks the task adds to (invariant id, Jinja) -> the rendered lines it adds (Jinja): "
        "SID routes of a local_sids check (``SID/64 encap seg6local ...``), rules of a policy_rules check "
        "(``priority P ... lookup T``). The check stays a damage check with them, so the task may add those and "
        "nothing else there (issue 36: invalidating it let any SID or rule on the PE pass)."))
    reference: dict[str, dict[str, list[str]] | str]
    source: str = Field(default="", exclude=True)

    @field_validator("id", "family")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(ID_RE, v):
            raise ValueError(f"{v!r} is not a name ({ID_RE})")
        return v

    @field_validator("reference")
    @classmethod
    def _levels(cls, v: dict[str, Any]) -> dict[str, Any]:
        for level, sol in v.items():
            if level not in LEVELS:
                raise ValueError(f"unknown level {level!r}; known: {', '.join(LEVELS)}")
            if isinstance(sol, str) and not sol.startswith(CANNOT):
                raise ValueError(f"{level}: a level's reference is device -> commands, or '{CANNOT} <reason>'")
            if isinstance(sol, str) and not sol[len(CANNOT):].strip():
                raise ValueError(f"{level}: '{CANNOT}' needs the reason")
        for level in REQUIRED_LEVELS:
            if not isinstance(v.get(level), dict) or not v[level]:
                raise ValueError(f"every template has a reference solution at {level} (device -> commands)")
        return v

    def cannot(self, level: str) -> str | None:
        """Why the template cannot be solved by a reference at ``level`` (None: it can)."""
        sol = self.reference.get(level)
        if sol is None:
            return f"no reference solution written for {level}"
        return sol[len(CANNOT):].strip() if isinstance(sol, str) else None


# -- loading with line numbers ----------------------------------------------------------------


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int:
    """The 1-based line of the YAML node at ``loc`` (pydantic's error location), or of the
    deepest node on the way there that exists (a missing field: its mapping)."""
    line = (node.start_mark.line + 1) if node is not None else 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if str(k.value) == str(part):
                    nxt = v
                    break
            if nxt is None:
                continue  # a pydantic location step that is no YAML key (a union member's name)
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
        else:
            continue
        line = node.start_mark.line + 1
    return line


def _duplicate_key(node: yaml.Node | None, path: str = "") -> tuple[int, str, int] | None:
    """(line, field, line of the first) of the first key given twice in one mapping, else None
    (PyYAML's loader keeps the last silently: a second ``family:`` or parameter would win)."""
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for k, v in node.value:
            key = str(k.value)
            field = f"{path}.{key}" if path else key
            if key in first:
                return k.start_mark.line + 1, field, first[key]
            first[key] = k.start_mark.line + 1
            found = _duplicate_key(v, field)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            found = _duplicate_key(v, f"{path}.{i}")
            if found:
                return found
    return None


def _bounded(text: str, source: str) -> None:
    """Refuse YAML that nests deeper than :data:`MAX_DEPTH`, holds a recursive alias (an alias
    inside its own anchor's node), or has more than :data:`MAX_NODES` nodes with aliases
    expanded -- before anything builds the (recursive or exponential) structure. Reads PyYAML's
    event stream, which is flat (no recursion).

    Raises:
        TemplateError: ``SOURCE:LINE: YAML: ...`` at the offending node; yaml.YAMLError for
            a syntax error (the caller reports it).
    """
    open_: list[list[Any]] = []  # collections being read: [anchor, nodes so far, itself included]
    sizes: dict[str, int] = {}  # anchor -> nodes of its node, aliases expanded
    done = 0  # nodes of the top-level collections read so far
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        line = ev.start_mark.line + 1
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            open_.append([ev.anchor, 1])
            if len(open_) > MAX_DEPTH:
                raise TemplateError(f"{source}:{line}: YAML: nested deeper than {MAX_DEPTH} levels")
            n = 0
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, n = open_.pop()
            if anchor:
                sizes[anchor] = n
        elif isinstance(ev, yaml.AliasEvent):
            if any(c[0] == ev.anchor for c in open_):
                raise TemplateError(f"{source}:{line}: YAML: recursive alias *{ev.anchor} (inside its own anchor &{ev.anchor})")
            n = sizes.get(ev.anchor, 1)
        elif isinstance(ev, yaml.ScalarEvent):
            n = 1
            if ev.anchor:
                sizes[ev.anchor] = 1
        else:
            continue
        if n:
            if open_:
                open_[-1][1] += n
            else:
                done += n
        if done + sum(c[1] for c in open_) > MAX_NODES:
            raise TemplateError(f"{source}:{line}: YAML: more than {MAX_NODES} nodes with aliases expanded (an alias bomb?)")


def parse_template(text: str, source: str = "<template>") -> Template:
    """Parse and check one template file's text (see :mod:`harness.templates.check` for the
    checks that need the expressions: names, dependencies, levels).

    Raises:
        TemplateError: ``SOURCE:LINE: field: message`` for a YAML syntax error, a missing or
            malformed field, or a semantic error (harness.templates.check).
    """
    try:
        _bounded(text, source)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise TemplateError(f"{source}:{line}: YAML: {getattr(e, 'problem', None) or e}") from None
    dup = _duplicate_key(node)
    if dup is not None:
        raise TemplateError(f"{source}:{dup[0]}: {dup[1]}: duplicate key (first at line {dup[2]}): YAML keeps only the last")
    if not isinstance(data, dict):
        raise TemplateError(f"{source}:1: a template is a mapping (id, family, parameters, ...), got {type(data).__name__}")
    try:
        t = Template.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        field = ".".join(str(x) for x in loc) or "(top)"
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise TemplateError(f"{source}:{_line_of(node, loc)}: {field}: {msg}{more}") from None
    t.source = source
    from harness.templates.check import check_template

    for loc, msg in check_template(t):
        raise TemplateError(f"{source}:{_line_of(node, loc)}: {'.'.join(str(x) for x in loc)}: {msg}")
    return t


def load_template(path: str | Path) -> Template:
    """Read and parse one template file.

    Raises:
        TemplateError: malformed, or not UTF-8 text (the file and line of the first bad byte).
        OSError: unreadable.
    """
    p = Path(path)
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise TemplateError(f"{p}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): a template "
                            "file is UTF-8 YAML") from None
    return parse_template(text, str(p))
