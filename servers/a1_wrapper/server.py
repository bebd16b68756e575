"""ANI level A1: the bounded per-device command wrapper (draft section 5.1, Table 1: "generic
guardrail (allowlist), snapshot and manual rollback"), built as NetConfArena's compact interface
(section III-C: get_running_config, apply_config, execute_validation, wait, submit) plus
get_topology and rollback.

- ``apply_config`` checks every command against the allowlist grammar first (all-or-nothing),
  takes the devices' configuration locks, snapshots each device (``substrate.devstate``), then
  applies (:mod:`servers.a1_wrapper.apply`): FRR lines through vtysh with FRR's own answer per
  line (:mod:`servers.a1_wrapper.vtysh`, no terminal), ``ip``/``nft`` forms as argument lists
  (:mod:`servers.a1_wrapper.kernel`). Each command is reported applied, unchanged (already so)
  or rejected with why, from the device's answer and, where the answer does not say, a read-back.
  Rejected commands do not stop the batch (as when configuration is pasted into a router).
- One rule decides whether a call that ran is an error (:func:`settle`): when something was
  refused and nothing took effect, the result is an MCP error (``isError``; the trajectory's
  ``tool_error``) whose text is the summary sentence and the result with the per-device echo and
  rejections; otherwise the result is not an error and its ``summary`` (its first field) names
  the rejected commands. In both cases the refusals are noted, so the trajectory's ``is_error``
  marks the call as an error action (NetConfArena III-D: an action "rejected by the device"
  counts, whether or not other lines of it were accepted).
- ``get_running_config`` prints each device's configuration as the commands that re-create it;
  applied back, it is accepted and changes nothing.
- ``execute_validation`` runs read-only forms only: FRR ``show`` commands, ping and traceroute
  from the device (bounded), read-only ``ip`` and ``nft`` forms.
- ``rollback(device, snapshot_id)`` restores a snapshot (``substrate.devstate.restore``), taking
  a snapshot of the state it replaces first.
- With ``ServerConfig.blocklist`` a blocklist of destructive commands applies on top of the
  allowlist (the draft's "ad-hoc measures ... treated as ablations within a level").

No agent text ever reaches a shell: FRR lines are vtysh arguments, everything else an argv.
"""

import re
import threading
import time
from collections import OrderedDict
from fnmatch import fnmatch
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ConfigDict, Field

from servers.a1_wrapper.apply import DeviceApply, DeviceRun, Rejection, config_lines
from servers.a1_wrapper.grammar import Command, Grammar, GrammarError, Problem, apply_filter
from servers.a1_wrapper.kernel import ruleset_commands
from servers.a1_wrapper.vtysh import run_lines
from servers.common import AniServer, ServerConfig, ServerSetupError, level_options, attach_lab, note_rejected, own_config_routers, pid_holder
from servers.common.server import cancel_event, note_cancelled
from substrate import addressing as addr
from substrate.devstate import SYSCTLS, DeviceState, capture, restore
from substrate.frr import ISIS_TAG
from substrate.topology import Role

LEVEL = "A1"
#: What A1 offers, whatever the lab (the instructions' second part).
_TOOLS_TEXT = (
    "get_topology and get_running_config read; apply_config sends configuration commands (FRR configuration lines, entered and "
    "left in configuration mode for you, and a bounded set of `ip -6 route|rule` and `nft` forms) and returns "
    "each device's command-by-command echo plus a snapshot id; execute_validation runs read-only commands "
    "(show, ping, traceroute, ip ... show, nft list); rollback restores a snapshot; wait lets protocols "
    "converge. Commands outside the allowed forms are refused with the forms that are allowed."
)
INSTRUCTIONS = (
    "Level A1 of anibench: a bounded command interface to each device of an emulated SRv6 provider network "
    "(FRR 8.4 routers running IS-IS; SRv6 data plane and firewalls in the Linux kernel). " + _TOOLS_TEXT
)
#: The same for a lab whose routers bring their own FRR configuration (an imported Containerlab
#: lab): ``{routers}`` is :func:`servers.common.own_config_routers`.
INSTRUCTIONS_OWN_CONFIG = (
    "Level A1 of anibench: a bounded command interface to each device of an emulated network. {routers} "
    "Forwarding and firewalls are the Linux kernel's. " + _TOOLS_TEXT
)

Commands = dict[str, str | list[str]]


class A1Options(BaseModel):
    """Level-specific options of A1 (``ServerConfig.options``)."""

    model_config = ConfigDict(extra="forbid")

    vtysh_timeout_s: float = Field(default=30.0, gt=0, le=300, description="Deadline of one vtysh session.")
    exec_timeout_s: float = Field(default=10.0, gt=0, le=120, description="Deadline of one ip/nft/read command.")
    probe_timeout_s: float = Field(default=40.0, gt=0, le=120, description="Deadline of one ping/traceroute.")
    lock_timeout_s: float = Field(default=5.0, ge=0, le=120, description="Bound on the wait for device config locks.")
    max_wait_s: float = Field(default=60.0, gt=0, le=600, description="Largest pause wait() grants.")
    max_output_bytes: int = Field(default=1024 * 1024, ge=1024, le=16 * 1024 * 1024,
                                  description="Output kept of one command, bytes (the rest is dropped with a marker). What "
                                  "is kept but does not fit one message is cut and paged with read_output.")  # fmt: skip
    snapshots_per_device: int = Field(default=50, ge=1, le=1000, description="Snapshots kept per device (oldest dropped).")
    allowlist_path: str | None = Field(default=None, description="Alternative allowlist file (YAML).")
    blocklist_path: str | None = Field(default=None, description="Alternative blocklist file, used when the blocklist is on.")


# -- result models -------------------------------------------------------------------------------


class TopologyNode(BaseModel):
    name: str
    role: str = Field(description="P (core router), PE (provider edge router) or host.")
    node_id: int | None = Field(default=None, description="Router number (routers only).")
    loopback: str | None = Field(default=None, description="Router loopback address (routers only).")
    locator: str | None = Field(default=None, description="SRv6 uSID locator, RFC 9800 (routers only).")
    managed: bool = Field(description="The agent may act on this device in this episode.")
    interfaces: dict[str, str] = Field(description="Interface name -> the other end of its link, as device:interface "
                                       "(every link shows at both of its ends).")


class TopologyInfo(BaseModel):
    """The lab's devices and links."""

    nodes: list[TopologyNode]
    underlay: str = Field(description="How the provider underlay is built.")


def settle(result: BaseModel, summary: str, changed: int, refused: list[str]) -> None:
    """The one rule of A1 for a call that ran: refusals are noted (the trajectory's ``is_error``:
    an error action, NetConfArena III-D), and the call is an MCP error iff something was refused
    and nothing took effect (``changed == 0``).

    Then a ``ToolError`` carries ``summary`` (the same sentence as the result's summary field)
    and the result's JSON, so the client sees ``isError`` with the echo and rejections. Otherwise
    it returns: a partly applied call succeeds (re-sending all of it would repeat what was
    applied) and its summary names the refused commands.
    """
    if refused:
        note_rejected(*refused)
    if refused and changed == 0:
        raise ToolError(f"{summary}\n{result.model_dump_json(indent=1)}")


def summarize(total: int, changed: int, unchanged: int, refused: list[str], *, verb: str = "applied") -> str:
    """One sentence that says what happened, consistent with the error flag of :func:`settle`
    (an error exactly when the sentence begins with NOTHING).

    ``verb`` ``applied`` (apply_config: ``changed`` commands changed the device, ``unchanged``
    were already in effect) or ``run`` (execute_validation: ``changed`` commands ran).
    """
    shown = "; ".join(" ".join(r.split())[:200] for r in refused[:5]) + (f"; ... {len(refused) - 5} more" if len(refused) > 5 else "")
    rest = total - len(refused)
    if verb == "run":
        if not refused:
            return f"run: all {total} command(s)"
        if changed == 0:
            return f"NOTHING RUN: {len(refused)} of {total} command(s) REJECTED ({shown})"
        return f"PARTLY RUN: {len(refused)} of {total} command(s) REJECTED ({shown}); the other {rest} ran"
    effect = f"{changed} changed the device" + (f", {unchanged} already in effect (no change)" if unchanged else "")
    if not refused:
        if changed == 0:
            return f"no change: all {total} command(s) accepted, all already in effect"
        return f"applied: all {total} command(s) accepted; {effect}"
    if changed == 0:
        tail = f"; the other {rest} accepted but already in effect (no change)" if rest else ""
        return (f"NOTHING APPLIED: {len(refused)} of {total} command(s) REJECTED ({shown}){tail}. "
                "Fix the rejected commands and send them again")  # fmt: skip
    return (f"PARTLY APPLIED: {len(refused)} of {total} command(s) REJECTED and not applied ({shown}); the other "
            f"{rest} accepted: {effect}")  # fmt: skip


class ApplyResult(BaseModel):
    summary: str = Field(description="What happened, in one sentence: applied (and how many changed the device or were "
                                     "already in effect), or which commands were REJECTED and why.")  # fmt: skip
    devices: dict[str, DeviceApply]


class DeviceValidation(BaseModel):
    output: str = Field(description="Transcript: each command after the device prompt, then its raw output.")
    rejected: list[Rejection] = Field(default_factory=list, description="Commands the device refused (syntax).")


class ValidationResult(BaseModel):
    summary: str = Field(description="What was run; when the devices refused some commands, which ones.")
    devices: dict[str, DeviceValidation]


class RollbackResult(BaseModel):
    device: str
    snapshot_id: str = Field(description="The snapshot restored.")
    undo_snapshot_id: str = Field(description="Snapshot of the state just replaced (roll back to it to undo).")
    changed: bool = Field(description="Anything had to be changed.")
    actions: list[str] = Field(description="What was changed, in order (bounded).")
    complete: bool = Field(description="The device now matches the snapshot exactly.")
    residual: list[str] = Field(description="Differences that could not be restored (empty when complete).")


class WaitResult(BaseModel):
    status: str


# -- helpers ---------------------------------------------------------------------------------------


def _lines(value: object) -> list[str]:
    """A device's commands: a newline-separated string (NetConfArena) or a list of lines. Only
    a line feed (or CR LF) separates commands: Unicode line separators inside a line are
    characters of that line (and refused by the grammar), never a hidden second command."""
    if isinstance(value, str):
        return _split(value)
    if isinstance(value, list):
        out: list[str] = []
        for v in value:
            out.extend(_split(v) if isinstance(v, str) else [v])  # non-strings rejected by the grammar
        return out
    return [value]  # type: ignore[list-item]


def _split(text: str) -> list[str]:
    lines = re.split(r"\r?\n", text)
    return lines[:-1] if len(lines) > 1 and lines[-1] == "" else lines


#: How get_running_config shows a route, rule or nftables object that A1 has no command for.
NOT_A_FORM = "! not an apply_config form (A1 cannot re-create it): "


def render_state(state: DeviceState, is_router: bool, grammar: Grammar | None = None) -> str:
    """A device's running configuration as text: FRR's running config, then the kernel state
    services use that FRR does not show (routes, rules, SRv6 source, nftables, interfaces,
    sysctls), written as the A1 commands that re-create it. Fed back to apply_config, it is
    accepted and changes nothing (the header lines restate the device's own, the routes, rules
    and nftables rules are already there); what A1 has no command for is a ``!`` comment: the
    objects of no A1 form, and, given ``grammar``, the routes, rules and nftables commands it
    does not accept (``pref high``, ``mtu``, nexthop objects, an nft ``comment``, ...)."""

    def command(line: str) -> str:
        if grammar is None:
            return line
        try:
            grammar.parse_config(state.node, [line], is_router=is_router)
        except GrammarError:
            return NOT_A_FORM + line
        return line

    n = state.node
    parts = []
    if is_router:
        parts.append(f"! ===== {n}: FRR running configuration (show running-config) =====")
        parts.append((state.frr_config or "! (FRR did not answer)\n").rstrip("\n"))
    else:
        parts.append(f"! ===== {n}: host (no FRR) =====")
    parts.append(f"! ===== {n}: kernel state outside FRR, as the commands that re-create it =====")
    body = [f"ip -6 route add {r}" for r in state.routes6] + [f"ip -4 route add {r}" for r in state.routes4]
    body += [f"ip -6 rule add {r}" for r in state.rules6] + [f"ip -4 rule add {r}" for r in state.rules4]
    if state.tunsrc:
        body.append(f"ip sr tunsrc set {state.tunsrc}")
    parts.append("\n".join(map(command, body)) if body else "! (no routes or rules outside FRR)")
    parts.append("! nftables ruleset (nft list ruleset), as the commands that re-create it:")
    parts.append("\n".join(c if c.startswith("!") else command(c) for c in ruleset_commands(state.nft)) or "! (empty)")
    parts.append("! interfaces (kernel):")
    by_if: dict[str, list[str]] = {}
    for a in state.addresses:
        ip, _, dev = a.partition(" dev ")
        by_if.setdefault(dev.strip(), []).append(ip)
    for name, link in state.links.items():
        kind = f"{link.kind} " if link.kind else ""
        addrs = ", ".join(by_if.get(name, [])) or "no global addresses"
        parts.append(f"!   {name}: {kind}{'up' if link.up else 'DOWN'} mtu {link.mtu}; {addrs}")
    every = {**state.sysctls, **state.iface_sysctls}
    sysctls = {k: v for k, v in every.items() if any(fnmatch(k, pat) for pat in SYSCTLS)}
    if sysctls:  # the ones services depend on (the state holds every writable one)
        parts.append("! sysctls: " + ", ".join(f"{k}={v}" for k, v in sysctls.items()))
    return "\n".join(parts) + "\n"


class SnapshotStore:
    """Snapshots per device, ids ``<device>@<n>``, the oldest dropped past a bound. Thread-safe."""

    def __init__(self, per_device: int):
        self.per_device = per_device
        self._lock = threading.Lock()
        self._snaps: dict[str, OrderedDict[str, DeviceState]] = {}
        self._count: dict[str, int] = {}

    def add(self, state: DeviceState) -> str:
        with self._lock:
            dev = state.node
            self._count[dev] = self._count.get(dev, 0) + 1
            sid = f"{dev}@{self._count[dev]}"
            snaps = self._snaps.setdefault(dev, OrderedDict())
            snaps[sid] = state
            while len(snaps) > self.per_device:
                snaps.popitem(last=False)
            return sid

    def get(self, device: str, sid: str) -> DeviceState:
        with self._lock:
            snaps = self._snaps.get(device, OrderedDict())
            if sid in snaps:
                return snaps[sid]
            known = list(snaps)
            taken = self._count.get(device, 0)
        other = sid.split("@", 1)[0] if isinstance(sid, str) and "@" in sid else None
        if other and other != device:
            raise ToolError(f"snapshot {sid!r} belongs to device {other!r}, not {device!r}")
        if not known:
            raise ToolError(f"no snapshot of {device} exists yet; apply_config takes one before each change")
        dropped = f" (only the last {self.per_device} are kept; {taken} were taken)" if taken > len(known) else ""
        raise ToolError(f"unknown snapshot {str(sid)[:64]!r} for {device}{dropped}; snapshots of {device}: {', '.join(known)}")


# -- the server ------------------------------------------------------------------------------------


def build_server(config: ServerConfig, *, lab: object = None) -> AniServer:  # noqa: C901
    """The A1 server over ``config.lab``.

    Raises:
        ServerSetupError: bad options or data files, lab missing or down, trajectory unwritable.
    """
    opts = level_options(A1Options, config, LEVEL)
    try:
        block: bool | str = (opts.blocklist_path or True) if config.blocklist else False
        grammar = Grammar.load(blocklist=block, allowlist=opts.allowlist_path)
    except (OSError, ValueError) as e:
        raise ServerSetupError(f"cannot load the A1 command grammar: {e}") from None
    lab = lab if lab is not None else attach_lab(config.lab)
    routers = own_config_routers(lab.topology)  # the instructions describe the lab actually served
    instructions = INSTRUCTIONS if routers is None else INSTRUCTIONS_OWN_CONFIG.format(routers=routers)
    instructions += " A blocklist of destructive commands is also in force." if config.blocklist else ""
    server = AniServer(config, level=LEVEL, instructions=instructions, lab=lab)
    lab_ = server.lab
    snapshots = SnapshotStore(opts.snapshots_per_device)
    holder = pid_holder(LEVEL)

    def is_router(device: str) -> bool:
        return lab_.state(device).role is not Role.HOST

    def commands_arg(commands: object) -> dict[str, list[str]]:
        if not isinstance(commands, dict) or not commands:
            raise ToolError('commands must map device names to commands, e.g. {"r1": "router isis CORE\\n net ..."}')
        if len(commands) > 64:
            raise ToolError("at most 64 devices per call")
        devices = server.devices(list(commands))
        return {d: _lines(commands[d]) for d in devices}

    # -- tools -------------------------------------------------------------------------------

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Get topology")
    def get_topology() -> TopologyInfo:
        """The network's devices (routers and hosts), their roles, router numbers, loopbacks, SRv6
        locators, interfaces and links. Devices with managed=false are outside this episode."""
        topo = lab_.topology
        nodes = []
        own = [r.name for r in topo.routers if r.self_configured]  # an imported lab's own configuration
        for n in lab_.nodes():
            ifaces = {lk.endpoint_of(n.name).interface: str(lk.peer_of(n.name)) for lk in topo.links_of(n.name)}
            rid = n.node_id if n.role is not Role.HOST and n.name not in own else None
            nodes.append(TopologyNode(
                name=n.name, role=n.role.value, node_id=rid,
                loopback=str(addr.loopback(rid).ip) if rid else None,
                locator=str(addr.locator(rid)) if rid else None,
                managed=n.name in server.device_names, interfaces=ifaces,
            ))  # fmt: skip
        underlay = (
            f"IS-IS level-2 instance {ISIS_TAG} (wide metrics, point-to-point core links) on every router; each router "
            "owns an SRv6 uSID locator fcbb:bb00:<id>::/48 (RFC 9800: 32-bit block, 16-bit node "
            "IDs) installed in the kernel as seg6local End with the NEXT-C-SID flavor, and a loopback fd00::<id>/128. "
            "FRR 8.4 cannot program SRv6 SIDs: the SRv6 data plane is kernel state (ip -6 route ... encap seg6|seg6local)."
        )
        if own:
            underlay = (
                f"Routers {', '.join(own)} run the lab's own FRR configuration (imported from a Containerlab lab; "
                "read it with get_running_config), not the IS-IS/SRv6 underlay: no router numbers, loopbacks or "
                "locators are assigned to them." + ("" if len(own) == len(topo.routers) else " Other routers: " + underlay)
            )
        return TopologyInfo(nodes=nodes, underlay=underlay)

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Get running configuration")
    def get_running_config(
        devices: Annotated[list[str] | str, Field(description='Device names, e.g. ["r1", "r2"] (or one name).')],
    ) -> dict[str, str]:
        """The full configuration text of each device: FRR's running configuration, then the kernel
        state that services use and FRR does not show (SRv6 seg6/seg6local routes, policy rules,
        the SRv6 encapsulation source, the nftables ruleset, interfaces, sysctls), written as the
        apply_config commands that re-create it: applied back, it is accepted and changes nothing. A router's
        configuration is a few thousand characters: ask for the devices you need (a result is bounded to one
        message, about 20,000 characters; longer texts are cut, each with a marker that read_output continues from)."""
        names = server.devices([devices] if isinstance(devices, str) else devices)
        if not names:
            raise ToolError(f"name at least one device; devices: {', '.join(server.device_names)}")
        states = lab_.map(lambda d: capture(lab_, d), names)
        return {d: render_state(s, is_router(d), grammar) for d, s in zip(names, states, strict=True)}

    @server.ani_tool(kind="config", read_only=False, destructive=True, idempotent=False, title="Apply configuration")
    def apply_config(
        commands: Annotated[
            Commands,
            Field(description='Device name -> configuration commands, as one newline-separated string or a list of '
                              'lines, e.g. {"r1": "router isis CORE\\nlsp-gen-interval 2", "r2": ["ip -6 route add '
                              'fd00:99::/64 via fd00::3 dev eth1"]}.'),
        ],
    ) -> ApplyResult:  # fmt: skip
        """Apply configuration commands to one or more devices and return what each command did.

        Commands are FRR configuration lines (configuration mode is entered and left for you; 'exit'
        leaves a sub-mode; 'configure terminal' and 'end' only return to the top level) or the allowed
        kernel forms: `ip [-6|-4] route|rule add|del|replace ...` (including SRv6 `encap seg6` and `encap
        seg6local action End|End.DT6|End.DX4|...`), `ip sr tunsrc set`, and a bounded set of `nft`
        table/chain/set/rule forms. Every command is checked first; if any is not allowed, nothing is
        applied and the error lists each bad command with the allowed forms. Before applying, the server
        takes each device's configuration lock and a snapshot (snapshot_id; see rollback). Each command's
        outcome comes from the device: applied (the configuration changed), unchanged (accepted, already
        so: e.g. a device's own get_running_config text applied back), or rejected with why (refused by
        FRR or the kernel, a 'no' line or delete that had nothing to remove, a daemon that is not running,
        or not run). A refused command does not stop the rest, as when configuration is pasted into a
        router. If something was rejected and nothing changed, the call fails (its text still has each
        device's echo and rejections); otherwise it succeeds and summary names the rejected commands (only
        they need fixing and re-sending). FRR lines after a kernel command start at the top level.
        """
        per_dev = commands_arg(commands)
        plans: dict[str, list[Command]] = {}
        problems = []
        for d, lines in per_dev.items():
            try:
                plans[d] = grammar.parse_config(d, lines, is_router=is_router(d))
            except GrammarError as e:
                problems.extend(e.problems)
        if problems:
            raise ToolError("NOTHING APPLIED: these commands are not allowed\n" + str(GrammarError(problems)))
        devices = list(plans)
        cancel = cancel_event()
        with lab_.config_lock(devices, holder=holder, timeout_s=opts.lock_timeout_s):
            states = dict(zip(devices, lab_.map(lambda d: capture(lab_, d), devices), strict=True))
            restated = [Problem(d, c.index, c.text, "outside what A1 manages; accepted only as it is on the device, and "
                                f"{d}'s running configuration has no such line")
                        for d in devices for c in plans[d] if c.family == "restate"
                        and ((), c.text) not in config_lines(states[d].frr_config)]  # fmt: skip
            if restated:
                raise ToolError("NOTHING APPLIED: these commands are not allowed\n" + str(GrammarError(restated)))
            sids = {d: snapshots.add(states[d]) for d in devices}
            results = lab_.map(lambda d: DeviceRun(lab_, d, states[d], opts, cancel).run(plans[d]), devices)
        out: dict[str, DeviceApply] = {}
        refused: list[str] = []
        for d, r in zip(devices, results, strict=True):
            r.snapshot_id = sids[d]
            out[d] = r
            refused += [f"{d}: {rej.command}: {rej.message}" for rej in r.rejected]
            if r.error:
                refused.append(f"{d}: {r.error}")
        changed = sum(len(r.applied) for r in results)
        unchanged = sum(len(r.unchanged) for r in results)
        total = changed + unchanged + sum(len(r.rejected) for r in results)
        if cancel is not None and cancel.is_set():
            note_cancelled(f"apply_config stopped on {', '.join(devices)}: {changed} command(s) changed the device(s), "
                           f"{len(refused)} not applied")  # fmt: skip
        summary = summarize(total, changed, unchanged, refused)
        res = ApplyResult(summary=summary, devices=out)
        settle(res, summary, changed, refused)
        return res

    @server.ani_tool(kind="validation", read_only=True, idempotent=True, title="Execute validation commands")
    def execute_validation(
        commands: Annotated[
            Commands,
            Field(description='Device name -> read-only commands (newline-separated string or list), e.g. '
                              '{"r1": "show isis neighbor\\nping fd00::3", "h1": ["ping -c 3 fd00:1:3::2"]}.'),
        ],
    ) -> ValidationResult:  # fmt: skip
        """Run read-only diagnostic commands on devices and return their raw output.

        Allowed: FRR `show ...` commands on routers (optionally `| include|exclude|begin TEXT`,
        plain-text matching), `ping` and `traceroute` from any device (bounded: at most 10 probes;
        defaults -c 5 -i 0.2 -W 1 and -n -q 1 -w 1 -m 16 are added when left out), and read-only
        `ip ... show|get` and `nft list ...` forms. Nothing here changes the device. Devices run in
        parallel, commands of one device in order. When the devices refuse every command (syntax,
        timeout) the call fails with the outputs in its text; when only some are refused, summary
        names them. A ping without reply is not a refusal.
        """  # NetConfArena III-C execute_validation
        per_dev = commands_arg(commands)
        plans: dict[str, list[Command]] = {}
        problems = []
        for d, lines in per_dev.items():
            try:
                plans[d] = grammar.parse_validation(d, lines, is_router=is_router(d))
            except GrammarError as e:
                problems.extend(e.problems)
        if problems:
            raise ToolError("NOTHING RUN: these commands are not allowed\n" + str(GrammarError(problems)))
        devices = list(plans)
        cancel = cancel_event()
        results = lab_.map(lambda d: _validate_device(lab_, d, plans[d], opts, cancel), devices)
        out = {}
        refused: list[str] = []
        for d, r in zip(devices, results, strict=True):
            out[d] = r
            refused += [f"{d}: {rej.command}: {rej.message}" for rej in r.rejected]
        # commands run without refusal ("*": the device failed mid-way, nothing of it counts)
        total = sum(sum(c.family != "comment" for c in plans[d]) for d in devices)
        done = sum(0 if any(x.command == "*" for x in out[d].rejected)
                   else max(0, sum(c.family != "comment" for c in plans[d]) - len(out[d].rejected)) for d in devices)
        summary = summarize(total, done, 0, refused, verb="run")
        res = ValidationResult(summary=summary, devices=out)
        settle(res, summary, done, refused)
        return res

    @server.ani_tool(kind="config", read_only=False, destructive=True, idempotent=True, title="Roll back to a snapshot")
    def rollback(
        device: Annotated[str, Field(description="Device name, e.g. 'r1'.")],
        snapshot_id: Annotated[str, Field(description="A snapshot id of that device, as returned by apply_config (e.g. 'r1@3').")],
    ) -> RollbackResult:
        """Restore a device to a snapshot taken by apply_config (FRR configuration and the kernel
        state: routes, rules, nftables, addresses, interface states). Only what differs is changed
        (FRR through frr-reload). The state being replaced is snapshotted first (undo_snapshot_id).
        Takes the device's configuration lock. When differences remain (complete=false) the call
        still succeeds if anything was restored, and fails (with the residual in its text) if
        nothing could be.
        """  # draft 5.1 (A1: snapshot and manual rollback)
        name = server.device(device)
        target = snapshots.get(name, snapshot_id)
        with lab_.config_lock([name], holder=holder, timeout_s=opts.lock_timeout_s):
            current = capture(lab_, name)
            undo = snapshots.add(current)
            rep = restore(lab_, target, current=current)
        res = RollbackResult(
            device=name, snapshot_id=snapshot_id, undo_snapshot_id=undo, changed=rep.changed,
            actions=[a[:300] for a in rep.actions[:100]] + ([f"... {len(rep.actions) - 100} more"] if len(rep.actions) > 100 else []),
            complete=not rep.residual, residual=[r[:500] for r in rep.residual[:50]],
        )  # fmt: skip
        residual = [f"{name}: rollback incomplete: " + "; ".join(rep.residual[:5])] if rep.residual else []
        summary = (f"NOTHING RESTORED on {name}: the differences below remain" if residual and not rep.changed
                   else f"restored {name} to {snapshot_id}" + (" (incomplete: see residual)" if residual else ""))  # fmt: skip
        settle(res, summary, int(rep.changed), residual)
        return res

    @server.ani_tool(kind="wait", read_only=True, idempotent=True, title="Wait")
    async def wait(
        seconds: Annotated[float, Field(ge=0, le=opts.max_wait_s, description=f"Seconds to pause (0-{opts.max_wait_s:g}), a "
                                                                              "JSON number (\"5\" is read as 5; true is refused).")],
    ) -> WaitResult:
        """Pause to let protocols converge or state settle, then report that the time has passed."""
        # NetConfArena III-C wait
        await anyio.sleep(seconds)
        return WaitResult(status=f"{seconds:g} seconds elapsed")

    return server


# -- execution on one device (runs in a worker thread; never raises) --------------------------------


def _groups(plan: list[Command]) -> list[tuple[str, list[Command]]]:
    """Consecutive commands of the same kind: ('frr'|'show', lines...) batches, others one by one."""
    out: list[tuple[str, list[Command]]] = []
    for c in plan:
        if c.family == "comment":
            continue
        if c.family in ("frr", "show") and out and out[-1][0] == c.family:
            out[-1][1].append(c)
        else:
            out.append((c.family, [c]))
    return out


def _validate_device(lab: Any, device: str, plan: list[Command], opts: A1Options,
                     cancel: threading.Event | None = None) -> DeviceValidation:  # fmt: skip
    out: list[str] = []
    rejected: list[Rejection] = []
    try:
        for family, cmds in _groups(plan):
            if cancel is not None and cancel.is_set():
                out.append("% not run: the call was cancelled")
                rejected.append(Rejection(command="*", message="cancelled"))
                break
            if family == "show":
                answers = run_lines(
                    lambda argv: lab.exec(device, argv, timeout_s=opts.vtysh_timeout_s, max_output=opts.max_output_bytes,
                                          cancel=cancel),
                    [" ".join(c.argv or c.text.split()) for c in cmds], cancel=cancel,
                )  # fmt: skip
                for c, a in zip(cmds, answers, strict=True):
                    body = apply_filter(a.output + ("\n" if a.output else ""), c.filter)
                    out.append(f"{a.prompt or device + '# '}{c.text}\n{body}".rstrip("\n"))
                    if a.status != "accepted":
                        rejected.append(Rejection(command=c.text, message=a.message or "refused without a message"))
                continue
            c = cmds[0]
            assert c.argv is not None
            timeout = opts.probe_timeout_s if family == "probe" else opts.exec_timeout_s
            t0 = time.monotonic()
            r = lab.exec(device, c.argv, timeout_s=timeout, max_output=opts.max_output_bytes, cancel=cancel)
            body = apply_filter((r.stdout + r.stderr), c.filter).rstrip("\n")
            shown = " ".join(c.argv) if family == "probe" else c.text
            out.append(f"{device}# {shown}" + (f"\n{body}" if body else ""))
            if r.timed_out or r.cancelled:
                out.append(f"% {'timed out' if r.timed_out else 'cancelled'} after {time.monotonic() - t0:.0f} s")
                rejected.append(Rejection(command=c.text, message=f"timed out after {timeout:g} s" if r.timed_out
                                          else "cancelled"))  # fmt: skip
            elif r.returncode != 0 and family != "probe":
                out.append(f"% exit status {r.returncode}")
                rejected.append(Rejection(command=c.text, message=(r.stderr.strip() or f"exit status {r.returncode}")[:500]))
            elif r.returncode != 0:
                out.append(f"% exit status {r.returncode}" + (" (no reply)" if r.returncode == 1 else ""))
    except Exception as e:  # noqa: BLE001
        out.append(f"% the device could not run the commands: {e}")
        rejected.append(Rejection(command="*", message=str(e)[:300]))
    return DeviceValidation(output="\n".join(out) + "\n", rejected=rejected)
