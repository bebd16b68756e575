"""Jinja rendering of template strings (jinja2, sandboxed, StrictUndefined).

A string that is exactly one expression (``"{{ x }}"``) evaluates to the native value, so that
lists, numbers and mappings keep their type in test-case parameters; any other string renders to
text. Containers are rendered element by element.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.sandbox import SandboxedEnvironment

_ONE_EXPR = re.compile(r"^\{\{(?P<e>(?:(?!\}\}|\{\{).)*)\}\}$", re.DOTALL)


@functools.cache
def env() -> SandboxedEnvironment:
    """The shared environment: strict undefined names, no autoescape, kept trailing newlines."""
    return SandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)


@functools.lru_cache(maxsize=4096)
def _compiled_expression(text: str) -> Any:
    return env().compile_expression(text, undefined_to_none=False)


@functools.lru_cache(maxsize=4096)
def _compiled_template(text: str) -> jinja2.Template:
    return env().from_string(text)


def expression(text: str, ctx: dict[str, Any]) -> Any:
    """Evaluate one Jinja expression (no braces); compiled once per process.

    Raises:
        jinja2.TemplateError: syntax error or undefined name.
    """
    return _compiled_expression(text)(**ctx)


def render(value: Any, ctx: dict[str, Any]) -> Any:
    """``value`` with every string rendered (module docstring).

    Raises:
        jinja2.TemplateError: syntax error or undefined name.
    """
    if isinstance(value, str):
        m = _ONE_EXPR.match(value.strip())
        if m:
            return expression(m.group("e"), ctx)
        return _compiled_template(value).render(**ctx)
    if isinstance(value, list):
        return [render(v, ctx) for v in value]
    if isinstance(value, dict):
        return {render(k, ctx) if isinstance(k, str) else k: render(v, ctx) for k, v in value.items()}
    return value


def names_in(value: Any, *, is_expression: bool = False) -> set[str]:
    """Names a string (or container of strings) refers to, undeclared inside it.

    Raises:
        jinja2.TemplateSyntaxError.
    """
    if isinstance(value, str):
        src = "{{ " + value + " }}" if is_expression else value
        return set(meta.find_undeclared_variables(env().parse(src)))
    if isinstance(value, list):
        return set().union(*(names_in(v, is_expression=is_expression) for v in value)) if value else set()
    if isinstance(value, dict):
        out: set[str] = set()
        for k, v in value.items():
            out |= names_in(k) | names_in(v, is_expression=is_expression)
        return out
    return set()
