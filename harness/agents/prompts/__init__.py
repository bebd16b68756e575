"""The prompts of the model-driven agent, as data: one YAML file per agent mode (``react.yaml``,
``single-turn.yaml``, ``planner-executor.yaml``) plus ``common.yaml``, in this directory.

Each file maps a template name to its text (Python ``str.format`` placeholders); the comment at
the top of each file says what every template is for. :data:`TEMPLATES` fixes, per file, the
templates it must define and the placeholders each may use: a missing or unknown template, or a
placeholder a template may not use, is refused when the file is loaded, naming the file and the
template. ``--agent-opt prompts=DIR`` reads the files present in another directory instead (same
names, same rules; a file missing there is the packaged one), e.g. to study the effect of wording;
a directory that does not exist, holds none of these files or holds a ``.yaml`` file of another
name (a typo would otherwise silently run the packaged prompts) is refused.
"""

from __future__ import annotations

import string
from functools import cache
from importlib import resources
from pathlib import Path

import yaml

from harness.errors import AnibenchError

__all__ = ["TEMPLATES", "Prompts", "check_directory", "load"]

#: File (without ``.yaml``) -> template name -> the placeholders it may use.
TEMPLATES: dict[str, dict[str, frozenset[str]]] = {
    "common": {
        "attached_file": frozenset({"name", "text"}),
        "server_instructions": frozenset({"instructions"}),
    },
    "react": {
        "system": frozenset({"server_instructions"}),
        "nudge": frozenset(),
    },
    "single-turn": {
        "system": frozenset({"server_instructions"}),
        "recover": frozenset({"tool", "error"}),
    },
    "planner-executor": {
        "planner_system": frozenset({"server_instructions"}),
        "plan": frozenset({"request", "tools"}),
        "replan": frozenset({"request", "tools", "plan", "done", "failed_step", "error"}),
        "executor_system": frozenset({"server_instructions"}),
        "step": frozenset({"plan", "n", "total", "step"}),
        "finish": frozenset(),
    },
}


class Prompts(dict[str, str]):
    """The templates of one file, by name; :meth:`render` fills one in."""

    file: str = ""

    def render(self, template: str, /, **values: object) -> str:
        """Template ``template`` with its placeholders filled from ``values``.

        Raises:
            KeyError: no such template, or a placeholder without a value (a bug: every
                placeholder a template may use is always given).
        """
        return self[template].format(**values)


def _placeholders(text: str) -> set[str]:
    return {field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(text) if field is not None}


def _check(file: str, path: str, data: object) -> Prompts:
    spec = TEMPLATES[file]
    if not isinstance(data, dict):
        raise AnibenchError(f"prompts {path}: expected a mapping of template name to text")
    missing = sorted(set(spec) - set(data))
    unknown = sorted(set(data) - set(spec))
    if missing or unknown:
        raise AnibenchError(f"prompts {path}: " + "; ".join(
            [f"missing template(s) {', '.join(missing)}"] * bool(missing)
            + [f"unknown template(s) {', '.join(unknown)} (known: {', '.join(spec)})"] * bool(unknown)))
    out = Prompts()
    out.file = path
    for name, text in data.items():
        if not isinstance(text, str):
            raise AnibenchError(f"prompts {path}: template {name!r} must be text")
        try:
            used = _placeholders(text)
        except ValueError as e:
            raise AnibenchError(f"prompts {path}: template {name!r}: {e}") from None
        if bad := sorted(used - spec[name]):
            allowed = ", ".join(f"{{{p}}}" for p in sorted(spec[name])) or "none"
            raise AnibenchError(f"prompts {path}: template {name!r} uses {', '.join(f'{{{b}}}' for b in bad)}; "
                                f"it may use: {allowed}")
        try:  # a conversion or format spec that fails on text ({error:d}) would fail mid-run
            text.format(**{p: "x" for p in spec[name]})
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise AnibenchError(f"prompts {path}: template {name!r} cannot be filled in: {e}") from None
        out[name] = text
    return out


@cache
def check_directory(directory: str) -> None:
    """Refuse a prompt directory that cannot be what was meant (see the module docstring).

    Raises:
        AnibenchError: no such directory; a ``.yaml`` file in it that is not a prompt file; none
            of the prompt files in it.
    """
    d = Path(directory)
    known = ", ".join(f"{f}.yaml" for f in TEMPLATES)
    if not d.is_dir():
        raise AnibenchError(f"prompts directory {directory} does not exist (or is not a directory)")
    names = {p.name for p in d.iterdir()}
    if unknown := sorted(n for n in names if n.endswith((".yaml", ".yml")) and n.removesuffix(".yaml") not in TEMPLATES):
        raise AnibenchError(f"prompts directory {directory}: {', '.join(unknown)} is not a prompt file; known: {known}")
    if not names & {f"{f}.yaml" for f in TEMPLATES}:
        raise AnibenchError(f"prompts directory {directory} holds none of the prompt files ({known})")


@cache
def load(file: str, directory: str | None = None) -> Prompts:
    """The templates of ``file`` (``common``, ``react``, ``single-turn``, ``planner-executor``).

    Args:
        file: the file's name without ``.yaml``.
        directory: where to read it; None (or a directory without the file) = the files shipped
            in this package.

    Raises:
        AnibenchError: unknown file, a directory refused by :func:`check_directory`, unreadable or
            invalid YAML, or templates that break the rules of :data:`TEMPLATES`.
    """
    if file not in TEMPLATES:
        raise AnibenchError(f"no prompt file {file!r}; known: {', '.join(TEMPLATES)}")
    if directory is not None:
        check_directory(directory)
    name = f"{file}.yaml"
    try:
        if directory is None or not (Path(directory) / name).exists():
            path = f"harness/agents/prompts/{name}"
            text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
        else:
            path = str(Path(directory) / name)
            text = Path(path).read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except OSError as e:
        raise AnibenchError(f"cannot read prompts {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise AnibenchError(f"prompts {path} are not valid YAML: {e}") from None
    return _check(file, path, data)
