"""Templates as task classes: the library, and an instance as a task variant.

A template's id is its task name (``harness task validate isis-metric``). Variant ``v`` of a
template in scenario ``sc`` is instance ``v`` of Algorithm 1 (:func:`instantiate`), with

- the HAI: the prompt (a fixed preamble, the template's goal, the closing sentence every class
  uses) and the files ``request.yaml`` (the template id and the parameters the agent is shown)
  and ``design.md`` (how services are built here, the same text as every task class);
- ``setup``: the template's customer-side steps;
- ``test_cases``: the template's hidden test cases; ``damage_checks``: every baseline invariant
  the template does not declare it changes (``invalidates``);
- ``reference``: per level, device -> commands, or "cannot express: reason" (hidden from the
  agent; the scripted operator renders the same from request.yaml, :mod:`harness.templates.operator`).
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from harness.errors import AnibenchError
from harness.tasks import Changes, SetupStep, TaskVariant
from harness.templates.instantiate import instantiate
from harness.templates.schema import Template, TemplateError, load_template
from substrate.scenario.model import Scenario

LIBRARY = "library"
PREAMBLE = ("You operate a multi-tenant SRv6 provider network (FRR and Linux routers; design.md describes how "
            "services are built here, request.yaml gives the ticket's values). Ticket: ")
CLOSING = " Do not disturb any other service. Check your work, then call submit."


class TemplateVariant(TaskVariant):
    """A task variant drawn from a protocol template (module docstring). ``changes`` is empty:
    a template changes protocol state, not the tenants' site inventory."""

    changes: Changes = Field(default_factory=lambda: Changes(tenant=""))
    template: str
    family: str
    parameters: dict[str, Any]
    reference: dict[str, dict[str, list[str]] | str] = Field(
        description="Level -> device -> commands, or 'cannot express: reason' (hidden from the agent).")


def library_dir() -> Path:
    """The directory of the shipped templates."""
    return Path(str(resources.files("harness.templates") / LIBRARY))


@functools.cache
def _library(directory: str) -> tuple[dict[str, Template], dict[str, str]]:
    """(id -> template, file stem -> why the file was left out) of ``directory``'s ``*.yaml``:
    a malformed file (not UTF-8, bad YAML, a bad field, an id that is not its name or is taken)
    is left out with its error, so the others stay usable."""
    out: dict[str, Template] = {}
    bad: dict[str, str] = {}
    for p in sorted(Path(directory).glob("*.yaml")):
        try:
            t = load_template(p)
        except (AnibenchError, OSError) as e:
            bad[p.stem] = str(e) if isinstance(e, AnibenchError) else f"{p}: cannot read: {e.strerror or e}"
            continue
        if t.id in out:
            bad[p.stem] = f"{p}: template id {t.id!r} is also {out[t.id].source}"
        elif t.id != p.stem:
            bad[p.stem] = f"{p}: a template's file is named after its id ({t.id}.yaml)"
        else:
            out[t.id] = t
    return out, bad


def templates(directory: str | Path | None = None) -> dict[str, Template]:
    """Every well-formed template of the library (id -> template), parsed once per process; the
    malformed files are left out (:func:`broken_templates` says why)."""
    return _library(str(directory or library_dir()))[0]


def broken_templates(directory: str | Path | None = None) -> dict[str, str]:
    """File stem -> the error of each template file of the library left out (file, line, field)."""
    return _library(str(directory or library_dir()))[1]


def is_template(name: str) -> bool:
    """Whether ``name`` is a template's id (or the name of a template file left out as
    malformed: using it reports the file's error)."""
    return name in templates() or name in broken_templates()


def request_doc(template: str, shown: dict[str, Any]) -> str:
    """request.yaml of a template variant."""
    return yaml.safe_dump({"template": template, "parameters": shown}, sort_keys=False)


def make_template_variant(name: str, sc: Scenario, variant: int, *, fault_seed: int | None = None) -> TemplateVariant:
    """Variant ``variant`` of template ``name`` in ``sc`` (module docstring).

    Raises:
        AnibenchError: unknown template. InstantiationRefused: the scenario cannot host it
            (names the parameter and why).
    """
    from harness.tasks import DESIGN_MD

    lib = templates()
    if name in broken_templates():
        raise TemplateError(broken_templates()[name])
    if name not in lib:
        raise AnibenchError(f"unknown template {name!r}; known: {', '.join(sorted(lib))}")
    t = lib[name]
    inst = instantiate(t, sc, variant)
    seed = sc.seed * 1000 + variant
    return TemplateVariant(
        task_class=name, variant=variant, seed=seed, scenario_seed=sc.seed,
        fault_seed=fault_seed if fault_seed is not None else seed, prompt=PREAMBLE + inst.prompt + CLOSING,
        files={"request.yaml": request_doc(name, inst.shown), "design.md": DESIGN_MD},
        setup=[SetupStep(node=s["node"], argv=["sh", "-c", s["sh"]], why=s["why"] or "customer side",
                         daemons=s.get("daemons", [])) for s in inst.setup],
        test_cases=inst.test_cases, damage_checks=inst.damage_checks, template=name, family=t.family,
        parameters=inst.parameters, reference=inst.reference,
    )
