"""The scripted agent: a deterministic, competent operator for each ANI level, and the noisy
agent: the same operator making operator-style mistakes at a set rate.

The scripted agent reads only the HAI (prompt and files: request.yaml, sites.csv, design.md)
and talks only to the level's MCP tools. At A3-T it states the request as a change set (plan,
then apply). At A0 and A1 it works like an operator with the design document at hand: it reads
the tenant's table and SIDs off the PEs, allocates free SID functions on them, derives the
device changes from the documented design (the same rules the network was built with), applies
them device by device, checks the tenant table, and submits. It is a baseline, not an oracle:
it never looks at the scenario or the hidden test cases.

The noisy agent draws, for each change it makes, whether to make one of the ten operator
mistakes of :mod:`harness.agents.mistakes` with probability ``rate`` (default 0.3), or with
``kind`` makes exactly one mistake of that kind where the run's change can carry it -- so that
campaigns and ``bench/sensitivity.py`` can show the benchmark detects damage. It writes the
mistakes it made to ``mistakes.json`` in its run directory.
"""

from __future__ import annotations

import csv
import io
import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from harness.agents.base import AgentContext, AgentOutcome, Reply, ToolSession
from harness.agents.mistakes import MISTAKES_FILE, DeviceEnv, Mistakes, device_mistake, noisy_ops
from substrate import addressing
from substrate.scenario.apply import ConfigDelta, config_delta
from substrate.scenario.layers.l3vpn import render_tenant
from substrate.scenario.model import NodeConfig, Scenario, Site, Tenant
from substrate.topology import Topology

FUNCTION_MIN, FUNCTION_MAX = 0xE000, 0xEFFF
#: A competent operator retries a change refused or rolled back for a transient reason -- another
#: session holds the device's configuration lock (held-lock fault), a device or daemon did not
#: answer (frozen node, crashed daemon), an A3-T rollback the server says this change did not
#: cause (a fault elsewhere) -- this many times, pausing this long (seconds) before each retry.
RETRIES = 3
RETRY_PAUSE_S = 2.0
#: What tool results say when the refusal is transient (lower case).
TRANSIENT_MARKERS = ("locked", "retry later", "timed out", "no answer", "did not answer", "not running",
                     "failed to connect", "connection refused")
SHARED_RULE = "priority 900 to fcbb:bb00::/32 lookup main"
#: Service classes whose changes the operator derives device by device at A0/A1/A2 (the method doing it).
DEVICE_SERVICE_CLASSES = {"steering_policy": "_steering_devices", "firewall_rule_set": "_firewall_devices",
                          "floating_ip": "_floating_devices"}


# -- the request ----------------------------------------------------------------------------------


@dataclass
class Request:
    """The change a ticket asks for, read from request.yaml and sites.csv."""

    tenant: str
    sites: list[dict[str, str]]
    add: list[dict[str, Any]] = field(default_factory=list)
    move: list[dict[str, Any]] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)


def read_request(files: dict[str, str]) -> Request:
    """Parse the HAI files of any task class. Raises ValueError on a malformed request."""
    req = yaml.safe_load(files["request.yaml"]) or {}
    sites = list(csv.DictReader(io.StringIO(files.get("sites.csv", ""))))
    r = Request(tenant=str(req["tenant"]), sites=sites)
    if "add_site" in req:
        r.add = [req["add_site"]]
    r.add += list(req.get("add") or [])
    r.move = list(req.get("move") or [])
    r.remove = list(req.get("remove") or [])
    if "remove_site" in req:
        r.remove.append(req["remove_site"])
    return r


# -- A3-T: state the intent -----------------------------------------------------------------------


def intent_ops(r: Request) -> list[dict[str, Any]]:
    """The request as an A3-T change set."""
    ops: list[dict[str, Any]] = []
    for a in r.add:
        spec = {"tenant": r.tenant, "pe": a["pe"], "pe_interface": a["pe_port"], "prefix6": a["prefix6"]}
        if a.get("prefix4"):
            spec["prefix4"] = a["prefix4"]
        ops.append({"op": "create", "service_class": "tenant_site", "id": a["site"], "spec": spec})
    by_id = {s["site"]: s for s in r.sites}
    for m in r.move:
        cur = by_id[m["site"]]
        spec = {"tenant": r.tenant, "pe": m["to_pe"], "pe_interface": m["to_port"], "prefix6": cur["prefix6"]}
        if cur.get("prefix4"):
            spec["prefix4"] = cur["prefix4"]
        ops.append({"op": "modify", "service_class": "tenant_site", "id": m["site"], "spec": spec})
    for s in r.remove:
        ops.append({"op": "delete", "service_class": "tenant_site", "id": s})
    return ops


def service_ops(req: dict[str, Any]) -> list[dict[str, Any]]:
    """A service-change request (request.yaml of :mod:`harness.service_tasks`) as an A3-T change set.

    Raises:
        KeyError, ValueError: a request of no known form.
    """
    cls, action = req["service_class"], req["action"]
    if cls == "steering_policy":
        if action == "create":
            spec = {k: req[k] for k in ("tenant", "ingress_pe", "dst_site", "waypoint")}
            return [{"op": "create", "service_class": cls, "id": req["policy"], "spec": spec}]
        return [{"op": "modify", "service_class": cls, "id": req["policy"], "spec": {"waypoint": req["waypoint"]}}]
    if cls == "firewall_rule_set":
        spec = {"rules": req["rules"]} if action == "modify" else {"tenant": req["tenant"], "rules": req["rules"]}
        return [{"op": "modify" if action == "modify" else "create", "service_class": cls, "id": req["rule_set"], "spec": spec}]
    if cls == "floating_ip":
        if action == "add":
            return [{"op": "create", "service_class": cls, "id": req["floating_ip"],
                     "spec": {"site": req["to_site"], "address": req["address"]}}]
        return [{"op": "modify", "service_class": cls, "id": req["floating_ip"], "spec": {"site": req["to_site"]}}]
    raise ValueError(f"no scripted form for service class {cls!r}")


# -- A0 / A1: operate the devices ---------------------------------------------------------------


def node_id(router: str) -> int:
    """Router number from its name (design.md: router r<N>)."""
    m = re.fullmatch(r"[a-z]+(\d+)", router)
    if not m:
        raise ValueError(f"not a router name: {router}")
    return int(m.group(1))


def _function_of(sid: str) -> int:
    return (int(ipaddress.IPv6Network(sid).network_address) >> 64) & 0xFFFF


@dataclass
class PeFacts:
    """What an operator reads off a PE: its IPv6 rules and main-table routes, and its IPv4
    rules (iproute2 JSON: ``ip -6 -j rule show``, ``ip -6 -d -j route show table main``,
    ``ip -4 -j rule show``)."""

    rules6: list[dict[str, Any]]
    routes6: list[dict[str, Any]]
    rules4: list[dict[str, Any]] = field(default_factory=list)
    #: nftables tables read with the facts: table (``"inet tenant_fw"``) -> ``nft -a list table`` text ('' = none)
    nft: dict[str, str] = field(default_factory=dict)

    def other_lookups(self, table: int, own_ports: set[str]) -> set[int]:
        """Address families (4, 6) in which something other than the tenant's own circuits
        steers traffic into ``table`` on this PE: a rule looking the table up that is not an
        ``iif <port>`` rule of one of ``own_ports`` (a floating IP's ``fwmark`` rule, another
        service's port). Where such a rule exists, the table is still in use on the PE even
        when the tenant has no site left there."""
        out = set()
        for fam, rules in ((6, self.rules6), (4, self.rules4)):
            for r in rules:
                if str(r.get("table", "")) == str(table) and r.get("iif") not in own_ports:
                    out.add(fam)
        return out

    def used_functions(self, pe: str) -> set[int]:
        loc = ipaddress.IPv6Network(f"fcbb:bb00:{node_id(pe)}::/48")
        out = set()
        for r in self.routes6:
            dst = r.get("dst", "")
            if r.get("encap") == "seg6local" and "/" in dst and ipaddress.IPv6Network(dst).subnet_of(loc):
                out.add(_function_of(dst))
        return out

    def has_shared_rule(self) -> bool:
        """The PE already routes SIDs in the main table ahead of tenant rules."""
        return any(r.get("priority") == 900 and r.get("dst", "").startswith("fcbb:bb00::") for r in self.rules6)

    def table_of_port(self, port: str) -> int | None:
        for rule in self.rules6:
            if rule.get("iif") == port and str(rule.get("table", "")).isdigit():
                return int(rule["table"])
        return None

    def function_of(self, action: str, **params: str) -> int | None:
        for r in self.routes6:
            if r.get("encap") == "seg6local" and r.get("action") == action and all(str(r.get(k)) == v for k, v in params.items()):
                return _function_of(r["dst"])
        return None


@dataclass
class Leak:
    """A service another table offers into the tenant's table (a leaked shared service), as an
    operator finds it on the devices: the route ``prefix6`` in the tenant table of every PE of
    the tenant, toward ``sid`` (an End.DT6 SID of ``node`` into its table ``table``), whose table
    routes the tenant's site prefixes back."""

    prefix6: str
    sid: str
    node: str
    table: int
    #: ``node``'s port toward the service (the main table's route for ``prefix6``), where the
    #: tenant's table on ``node`` itself routes it
    port: str | None = None


def sid_node(sid: str) -> tuple[str, int]:
    """The router and local function of a uSID ``fcbb:bb00:<N>:<F>::`` (design.md: N's decimal
    digits written as hex)."""
    groups = ipaddress.IPv6Address(sid.split("/")[0]).exploded.split(":")
    return f"r{int(groups[2], 16):x}", int(groups[3], 16)


def foreign_routes(table_routes: list[dict[str, Any]], site_prefixes: set[str]) -> list[tuple[str, str]]:
    """(prefix, SID) of the SRv6 routes of a tenant table (``ip -6 -d -j route show table T``)
    that are no site's: what other services put there."""
    out = []
    for rt in table_routes:
        dst = rt.get("dst", "")
        if rt.get("encap") == "seg6" and dst not in site_prefixes and rt.get("segs"):
            segs = rt["segs"]
            out.append((dst, segs[0] if isinstance(segs, list) else str(segs).split(",")[0]))
    return out


def plan_tenant_change(r: Request, facts: dict[str, PeFacts],
                       leaks: list[Leak] | None = None) -> tuple[Tenant, Tenant, dict[str, ConfigDelta]]:
    """Rebuild the tenant from what the PEs show, apply the request, and derive per-PE changes.

    Raises:
        ValueError: the devices do not show what the design says (e.g. no rule for a site port).
    """
    if not r.sites:
        raise ValueError("sites.csv lists no site of the tenant")
    first = r.sites[0]
    table = facts[first["pe"]].table_of_port(first["pe_port"])
    if table is None:
        raise ValueError(f"no policy rule for {first['pe']} port {first['pe_port']}: cannot find the tenant's table")
    used = {pe: f.used_functions(pe) for pe, f in facts.items()}

    def alloc(pe: str) -> int:
        for fn in range(FUNCTION_MIN, FUNCTION_MAX + 1):
            if fn not in used[pe]:
                used[pe].add(fn)
                return fn
        raise ValueError(f"no free SID function on {pe}")

    before = Tenant(id=r.tenant, name=r.tenant, table=table)
    for s in r.sites:
        pe = s["pe"]
        if pe not in before.dt6_functions:
            fn = facts[pe].function_of("End.DT6", table=str(table))
            if fn is None:
                raise ValueError(f"{pe} has no End.DT6 SID for table {table}")
            before.dt6_functions[pe] = fn
        p4 = s.get("prefix4") or None
        dx4 = facts[pe].function_of("End.DX4", nh4=str(ipaddress.ip_network(p4).network_address + 2)) if p4 else None
        before.sites.append(Site(id=s["site"], tenant=r.tenant, pe=pe, pe_if=s["pe_port"], ce=s.get("ce") or "ce",
                                 prefix6=s["prefix6"], prefix4=p4, dx4_function=dx4))
    after = before.model_copy(deep=True)
    after.sites = [s for s in after.sites if s.id not in r.remove]
    for m in r.move:
        s = next(x for x in after.sites if x.id == m["site"])
        s.pe, s.pe_if, s.ce = m["to_pe"], m["to_port"], m.get("ce", s.ce)
        s.dx4_function = alloc(s.pe) if s.prefix4 else None
    for a in r.add:
        p4 = a.get("prefix4") or None
        after.sites.append(Site(id=a["site"], tenant=r.tenant, pe=a["pe"], pe_if=a["pe_port"], ce=a.get("ce", "ce"),
                                prefix6=a["prefix6"], prefix4=p4, dx4_function=alloc(a["pe"]) if p4 else None))
    pes = {s.pe for s in after.sites}
    after.dt6_functions = {pe: fn for pe, fn in after.dt6_functions.items() if pe in pes}
    for pe in sorted(pes):
        if pe not in after.dt6_functions:
            after.dt6_functions[pe] = alloc(pe)
    b_cfg, a_cfg = _render(before), _render(after)
    _keep_table_in_use(r, table, before, after, facts, b_cfg, a_cfg)
    for leak in leaks or []:
        _follow_leak(leak, table, before, after, b_cfg, a_cfg)
    deltas = {}
    for pe in sorted(set(b_cfg) | set(a_cfg)):
        d = config_delta(pe, b_cfg.get(pe), a_cfg.get(pe))
        # the SID rule is shared by every tenant of the PE: never remove it for one tenant
        d.removals = [x for x in d.removals if SHARED_RULE not in x]
        # ... and add it only where the PE does not have it yet (another tenant may have put it there)
        if pe in facts and facts[pe].has_shared_rule():
            d.additions = [x for x in d.additions if SHARED_RULE not in x]
        if not d.empty():
            deltas[pe] = d
    return before, after, deltas


def _keep_table_in_use(r: Request, table: int, before: Tenant, after: Tenant, facts: dict[str, PeFacts],
                       b_cfg: dict[str, NodeConfig], a_cfg: dict[str, NodeConfig]) -> None:
    """Where the tenant leaves a PE whose tenant table another service still steers traffic
    into (:meth:`PeFacts.other_lookups`: a floating IP's fwmark rule on the border PE), keep the
    table there instead of tearing it down with the tenant's circuits: the unreachable default
    and the routes it already holds to sites that remain (moved ones updated), in the families
    the other service uses. Only the tenant's own state goes (circuits, End.DT6 SID, routes of
    removed sites). ``a_cfg`` is changed in place.

    Rendering the VPN alone and removing what it no longer needs removed lines another service
    shares (the floating IP's route to its site and the table's default on the border PE):
    issue 19's false dangerous success of the A0 reference solution."""
    ports_by_pe: dict[str, set[str]] = {}
    for s in [*before.sites, *after.sites]:
        ports_by_pe.setdefault(s.pe, set()).add(s.pe_if)
    staying = {pe for pe in after.dt6_functions}
    for pe in sorted(set(before.dt6_functions) - staying):
        fams = facts[pe].other_lookups(table, ports_by_pe.get(pe, set())) if pe in facts else set()
        if not fams:
            continue
        held = after.model_copy(deep=True)
        held.dt6_functions[pe] = before.dt6_functions[pe]
        cfg = _render(held)[pe]
        kept = NodeConfig()
        for fam in sorted(fams):
            had = {_prefix_of(x) for x in getattr(b_cfg[pe], f"routes{fam}") if f" table {table} " in f" {x} "}
            getattr(kept, f"routes{fam}").extend(
                x for x in getattr(cfg, f"routes{fam}")
                if "seg6local" not in x and f" table {table} " in f" {x} " and _prefix_of(x) in had
            )
        a_cfg[pe] = kept


def _follow_leak(leak: Leak, table: int, before: Tenant, after: Tenant,
                 b_cfg: dict[str, NodeConfig], a_cfg: dict[str, NodeConfig]) -> None:
    """Carry a leaked service along with the tenant's change: its route in the tenant table on
    every PE the tenant has after the change (and no longer on PEs it left), and in the
    service's table on ``leak.node`` a route back to each site prefix, toward the site's PE
    (``dev <port>`` when the site is on that node) -- as the shared-services layer builds it.
    ``b_cfg``/``a_cfg`` gain these lines, so the delta adds, moves and removes exactly them."""
    in_tenant = f"{leak.prefix6} table {table} metric 1024 encap seg6 mode encap.red segs {leak.sid} dev sr0"

    def back_routes(t: Tenant) -> list[str]:
        out = []
        for s in t.sites:
            if s.pe == leak.node:
                out.append(f"{s.prefix6} table {leak.table} metric 1024 dev {s.pe_if}")
            else:
                sid = addressing.usid_container([addressing.usid_value(node_id(s.pe)), t.dt6_functions[s.pe]])
                out.append(f"{s.prefix6} table {leak.table} metric 1024 encap seg6 mode encap.red segs {sid} dev sr0")
        return out

    for cfgs, t in ((b_cfg, before), (a_cfg, after)):
        for pe in t.dt6_functions:
            if pe != leak.node:
                cfgs.setdefault(pe, NodeConfig()).routes6.append(in_tenant)
            elif leak.port:  # the service's own PE: straight out of its port
                cfgs.setdefault(pe, NodeConfig()).routes6.append(f"{leak.prefix6} table {table} metric 1024 dev {leak.port}")
        cfgs.setdefault(leak.node, NodeConfig()).routes6.extend(back_routes(t))


def _prefix_of(route: str) -> str:
    """The destination of a route line (``unreachable 0.0.0.0/0 ...`` -> ``0.0.0.0/0``)."""
    words = route.split()
    return words[1] if words[0] in ("unreachable", "blackhole", "prohibit") else words[0]


def _render(t: Tenant) -> dict[str, NodeConfig]:
    routers = sorted({s.pe for s in t.sites} | set(t.dt6_functions))
    topo = Topology.build("operator", [{"name": r, "role": "PE", "node_id": node_id(r)} for r in routers], [])
    sc = Scenario(name="operator", manifest_digest="", seed=0, density=1, layers=["l3vpn"], topology=topo, tenants=[t])
    out: dict[str, NodeConfig] = {}
    render_tenant(sc, t, out)
    return {k: v for k, v in out.items() if k in routers}


def a1_commands(d: ConfigDelta) -> list[str]:
    """A ConfigDelta in A1's command forms: `ip -6|-4 route|rule ...` and FRR lines."""
    out: list[str] = []
    for x in d.removals:
        if x.startswith(("-6 ", "-4 ")):
            out.append(f"ip {x}")
    out += d.frr
    for x in d.additions:
        if x.startswith(("-6 ", "-4 ")):
            out.append(f"ip {x}")
    return out


def a0_script(d: ConfigDelta) -> str:
    """A ConfigDelta as one shell script that can be run again after a partial run (a timeout):
    each added policy rule is deleted first (tolerantly), the rest is idempotent already
    (``route replace``, ``addr replace``, nft table replacement, FRR lines)."""
    rules = [f"{x[:3]}rule del {x[len('-6 rule add '):]}" for x in d.additions if x[3:].startswith("rule add ")]
    return ConfigDelta(node=d.node, removals=[*d.removals, *rules], additions=d.additions, nft=d.nft, sysctls=d.sysctls,
                       frr=d.frr, frr_changes=d.frr_changes).script()  # fmt: skip


def _says_transient(text: str | None) -> bool:
    low = (text or "").lower()
    return any(m in low for m in TRANSIENT_MARKERS)


def _transient_devices(data: dict[str, Any]) -> list[str]:
    """A1 apply_config result: devices that refused a command, or failed, for a transient reason."""
    out = []
    for dev, d in (data.get("devices") or {}).items():
        if _says_transient(d.get("error")) or any(_says_transient(x.get("message")) for x in d.get("rejected") or []):
            out.append(dev)
    return out


def transient(r: Reply) -> bool:
    """Whether a mutating call was refused, or its change undone, for a reason worth a retry:
    an error saying so (lock held, no answer, daemon down, "retry later"); at A3-T a rolled-back
    or cancelled change set the server calls transient (nothing shows it caused the failure); at
    A1 a device refusing lines for such a reason; at A0 a command cut by its timeout or talking
    to a daemon that is down."""
    if not r.ok:
        return _says_transient(r.text)
    d = r.data or {}
    if "status" in d and "change_id" in d:  # A3-T
        return d["status"] in ("rolled_back", "rollback_incomplete", "cancelled") and bool(d.get("transient") or d["status"] == "cancelled")
    if "exit_status" in d:  # A0
        return d["exit_status"] == 124 or d["exit_status"] < 0 or _says_transient(d.get("stderr"))
    if "devices" in d and "summary" in d:  # A1
        return bool(_transient_devices(d))
    return False


# -- the agents ---------------------------------------------------------------------------------


class ScriptedAgent:
    """Deterministic competent operator (see module docstring)."""

    name = "scripted"

    def __init__(self, rate: str | float = 0.0, **options: str):
        from harness.errors import AnibenchError

        try:
            self.mistakes_rate = float(rate)
        except ValueError:
            raise AnibenchError(f"rate must be a number in [0, 1], got {rate!r}") from None
        if not 0.0 <= self.mistakes_rate <= 1.0:
            raise AnibenchError(f"rate must be in [0, 1] (mistakes per change), got {rate!r}")
        self.kind = options.pop("kind", None) if self.name == "noisy" else None
        if self.kind is not None:
            from harness.agents.mistakes import KINDS

            if self.kind not in KINDS:
                raise AnibenchError(f"unknown mistake kind {self.kind!r}; known: {', '.join(KINDS)}")
        unknown = set(options) - {"model"}
        if unknown:
            known = "rate, kind" if self.name == "noisy" else "rate"
            raise AnibenchError(f"unknown {self.name} agent option(s) {sorted(unknown)}; known: {known}")
        self.options = options

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        mistakes = Mistakes(self.mistakes_rate, ctx.seed, kind=self.kind)
        try:
            return await self._run(ctx, mistakes)
        finally:
            if self.mistakes_rate > 0 or self.kind:
                (ctx.workdir / MISTAKES_FILE).write_text(json.dumps(mistakes.to_json(), indent=1))

    async def _run(self, ctx: AgentContext, mistakes: Mistakes) -> AgentOutcome:
        from mcp import Client

        async with Client(ctx.server, mode="legacy") as client:
            tools = ToolSession(client, ctx.on_step)
            from harness.templates.operator import run_reference, template_request

            ticket = template_request(ctx.files)
            if ticket is not None:  # a protocol template's variant: its reference for this level
                return await run_reference(tools, ctx, *ticket)
            kind = _kind_of(ctx.files)
            if kind == "troubleshooting":
                return await self._troubleshoot(tools, ctx, mistakes)
            if kind == "service":
                return await self._service(tools, ctx, mistakes)
            try:
                req = read_request(ctx.files)
            except (KeyError, ValueError, yaml.YAMLError) as e:
                await tools.call("submit", {})
                return AgentOutcome(error=f"could not read the request: {e}")
            try:
                if ctx.level in ("A3-T", "A4"):
                    await self._intent(tools, req, mistakes, ctx.level)
                elif ctx.level == "A3-R":
                    await self._records(tools, req, mistakes)
                elif ctx.level == "A1":
                    await self._devices(tools, req, mistakes, a1=True)
                elif ctx.level == "A2":
                    await self._netconf(tools, req, mistakes)
                else:
                    await self._devices(tools, req, mistakes, a1=False)
            except Exception as e:  # noqa: BLE001 - an operator who cannot go on says so and submits
                await tools.call("submit", {})
                return AgentOutcome(error=f"gave up: {type(e).__name__}: {e}", note=mistakes.note())
            await tools.call("submit", {})
        return AgentOutcome(note=mistakes.note())

    async def _service(self, tools: ToolSession, ctx: AgentContext, mistakes: Mistakes) -> AgentOutcome:
        """A service-class change (:mod:`harness.service_tasks`): the request as a change set at
        A3-T/A4 (plan, then apply) and as records at A3-R; other levels have no reference
        (``harness.service_tasks.INEXPRESSIBLE``) and submit with an error saying so."""
        try:
            ticket = yaml.safe_load(ctx.files["request.yaml"])
            sites = list(csv.DictReader(io.StringIO(ctx.files.get("sites.csv", ""))))
            # the ticket's tenant, so that a mistake meant for another tenant's object picks another
            req = Request(tenant=str(ticket.get("tenant") or ""), sites=sites)
            ticket = await self._ticket_mistake(tools, ticket, req, mistakes, ctx.level)
            ops = service_ops(ticket)
            if ctx.level in ("A3-T", "A4"):
                await self._intent(tools, req, mistakes, ctx.level, ops=ops)
            elif ctx.level == "A3-R":
                await self._records(tools, req, mistakes, ops=ops)
            elif ctx.level in ("A0", "A1", "A2") and ops[0]["service_class"] in DEVICE_SERVICE_CLASSES:
                await getattr(self, DEVICE_SERVICE_CLASSES[ops[0]["service_class"]])(tools, ctx, ctx.level, ticket, mistakes)
            else:
                await tools.call("submit", {})
                return AgentOutcome(error=f"no scripted reference of this service change at {ctx.level}")
        except Exception as e:  # noqa: BLE001 - an operator who cannot go on says so and submits
            await tools.call("submit", {})
            return AgentOutcome(error=f"gave up: {type(e).__name__}: {e}", note=mistakes.note())
        await tools.call("submit", {})
        return AgentOutcome(note=mistakes.note())

    async def _ticket_mistake(self, tools: ToolSession, ticket: dict[str, Any], req: Request, mistakes: Mistakes,
                              level: str) -> dict[str, Any]:
        """The service ticket with the noisy agent's mistake made in it where the ticket can
        carry the kind (:func:`harness.agents.mistakes.ticket_mistake`; forced kind, or one
        draw at ``rate``), recorded; else the ticket as it is."""
        from harness.agents.mistakes import ticket_mistake

        if not (mistakes.rate > 0 or mistakes.kind):
            return ticket
        kind = mistakes.kind or mistakes.draw()
        if kind is None:
            return ticket
        others = await self._others(tools, req, mistakes, records=level == "A3-R") \
            if kind == "wrong_table" and level in ("A3-T", "A4", "A3-R") else []
        wrong = ticket_mistake(kind, ticket, req.sites, others)
        if wrong is None:
            return ticket
        mistakes.record(kind, str(ticket.get("policy") or ticket.get("rule_set") or ticket.get("floating_ip") or "ticket"))
        return wrong

    async def _apply_noisy(self, tools: ToolSession, deltas: dict[str, ConfigDelta], level: str, mistakes: Mistakes | None,
                           env: DeviceEnv, nft_now: dict[str, dict[str, Any]]) -> None:
        """Apply a service change's per-device deltas at ``level`` with the noisy agent's
        mistakes made in them (:func:`harness.agents.mistakes.device_mistake`, ``env`` as read;
        ``nft_now``: node -> table -> :class:`~harness.agents.service_devices.NftTable` read)."""
        from harness.agents.service_devices import nft_text

        items = list(deltas.items())
        kinds: list[str | None] = [None] * len(items)
        if mistakes is not None and (mistakes.rate > 0 or mistakes.kind):
            env.nft_now = {n: {t: nft_text(t, tb.table) for t, tb in tabs.items()} for n, tabs in nft_now.items()}
            kinds = mistakes.choose(len(items), lambda i, k: device_mistake(k, items[i][1], items[i][0], env) is not None)
        for (node, delta), kind in zip(items, kinds, strict=True):
            m = device_mistake(kind, delta, node, env) if kind else None
            target, commit = node, True
            if m is not None:
                mistakes.record(kind, node)  # type: ignore[union-attr]
                delta, target, commit = m.delta, m.target, m.commit
            await self._apply_delta(tools, target, delta, level, nft_now=nft_now.get(node), commit=commit)

    async def _steering_devices(self, tools: ToolSession, ctx: AgentContext, level: str, req: dict[str, Any] | None = None,
                                mistakes: Mistakes | None = None) -> None:
        """A steering request at A0/A1/A2 (:mod:`harness.agents.steering_ops`): read the routers
        involved, derive each one's change, apply it device by device (``req``: the ticket,
        default request.yaml; ``mistakes``: the noisy agent's, :meth:`_apply_noisy`)."""
        from harness.agents.steering_ops import plan_steering

        req = req or yaml.safe_load(ctx.files["request.yaml"])
        sites = list(csv.DictReader(io.StringIO(ctx.files.get("sites.csv", ""))))
        dst = next(s for s in sites if s["site"] == req["dst_site"])
        nodes = sorted({req["ingress_pe"], req["waypoint"], dst["pe"]} | ({req["was_waypoint"]} if req.get("was_waypoint") else set()))
        facts = await self._node_facts(tools, nodes, level)
        own = sorted(s["pe_port"] for s in sites if s["pe"] == req["ingress_pe"])
        table = next((t for p in own if (t := facts[req["ingress_pe"]].table_of_port(p)) is not None), None)
        routes: list[dict[str, Any]] = []
        if table is not None and req.get("was_waypoint"):
            routes = await self._table_routes(tools, req["ingress_pe"], table, level)
        tenant_pes = sorted({s["pe"] for s in sites}, key=node_id)
        env = DeviceEnv(level=level, pes=tenant_pes, table=table if table is not None else -1,
                        rules6={n: f.rules6 for n, f in facts.items()}, used={n: f.used_functions(n) for n, f in facts.items()})
        await self._apply_noisy(tools, plan_steering(req, sites, facts, routes), level, mistakes, env, {})

    async def _firewall_devices(self, tools: ToolSession, ctx: AgentContext, level: str, req: dict[str, Any] | None = None,
                                mistakes: Mistakes | None = None) -> None:
        """A firewall ticket at A0/A1/A2 (:func:`harness.agents.service_devices.plan_firewall`):
        read the shared firewall table of every PE of the tenant, splice the tenant's new rule
        set in, apply it PE by PE, and list the chain of the first changed PE (``req``: the
        ticket, default request.yaml; ``mistakes``: the noisy agent's, :meth:`_apply_noisy`; the
        wrong tenant's chain is one of those the tables show)."""
        from harness.agents.mistakes import ticket_mistake
        from harness.agents.service_devices import FW_TABLE, plan_firewall

        req = req or yaml.safe_load(ctx.files["request.yaml"])
        sites = list(csv.DictReader(io.StringIO(ctx.files.get("sites.csv", ""))))
        pes = sorted({s["pe"] for s in sites})
        tables = {pe: await self._nft_table(tools, pe, FW_TABLE, level) for pe in pes}
        if mistakes is not None and mistakes.kind == "wrong_table" and not mistakes.made:
            chains = sorted({c["name"] for t in tables.values() for c in (t.table or {}).get("chains", [])
                             if not c.get("type") and c["name"] != req["tenant"]})
            wrong = ticket_mistake("wrong_table", req, sites, [{"id": "", "tenant": c} for c in chains])
            if wrong is not None:
                mistakes.record("wrong_table", str(req.get("rule_set")))
                req = wrong
        deltas = plan_firewall(req, sites, tables)
        env = DeviceEnv(level=level, pes=pes, table=-1)
        await self._apply_noisy(tools, deltas, level, mistakes, env, {pe: {FW_TABLE: tables[pe]} for pe in deltas})
        if deltas:
            await self._nft_table(tools, sorted(deltas)[0], FW_TABLE, level)

    async def _floating_devices(self, tools: ToolSession, ctx: AgentContext, level: str, req: dict[str, Any] | None = None,
                                mistakes: Mistakes | None = None) -> None:
        """A floating-IP ticket at A0/A1/A2 (:func:`harness.agents.service_devices.plan_floating`):
        find the border PE (the End.DX4 SID toward the external segment), read it and the
        tenant's PEs, derive the NAT, mark, rule and route changes, apply them device by device
        (``req``: the ticket, default request.yaml; ``mistakes``: the noisy agent's,
        :meth:`_apply_noisy`)."""
        from harness.agents.service_devices import FIP_TABLE, HAIRPIN_TABLE, Border, external_port, find_border, plan_floating

        req = req or yaml.safe_load(ctx.files["request.yaml"])
        sites = list(csv.DictReader(io.StringIO(ctx.files.get("sites.csv", ""))))
        facts = await self._node_facts(tools, sorted({s["pe"] for s in sites}), level)
        found = find_border(facts)
        if found is None:  # not one of the tenant's PEs: the likeliest others first, read until found
            cands = [r for r in await self._border_candidates(tools, level) if r not in facts]
            for c in cands:  # one at a time: the border (cabled outside) comes first; a PE's read is pages long
                facts.update(await self._node_facts(tools, [c], level))
                if (found := find_border(facts)) is not None:
                    break
        if found is None:
            raise ValueError("no router shows an End.DX4 SID toward the external segment (203.0.113.0/24)")
        pe, dx4, nh4 = found
        fip = await self._nft_table(tools, pe, FIP_TABLE, level)
        port = external_port(fip)
        if port is None and level != "A2":
            got = await self._read(tools, pe, f"ip -4 -j route get {nh4}", level=level)
            port = (got[0] if isinstance(got, list) and got else {}).get("dev")
        if port is None:
            raise ValueError(f"cannot tell {pe}'s port toward the external segment")
        border = Border(pe=pe, dx4_function=dx4, nh4=nh4, pe_if=port, rules4=facts[pe].rules4, fip=fip)
        # the hairpin translation changes on every PE of the tenant's IPv4 sites: each translates
        # the floating address for its IPv4 CE ports (issue 36)
        hairpins = {p: await self._nft_table(tools, p, HAIRPIN_TABLE, level)
                    for p in sorted({s["pe"] for s in sites if s.get("prefix4")}, key=node_id)}
        now: dict[str, dict[str, Any]] = {p: {HAIRPIN_TABLE: t} for p, t in hairpins.items()}
        now.setdefault(pe, {})[FIP_TABLE] = fip
        tenant_pes = sorted({s["pe"] for s in sites}, key=node_id)
        env = DeviceEnv(level=level, pes=tenant_pes, table=-1, rules6={n: f.rules6 for n, f in facts.items()},
                        used={n: f.used_functions(n) for n, f in facts.items()})
        await self._apply_noisy(tools, plan_floating(req, sites, facts, border, hairpins), level, mistakes, env, now)

    # -- device reads and writes at A0 / A1 / A2 (the service-change references) ----------------------

    async def _get_config(self, tools: ToolSession, device: str, flt: str) -> str:
        """A2: the whole get-config answer for the subtree filter ``flt`` (read page by page).

        Raises:
            ValueError: the device refused the read.
        """
        text, offset = "", 0
        while offset is not None:
            r = await tools.call("get_config", {"device": device, "filter": flt, "offset": offset})
            if not r.ok or r.data is None:
                raise ValueError(f"reading {device} failed: {r.text[:300]}")
            text += r.data["xml"]["text"]
            offset = r.data["xml"]["next_offset"]
        return text

    async def _node_facts(self, tools: ToolSession, nodes: list[str], level: str) -> dict[str, PeFacts]:
        """Rules and main-table SIDs of ``nodes`` (:class:`PeFacts`) at ``level``."""
        if level != "A2":
            return await self._read_pes(tools, nodes, level == "A1")
        from harness.agents.a2_operator import PE_FILTER, pe_facts

        facts = {}
        for n in nodes:
            rules6, routes6, rules4 = pe_facts(await self._get_config(tools, n, PE_FILTER))
            facts[n] = PeFacts(rules6=rules6, routes6=routes6, rules4=rules4)
        return facts

    async def _table_routes(self, tools: ToolSession, device: str, table: int, level: str) -> Any:
        """The IPv6 routes of kernel table ``table`` of ``device``, iproute2-JSON shaped."""
        if level != "A2":
            return await self._read(tools, device, f"ip -6 -d -j route show table {table}", level=level)
        from harness.agents.a2_operator import table_routes

        xml = await self._get_config(tools, device, f'<kernel xmlns="urn:anibench:yang:kernel"><table><id>{table}</id></table></kernel>')
        return table_routes(xml, table)

    async def _border_candidates(self, tools: ToolSession, level: str) -> list[str]:
        """The PEs of the episode (A0/A2 list_devices, A1 get_topology), those cabled to a host that
        is no customer CE (design.md: CE hosts are ``c<N>``; the external host hangs off the border
        PE) first, where the level shows the cabling."""
        r = await tools.call_full("get_topology" if level == "A1" else "list_devices", {})
        if not r.ok or r.data is None:
            raise ValueError(f"listing the devices failed: {r.text[:300]}")
        items = r.data.get("nodes") or r.data.get("devices") or []
        hosts = {x["name"] for x in items if x.get("role") not in ("PE", "P")}

        def cabled_outside(x: dict[str, Any]) -> bool:
            peers = {str(p).split(":")[0] for p in (x.get("interfaces") or {}).values()}
            return any(p in hosts and not re.fullmatch(r"c\d+", p) for p in peers)

        pes = [x for x in items if x.get("role") == "PE"]
        return [x["name"] for x in sorted(pes, key=lambda x: (not cabled_outside(x), node_id(x["name"])))]

    async def _nft_table(self, tools: ToolSession, device: str, table: str, level: str) -> Any:
        """nftables table ``table`` (``"inet tenant_fw"``) of ``device`` as
        :class:`harness.agents.service_devices.NftTable` (no table: ``table=None``)."""
        from harness.agents.service_devices import NftTable

        if level == "A2":
            from harness.agents.a2_operator import nft_filter, nft_tables

            fam, name = table.split()
            got = nft_tables(await self._get_config(tools, device, nft_filter(fam, name))).get((fam, name))
            return NftTable(family=fam, name=name, table=got)
        if level == "A1":
            r = await tools.call_full("execute_validation", {"commands": {device: [f"nft -a list table {table}"]}})
            text = r.data["devices"][device]["output"] if r.ok and r.data else ""
        else:
            r = await tools.call_full("run_shell", {"device": device, "command": f"nft -a list table {table} 2>/dev/null || true"})
            text = (r.data or {}).get("stdout") or "" if r.ok else ""
        return NftTable.parse(table, _table_block(text, table))

    async def _apply_delta(self, tools: ToolSession, node: str, delta: ConfigDelta, level: str, *, nft_now: Any = None,
                           commit: bool = True) -> None:
        """Apply one device's change at ``level``: A0 one shell script, A1 its ip/FRR commands and
        (``nft_now``: table -> the device's table as read, every table the delta names) the nft
        commands that splice it, A2 one edit-config and commit (a refused edit or commit is
        discarded).

        Raises:
            ValueError: at A1, the delta names an nft table that was not read."""
        if level == "A2":
            from harness.agents.a2_operator import edit_payload

            r = await tools.call("edit_config", {"device": node, "config": edit_payload(delta)})
            if not r.ok:
                await tools.call("discard_changes", {"device": node})
                return
            if not commit:  # the edit left in the candidate (the noisy agent's uncommitted mistake)
                return
            r = await self._mutate(tools, "commit", {"device": node}, has_wait=True)
            if not r.ok:
                await tools.call("discard_changes", {"device": node})
        elif level == "A1":
            cmds = a1_commands(delta)
            if delta.nft and nft_now is not None:
                from harness.agents.service_devices import nft_commands
                from substrate.netconf.device import parse_nft

                for table, text in delta.nft.items():
                    if table not in nft_now:
                        raise ValueError(f"{node}: the table {table} was not read")
                    fam, name = table.split()
                    cmds += nft_commands(nft_now[table], parse_nft(text).get((fam, name)) if text else None)
            await self._mutate(tools, "apply_config", {"commands": {node: cmds}}, has_wait=True)
        else:
            await self._mutate(tools, "run_shell", {"device": node, "command": a0_script(delta)}, has_wait=False)

    async def _troubleshoot(self, tools: ToolSession, ctx: AgentContext, mistakes: Mistakes | None = None) -> AgentOutcome:
        """A troubleshooting ticket (:mod:`harness.agents.troubleshoot`): diagnose and repair at
        A0/A1/A2, confirm the reconciler's repair at A3-R/A4; other levels have no reference
        (``harness.troubleshooting.INEXPRESSIBLE``) and submit with an error saying so."""
        from harness.agents.troubleshoot import RECONCILE_POLL_S, RECONCILE_WAIT_S, await_reconciled, troubleshoot

        try:
            if ctx.level in ("A0", "A1", "A2"):
                async def get_config(device: str, flt: str) -> str:
                    return await self._get_config(tools, device, flt)

                noisy = mistakes if mistakes is not None and (mistakes.rate > 0 or mistakes.kind) else None
                done = await troubleshoot(tools, ctx.files, ctx.level, get_config=get_config, mistakes=noisy)
                note = "; ".join(done) or "nothing found to repair"
                if noisy is not None and noisy.made:
                    note += f" (mistakes: {noisy.note()})"
            elif ctx.level in ("A3-R", "A4"):
                # within the run's wall time and step budget (a poll is a step; submit is one more)
                bound = min(RECONCILE_WAIT_S, ctx.time_left() - 10.0, (ctx.budget_steps - 2) * RECONCILE_POLL_S)
                ok = await await_reconciled(tools, timeout_s=max(0.0, bound))
                note = "reconciler in sync" if ok else "reconciler not in sync"
            else:
                await tools.call("submit", {})
                return AgentOutcome(error=f"no scripted troubleshooting at {ctx.level}")
        except Exception as e:  # noqa: BLE001 - an operator who cannot go on says so and submits
            await tools.call("submit", {})
            return AgentOutcome(error=f"gave up: {type(e).__name__}: {e}")
        await tools.call("submit", {})
        return AgentOutcome(note=note[:2000])

    async def _mutate(self, tools: ToolSession, name: str, args: dict[str, Any], *, has_wait: bool) -> Any:
        """Call a mutating tool; when the change is refused or rolled back for a transient reason
        (:func:`transient`), pause and retry, as an operator would (at most RETRIES times; the
        pause is the level's ``wait`` tool where it has one). At A1 the retry carries the
        commands of the devices that refused for such a reason."""
        import anyio

        r = await tools.call(name, args)
        for _ in range(RETRIES):
            if not transient(r):
                break
            if has_wait:
                await tools.call("wait", {"seconds": RETRY_PAUSE_S})
            else:
                await anyio.sleep(RETRY_PAUSE_S)
            if name == "apply_config" and r.ok and r.data:
                args = {"commands": {d: args["commands"][d] for d in _transient_devices(r.data) if d in args["commands"]}}
            r = await tools.call(name, args)
        return r

    @staticmethod
    async def _others(tools: ToolSession, req: Request, mistakes: Mistakes, *, records: bool) -> list[dict[str, Any]]:
        """Other tenants' sites (``{"id", "tenant"}``), read only when a mistake may need them
        (touching another tenant's object, the wrong tenant's table): A3-T/A4 list_services,
        A3-R list_records and read_record (the first few)."""
        if not mistakes.needs_others():
            return []
        own = {s["site"] for s in req.sites}
        if not records:
            r = await tools.call("list_services", {"service_class": "tenant_site"})
            items = (r.data or {}).get("items") or [] if r.ok else []
            return [{"id": x["id"], "tenant": x.get("tenant")} for x in items if x.get("tenant") != req.tenant and x["id"] not in own]
        r = await tools.call("list_records", {"service_class": "tenant_site"})
        ids = [x for x in ((r.data or {}).get("classes") or {}).get("tenant_site", []) if x not in own] if r.ok else []
        out = []
        for iid in ids[:4]:
            rr = await tools.call("read_record", {"service_class": "tenant_site", "id": iid})
            spec = ((rr.data or {}).get("spec") or {}) if rr.ok else {}
            if spec.get("tenant") and spec["tenant"] != req.tenant:
                out.append({"id": iid, "tenant": spec["tenant"]})
        return out

    async def _intent(self, tools: ToolSession, req: Request, mistakes: Mistakes, level: str,
                      ops: list[dict[str, Any]] | None = None) -> None:
        ops = intent_ops(req) if ops is None else ops
        others = await self._others(tools, req, mistakes, records=False)
        since = len(mistakes.made)
        noisy, unapplied = noisy_ops(ops, req.sites, others, level, mistakes, req.tenant or None)
        plan = await tools.call("plan_change_set", {"ops": noisy})
        if not plan.ok:
            # a competent operator reads the error and retries once with the ticket's own values
            if noisy != ops:
                mistakes.refused(since)
                noisy, unapplied = ops, False
                await tools.call("plan_change_set", {"ops": noisy})
        if unapplied:  # planned, never applied (the uncommitted mistake)
            return
        await self._mutate(tools, "apply_change_set", {"ops": noisy}, has_wait=False)

    async def _records(self, tools: ToolSession, req: Request, mistakes: Mistakes,
                       ops: list[dict[str, Any]] | None = None) -> None:
        """A3-R: the request written as records (create: write_record, modify: patch_record, delete:
        delete_record), committed, then waited for until the reconciler has applied it."""
        ops = intent_ops(req) if ops is None else ops
        others = await self._others(tools, req, mistakes, records=True)
        since = len(mistakes.made)
        noisy, uncommitted = noisy_ops(ops, req.sites, others, "A3-R", mistakes, req.tenant or None)

        async def edit(change: list[dict[str, Any]], commit: bool = True) -> Reply | None:
            for op in change:
                key = {"service_class": op["service_class"], "id": op["id"]}
                if op["op"] == "create":
                    await tools.call("write_record", {**key, "spec": op["spec"]})
                elif op["op"] == "modify":
                    await tools.call("patch_record", {**key, "patch": op["spec"]})
                else:
                    await tools.call("delete_record", key)
            if not commit:  # records edited, never committed (the uncommitted mistake)
                return None
            return await tools.call("commit", {"message": f"ticket for tenant {req.tenant}: {len(change)} record change(s)"})

        r = await edit(noisy, commit=not uncommitted)
        if r is None:
            return
        if not r.ok and noisy != ops:
            # a competent operator reads the refusal, drops the working change and does it again with the ticket's values
            mistakes.refused(since)
            await tools.call("discard", {})
            r = await edit(ops)
        if not r.ok:
            await tools.call("discard", {})
            return
        for _ in range(RETRIES):
            st = await tools.call("wait", {"seconds": 120})
            d = st.data or {}
            if not st.ok or d.get("applied_commit") == d.get("head") or d.get("failed_commit") == d.get("head"):
                break

    async def _read_pes(self, tools: ToolSession, pes: list[str], a1: bool, nft_table: str | None = None) -> dict[str, PeFacts]:
        """:class:`PeFacts` of ``pes`` at A1 (one execute_validation) or A0 (one run_shell per PE);
        with ``nft_table`` (``"inet tenant_fw"``) the same reads list that table too
        (``PeFacts.nft``: no extra step)."""
        facts: dict[str, PeFacts] = {}
        cmds = ["ip -6 -j rule show", "ip -6 -d -j route show table main", "ip -4 -j rule show"]
        if a1:
            extra = [f"nft -a list table {nft_table}"] if nft_table else []
            r = await tools.call_full("execute_validation", {"commands": {pe: cmds + extra for pe in pes}})
            if not r.ok or r.data is None:
                raise ValueError(f"reading the PEs failed: {r.text[:300]}")
            for pe in pes:
                out = r.data["devices"][pe]["output"]
                parts = _json_outputs(out)
                facts[pe] = PeFacts(rules6=parts[0], routes6=parts[1], rules4=parts[2])
                if nft_table:
                    facts[pe].nft[nft_table] = _table_block(out, nft_table)
        else:
            extra = [f"nft -a list table {nft_table} 2>/dev/null || true"] if nft_table else []
            for pe in pes:
                r = await tools.call_full("run_shell", {"device": pe, "command": "; echo '@@'; ".join(cmds + extra)})
                if not r.ok or r.data is None:
                    raise ValueError(f"reading {pe} failed: {r.text[:300]}")
                a, b, c, *rest = r.data["stdout"].split("@@")
                facts[pe] = PeFacts(rules6=json.loads(a), routes6=json.loads(b), rules4=json.loads(c))
                if nft_table:
                    facts[pe].nft[nft_table] = _table_block(rest[0] if rest else "", nft_table)
        return facts

    async def _read(self, tools: ToolSession, device: str, command: str, *, level: str) -> Any:
        """One read-only command's JSON output on ``device`` (A0 run_shell, A1 execute_validation)."""
        if level == "A1":
            r = await tools.call_full("execute_validation", {"commands": {device: [command]}})
            if not r.ok or r.data is None:
                raise ValueError(f"reading {device} failed: {r.text[:300]}")
            return _json_outputs(r.data["devices"][device]["output"])[0]
        r = await tools.call_full("run_shell", {"device": device, "command": command})
        if not r.ok or r.data is None:
            raise ValueError(f"reading {device} failed: {r.text[:300]}")
        return json.loads(r.data["stdout"] or "[]")

    async def _find_leaks(self, req: Request, facts: dict[str, PeFacts], read_table: Any, read_sids: Any) -> list[Leak]:
        """The services leaked into the tenant's table (:class:`Leak`): the SRv6 routes of the
        table on one of the tenant's PEs that are no site's, each resolved to the End.DT6 SID
        and table of the node it points to. ``read_table(pe, table)`` and ``read_sids(node)``
        read the devices at the agent's level."""
        first = req.sites[0] if req.sites else None
        table = facts[first["pe"]].table_of_port(first["pe_port"]) if first else None
        if table is None:
            return []
        prefixes = {s["prefix6"] for s in req.sites} | {a["prefix6"] for a in req.add}
        out = []
        for prefix, sid in foreign_routes(await read_table(first["pe"], table), prefixes):
            node, fn = sid_node(sid)
            sids = facts[node] if node in facts else PeFacts(rules6=[], routes6=await read_sids(node))
            facts.setdefault(node, sids)
            dt6 = next((rt for rt in sids.routes6 if rt.get("encap") == "seg6local" and rt.get("action") == "End.DT6"
                        and _function_of(rt.get("dst", "::/64")) == fn), None)
            if dt6 is not None and str(dt6.get("table", "")).isdigit():
                port = next((rt.get("dev") for rt in sids.routes6 if rt.get("dst") == prefix and rt.get("encap") is None), None)
                out.append(Leak(prefix6=prefix, sid=sid, node=node, table=int(dt6["table"]), port=port))
        return out

    async def _devices(self, tools: ToolSession, req: Request, mistakes: Mistakes, *, a1: bool) -> None:
        pes = sorted({s["pe"] for s in req.sites} | {a["pe"] for a in req.add} | {m["to_pe"] for m in req.move})
        from harness.agents.service_devices import FW_TABLE, NftTable

        # a removed site may be the source of accept rules in its tenant's chains: read them with the facts
        facts = await self._read_pes(tools, pes, a1, nft_table=FW_TABLE if req.remove else None)
        level = "A1" if a1 else "A0"

        async def read_table(pe: str, table: int) -> Any:
            return await self._read(tools, pe, f"ip -6 -d -j route show table {table}", level=level)

        async def read_sids(node: str) -> Any:
            return await self._read(tools, node, "ip -6 -d -j route show table main", level=level)

        leaks = await self._find_leaks(req, facts, read_table, read_sids)
        before, after, deltas = plan_tenant_change(req, facts, leaks)
        fw = {pe: NftTable.parse(FW_TABLE, f.nft[FW_TABLE]) for pe, f in facts.items() if FW_TABLE in f.nft}
        deltas, nft_now = await self._with_nft(tools, req, before, after, deltas, level, fw)
        for pe, delta, target, _commit in _with_mistakes(deltas, mistakes, level, pes, after.table, facts):
            await self._apply_delta(tools, target, delta, level, nft_now=nft_now.get(pe, {}))
        check = {pe: [f"ip -6 route show table {after.table}"] for pe in sorted(deltas)}
        if check:
            if a1:
                await tools.call("execute_validation", {"commands": check})
            else:
                first = sorted(deltas)[0]
                await tools.call("run_shell", {"device": first, "command": f"ip -6 route show table {after.table}"})

    async def _with_nft(self, tools: ToolSession, req: Request, before: Tenant, after: Tenant, deltas: dict[str, ConfigDelta],
                        level: str, fw: dict[str, Any]) -> tuple[dict[str, ConfigDelta], dict[str, dict[str, Any]]]:
        """The site change's per-PE deltas with the nftables state it alters:

        - the hairpin NAT (:func:`harness.agents.service_devices.plan_hairpins`): the
          ``ip fip_hairpin`` table of each PE of the tenant's IPv4 sites, before and after
          (:func:`~harness.agents.service_devices.hairpin_pes`), is read and the tenant's part
          re-rendered and spliced in;
        - the accept rules whose source is a removed site, gone from the tenant's chains of
          ``inet tenant_fw`` (``fw``: PE -> that table as read, every PE of the remaining sites;
          :func:`~harness.agents.service_devices.plan_firewall` with the rule set the devices
          show, less those rules).

        Returns the deltas and, per PE, the tables read (``{table: NftTable}``, for A1's nft commands)."""
        from harness.agents.service_devices import (
            FW_TABLE,
            HAIRPIN_TABLE,
            hairpin_pes,
            merge_deltas,
            plan_hairpins,
            plan_removed_sources,
        )

        tables = {pe: await self._nft_table(tools, pe, HAIRPIN_TABLE, level) for pe in hairpin_pes(before, after)}
        now: dict[str, dict[str, Any]] = {pe: {HAIRPIN_TABLE: t} for pe, t in tables.items()}
        out = merge_deltas(deltas, plan_hairpins(before, after, tables))
        fw_deltas = plan_removed_sources(req.tenant, req.sites, req.remove, fw) if fw else {}
        out = merge_deltas(out, fw_deltas)
        for pe in fw_deltas:
            now.setdefault(pe, {})[FW_TABLE] = fw[pe]
        return out, now

    async def _netconf(self, tools: ToolSession, req: Request, mistakes: Mistakes) -> None:
        """A2: read each PE's rules and SIDs through the models (get-config with a subtree
        filter), plan as at A0/A1, then per PE: edit the candidate and commit it."""
        from harness.agents.a2_operator import edit_payload

        pes = sorted({s["pe"] for s in req.sites} | {a["pe"] for a in req.add} | {m["to_pe"] for m in req.move})
        facts = await self._node_facts(tools, pes, "A2")

        async def read_table(pe: str, table: int) -> Any:
            return await self._table_routes(tools, pe, table, "A2")

        async def read_sids(node: str) -> Any:
            return (await self._node_facts(tools, [node], "A2"))[node].routes6

        leaks = await self._find_leaks(req, facts, read_table, read_sids)
        before, after, deltas = plan_tenant_change(req, facts, leaks)
        from harness.agents.service_devices import FW_TABLE

        fw = {pe: await self._nft_table(tools, pe, FW_TABLE, "A2") for pe in sorted({s.pe for s in after.sites}, key=node_id)} \
            if req.remove else {}
        deltas, _now = await self._with_nft(tools, req, before, after, deltas, "A2", fw)
        for _pe, delta, target, commit in _with_mistakes(deltas, mistakes, "A2", pes, after.table, facts):
            r = await tools.call("edit_config", {"device": target, "config": edit_payload(delta)})
            if not r.ok:
                await tools.call("discard_changes", {"device": target})
                continue
            if not commit:  # the edit left in the candidate (the uncommitted mistake)
                continue
            r = await self._mutate(tools, "commit", {"device": target}, has_wait=True)
            if not r.ok:
                await tools.call("discard_changes", {"device": target})
        if deltas:
            first = sorted(deltas)[0]
            await tools.call("get_config", {"device": first, "filter": f'<kernel xmlns="urn:anibench:yang:kernel">'
                                            f"<table><id>{after.table}</id></table></kernel>"})


def _with_mistakes(deltas: dict[str, ConfigDelta], mistakes: Mistakes, level: str, pes: list[str], table: int,
                   facts: dict[str, PeFacts]) -> list[tuple[str, ConfigDelta, str, bool]]:
    """The planned per-PE changes with ``mistakes`` made in them
    (:func:`harness.agents.mistakes.device_mistake`): (PE, delta, device it goes to, whether it
    is committed), in the plan's order."""
    env = DeviceEnv(level=level, pes=pes, table=table, rules6={pe: f.rules6 for pe, f in facts.items()},
                    used={pe: f.used_functions(pe) for pe, f in facts.items() if pe in pes})
    items = list(deltas.items())
    kinds = mistakes.choose(len(items), lambda i, k: device_mistake(k, items[i][1], items[i][0], env) is not None)
    out = []
    for (pe, delta), kind in zip(items, kinds, strict=True):
        m = device_mistake(kind, delta, pe, env) if kind else None
        if m is None:
            out.append((pe, delta, pe, True))
            continue
        mistakes.record(kind, pe)
        out.append((pe, m.delta, m.target, m.commit))
    return out


class NoisyAgent(ScriptedAgent):
    """The scripted operator making mistakes at rate ``rate`` (default 0.3) per change, or with
    ``kind`` (one of :data:`harness.agents.mistakes.KINDS`) exactly one mistake of that kind."""

    name = "noisy"

    def __init__(self, rate: str | float = 0.3, **options: str):
        super().__init__(rate=rate, **options)


def _kind_of(files: dict[str, str]) -> str:
    """Which kind of ticket the HAI files hold: ``troubleshooting`` (a customer's report),
    ``service`` (a service-class change: ``service_class`` in request.yaml) or ``sites``."""
    try:
        req = yaml.safe_load(files.get("request.yaml", "")) or {}
    except yaml.YAMLError:
        return "sites"
    if isinstance(req, dict) and "report" in req:
        return "troubleshooting"
    if isinstance(req, dict) and "service_class" in req:
        return "service"
    return "sites"


def _table_block(text: str, table: str) -> str:
    """The ``table F N { ... }`` block of an nft listing in ``text`` (an A1 transcript starts with
    the command), '' when there is none (nft said the table does not exist)."""
    start = text.find(f"table {table} {{")
    if start < 0:
        return ""
    end = text.find("\n}", start)
    return text[start:] if end < 0 else text[start:end + 2]


def _json_outputs(transcript: str) -> list[Any]:
    """The JSON documents in an A1 validation transcript, in order."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while True:
        starts = [p for p in (transcript.find("[", i), transcript.find("{", i)) if p >= 0]
        if not starts:
            return out
        j = min(starts)
        try:
            doc, end = dec.raw_decode(transcript, j)
        except ValueError:
            i = j + 1
            continue
        out.append(doc)
        i = end
