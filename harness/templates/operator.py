"""The scripted operator of a template variant: the template's reference solution for the
agent's level, rendered from the ticket alone (request.yaml: the template id and the parameters
the agent is shown) and sent through the level's MCP tools -- A0 ``run_shell`` (one script per
device), A1 ``apply_config`` (every device's lines in one call), A2 ``edit_config`` of each
device's candidate (the reference's lines are XML elements in the models' namespaces, joined into
one ``<config>`` content) and ``commit`` (on an edit or commit error: ``discard_changes`` and
the error is the outcome's). It never sees the scenario or
the hidden test cases (harness.agents.scripted's contract).

A level whose reference the template marks "cannot express: reason" is not attempted: the run is
reported as one the harness could not conduct (``AgentOutcome.run_failed``), with the reason, so
that campaigns show the skipped cells instead of scoring a failure nobody attempted.
"""

from __future__ import annotations

from typing import Any

import yaml

from harness.agents.base import AgentContext, AgentOutcome, ToolSession

#: A0 scripts stop at the first failing command (the tool result says which).
A0_PRELUDE = "set -e"
#: Levels whose tools this operator drives.
DRIVEN = ("A0", "A1", "A2")


def template_request(files: dict[str, str]) -> tuple[str, dict[str, Any]] | None:
    """(template id, shown parameters) when the ticket is a template's, else None."""
    try:
        doc = yaml.safe_load(files.get("request.yaml", "")) or {}
    except yaml.YAMLError:
        return None
    if isinstance(doc, dict) and "template" in doc and isinstance(doc.get("parameters"), dict):
        return str(doc["template"]), doc["parameters"]
    return None


def reference_for(template: str, parameters: dict[str, Any], level: str) -> dict[str, list[str]] | str:
    """The level's reference solution (device -> commands) or ``cannot express: reason``.

    Raises:
        AnibenchError: unknown template.
    """
    from harness.errors import AnibenchError
    from harness.templates.instantiate import render_reference
    from harness.templates.tasks import templates

    lib = templates()
    if template not in lib:
        raise AnibenchError(f"request.yaml names an unknown template {template!r}")
    ref = render_reference(lib[template], parameters)[level]
    if isinstance(ref, dict) and level not in DRIVEN:
        return f"cannot express: the scripted operator drives {', '.join(DRIVEN)} only"
    return ref


async def run_reference(tools: ToolSession, ctx: AgentContext, template: str, parameters: dict[str, Any]) -> AgentOutcome:
    """Apply the reference at ``ctx.level`` and submit (module docstring)."""
    ref = reference_for(template, parameters, ctx.level)
    if isinstance(ref, str):
        return AgentOutcome(error=f"template {template} at {ctx.level}: {ref} (skipped)", run_failed=True)
    if ctx.level == "A1":
        r = await tools.call("apply_config", {"commands": ref})
        note = "" if r.ok else f"apply_config failed: {r.text[:300]}"
    elif ctx.level == "A2":
        note = ""
        for dev, elements in ref.items():
            for tool, args in (("edit_config", {"device": dev, "config": "".join(elements)}), ("commit", {"device": dev})):
                r = await tools.call(tool, args)
                if not r.ok:
                    note += f"{dev}: {tool} failed: {r.text[:300]}; "
                    await tools.call("discard_changes", {"device": dev})
                    break
    else:
        note = ""
        for dev, lines in ref.items():
            r = await tools.call("run_shell", {"device": dev, "command": "\n".join([A0_PRELUDE, *lines])})
            d = r.data or {}
            if not r.ok or d.get("exit_status") not in (0, None):
                note += f"{dev}: exit {d.get('exit_status')} {str(d.get('stderr', r.text))[:200]}; "
    await tools.call("submit", {})
    return AgentOutcome(error=note or None)
