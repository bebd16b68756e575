"""The argument policy of every level: how JSON values that are not quite the declared type are
treated, the same for every tool and at every depth of an argument (one place, applied by
:class:`~servers.common.server.AniServer` before a tool's own validation).

- **Booleans are never numbers.** ``true``/``false`` where a number is expected is refused
  (JSON Schema keeps ``boolean`` and ``number`` apart; Python's ``bool`` being an ``int``, and
  pydantic's lax mode, would otherwise read ``true`` as 1).
- **A string holding a JSON value of the expected type is read as that value**, where a number,
  integer, object or array is expected and a string is not: ``"30"`` is 30, ``"[\\"r1\\"]"`` is a
  list, ``"{\\"r1\\": \\"...\\"}"`` an object. Some clients send every argument as a string (or
  JSON-encode nested objects); the value means the same either way, so the call is not failed for
  its transport form. A string that does not hold such a value (``"ten"``, ``"NaN"``, ``"true"``
  for a number) is refused by the tool's validation with the expected type.
- **Numbers are never strings**: ``5`` where a string (a device name, a command) is expected is
  refused.

:data:`ARGUMENT_POLICY` is the one-paragraph statement given to agents (server instructions).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: The policy as agents read it (appended to every server's instructions; README "ANI servers").
ARGUMENT_POLICY = (
    "Arguments are JSON values of the types the tool's input schema gives. Where a number, object or array is "
    "expected, a string holding that JSON value is read as the value (\"30\" is 30); booleans are never numbers "
    "(true is refused where a number is expected) and numbers are never strings."
)

_JSON_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    seen = 0
    while isinstance(ref, str) and ref.startswith("#/") and seen < 32:
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
        ref = node.get("$ref") if isinstance(node, Mapping) else None
        seen += 1
    return schema


def _alternatives(schema: Mapping[str, Any], root: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The schema's alternatives (anyOf/oneOf flattened, $ref resolved); [schema] otherwise."""
    schema = _resolve(schema, root)
    subs = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(subs, list):
        out: list[Mapping[str, Any]] = []
        for s in subs:
            if isinstance(s, Mapping):
                out.extend(_alternatives(s, root))
        return out
    return [schema]


def _types(schema: Mapping[str, Any]) -> set[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    if "properties" in schema or "additionalProperties" in schema:
        return {"object"}
    if "items" in schema or "prefixItems" in schema:
        return {"array"}
    if "enum" in schema or "const" in schema:
        vals = schema.get("enum") or [schema.get("const")]
        return {_json_type(v) for v in vals}
    return set(_JSON_TYPES)  # unconstrained


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object" if isinstance(v, dict) else "unknown"


def _accepts(types: set[str], v: Any) -> bool:
    t = _json_type(v)
    return t in types or (t == "integer" and "number" in types) or (
        t == "number" and "integer" in types and float(v).is_integer())


def _parse_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(name)

    try:
        return json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError):
        return _NOT_JSON


_NOT_JSON = object()


def normalize(value: Any, schema: Mapping[str, Any], *, root: Mapping[str, Any] | None = None,
              path: str = "") -> tuple[Any, list[str]]:  # fmt: skip
    """Apply the policy to ``value`` against its JSON ``schema`` (recursively).

    Returns:
        The value with JSON-holding strings replaced by their values where the schema expects
        a number, integer, object or array (and no string), and the list of refusals
        (``"path: true is a boolean, not a number"``), empty when none.
    """
    root = schema if root is None else root
    alts = _alternatives(schema, root)
    types: set[str] = set()
    for a in alts:
        types |= _types(a)
    where = path or "arguments"
    if isinstance(value, bool):
        if "boolean" not in types and types & {"number", "integer"}:
            return value, [f"{where}: {str(value).lower()} is a boolean, not a number"]
        return value, []
    if isinstance(value, str) and "string" not in types and types & {"number", "integer", "object", "array"}:
        parsed = _parse_json(value)
        if parsed is not _NOT_JSON and not isinstance(parsed, bool | str) and parsed is not None \
                and _accepts(types, parsed):  # fmt: skip
            value = parsed
        else:
            return value, []  # the tool's validation names the expected type
    problems: list[str] = []
    if isinstance(value, dict):
        obj = next((a for a in alts if "object" in _types(a)), None)
        if obj is None:
            return value, []
        props = obj.get("properties") if isinstance(obj.get("properties"), Mapping) else {}
        extra = obj.get("additionalProperties")
        out = {}
        for k, v in value.items():
            sub = props.get(k) if isinstance(k, str) else None
            if sub is None and isinstance(extra, Mapping):
                sub = extra
            if isinstance(sub, Mapping):
                v, p = normalize(v, sub, root=root, path=f"{path}.{k}" if path else str(k))
                problems += p
            out[k] = v
        return out, problems
    if isinstance(value, list):
        arr = next((a for a in alts if "array" in _types(a)), None)
        items = arr.get("items") if arr is not None else None
        if not isinstance(items, Mapping):
            return value, []
        out_list = []
        for i, v in enumerate(value):
            v, p = normalize(v, items, root=root, path=f"{path}[{i}]")
            problems += p
            out_list.append(v)
        return out_list, problems
    return value, []
