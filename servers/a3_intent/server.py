"""ANI level A3-T: typed transactional service intent (draft section 5.1, Table 1: "cross-device
workflow transaction, active validation, rollback"; section 7.1 pilot: an agent at A3-T applies a
five-operation change set in about three steps).

Tools (every one counts as a step; budget, ``submit`` and the trajectory come from
:mod:`servers.common`):

- ``list_service_classes``: the typed catalog (:mod:`servers.a3_intent.catalog`): each class's
  create spec and modify patch as JSON Schema, its id form, what the server allocates, examples;
- ``list_services(service_class, filter)``: instances of a class from the current inventory
  (scenario records plus committed change sets, read from the lab directory on every call);
  ``attachment_circuit`` lists PE ports cabled to CEs with their use, read from the devices;
- ``get_service(id)``: one instance: spec, allocated resources, devices, references,
  invariants, and whether the devices still hold its state (drift made outside A3-T shows);
- ``plan_change_set(ops)``: dry run -- validation, allocation, the per-device changes and the
  invariants active validation would check; nothing is changed;
- ``apply_change_set(ops)``: the change set as one cross-device transaction with active
  validation and automatic rollback (:mod:`servers.a3_intent.transaction`); idempotent;
- ``get_change(change_id)``: a past apply's result.

A change set that is invalid comes back as an MCP error listing every problem with its field
path (``ops[1].spec.prefix6: ...``); nothing is changed. Every change to the network goes through
:mod:`substrate` (device deltas computed by :func:`substrate.scenario.apply.config_delta` from the
layers' own renderings); no agent text reaches a shell.
"""

import functools
import logging
import threading
from collections.abc import Callable
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from servers.a3_intent import catalog as cat
from servers.a3_intent.catalog import ChangeSetRejected, natural_key, parse_ops
from servers.a3_intent.inventory import expected_found, scanned_nodes
from servers.a3_intent.planner import drift, underlay_frr
from servers.a3_intent.transaction import ChangeResult, Engine, EngineOptions, PlanResult, TransactionError
from servers.common import AniServer, ServerConfig, ServerSetupError, level_options, note_rejected, pid_holder
from substrate.errors import SubstrateError
from substrate.locks import ConfigLockHeld
from substrate.scenario.generator import render_scenario
from substrate.scenario.layers.base import intents, registry
from substrate.scenario.model import NodeConfig, Scenario

log = logging.getLogger("anibench.servers.a3t")

LEVEL = "A3-T"
INSTRUCTIONS = (
    "Level A3-T of anibench: typed, transactional service intent over an emulated multi-tenant SRv6 provider network. "
    "You do not configure devices: you state service changes and the server turns them into device changes. "
    f"list_service_classes shows the service classes ({', '.join(cat.SERVICE_CLASSES)}) "
    "with the JSON Schema of their specs; list_services and get_service read the inventory (attachment_circuit lists "
    "PE ports cabled to customer CEs, free or in use). plan_change_set is a dry run; apply_change_set applies a list of "
    "operations ({op: create|modify|delete, service_class, id, spec}) as one transaction across devices: it validates, "
    "allocates SIDs, tables and addresses, applies, checks the changed services and their neighbours with real traffic, "
    "and, if the change broke something, undoes exactly what it changed, saying what failed and why (checks that were "
    "already failing before are reported, not held against the change). Applying the same change set twice changes "
    "nothing the second time. apply_change_set takes seconds (it validates with real traffic); get_change('latest') "
    "tells what became of a call whose answer you did not get."
)
CLASS_NAMES = Literal[(*cat.SERVICE_CLASSES, *cat.READ_ONLY_CLASSES)]  # type: ignore[valid-type]


class A3Options(BaseModel):
    """Level-specific options of A3-T (``ServerConfig.options``)."""

    model_config = ConfigDict(extra="forbid")

    lock_timeout_s: float = Field(default=5.0, ge=0, le=120, description="Bound on the wait for the transaction lock and device config locks.")
    capture_timeout_s: float = Field(default=8.0, gt=0, le=60, description="Deadline of one device state capture.")
    device_timeout_s: float = Field(default=20.0, gt=0, le=120, description="Deadline of applying one device's change.")


# -- result models ------------------------------------------------------------------------------------


class ClassInfo(BaseModel):
    name: str
    description: str
    id_format: str
    operations: list[str]
    allocated_by_server: list[str]
    create_spec: dict[str, Any] | None = Field(default=None, description="JSON Schema of the create spec.")
    modify_spec: dict[str, Any] | None = Field(default=None, description="JSON Schema of the modify spec (fields left out keep their value).")
    examples: list[dict[str, Any]] = Field(default_factory=list, description="Example operations.")


class ClassList(BaseModel):
    classes: list[ClassInfo]
    operation_shape: str
    pools: dict[str, Any] = Field(description="The pools the server allocates from (the scenario's).")


class ServiceList(BaseModel):
    service_class: str
    count: int
    items: list[dict[str, Any]]
    inventory_version: int = Field(description="Committed change sets since the lab's baseline.")


class ServiceDetail(BaseModel):
    id: str
    service_class: str
    spec: dict[str, Any] = Field(description="The instance as a create spec would state it.")
    allocated: dict[str, Any] = Field(description="Resources the server allocated (SIDs, table, CE, mark, ...).")
    devices: list[str] = Field(description="Devices holding its state.")
    referenced_by: list[str] = Field(default_factory=list, description="Instances that refer to it.")
    invariants: list[str] = Field(description="Ids of its invariants (what active validation checks for it).")
    device_state: dict[str, Any] = Field(description="in_sync; differences: per device, what its records expect and the device "
                                         "lacks or holds otherwise ('... missing', '... differs'), and what the device holds where "
                                         "the instance's state lives but no record explains ('... extra'); unreadable devices.")
    inventory_version: int


# -- helpers ---------------------------------------------------------------------------------------------


def _rejected(e: ChangeSetRejected, notes: tuple[str, ...] | list[str] = ()) -> ToolError:
    """The tool error of a rejected change set, with ``notes`` (e.g. a damaged journal entry,
    which may explain state no service explains)."""
    note_rejected(*[str(p) for p in e.problems[:20]])
    return ToolError(str(e) + "".join(f"\nNote: {n}" for n in notes))


def _spec_of(cls: str, x: Any) -> dict[str, Any]:
    return cat.INTENTS[cls].spec_of(x)


def _instances(sc: Scenario) -> dict[str, tuple[str, Any]]:
    return {x.id: (it.name, x) for it in intents() if not it.read_only for x in it.instances(sc)}


def _summary(cls: str, x: Any) -> dict[str, Any]:
    return cat.INTENTS[cls].summary(x)


def _without(sc: Scenario, cls: str, iid: str) -> Scenario:
    """``sc`` without an instance and the instances that depend on it (for the state it owns)."""
    s = sc.model_copy(deep=True)
    for c in registry():
        c.drop_dependents(s, cls, iid)
    return s


def _owned(full: dict[str, NodeConfig], reduced: dict[str, NodeConfig]) -> dict[str, NodeConfig]:
    out = {}
    for node, cfg in full.items():
        r = reduced.get(node, NodeConfig())
        own = NodeConfig(
            links_up=[], addresses=[x for x in cfg.addresses if x not in r.addresses],
            rules6=[x for x in cfg.rules6 if x not in r.rules6], rules4=[x for x in cfg.rules4 if x not in r.rules4],
            routes6=[x for x in cfg.routes6 if x not in r.routes6], routes4=[x for x in cfg.routes4 if x not in r.routes4],
            nft={}, frr=[x for x in cfg.frr if x not in r.frr],
            qdiscs={d: v for d, v in cfg.qdiscs.items() if r.qdiscs.get(d) != v},
        )  # fmt: skip
        if not own.is_empty():
            out[node] = own
    return out


# -- the server ---------------------------------------------------------------------------------------------


#: How apply_change_set carries out a parsed change set: ``(ops, submitted, allowed, cancel) -> ChangeResult``
#: (raises as :meth:`Engine.apply`). A3-T's is the engine's; A4 records it in the source of truth first.
ApplyFn = Callable[[list[Any], list[dict[str, Any]], set[str], threading.Event], ChangeResult]


def build_server(  # noqa: C901
    config: ServerConfig, *, lab: object = None, level: str = LEVEL, instructions: str = INSTRUCTIONS,
    options_model: type[A3Options] | type[BaseModel] = A3Options, result_model: type[ChangeResult] = ChangeResult,
    apply_with: Callable[[AniServer, Engine, Any], tuple[ApplyFn, str]] | None = None,
) -> AniServer:  # fmt: skip
    """The A3-T server over ``config.lab`` (a lab deployed from a scenario).

    The other arguments make it another level's server with the same typed tools (A4,
    :mod:`servers.a4_reconciled_intent`): its name and instructions, its options model (with
    A3Options' engine deadlines), and ``apply_with(server, engine, options) -> (apply, note)``,
    called once the engine is ready: ``apply`` replaces :meth:`Engine.apply` in apply_change_set,
    whose result is a ``result_model`` and whose description gets ``note`` appended.

    Raises:
        ServerSetupError: bad options, lab missing, down or not deployed from a scenario, trajectory unwritable.
    """
    opts = level_options(options_model, config, level)
    server = AniServer(config, level=level, instructions=instructions, lab=lab)
    lab_ = server.lab
    engine = Engine(lab_, EngineOptions(lock_timeout_s=opts.lock_timeout_s, capture_timeout_s=opts.capture_timeout_s,
                                        device_timeout_s=opts.device_timeout_s, holder=pid_holder(level)))  # fmt: skip
    try:
        engine.records.base_scenario()
    except SubstrateError as e:
        raise ServerSetupError(f"{level} needs a lab deployed from a scenario: {e}") from None
    # a transaction whose server died is finished now (completed if committed, else undone)
    for note in engine.recover_at_start():
        log.warning("%s on %s: %s", level, lab_.name, note)
    allowed = set(server.device_names)
    run_apply: ApplyFn = lambda ops, submitted, allowed, cancel: engine.apply(ops, submitted=submitted, allowed=allowed, cancel=cancel)  # noqa: E731
    apply_note = ""
    if apply_with is not None:
        run_apply, apply_note = apply_with(server, engine, opts)

    def inventory() -> tuple[Scenario, int]:
        sc, st = engine.inventory()
        return sc, st.version

    def ops_arg(ops: Any) -> tuple[list[Any], list[dict[str, Any]]]:
        try:
            return parse_ops(ops), ops if isinstance(ops, list) else []
        except ChangeSetRejected as e:
            raise _rejected(e) from None

    # typed as Any so that parse_ops reports every problem with its path (``ops[1].spec.pe``);
    # the advertised input schema is the catalog's precise one, its definitions at the root
    ops_schema, ops_defs = cat.ops_json_schema(engine.records.base_scenario().layers)
    OpsArg = Annotated[
        Any,
        WithJsonSchema({"type": "array"}),  # set_argument_schema below
        Field(description=cat.OPS_DESCRIPTION),
    ]

    # -- reading ------------------------------------------------------------------------------------------

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="List service classes")
    def list_service_classes() -> ClassList:
        """The typed service catalog: each class with its description, id form, the operations it takes, what the
        server allocates for it, the JSON Schema of its create spec and modify spec, and example operations.
        attachment_circuit is read-only (the PE ports where sites attach)."""  # draft section 5.1 (A3-T)
        sc = engine.records.base_scenario()
        classes = []
        for name in cat.classes_of(sc.layers):
            info = cat.CLASS_INFO[name]
            writable = name in cat.SERVICE_CLASSES
            classes.append(ClassInfo(
                name=name, description=info["description"], id_format=info["id_format"],
                operations=["create", "modify", "delete"] if writable else ["list"],
                allocated_by_server=info["allocated"],
                create_spec=cat.spec_schema(name) if writable else None,
                modify_spec=cat.spec_schema(name, patch=True) if writable else None,
                examples=cat.EXAMPLES.get(name, []),  # defined by substrate.scenario.layers.<info["layer"]>
            ))  # fmt: skip
        shape = ('{"op": "create"|"modify"|"delete", "service_class": <class>, "id": <instance id>, "spec": {...}}: '
                 "create takes the full spec (id optional: allocated), modify the fields to change, delete no spec")  # fmt: skip
        pools = sc.pools.model_dump(mode="json")
        pools["functions"] = [hex(x) for x in sc.pools.functions]
        pools["marks"] = [hex(x) for x in sc.pools.marks]
        return ClassList(classes=classes, operation_shape=shape, pools=pools)

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="List services")
    def list_services(
        service_class: Annotated[CLASS_NAMES, Field(description="Service class, e.g. 'tenant_site' or 'attachment_circuit'.")],
        filter: Annotated[  # noqa: A002 - the tool's parameter name
            dict[str, str | int | bool | None] | None,
            Field(description='Exact-match filter on the listed fields, e.g. {"tenant": "t3"} or {"pe": "r2", "status": "free"}.'),
        ] = None,
    ) -> ServiceList:
        """The instances of a service class in the current inventory (scenario records plus every change set
        committed since the lab's baseline), one summary per instance, optionally filtered by field values.
        For attachment_circuit the devices are read too: a circuit carrying state that no service explains
        shows as 'in use outside A3-T'."""
        sc, version = inventory()
        intent = cat.INTENTS[service_class]
        if intent.read_only:  # read from the devices too: state no record explains shows
            _states, found, _errors = engine.scan(sc, scanned_nodes(sc))
            items = intent.items(sc, found.minus(expected_found(sc)))
        else:
            items = [intent.summary(x) for x in intent.instances(sc)]
            items.sort(key=lambda d: natural_key(d["id"]))
        if filter:
            fields = set(items[0]) if items else set()
            unknown = [k for k in filter if items and k not in fields]
            if unknown:
                raise ToolError(f"filter: unknown field(s) {', '.join(map(repr, unknown))} for {service_class}; fields: {', '.join(sorted(fields))}")
            items = [d for d in items if all(str(d.get(k)) == str(v) if v is not None else d.get(k) is None for k, v in filter.items())]
        return ServiceList(service_class=service_class, count=len(items), items=items, inventory_version=version)

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Get service")
    def get_service(
        id: Annotated[str, Field(max_length=64, description="Instance id, e.g. 't3s2', 't3', 'sp1', 'fw-t3', 'fip1'.")],  # noqa: A002
    ) -> ServiceDetail:
        """One service instance: its spec, the resources the server allocated for it (SIDs, table, CE, mark), the
        devices that hold its state, the instances that refer to it, its invariants, and device_state: whether the
        devices still hold every item its records imply (state removed or changed outside A3-T shows here)."""
        sc, version = inventory()
        inst = _instances(sc)
        if id not in inst:
            ids = sorted(inst, key=natural_key)
            raise ToolError(f"no service instance {id[:64]!r}; instances: {', '.join(ids[:40])}{' ...' if len(ids) > 40 else ''}")
        cls, x = inst[id]
        intent = cat.INTENTS[cls]
        allocated = intent.allocated(sc, x)
        refs = [r for c in registry() for r in c.references(sc, cls, id)]
        owned = _owned(sc.node_config, render_scenario(_without(sc, cls, id)))
        devices = intent.devices(sc, x, sorted(owned, key=natural_key))
        invs = intent.invariant_ids(sc, x)
        states, _found, errors = engine.scan(sc, devices)
        views = engine.frr_views(devices)
        differences: dict[str, list[str]] = {}
        for n in devices:
            if n in states:
                full = sc.node_config.get(n, NodeConfig())
                mine = owned.get(n, NodeConfig()) if not intent.owned_nft else NodeConfig(nft=full.nft)
                lines = drift(n, mine, states[n], full=full, frr=views.get(n), underlay=underlay_frr(sc, n))
                if lines:
                    differences[n] = lines[:20] + ([f"... {len(lines) - 20} more"] if len(lines) > 20 else [])
        errors += [f"{n}: FRR did not answer" for n in devices if n in lab_.routers() and n in states and n not in views]
        return ServiceDetail(
            id=id, service_class=cls, spec=_spec_of(cls, x), allocated=allocated, devices=devices, referenced_by=refs,
            invariants=invs,
            device_state={"in_sync": not differences and not errors, "differences": differences, "unreadable": errors},
            inventory_version=version,
        )  # fmt: skip

    # -- changing -----------------------------------------------------------------------------------------

    @server.ani_tool(kind="validation", read_only=True, idempotent=True, title="Plan a change set (dry run)")
    def plan_change_set(ops: OpsArg) -> PlanResult:
        """Dry run of a change set: validates types, references and resource constraints against the live inventory
        (records and the devices' current state), allocates what the server allocates (SIDs, tables, 'auto' prefixes
        and addresses), and returns per operation its effect and allocations, per device the exact changes
        ('- ' removed, '+ ' added, '~ ' replaced), and the invariants apply_change_set would then check.
        Nothing is changed. An invalid change set is an error listing each problem with its field path
        (e.g. ops[1].spec.prefix6). Allocations may differ at apply time if the network changes in between."""
        parsed, _raw = ops_arg(ops)
        try:
            return engine.plan(parsed, allowed=allowed)
        except ChangeSetRejected as e:
            raise _rejected(e, engine.unreadable()) from None

    async def apply_change_set(ops: OpsArg) -> ChangeResult:
        """Apply a change set as ONE transaction across devices: validate (as plan_change_set; an invalid change set
        is an error listing each problem with its field path, and nothing is changed), lock every device it touches,
        record their state, apply each device's changes, then validate actively -- real traffic and state checks of
        the changed services and of every service sharing a device with them. Regressions are judged: a check of a
        new or changed service that fails, or a check that passed just before the apply and fails after it; checks
        already failing before (a fault elsewhere) are reported in validation.already_failing, not judged. On a
        regression or a device refusal everything the change set changed is undone -- only that: other changes made
        meanwhile (faults, other operators) are left alone -- and the result names the failed checks with their
        evidence (status rolled_back; transient: true when nothing shows the change set caused it, so retrying later
        may succeed). A committed change is also saved in each router's startup configuration. Applying the same
        change set again changes nothing and says so (status no_change). Change sets are serialized; a device
        locked by someone else is waited for (bounded), then reported. Takes seconds.
        Cancelling the call (or a client timeout) stops the transaction at its next step: it is undone, unless it
        had already passed validation and been committed, in which case it stays committed (status cancelled or
        applied); get_change('latest') shows which. A change whose server died is finished by the next server
        (committed ones completed, others undone) and get_change says so."""
        # draft section 5.1 (A3-T: cross-device transaction, active validation, rollback)
        parsed, raw = ops_arg(ops)
        cancel = threading.Event()
        try:
            # abandoned when the call is cancelled, but waited for before the process exits (a client that
            # cancels and goes away must not cut the transaction: it ends undone or committed, as described)
            work = server.unabandoned(functools.partial(run_apply, parsed, raw, allowed, cancel))
            res = await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        except ChangeSetRejected as e:
            raise _rejected(e, engine.unreadable()) from None
        except ConfigLockHeld as e:
            raise ToolError(f"{e} Nothing was changed.") from None
        except TransactionError as e:
            raise ToolError(str(e)) from None
        except anyio.get_cancelled_exc_class():
            cancel.set()  # the transaction goes on in its thread, to its next step, and ends there (see description)
            raise
        if res.status in ("rolled_back", "rollback_incomplete"):
            note_rejected(res.message)
        return res

    apply_change_set.__annotations__["return"] = result_model
    apply_change_set.__doc__ = (apply_change_set.__doc__ or "") + apply_note
    server.ani_tool(kind="config", read_only=False, destructive=True, idempotent=True, title="Apply a change set")(apply_change_set)

    for name in ("plan_change_set", "apply_change_set"):
        server.set_argument_schema(name, "ops", ops_schema, ops_defs)

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Get a change")
    def get_change(
        change_id: Annotated[str, Field(max_length=16, description="Change id returned by apply_change_set, e.g. 'c3', or "
                                                                   "'latest' for the most recent one.")],
    ) -> ChangeResult:
        """The result of an earlier apply_change_set (status, per-operation effects and allocations, per-device changes,
        validation verdicts with evidence, rollback, recovery, timings, and the change set as submitted). 'latest' gives
        the most recent change (e.g. after a cancelled or timed-out apply_change_set, whose result did not arrive).
        Change ids count from the lab's baseline (a lab reset starts again from c1)."""
        if change_id == "latest":
            change_id = engine.records.latest_change() or "none"
        rec = engine.records.change(change_id)
        if rec is None:
            ids = engine.records.change_ids()
            raise ToolError(f"no change {change_id[:16]!r}; changes: {', '.join(ids) if ids else 'none yet'}"
                            + "".join(f"; {w}" for w in engine.unreadable()))  # fmt: skip
        rec.pop("epoch", None)
        return ChangeResult.model_validate(rec)

    return server
