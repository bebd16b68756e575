"""Service-class layers: the registry and what a layer is.

A layer (draft section 6, "layered, seeded scenario generator") declares its prerequisites
(``requires``), validates its parameters (``Params``), generates its service instances into the
scenario from a seeded random generator (``generate``), renders them to device state
(``render``) and emits each instance's baseline invariants (``invariants``). ``render`` and
``invariants`` are pure functions of the scenario's inventory: A3-T re-runs them after an intent
changes the inventory, and task classes use ``invariants`` to produce hidden test cases.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from substrate.scenario.model import Invariant, NodeConfig, Scenario


class LayerParams(BaseModel):
    """Base of every layer's parameters: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class GenerationError(ValueError):
    """A layer cannot generate what the manifest asks (e.g. density does not fit the pools).

    ``field`` names the manifest field at fault (e.g. ``layers.l3vpn.tenants_per_density``).
    """

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


@contextlib.contextmanager
def density_fits(density: int) -> Iterator[None]:
    """Within the block, a pool running dry is reported as the density not fitting the pools
    (the error keeps naming the pool's field)."""
    try:
        yield
    except GenerationError as e:
        raise GenerationError(e.field, f"density {density} does not fit the pools: {e}") from None


#: Members every service class must define itself (not inherit from :class:`ServiceClass`):
#: checked at registration, i.e. when the class's module is imported.
REQUIRED_MEMBERS: tuple[str, ...] = ("name", "requires", "Params", "records", "intents", "generate", "render", "invariants")


class ServiceClass:
    """A service class (draft section 6): one module owns everything about it, behind one interface.

    Scenario generation (:mod:`substrate.scenario.generator`):

    - ``name``: the manifest's layer name; ``requires``: layers it needs before it;
      ``Params``: its manifest parameters (pydantic, unknown keys refused);
    - ``generate(sc, params, rng, density)``: add instances (and any nodes they need) to ``sc``;
    - ``render(sc, out)``: the instances' device state, per node (pure function of the inventory);
    - ``invariants(sc)``: the instances' baseline invariants (pure function of the inventory).

    Inventory and pools:

    - ``records``: the :class:`~substrate.scenario.model.Scenario` fields holding its instances
      that change sets change; ``derived``: fields recomputed from the records by ``derive(sc)``;
    - ``claim(sc, ipam)``: mark the pool resources its instances hold as used
      (:class:`~substrate.scenario.layers.addressing.Ipam`); ``found_in(node, state, found)``:
      the same resources as a device's state shows them (drift, hand-made state);
      ``sids(sc)``: the SIDs they bind.

    Typed intent (A3-T and the levels built on it): ``intents``, the catalog classes it offers
    (:class:`Intent`: spec and patch models, their operations, read views), and the planner hooks
    ``prepare``, ``after_ops``, ``allocate``, ``integrity`` (called in registry order with the
    planner as context, see :class:`PlanContext`), ``service_nodes``, ``address_owners`` and
    ``changed`` (the validation scope), ``references``, ``drop_dependents`` and ``site_gone``
    (instances bound to another instance).

    Observation: ``checks``, the observer check kinds it adds (kind -> function, see
    :mod:`substrate.scenario.observer`).

    Tasks: ``pins_site(sc, site)``: moving or removing the site would change an instance.

    Subclasses register with :func:`register`; the members in :data:`REQUIRED_MEMBERS` must be
    defined by the class itself (an empty tuple or an explicit no-op says "none").
    """

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    Params: ClassVar[type[LayerParams]] = LayerParams
    records: ClassVar[tuple[str, ...]] = ()
    derived: ClassVar[tuple[str, ...]] = ()
    intents: ClassVar[tuple[Intent, ...]] = ()
    checks: ClassVar[dict[str, Callable[..., Any]]] = {}
    #: Those of ``checks`` that send probes from a host named by the invariant's ``src``: the
    #: observer flushes host neighbour caches before a pass that has any (issue 19).
    probe_kinds: ClassVar[frozenset[str]] = frozenset()
    #: First words of generation-error fields that name this class's parameters (``pools`` for
    #: ``addressing``: its pools run dry as ``pools.prefix6``), for the manifest's line numbers.
    error_fields: ClassVar[tuple[str, ...]] = ()

    # -- generation -------------------------------------------------------------------------------

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        """Add this layer's instances (and any nodes they need) to ``sc``; return the scenario."""
        return sc

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        """Add this layer's device state for every instance to ``out`` (node -> config)."""

    def invariants(self, sc: Scenario) -> list[Invariant]:
        """Baseline invariants of this layer's instances."""
        return []

    # -- inventory and pools ----------------------------------------------------------------------

    def derive(self, sc: Scenario) -> None:
        """Recompute the ``derived`` fields of ``sc`` after its records changed."""

    def claim(self, sc: Scenario, ipam: Any) -> None:
        """Mark the pool resources held by ``sc``'s instances of this class as used in ``ipam``."""

    def found_in(self, node: str, state: Any, found: Any) -> None:
        """Add to ``found`` (A3-T's ``Found``: pool resources in use on devices, whatever the
        records say) those of this class's kind that ``node``'s device ``state`` (a
        :class:`~substrate.devstate.DeviceState`) shows, e.g. an address its rules translate."""

    def hosts(self, sc: Scenario) -> set[str]:
        """Hosts this class cabled to PEs for its own use (not attachment circuits for sites)."""
        return set()

    def sids(self, sc: Scenario) -> list[tuple[str, int, str, str, dict[str, Any]]]:
        """The SIDs its instances allocate, as (node, local function, behaviour, what for,
        behaviour parameters): the ``addressing`` class checks each stays bound."""
        return []

    # -- planner hooks (ctx: the planner, see PlanContext) ------------------------------------------

    def prepare(self, ctx: Any, ops: list[Any]) -> None:
        """Before the operations of a change set are applied to the working inventory."""

    def after_ops(self, ctx: Any) -> None:
        """After every operation was applied (cascades onto this class's instances)."""

    def allocate(self, ctx: Any, ipam: Any) -> None:
        """Allocate what the operations left pending for this class (registry order)."""

    def integrity(self, ctx: Any) -> None:
        """Check the final inventory's rules of this class, blaming operations (``ctx.final``)."""

    # -- validation scope ----------------------------------------------------------------------------

    def service_nodes(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        """Add, per invariant ``service`` of this class, the devices it has state on or is probed from."""

    def address_owners(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        """Add, per address this class's instances answer on, the devices that make it answer."""

    def changed(self, old: Scenario, new: Scenario) -> set[str]:
        """Invariant ``service`` names of this class whose records (or what they derive from) differ."""
        return set()

    # -- references between instances ----------------------------------------------------------------

    def references(self, sc: Scenario, cls: str, iid: str) -> list[str]:
        """This class's instances that refer to instance ``iid`` of catalog class ``cls`` (as shown to an agent)."""
        return []

    def drop_dependents(self, sc: Scenario, cls: str, iid: str) -> None:
        """Remove from ``sc`` this class's instances that cannot exist without ``iid`` (of class ``cls``)."""

    def site_gone(self, sc: Scenario, site: str) -> list[tuple[str, list[str]]]:
        """Adjust this class's instances to a removed site; return (instance id, notes) of those changed."""
        return []

    def pins_site(self, sc: Scenario, site: str) -> bool:
        """Whether moving or removing ``site`` would change one of this class's instances."""
        return False


#: The former name of :class:`ServiceClass`.
Layer = ServiceClass


class Intent:
    """One class of the typed intent catalog (A3-T), offered by a :class:`ServiceClass`.

    ``name`` (``service_class`` in operations), ``Spec`` and ``Patch`` (pydantic models of a
    create spec and a modify merge-patch; None for a read-only class), ``id_type`` and
    ``id_doc`` (the id of a create, and what a left-out id becomes), ``info`` (description,
    id_format, allocated), ``examples`` (operations).

    Operations: ``apply(ctx, i, op)`` applies operation ``i`` to the planner's working inventory
    (:class:`PlanContext`). Views: ``instances(sc)``, ``spec_of(x)``, ``summary(x)``,
    ``allocated(sc, x)``, ``service(x)`` (the invariant ``service`` of the instance),
    ``invariant_ids(sc, x)``, ``devices(sc, x, owned)``, ``owned_nft`` (its drift is judged on
    whole nftables tables). Removing an instance (and what depends on it) is the service classes'
    ``drop_dependents``. A read-only class lists ``items(sc, extra)``
    instead (``extra``: device resources no record explains).
    """

    name: ClassVar[str]
    Spec: ClassVar[type[BaseModel] | None] = None
    Patch: ClassVar[type[BaseModel] | None] = None
    id_type: ClassVar[Any] = str
    id_doc: ClassVar[str] = ""
    info: ClassVar[dict[str, Any]] = {}
    examples: ClassVar[list[dict[str, Any]]] = []
    owned_nft: ClassVar[bool] = False
    #: Read-only classes are listed (``items``), never changed by a change set.
    read_only: ClassVar[bool] = False

    def apply(self, ctx: Any, i: int, op: Any) -> None:
        raise NotImplementedError

    def instances(self, sc: Scenario) -> list[Any]:
        return []

    def spec_of(self, x: Any) -> dict[str, Any]:
        return {}

    def summary(self, x: Any) -> dict[str, Any]:
        return {"id": x.id, **self.spec_of(x)}

    def allocated(self, sc: Scenario, x: Any) -> dict[str, Any]:
        return {}

    def service(self, x: Any) -> str:
        return ""

    def invariant_ids(self, sc: Scenario, x: Any) -> list[str]:
        svc = self.service(x)
        return [i.id for i in sc.invariants if i.service == svc]

    def devices(self, sc: Scenario, x: Any, owned: list[str]) -> list[str]:
        return owned

    def items(self, sc: Scenario, extra: Any) -> list[dict[str, Any]]:
        return []


class RecordIntent(Intent):
    """An intent whose instances are the records of one :class:`Scenario` list field, with spec
    and patch fields named as the record's: create (no change when an instance with this spec
    exists; id ``<id_prefix><N>`` when left out), modify (a merge-patch of the record's fields),
    delete. ``refuse(ctx, i, op)`` may refuse an operation first (e.g. the network lacks what
    the class needs); ``delete_notes(x)`` says what a delete frees."""

    field: ClassVar[str]
    id_prefix: ClassVar[str]
    Record: ClassVar[type[BaseModel]]

    def instances(self, sc: Scenario) -> list[Any]:
        return list(getattr(sc, self.field))

    def refuse(self, ctx: Any, i: int, op: Any) -> bool:
        return False

    def delete_notes(self, x: Any) -> list[str]:
        return []

    def apply(self, ctx: Any, i: int, op: Any) -> None:
        if self.refuse(ctx, i, op):
            return
        items = getattr(ctx.work, self.field)
        by_id = {x.id: x for x in items}
        if op.op == "create":
            spec = op.spec.model_dump()
            same = [x for x in items if all(getattr(x, k) == v for k, v in spec.items()) and op.id in (None, x.id)]
            if same:
                ctx.result(i, op, same[0].id, "no change", notes=[f"{same[0].id} exists with this spec"])
                return
            iid = op.id or ctx.new_id(self.id_prefix, set(ctx.ids()))
            if ctx.in_use(i, iid):
                return
            items.append(self.Record(id=iid, **spec))
            ctx.result(i, op, iid, "created")
            return
        if op.id not in by_id:
            ctx.missing(i, op, self.name)
            return
        cur = by_id[op.id]
        if op.op == "delete":
            items.remove(cur)
            ctx.result(i, op, cur.id, "deleted", notes=self.delete_notes(cur))
            return
        new = cur.model_copy(update={k: getattr(op.spec, k) for k in op.spec.model_fields_set if getattr(op.spec, k) is not None})
        if new == cur:
            ctx.result(i, op, cur.id, "no change")
            return
        items[items.index(cur)] = new
        ctx.result(i, op, cur.id, "modified")


class PlanContext(Protocol):
    """What a service class's planner hooks and :meth:`Intent.apply` may use of the planner
    (:class:`servers.a3_intent.planner` implements it): the inventory before (``old``) and as the
    operations leave it (``work``), device resources no record explains (``unexplained``),
    recording problems (``bad(path, message)``, ``final(refs, message)`` blamed on the last
    operation touching one of ``refs``), results (``result(i, op, id, effect, notes=...)``),
    ids in use (``ids()``, ``in_use(i, id)``, ``missing(i, op, cls)``, ``new_id(prefix, taken)``),
    instances deleted earlier in the change set (``gone``), per-class scratch space
    (``pending(key)``), and the topology's PEs and routers."""

    old: Scenario
    work: Scenario
    problems: list[Any]
    results: list[Any]
    touch: dict[str, tuple[int, str]]
    gone: dict[str, Any]
    warnings: list[str]
    pes: list[str]
    routers: list[str]

    def bad(self, path: str, message: str) -> None: ...
    def final(self, refs: list[tuple[str, str]], message: str) -> None: ...
    def pending(self, key: str, factory: Callable[[], Any] = list) -> Any: ...


LAYERS: dict[str, ServiceClass] = {}


class ServiceClassError(TypeError):
    """A service-class module breaks the interface (raised when it is imported)."""


def register(cls: type[ServiceClass]) -> type[ServiceClass]:
    """Class decorator: make a service class available to manifests under ``cls.name``.

    Raises:
        ServiceClassError: a member of :data:`REQUIRED_MEMBERS` is not defined by the class
            itself, or ``name`` is taken (the message names the module and the member).
    """
    missing = [m for m in REQUIRED_MEMBERS if m not in vars(cls)]
    if missing:
        raise ServiceClassError(f"service class {cls.__name__} in {cls.__module__} does not define "
                                f"{', '.join(missing)} (every service class defines {', '.join(REQUIRED_MEMBERS)})")
    for intent in cls.intents:
        need = ["name", "info"] + ([] if intent.read_only else ["Spec", "Patch", "apply", "instances", "service"])
        lacking = [m for m in need if not any(m in vars(k) for k in type(intent).__mro__ if k is not Intent)]
        if lacking:
            raise ServiceClassError(f"intent {type(intent).__name__} of service class {cls.__name__} in {cls.__module__} "
                                    f"does not define {', '.join(lacking)}")
    if cls.name in LAYERS and type(LAYERS[cls.name]) is not cls:
        raise ServiceClassError(f"service class name {cls.name!r} of {cls.__module__} is already {type(LAYERS[cls.name]).__module__}'s")
    _check_against_registry(cls)
    LAYERS[cls.name] = cls()
    return cls


def _check_against_registry(cls: type[ServiceClass]) -> None:
    """What a class names must exist and what it adds must be its own: ``requires`` names
    classes registered before it, ``records`` and ``derived`` name :class:`Scenario` fields, and
    its catalog class names and check kinds are taken by no other class (nor, for check kinds, by
    the observer's own: a shadowed check would judge the class's invariants with another's rule).

    Raises:
        ServiceClassError: naming the module, the member and the offending value.
    """
    from substrate.scenario.observer import CHECKS

    where = f"service class {cls.__name__} in {cls.__module__}"
    others = [c for c in LAYERS.values() if type(c) is not cls]
    unknown = [r for r in cls.requires if r not in LAYERS]
    if unknown:
        raise ServiceClassError(f"{where}: requires names {', '.join(map(repr, unknown))}, not registered before it "
                                f"(registered: {', '.join(LAYERS) or 'none'})")  # fmt: skip
    fields = [f for f in (*cls.records, *cls.derived) if f not in Scenario.model_fields]
    if fields:
        raise ServiceClassError(f"{where}: records/derived name {', '.join(map(repr, fields))}, not fields of Scenario")
    taken = {i.name: type(c).__module__ for c in others for i in c.intents}
    for i in cls.intents:
        if i.name in taken:
            raise ServiceClassError(f"{where}: intents: catalog class {i.name!r} is already {taken[i.name]}'s")
    kinds = {k: type(c).__module__ for c in others for k in c.checks} | {k: "the observer" for k in CHECKS}
    for k in cls.checks:
        if k in kinds:
            raise ServiceClassError(f"{where}: checks: kind {k!r} is already {kinds[k]}'s")


def registry() -> list[ServiceClass]:
    """Every registered service class, in registry order (see :mod:`substrate.scenario.layers`)."""
    from substrate.scenario import layers  # noqa: F401 - imports register the built-ins

    return list(LAYERS.values())


def intents() -> list[Intent]:
    """Every catalog class of every service class, in registry order."""
    return [i for c in registry() for i in c.intents]


def get_layer(name: str) -> ServiceClass:
    """The service class called ``name``. Raises KeyError listing the registered ones."""
    from substrate.scenario import layers  # noqa: F401 - imports register the built-ins

    try:
        return LAYERS[name]
    except KeyError:
        raise KeyError(f"unknown layer {name!r}; registered service classes: {', '.join(LAYERS)}") from None


def address_plan_clash(sc: Scenario, prefix: str) -> str:
    """What the IPv6 ``prefix`` (e.g. a link /64 a manifest gives a layer) overlaps in ``sc``'s
    address plan: the tenant pool, the SID block, the loopback or base-host net
    (:mod:`substrate.addressing`), or an address a registered class's instances already own
    (``address_owners``, e.g. another layer's link); "" if nothing. Shapes: "the SID block
    fcbb:bb00::/32", "fd5e::1 (r3)"."""
    import ipaddress

    from substrate.addressing import BASE_HOST_NET, LOOPBACK_NET
    from substrate.scenario.model import SID_BLOCK

    net = ipaddress.IPv6Network(prefix)
    plan = {"the tenant pool": sc.pools.prefix6, "the SID block": SID_BLOCK, "the loopback net": str(LOOPBACK_NET),
            "the base-host net": str(BASE_HOST_NET)}  # fmt: skip
    for what, q in plan.items():
        if net.overlaps(ipaddress.IPv6Network(q)):
            return f"{what} {q}"
    owners: dict[str, set[str]] = {}
    for c in registry():
        c.address_owners(sc, owners)
    for a, nodes in sorted(owners.items()):
        ip = ipaddress.ip_address(a)
        if ip.version == 6 and ip in net:
            return f"{a} ({', '.join(sorted(nodes))})"
    return ""


def node_cfg(out: dict[str, NodeConfig], node: str) -> NodeConfig:
    """The (created on demand) config of ``node`` in a rendering."""
    if node not in out:
        out[node] = NodeConfig()
    return out[node]


def zipf_weights(n: int, s: float) -> list[float]:
    """Weights 1/k^s for k = 1..n (a Zipf law, for skewed sizes and node load)."""
    return [1.0 / (k**s) for k in range(1, n + 1)]


def nft_chain_invariants(sc: Scenario, node: str, table: str, *, id_prefix: str, service: str,
                         chain_service: Callable[[str], str] | None = None, what: str = "",
                         unordered: frozenset[str] = frozenset()) -> list[Invariant]:
    """The ``nft_chain`` state invariants of nftables table ``table`` on ``node`` as the scenario
    renders it (``sc.node_config``; not rendered there: no table): one for the table's chains
    (id ``id_prefix``, params ``chains``: their names, none when the table is not rendered) and
    one per rendered chain (id ``<id_prefix>/<chain>``, params ``chain`` and ``rules``: the
    chain's lines, normalized by :func:`substrate.scenario.observer.nft_chain_lines`).
    ``chain_service(chain)`` names the service of a chain's invariant (default ``service``);
    ``what`` says what the table is, for the descriptions; chains in ``unordered`` are compared
    as a multiset (params ``ordered: false``: rules whose matches exclude each other, such as
    jumps by output port, whose order changes no verdict). Issue 19: probes sample ports and
    site pairs, so a rule added where none samples was invisible."""
    from substrate.scenario.observer import nft_chains_of

    cfg = sc.node_config.get(node)
    chains = nft_chains_of(cfg.nft.get(table, "") if cfg else "")
    label = f" ({what})" if what else ""
    out = [Invariant(
        id=id_prefix, kind="nft_chain", service=service,
        params={"node": node, "table": table, "chains": sorted(chains)},
        description=f"{node}: table {table}{label} holds exactly the chains " + (", ".join(sorted(chains)) if chains else
                                                                            "rendered: none (no such table)"),
    )]
    for name, rules in chains.items():
        out.append(Invariant(
            id=f"{id_prefix}/{name}", kind="nft_chain", service=chain_service(name) if chain_service else service,
            params={"node": node, "table": table, "chain": name, "rules": rules} | ({"ordered": False} if name in unordered else {}),
            description=f"{node}: chain {name} of {table}{label} holds exactly its {len(rules)} rendered lines",
        ))
    return out
