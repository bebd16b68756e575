"""ANI level A0: a raw root shell on each device (draft section 5.1, Table 1: "raw device shell;
none; unbounded action space").

Tools: ``list_devices``, ``run_shell(device, command, timeout_s)``, ``submit``. A command runs as
``bash -c COMMAND`` inside the node (its network, mount, PID, UTS and IPC namespaces) with the
capabilities an operator's shell does not need dropped (``Lab.exec(confined=True)``): the shell
is root of its node's namespaces only, sees only its node's processes and files, reaches other
nodes only over the lab's links, runs within the node's resource limits, and nothing it starts
outlives the call (``substrate.confine``; README "What a node is"). A0 does not take the
per-device configuration locks, as a root shell on a real box would not (``substrate.locks``).
"""


from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servers.a0_shell.classify import classify_shell, shell_rejected
from servers.common import AniServer, ServerConfig, ServerSetupError, attach_lab, note_rejected, own_config_routers
from servers.common.server import cancel_event, note_cancelled
from substrate.process import TRUNCATION_MARK

LEVEL = "A0"
INSTRUCTIONS = (
    "Level A0 of anibench: a root shell on each device of an emulated SRv6 provider network. Routers run "
    "FRR 8.4 (zebra, staticd, isisd; configure with vtysh, e.g. vtysh -c 'configure terminal' -c '...'); the "
    "SRv6 data plane and firewalls are the Linux kernel's (iproute2 `ip -6 route ... encap seg6|seg6local`, "
    "`ip -6 rule`, nftables). Hosts are plain Linux nodes. Commands run with bash -c in the device, "
    "non-interactively: give programs their arguments (ping -c 3, not plain ping)."
)
#: The same for a lab whose routers bring their own FRR configuration (an imported Containerlab
#: lab): ``{routers}`` is :func:`servers.common.own_config_routers`.
INSTRUCTIONS_OWN_CONFIG = (
    "Level A0 of anibench: a root shell on each device of an emulated network. {routers} Read and change FRR "
    "with vtysh (e.g. vtysh -c 'show running-config', vtysh -c 'configure terminal' -c '...'); forwarding and "
    "firewalls are the Linux kernel's (iproute2, nftables). Hosts are plain Linux nodes. Commands run with bash -c "
    "in the device, non-interactively: give programs their arguments (ping -c 3, not plain ping)."
)


def instructions_for(lab: Any) -> str:
    """A0's instructions for ``lab``: the SRv6 provider network's, or those of a lab whose routers
    run their own configuration (they must describe the lab actually served)."""
    routers = own_config_routers(lab.topology)
    return INSTRUCTIONS if routers is None else INSTRUCTIONS_OWN_CONFIG.format(routers=routers)


class A0Options(BaseModel):
    """Level-specific options of A0 (``ServerConfig.options``)."""

    model_config = ConfigDict(extra="forbid")

    max_output_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024,
        description="Output kept per stream (stdout, stderr), bytes; the rest is dropped with a marker. What is kept but "
        "does not fit one message is cut and paged with read_output (ServerConfig.max_message_bytes).")  # fmt: skip
    default_timeout_s: float = Field(default=30.0, gt=0, le=600, description="Deadline when the agent gives none.")
    max_timeout_s: float = Field(default=120.0, gt=0, le=600, description="Largest deadline an agent may ask for.")


class Device(BaseModel):
    name: str
    role: str = Field(description="P (core router), PE (provider edge router) or host (customer/test host).")
    interfaces: dict[str, str] = Field(description="Interface name -> the other end, as device:interface.")


class DeviceList(BaseModel):
    devices: list[Device]


class ShellResult(BaseModel):
    """Outcome of one shell command."""

    device: str
    exit_status: int = Field(description="Exit status of bash (negative: killed by that signal).")
    stdout: str = Field(description="Standard output. When too long for one message it is cut, ending with a marker "
                        "that names the output id and offset read_output continues from.")
    stderr: str = Field(description="Standard error (cut and paged likewise).")
    truncated: bool = Field(description="Output beyond the server's capture limit (max_output_bytes per stream) was "
                            "dropped and cannot be read (a marker in the stream says how much); cut-but-kept output "
                            "is not 'truncated'.")
    duration_s: float
    killed_leftovers: list[str] = Field(
        default_factory=list,
        description="Processes the command left running when it ended (background jobs, setsid, daemons other than the "
        "device's FRR daemons), killed then, as 'name (pid N)'. Nothing a command starts outlives its call.")


def _kept(text: str, limit: int) -> str:
    """A stream with the capture marker saying plainly that the dropped bytes are gone."""
    head, sep, tail = text.partition(TRUNCATION_MARK.split("{", 1)[0])
    if not sep:
        return text
    dropped = tail.split(" ", 1)[0]
    return (f"{head}\n[... {dropped} more bytes dropped: over the server's capture limit of {limit} bytes per stream; "
            "they were not kept and cannot be read ...]\n")


def build_server(config: ServerConfig, *, lab: object = None) -> AniServer:
    """The A0 server over ``config.lab``.

    Raises:
        ServerSetupError: bad options, lab missing or down, trajectory unwritable.
    """
    try:
        opts = A0Options.model_validate(config.options)
    except ValidationError as e:
        raise ServerSetupError(f"bad A0 options: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}; "
                               f"known options: {', '.join(A0Options.model_fields)}") from None  # fmt: skip
    lab = lab if lab is not None else attach_lab(config.lab)
    server = AniServer(config, level=LEVEL, instructions=instructions_for(lab), lab=lab)
    lab_ = server.lab

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="List devices")
    def list_devices() -> DeviceList:
        """List the devices (routers and hosts) this episode may act on, with their role and their
        interfaces and what each connects to (device:interface)."""
        topo = lab_.topology
        out = []
        for n in lab_.nodes():
            if n.name not in server.device_names:
                continue
            ifaces = {lk.endpoint_of(n.name).interface: str(lk.peer_of(n.name)) for lk in topo.links_of(n.name)}
            out.append(Device(name=n.name, role=n.role.value, interfaces=ifaces))
        return DeviceList(devices=out)

    @server.ani_tool(
        kind=lambda args: classify_shell(args.get("command")),  # type: ignore[arg-type,return-value]
        read_only=False, destructive=True, idempotent=False, title="Run a shell command",
    )  # fmt: skip
    def run_shell(
        device: Annotated[str, Field(description="Device name (see list_devices), e.g. 'r1'.")],
        command: Annotated[str, Field(min_length=1, max_length=65536, description="A bash command line, run with bash -c in the device.")],
        timeout_s: Annotated[
            float | None,
            Field(gt=0, le=opts.max_timeout_s, description=f"Deadline in seconds, a JSON number (default {opts.default_timeout_s:g}, at most {opts.max_timeout_s:g}; \"30\" is read as 30, true is refused); the command is killed when it passes."),
        ] = None,
    ) -> ShellResult:
        """Run a shell command as root inside one device and return its exit status and output.

        The command runs with `bash -c` in the device's own namespaces, with no terminal and stdin
        closed; each call is a fresh shell (no state carries over but files). Output too long for
        one message is cut: the stream ends with a marker naming an output id and offset, and
        read_output returns the rest. Cancelling the call (MCP notifications/cancelled) kills the
        command. Errors: unknown device (the message lists the devices); deadline passed (the
        command was killed; the partial output is in the message).
        """  # fmt: skip
        name = server.device(device)
        if "\x00" in command:
            from mcp.server.mcpserver.exceptions import ToolError

            raise ToolError("the command contains a NUL character, which no shell command can hold; remove it")
        deadline = timeout_s if timeout_s is not None else opts.default_timeout_s
        r = lab_.exec(name, ["bash", "-c", command], timeout_s=deadline, confined=True, max_output=opts.max_output_bytes,
                      cancel=cancel_event())  # fmt: skip
        if r.cancelled:
            note_cancelled(f"the command's process group on {name} was killed after {r.duration_s:.1f} s "
                           f"(output so far: {(r.stdout + r.stderr)[-300:]!r})")  # fmt: skip
        if r.timed_out:
            from mcp.server.mcpserver.exceptions import ToolError

            partial = (r.stdout[-4000:] + ("\n--- stderr ---\n" + r.stderr[-2000:] if r.stderr.strip() else "")).strip()
            note_rejected(f"timed out after {deadline:g} s")
            killed = r.extra.get("leftovers_killed", [])
            raise ToolError(
                f"timeout: the command did not finish within {deadline:g} s and was killed on {name}"
                + (f", with {len(killed)} process(es) it had started" if killed else "") + ". "
                f"Give programs bounded arguments (e.g. ping -c 3) or a larger timeout_s (at most {opts.max_timeout_s:g})."
                + (f" Partial output:\n{partial}" if partial else " It printed nothing.")
            )
        why = shell_rejected(classify_shell(command), r.returncode, r.stdout + r.stderr)
        if why:
            note_rejected(why)
        return ShellResult(
            device=name, exit_status=r.returncode, stdout=_kept(r.stdout, opts.max_output_bytes),
            stderr=_kept(r.stderr, opts.max_output_bytes), truncated=r.truncated, duration_s=round(r.duration_s, 4),
            killed_leftovers=r.extra.get("leftovers_killed", []),
        )  # fmt: skip

    return server
