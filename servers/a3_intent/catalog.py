"""The typed service catalog of A3-T: service classes, their specs, and change-set operations.

Every service class of the brownfield generator (``substrate.scenario.layers``) that an agent may
change has a *spec* (what the agent states when creating an instance) and a *patch* (what it
states when modifying one: RFC 7396 merge-patch semantics, a field left out keeps its value and
an explicit ``null`` clears an optional one). Resources the agent does not choose (SRv6 SID
functions, routing-table ids, firewall marks) are allocated by the server from the scenario's
pools (:class:`substrate.scenario.model.Pools`), so a spec never names them.

A change set is a list of operations, each ``{"op": "create"|"modify"|"delete",
"service_class": ..., "id": ..., "spec": {...}}``: a discriminated union on ``service_class``
whose members are discriminated unions on ``op``, so the tool input JSON Schema says exactly
which spec each (class, op) takes. :func:`parse_ops` validates raw JSON against it and reports
every problem with its field path (``ops[1].spec.prefix6: ...``).

Classes: every catalog class (:class:`substrate.scenario.layers.base.Intent`) of every registered
service class (:mod:`substrate.scenario.layers`, draft-salsano-nmrg-nmaa-benchmarking-framework
section 6), in registry order; the service-class module owns its spec, patch, description and
examples, and this module assembles them. Nothing here names a class.
"""

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model, field_validator

from substrate.scenario.layers import intents, registry
from substrate.scenario.layers.specs import AUTO, ID_RE, Spec  # noqa: F401 - re-exported
from substrate.scenario.layers.specs import Address4, IfName, InstanceId, NodeName, Prefix4, Prefix6

#: Most operations in one change set.
MAX_OPS = 50

#: Catalog classes a change set may change, and read-only ones (listed, never changed), in registry order.
SERVICE_CLASSES: tuple[str, ...] = tuple(i.name for i in intents() if not i.read_only)
READ_ONLY_CLASSES: tuple[str, ...] = tuple(i.name for i in intents() if i.read_only)
INTENTS = {i.name: i for i in intents()}
OP_NAMES: tuple[str, ...] = ("create", "modify", "delete")
SPEC_MODELS: dict[str, type[Spec]] = {i.name: i.Spec for i in intents() if i.Spec is not None}
PATCH_MODELS: dict[str, type[Spec]] = {i.name: i.Patch for i in intents() if i.Patch is not None}


# -- operations ------------------------------------------------------------------------------------


class _Op(BaseModel):
    """Base of every operation model (unknown fields are errors)."""

    model_config = ConfigDict(extra="forbid")


def _ops_for(cls_name: str, spec: type[Spec], patch: type[Spec], id_type: Any, create_id_doc: str) -> Any:
    """The discriminated union (on ``op``) of one class's create, modify and delete operations."""
    title = "".join(w.capitalize() for w in cls_name.split("_"))
    tag = (Literal[cls_name], Field(description="Service class (see list_service_classes)."))  # type: ignore[valid-type]
    op_doc = "create | modify | delete"
    create = create_model(
        f"Create{title}", __base__=_Op, __doc__=f"Create a {cls_name} instance.",
        op=(Literal["create"], Field(description=op_doc)), service_class=tag,
        id=(id_type | None, Field(default=None, description=create_id_doc)), spec=(spec, ...),
    )  # fmt: skip
    modify = create_model(
        f"Modify{title}", __base__=_Op, __doc__=f"Change a {cls_name} instance (fields left out keep their value).",
        op=(Literal["modify"], Field(description=op_doc)), service_class=tag,
        id=(id_type, Field(description="Id of the instance to change.")), spec=(patch, ...),
    )  # fmt: skip
    delete = create_model(
        f"Delete{title}", __base__=_Op, __doc__=f"Remove a {cls_name} instance.",
        op=(Literal["delete"], Field(description=op_doc)), service_class=tag,
        id=(id_type, Field(description="Id of the instance to remove.")),
        spec=(None, Field(default=None, description="Delete takes no spec (leave it out or null).")),
    )  # fmt: skip
    return Annotated[create | modify | delete, Field(discriminator="op")]


def _union(members: list[Any]) -> Any:
    out = members[0]
    for m in members[1:]:
        out = out | m
    return out


Op = Annotated[
    _union([_ops_for(i.name, i.Spec, i.Patch, i.id_type, i.id_doc) for i in intents() if not i.read_only]),
    Field(discriminator="service_class"),
]
_OPS = TypeAdapter(list[Op])


# -- problems and their paths --------------------------------------------------------------------


#: Most characters of a problem's message and of its path: a value echoed in a message (a 1 MB
#: prefix, a 1 MB unexpected key) is cut, so one bad field cannot make a 40,000-character error
#: (issue 35, the attack on A3-R/A4's inputs).
MAX_PROBLEM_CHARS = 300


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else f"{text[:most]}... ({len(text) - most} more characters)"


class Problem(BaseModel):
    """One reason a change set is refused, at a field path such as ``ops[1].spec.prefix6``
    (each at most :data:`MAX_PROBLEM_CHARS` characters, the rest cut and counted)."""

    path: str
    message: str

    @field_validator("path", "message", mode="after")
    @classmethod
    def _bounded(cls, v: str) -> str:
        return _cut(v, MAX_PROBLEM_CHARS)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ChangeSetRejected(Exception):
    """A change set was refused before any device was touched; ``problems`` lists every reason."""

    def __init__(self, problems: list[Problem], what: str = "change set rejected; nothing was changed"):
        self.problems = problems
        self.what = what
        super().__init__(f"{what}:\n" + "\n".join(f"- {p}" for p in problems))


def path_of(loc: tuple[Any, ...], prefix: str = "ops") -> str:
    """``ops[1].spec.rules[0].port`` from a pydantic location under the ops list (the union tags
    pydantic inserts -- service class and op names -- are dropped)."""
    out = prefix
    parts = list(loc)
    if parts and isinstance(parts[0], int):
        out += f"[{parts.pop(0)}]"
        if parts and parts[0] in SERVICE_CLASSES:
            parts.pop(0)
            if parts and parts[0] in OP_NAMES:
                parts.pop(0)
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _message(err: dict[str, Any]) -> tuple[tuple[Any, ...], str]:
    loc, typ, msg = tuple(err.get("loc", ())), err.get("type", ""), err.get("msg", "invalid")
    if typ in ("union_tag_invalid", "union_tag_not_found"):
        field = "op" if len(loc) >= 2 and loc[1] in SERVICE_CLASSES else "service_class"
        allowed = OP_NAMES if field == "op" else SERVICE_CLASSES
        given = (err.get("ctx") or {}).get("tag")
        what = f"unknown {field} {given!r}" if typ == "union_tag_invalid" else f"{field} is required"
        return (*loc[:2], field) if field == "op" else (*loc[:1], field), f"{what}; one of: {', '.join(allowed)}"
    if typ == "extra_forbidden":
        return loc, "unexpected field" + (" (delete takes no spec)" if loc and loc[-1] == "spec" else "")
    if typ == "none_required" and loc and loc[-1] == "spec":
        return loc, "delete takes no spec (leave it out or null)"
    if typ == "missing":
        return loc, "field required"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if typ == "string_pattern_mismatch":
        pattern = (err.get("ctx") or {}).get("pattern", "")
        msg = f"{err.get('input')!r} is not a valid name (pattern {pattern})"
    return loc, msg


def parse_ops(raw: Any) -> list[Any]:
    """Validate raw JSON operations against the catalog.

    Raises:
        ChangeSetRejected: every schema violation, each with its field path.
    """
    if not isinstance(raw, list):
        raise ChangeSetRejected([Problem(path="ops", message="must be a list of operations")], "change set rejected")
    if not raw:
        raise ChangeSetRejected([Problem(path="ops", message="empty change set: give at least one operation")], "change set rejected")
    if len(raw) > MAX_OPS:
        raise ChangeSetRejected([Problem(path="ops", message=f"at most {MAX_OPS} operations per change set, got {len(raw)}")],
                                "change set rejected")  # fmt: skip
    try:
        return _OPS.validate_python(raw)
    except ValidationError as e:
        problems = []
        seen = set()
        for err in e.errors():
            loc, msg = _message(err)  # type: ignore[arg-type]
            p = Problem(path=path_of(loc), message=msg)
            if (p.path, p.message) not in seen:
                seen.add((p.path, p.message))
                problems.append(p)
        raise ChangeSetRejected(problems, "change set rejected (schema)") from None


# -- JSON Schemas ------------------------------------------------------------------------------------


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """A self-contained copy of a pydantic JSON Schema: ``$ref``s to ``$defs`` replaced by the
    definitions, OpenAPI ``discriminator`` keywords and pydantic's ``title``s dropped and ``oneOf`` written as ``anyOf``
    (the tags are distinct constants, so both say the same; ``anyOf`` is what most tool-calling
    model APIs accept)."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node and node["$ref"].startswith("#/$defs/"):
                target = walk(defs[node["$ref"].split("/")[-1]])
                extra = {k: walk(v) for k, v in node.items() if k != "$ref"}
                return {**target, **extra}
            out = {}
            for k, v in node.items():
                if k in ("$defs", "discriminator", "title"):
                    continue
                out["anyOf" if k == "oneOf" else k] = walk(v)
            return out
        if isinstance(node, list):
            return [walk(x) for x in node]
        return node

    return walk(schema)


OPS_DESCRIPTION = (
    "The change set: operations applied together as one transaction, in order, e.g. "
    '[{"op": "create", "service_class": "tenant_site", "id": "t3s4", "spec": {"tenant": "t3", "pe": "r2", '
    '"pe_interface": "eth5", "prefix6": "fd10:0:0:9::/64"}}, {"op": "modify", "service_class": "tenant_site", "id": "t3s2", '
    '"spec": {"pe": "r6", "pe_interface": "eth4"}}, {"op": "delete", "service_class": "tenant_site", "id": "t1s2"}]. '
    "create takes the full spec, modify only the fields to change, delete no spec."
)


def _bare(schema: Any) -> Any:
    """A pydantic JSON Schema without its ``title``s (noise to a model), ``oneOf`` as ``anyOf``."""
    if isinstance(schema, dict):
        return {("anyOf" if k == "oneOf" else k): _bare(v) for k, v in schema.items() if k not in ("title", "discriminator")}
    if isinstance(schema, list):
        return [_bare(x) for x in schema]
    return schema


def ops_json_schema(layers: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON Schema of the ``ops`` argument, compact and as precise as the validator (``parse_ops``);
    with ``layers`` (a scenario's), only the operations of the classes those service classes offer.

    One schema per operation shape, each naming its class and op as constants and referring to
    the class's spec or patch schema, which is written once in ``$defs`` (with the instance id
    forms): a client that resends the tool list every turn pays each spec once per tool, not once
    per operation (the fully inlined form was 17.6 KB per tool, issue 11).

    Returns:
        ``(ops_schema, defs)``: the property's schema, whose ``$ref``s are ``#/$defs/NAME``, and
        the definitions, which go at the root of the tool's input schema (JSON Schema 2020-12
        ``$defs``: refs resolve against the document root).
    """
    named = {"id": InstanceId, "device": NodeName, "interface": IfName, "prefix6": Prefix6, "prefix4": Prefix4,
             "address4": Address4}  # fmt: skip
    types = {name: _bare(TypeAdapter(t).json_schema()) for name, t in named.items()}
    defs: dict[str, Any] = dict(types)

    def shared(node: Any) -> Any:
        """``node`` with every use of a named type replaced by a ``$ref`` to it (a field's own
        description kept beside the ref)."""
        if isinstance(node, list):
            return [shared(x) for x in node]
        if not isinstance(node, dict):
            return node
        for name, t in types.items():
            if {k: v for k, v in node.items() if k != "description"} == {k: v for k, v in t.items() if k != "description"}:
                own = node.get("description")
                return {"$ref": f"#/$defs/{name}", **({"description": own} if own and own != t.get("description") else {})}
        return {k: shared(v) for k, v in node.items()}

    shapes = []
    writable = {i.name: i for i in intents() if not i.read_only}
    for cls_name in [n for n in (classes_of(layers) if layers is not None else SERVICE_CLASSES) if n in writable]:
        intent = writable[cls_name]
        ident = shared(_bare(TypeAdapter(intent.id_type).json_schema()))
        if "$ref" not in ident:  # an id form of the class's own: written once
            defs[f"{cls_name}_id"] = {**ident, **({"description": intent.id_doc} if intent.id_doc else {})}
            ident = {"$ref": f"#/$defs/{cls_name}_id"}
        new_id = {"anyOf": [ident, {"type": "null"}], "description": "The new instance's id; left out or null: allocated."}
        for kind, model in (("spec", SPEC_MODELS[cls_name]), ("patch", PATCH_MODELS[cls_name])):
            schema = _bare(model.model_json_schema(ref_template="#/$defs/{model}"))
            defs.update(shared(schema.pop("$defs", {})))
            defs[f"{cls_name}_{kind}"] = shared(schema)
        for op in OP_NAMES:
            props: dict[str, Any] = {"op": {"const": op}, "service_class": {"const": cls_name}}
            required = ["op", "service_class"]
            if op == "create":
                props["id"] = new_id
                props["spec"] = {"$ref": f"#/$defs/{cls_name}_spec"}
                required.append("spec")
            else:
                props["id"] = ident
                props["spec"] = ({"$ref": f"#/$defs/{cls_name}_patch"} if op == "modify"
                                 else {"type": "null", "description": "Delete takes no spec."})
                required += ["id", "spec"] if op == "modify" else ["id"]
            shapes.append({"type": "object", "properties": props, "required": required, "additionalProperties": False})
    ops = {"type": "array", "minItems": 1, "maxItems": MAX_OPS, "description": OPS_DESCRIPTION,
           "items": {"anyOf": shapes}}
    return ops, defs


def classes_of(layers: list[str]) -> list[str]:
    """The catalog classes (writable, then read-only, in registry order) offered by the service
    classes ``layers`` (a scenario's)."""
    owner = {i.name: c.name for c in registry() for i in c.intents}
    return [n for n in (*SERVICE_CLASSES, *READ_ONLY_CLASSES) if owner[n] in layers]


def spec_schema(cls_name: str, patch: bool = False) -> dict[str, Any]:
    """Self-contained JSON Schema of a class's create spec (or modify patch)."""
    model = (PATCH_MODELS if patch else SPEC_MODELS)[cls_name]
    return _inline(model.model_json_schema())


# -- class descriptions (list_service_classes) -------------------------------------------------------

CLASS_INFO: dict[str, dict[str, Any]] = {i.name: i.info for i in intents()}
EXAMPLES: dict[str, list[dict[str, Any]]] = {i.name: i.examples for i in intents() if i.examples}


def natural_key(s: str) -> list[Any]:
    """Sort key that orders ``t2s10`` after ``t2s9``."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", s)]
