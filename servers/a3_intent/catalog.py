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

Classes (draft-salsano-nmrg-nmaa-benchmarking-framework section 6, "service classes"):

- ``tenant``: a tenant's L3VPN over SRv6 (its routing table; layer ``l3vpn``);
- ``tenant_site``: one site of a tenant, a CE behind a PE port (layer ``l3vpn``); a *move* is a
  modify with a new ``pe``/``pe_interface``;
- ``steering_policy``: a tenant flow pinned through a waypoint (layer ``steering``, RFC 9800 uSID);
- ``firewall_rule_set``: a tenant's firewall rules (layer ``firewall``), one set per tenant;
- ``floating_ip``: 1:1 NAT of a TEST-NET-2 address to a site (layer ``floating_ip``, RFC 5737);
- ``attachment_circuit`` (read-only): PE ports cabled to CE hosts, free or in use.
"""

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from substrate.scenario.model import FirewallRule
from substrate.topology import IFNAME_RE, NODE_NAME_RE

#: Instance ids: short, lowercase, no '-' or '/' (they appear inside invariant ids such as
#: ``l3vpn/t3/isolated/t3s1-x-t1s2``).
ID_RE = r"^[a-z][a-z0-9_]{0,31}$"
#: Firewall rule set ids may carry the generator's ``fw-<tenant>`` form.
FW_ID_RE = r"^[a-z][a-z0-9_-]{0,31}$"
#: Most operations in one change set.
MAX_OPS = 50
AUTO = "auto"

ServiceClass = Literal["tenant", "tenant_site", "steering_policy", "firewall_rule_set", "floating_ip"]
SERVICE_CLASSES: tuple[str, ...] = ("tenant", "tenant_site", "steering_policy", "firewall_rule_set", "floating_ip")
#: Read-only classes (listed, never changed by a change set).
READ_ONLY_CLASSES: tuple[str, ...] = ("attachment_circuit",)
OP_NAMES: tuple[str, ...] = ("create", "modify", "delete")


# -- field types -----------------------------------------------------------------------------------


def _prefix(version: int, length: int) -> Any:
    example = "fd10:0:0:7::/64" if version == 6 else "10.0.7.0/24"

    def check(v: str) -> str:
        if v == AUTO:
            return v
        try:
            net = ipaddress.ip_network(v, strict=False)
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv{version} prefix (e.g. {example}) or 'auto'") from None
        if net.version != version:
            raise ValueError(f"{v!r} is an IPv{net.version} prefix; an IPv{version} prefix is expected here")
        if net.prefixlen != length:
            raise ValueError(f"site prefixes are /{length} (PE gets host 1, CE host 2); got /{net.prefixlen}")
        try:
            ipaddress.ip_network(v, strict=True)
        except ValueError:
            raise ValueError(f"{v!r} has host bits set; did you mean {net}?") from None
        return str(net)

    return AfterValidator(check)


def _ipv4_address(v: str) -> str:
    if v == AUTO:
        return v
    try:
        return str(ipaddress.IPv4Address(v))
    except ValueError:
        raise ValueError(f"{v!r} is not an IPv4 address (e.g. 198.51.100.20) or 'auto'") from None


InstanceId = Annotated[str, Field(pattern=ID_RE, description="Instance id: lowercase letters, digits and '_', starting with a letter.")]
NodeName = Annotated[str, Field(pattern=NODE_NAME_RE, description="Device name, e.g. 'r2'.")]
IfName = Annotated[str, Field(pattern=IFNAME_RE, description="Interface name, e.g. 'eth5'.")]
Prefix6 = Annotated[str, _prefix(6, 64), Field(description="IPv6 /64 from the tenant pool, or 'auto' (allocated lowest-free from the pool).",
                                               examples=["fd10:0:0:7::/64", "auto"])]
Prefix4 = Annotated[str, _prefix(4, 24), Field(description="IPv4 /24 from the tenant pool, or 'auto'.", examples=["10.0.7.0/24", "auto"])]
Address4 = Annotated[str, AfterValidator(_ipv4_address), Field(description="IPv4 address from the floating pool, or 'auto'.",
                                                                examples=["198.51.100.20", "auto"])]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- specs and patches -----------------------------------------------------------------------------


class TenantSpec(_Spec):
    """A tenant (customer) L3VPN. Its routing table id is allocated from the table pool; its
    per-PE End.DT6 SIDs are allocated when its first site on a PE is created."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$", description="Customer name, unique, e.g. 'vandelay'.")


class TenantPatch(_Spec):
    """Fields of a tenant to change (left out = unchanged)."""

    name: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]{0,31}$", description="New customer name.")


class TenantSiteSpec(_Spec):
    """A tenant site: the CE host cabled to (pe, pe_interface) -- a spare attachment circuit
    (list_services attachment_circuit) -- gets the site's prefixes (PE ::1/.1, CE ::2/.2)."""

    tenant: InstanceId = Field(description="Tenant id, e.g. 't3'.")
    pe: NodeName = Field(description="PE router the site attaches to.")
    pe_interface: IfName = Field(description="PE port of the attachment circuit (cabled to the site's CE host).")
    prefix6: Prefix6 = AUTO
    prefix4: Prefix4 | None = Field(default=None, description="IPv4 /24, 'auto' to allocate one, or null for an IPv6-only site.")


class TenantSitePatch(_Spec):
    """Fields of a site to change. A new pe/pe_interface moves the site to that circuit (the CE
    changes with it); prefix4 null removes the site's IPv4 service. The tenant cannot change."""

    tenant: InstanceId | None = Field(default=None, description="Must equal the site's tenant if given.")
    pe: NodeName | None = None
    pe_interface: IfName | None = None
    prefix6: Prefix6 | None = None
    prefix4: Prefix4 | None = None


class SteeringPolicySpec(_Spec):
    """Traffic of ``tenant`` entering at ``ingress_pe`` toward ``dst_site`` goes through
    ``waypoint`` (a uSID End SID with the NEXT-C-SID flavor is allocated on the waypoint, RFC 9800)."""

    tenant: InstanceId
    ingress_pe: NodeName = Field(description="PE where the tenant has a site; its traffic to dst_site is steered.")
    dst_site: InstanceId = Field(description="Destination site (of the same tenant, on another PE).")
    waypoint: NodeName = Field(description="Router the traffic must cross (not the ingress or egress PE).")


class SteeringPolicyPatch(_Spec):
    """Fields of a steering policy to change."""

    tenant: InstanceId | None = Field(default=None, description="Must equal the policy's tenant if given.")
    ingress_pe: NodeName | None = None
    dst_site: InstanceId | None = None
    waypoint: NodeName | None = None


class FirewallRuleSetSpec(_Spec):
    """A tenant's firewall: rules in the tenant's chain of the shared ``inet tenant_fw`` table
    on each PE hosting a destination site. A rule protects one TCP port of one site: ``drop``
    from every source (``src_site`` null), optionally preceded by ``accept`` rules for chosen
    source sites. Other ports stay open."""

    tenant: InstanceId
    rules: list[FirewallRule] = Field(min_length=1, max_length=64)


class FirewallRuleSetPatch(_Spec):
    """A new rule list for the set (replaces the old list)."""

    tenant: InstanceId | None = Field(default=None, description="Must equal the set's tenant if given.")
    rules: list[FirewallRule] | None = Field(default=None, min_length=1, max_length=64)


class FloatingIpSpec(_Spec):
    """A public address (TEST-NET-2, RFC 5737) NATed 1:1 to the CE of an IPv4 site on the border PE."""

    site: InstanceId = Field(description="Site whose CE receives the traffic (it must have IPv4).")
    address: Address4 = AUTO


class FloatingIpPatch(_Spec):
    """Fields of a floating IP to change."""

    site: InstanceId | None = None
    address: Address4 | None = None


SPEC_MODELS: dict[str, type[_Spec]] = {
    "tenant": TenantSpec, "tenant_site": TenantSiteSpec, "steering_policy": SteeringPolicySpec,
    "firewall_rule_set": FirewallRuleSetSpec, "floating_ip": FloatingIpSpec,
}  # fmt: skip
PATCH_MODELS: dict[str, type[_Spec]] = {
    "tenant": TenantPatch, "tenant_site": TenantSitePatch, "steering_policy": SteeringPolicyPatch,
    "firewall_rule_set": FirewallRuleSetPatch, "floating_ip": FloatingIpPatch,
}  # fmt: skip


# -- operations ------------------------------------------------------------------------------------


class _Op(BaseModel):
    """Base of every operation model (unknown fields are errors)."""

    model_config = ConfigDict(extra="forbid")


def _ops_for(cls_name: str, spec: type[_Spec], patch: type[_Spec], id_type: Any, create_id_doc: str) -> Any:
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


TenantOp = _ops_for("tenant", TenantSpec, TenantPatch, InstanceId, "New tenant id (e.g. 't7'); left out = next free 't<N>'.")
TenantSiteOp = _ops_for("tenant_site", TenantSiteSpec, TenantSitePatch, InstanceId,
                        "New site id (e.g. 't3s4'); left out = next free '<tenant>s<N>'.")
SteeringPolicyOp = _ops_for("steering_policy", SteeringPolicySpec, SteeringPolicyPatch, InstanceId,
                            "New policy id (e.g. 'sp4'); left out = next free 'sp<N>'.")
FirewallRuleSetOp = _ops_for("firewall_rule_set", FirewallRuleSetSpec, FirewallRuleSetPatch,
                             Annotated[str, Field(pattern=FW_ID_RE)], "Rule set id; left out = 'fw-<tenant>'.")
FloatingIpOp = _ops_for("floating_ip", FloatingIpSpec, FloatingIpPatch, InstanceId,
                        "New floating IP id (e.g. 'fip3'); left out = next free 'fip<N>'.")

Op = Annotated[
    TenantOp | TenantSiteOp | SteeringPolicyOp | FirewallRuleSetOp | FloatingIpOp,
    Field(discriminator="service_class"),
]
_OPS = TypeAdapter(list[Op])


# -- problems and their paths --------------------------------------------------------------------


class Problem(BaseModel):
    """One reason a change set is refused, at a field path such as ``ops[1].spec.prefix6``."""

    path: str
    message: str

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


def ops_json_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON Schema of the ``ops`` argument, compact and as precise as the validator (``parse_ops``).

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
    defs: dict[str, Any] = {**types, "fw_id": {"type": "string", "pattern": FW_ID_RE, "description": "Rule set id, e.g. 'fw-t3'."}}

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

    for name, ref in (("new_id", "id"), ("new_fw_id", "fw_id")):
        defs[name] = {"anyOf": [{"$ref": f"#/$defs/{ref}"}, {"type": "null"}],
                      "description": "The new instance's id (e.g. 't7', 't3s4', 'sp4', 'fip3'; a rule set is 'fw-<tenant>'); "
                                     "left out or null: allocated."}  # fmt: skip
    shapes = []
    for cls_name in SERVICE_CLASSES:
        for kind, model in (("spec", SPEC_MODELS[cls_name]), ("patch", PATCH_MODELS[cls_name])):
            schema = _bare(model.model_json_schema(ref_template="#/$defs/{model}"))
            defs.update(shared(schema.pop("$defs", {})))
            defs[f"{cls_name}_{kind}"] = shared(schema)
        ident = {"$ref": "#/$defs/fw_id" if cls_name == "firewall_rule_set" else "#/$defs/id"}
        for op in OP_NAMES:
            props: dict[str, Any] = {"op": {"const": op}, "service_class": {"const": cls_name}}
            required = ["op", "service_class"]
            if op == "create":
                props["id"] = {"$ref": "#/$defs/new_fw_id" if cls_name == "firewall_rule_set" else "#/$defs/new_id"}
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


def spec_schema(cls_name: str, patch: bool = False) -> dict[str, Any]:
    """Self-contained JSON Schema of a class's create spec (or modify patch)."""
    model = (PATCH_MODELS if patch else SPEC_MODELS)[cls_name]
    return _inline(model.model_json_schema())


# -- class descriptions (list_service_classes) -------------------------------------------------------

CLASS_INFO: dict[str, dict[str, Any]] = {
    "tenant": {
        "description": "A tenant's L3VPN over SRv6: one routing table (same id on every PE of the tenant, selected by "
                       "policy rules on its CE ports) and one End.DT6 SID per PE with sites. Delete needs the tenant "
                       "to have no sites, policies, rule set or floating IPs left.",
        "id_format": "t<N>, e.g. 't4'",
        "allocated": ["table (from pools.tables)", "End.DT6 SID function per PE (from pools.functions)"],
        "layer": "l3vpn",
    },
    "tenant_site": {
        "description": "A tenant site: the CE host on an attachment circuit (PE port) with an IPv6 /64 and optionally an "
                       "IPv4 /24; PE ::1/.1, CE ::2/.2. Remote PEs reach it with H.Encaps.Red to the site PE's uDT6 "
                       "(IPv6) or the site's own End.DX4 SID (IPv4). Move = modify with a new pe/pe_interface. "
                       "Prefixes must not overlap another site of the same tenant, and a prefix can be attached only "
                       "once per PE (any tenant).",
        "id_format": "<tenant>s<N>, e.g. 't3s4'",
        "allocated": ["prefix6/prefix4 when 'auto' (lowest free in pools.prefix6 / pools.prefix4)",
                      "End.DX4 SID function on the PE for IPv4 sites", "the tenant's End.DT6 SID on a new PE"],
        "layer": "l3vpn",
    },
    "steering_policy": {
        "description": "Pins a tenant's traffic from one PE to one remote site through a waypoint router: the segment "
                       "list is one uSID container <waypoint><policy End SID><egress PE><egress uDT6/uDX4> (RFC 9800).",
        "id_format": "sp<N>, e.g. 'sp3'",
        "allocated": ["End (NEXT-C-SID) SID function on the waypoint"],
        "layer": "steering",
    },
    "firewall_rule_set": {
        "description": "A tenant's firewall rules (nftables chain <tenant> in the shared 'inet tenant_fw' table of each PE "
                       "hosting a destination site). A drop rule closes a TCP port of a site to every source (src_site "
                       "null); accept rules before it let chosen source sites through. One set per tenant. Port 8443 is "
                       "the open-port control of the set's checks and cannot be filtered.",
        "id_format": "fw-<tenant>, e.g. 'fw-t3'",
        "allocated": [],
        "layer": "firewall",
    },
    "floating_ip": {
        "description": "A public IPv4 address (198.51.100.0/24, RFC 5737) NATed 1:1 on the border PE to the CE of an "
                       "IPv4 site, with a firewall mark that selects the tenant's table; replies return through the "
                       "border PE's End.DX4 SID toward the external host.",
        "id_format": "fip<N>, e.g. 'fip2'",
        "allocated": ["address when 'auto' (pools.floating4)", "firewall mark (pools.marks)"],
        "layer": "floating_ip",
    },
    "attachment_circuit": {
        "description": "Read-only: each PE port cabled to a CE host, with the site using it or 'free'. New sites and "
                       "moved sites go on free circuits. A circuit whose devices carry addresses or rules that no "
                       "service explains is shown as 'in use outside A3-T'.",
        "id_format": "<pe>:<pe_interface>, e.g. 'r2:eth5'",
        "allocated": [],
        "layer": "l3vpn",
    },
}

EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "tenant": [{"op": "create", "service_class": "tenant", "id": "t4", "spec": {"name": "vandelay"}}],
    "tenant_site": [
        {"op": "create", "service_class": "tenant_site", "id": "t3s4",
         "spec": {"tenant": "t3", "pe": "r2", "pe_interface": "eth5", "prefix6": "auto", "prefix4": "auto"}},
        {"op": "modify", "service_class": "tenant_site", "id": "t3s2", "spec": {"pe": "r6", "pe_interface": "eth4"}},
        {"op": "delete", "service_class": "tenant_site", "id": "t3s1"},
    ],
    "steering_policy": [{"op": "create", "service_class": "steering_policy", "id": "sp2",
                         "spec": {"tenant": "t3", "ingress_pe": "r1", "dst_site": "t3s1", "waypoint": "r5"}}],
    "firewall_rule_set": [{"op": "modify", "service_class": "firewall_rule_set", "id": "fw-t3", "spec": {"rules": [
        {"src_site": "t3s2", "dst_site": "t3s1", "port": 22, "action": "accept"},
        {"src_site": None, "dst_site": "t3s1", "port": 22, "action": "drop"}]}}],
    "floating_ip": [{"op": "create", "service_class": "floating_ip", "id": "fip2", "spec": {"site": "t3s2", "address": "auto"}}],
}  # fmt: skip


def natural_key(s: str) -> list[Any]:
    """Sort key that orders ``t2s10`` after ``t2s9``."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", s)]
