"""``harness serve`` (run an ANI level's MCP server) and ``harness mcp-config`` (print the block
that attaches Claude Desktop or Claude Code to it).

Startup is kept fast: only the chosen level's modules are imported, after the options are
parsed. A stdio server writes nothing to stdout but MCP messages.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from harness.cli.common import err, fail, friendly_errors

#: PATH given to a server started by a client with a minimal environment (Claude Desktop): the
#: lab needs nsenter, setpriv, ip, nft, vtysh.
SERVER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

AniOpt = Annotated[str, typer.Option("--ani", "-a", help="ANI level: A0 (raw shell), A1 (bounded wrapper), A2 (NETCONF/YANG), A3-T (typed transactional intent), A3-R (reconciled source of truth), A4 (typed intent in a reconciled source of truth).")]
LabOpt = Annotated[str, typer.Option("--lab", "-l", envvar="ANIBENCH_LAB", help="Name of the deployed lab.")]
TransportOpt = Annotated[str, typer.Option("--transport", help="stdio or http (streamable HTTP).")]
HostOpt = Annotated[str, typer.Option(help="HTTP: address to bind (loopback by default).")]
PortOpt = Annotated[int, typer.Option(min=0, max=65535, help="HTTP: port, 1-65535 (0 = any free port, printed on stderr).")]
#: mcp-config writes the port into a URL the client connects to: 0 would name no server.
ClientPortOpt = Annotated[int, typer.Option("--port", min=1, max=65535, help="HTTP: port of the running server, 1-65535.")]
PathOpt = Annotated[str, typer.Option("--path", help="HTTP: endpoint path.")]
TokenOpt = Annotated[
    str | None, typer.Option("--token", envvar="ANIBENCH_MCP_TOKEN", help="HTTP: require this bearer token.")
]
TrajectoryOpt = Annotated[Path | None, typer.Option("--trajectory", help="Trajectory JSONL file (one line per tool call).")]
BudgetOpt = Annotated[int | None, typer.Option("--budget-steps", min=1, help="Step budget: most tool calls in the episode.")]
BlocklistOpt = Annotated[bool, typer.Option("--blocklist", help="A1 ablation: add the blocklist of destructive commands.")]
DevicesOpt = Annotated[str | None, typer.Option(
    "--devices", help="Comma-separated devices the agent may act on; 'all' = every node, customer and external "
    "hosts included [default: the routers (P and PE), as in campaigns].")]
MaxMessageOpt = Annotated[int | None, typer.Option(
    "--max-message-bytes", min=4096, help="Bound on one JSON-RPC message the server sends, in bytes (a result's text, its "
    "structured copy and their escaping); longer texts are cut with a marker that the read_output tool continues from "
    "[default: 40960: a result's text stays near 20,000 characters, under what clients warn about].")]
ToolPrefixOpt = Annotated[str | None, typer.Option(
    "--tool-prefix", help="Put this before every tool name (e.g. a1_ gives a1_submit), for clients that attach two "
    "levels and do not prefix tool names themselves (every level has submit and read_output).")]
OptionOpt = Annotated[
    list[str] | None, typer.Option("--option", "-o", help="Level option KEY=VALUE (VALUE parsed as JSON when it can be).")
]


def _options(pairs: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in pairs or []:
        key, sep, value = p.partition("=")
        if not sep or not key:
            fail(f"--option needs KEY=VALUE, got {p!r}", code=2)
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _level(ani: str, blocklist: bool = False) -> str:
    """The canonical level of ``--ani``; exits with one line for an unknown level, or for
    ``--blocklist`` on a level that has none."""
    from servers.registry import BLOCKLIST_LEVELS, normalize_level

    try:
        level = normalize_level(ani)
    except KeyError as e:
        fail(str(e.args[0]), code=2)
        raise  # unreachable
    if blocklist and level not in BLOCKLIST_LEVELS:
        fail(f"--blocklist applies to {', '.join(sorted(BLOCKLIST_LEVELS))} only; level {level} has no blocklist", code=2)
    return level


def _token(token: str | None) -> None:
    """Refuse an empty bearer token at start (an empty header value would protect nothing)."""
    if token is not None and not token.strip():
        fail("--token (or ANIBENCH_MCP_TOKEN) is empty: give a real token, or leave it out", code=2)


def _devices(value: str | None) -> list[str] | str | None:
    """``--devices`` as ServerConfig takes it: None (the routers), ``"all"`` or a list of names."""
    if value is None:
        return None
    if value.strip().lower() == "all":
        return "all"
    names = [d.strip() for d in value.split(",") if d.strip()]
    if not names:
        fail("--devices needs node names, or 'all' (leave it out for the routers)", code=2)
    return names


@friendly_errors
def serve(
    ani: AniOpt,
    lab: LabOpt,
    transport: TransportOpt = "stdio",
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8765,
    path: PathOpt = "/mcp",
    token: TokenOpt = None,
    trajectory: TrajectoryOpt = None,
    budget_steps: BudgetOpt = None,
    blocklist: BlocklistOpt = False,
    devices: DevicesOpt = None,
    option: OptionOpt = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Label copied into every trajectory line.")] = None,
    max_message_bytes: MaxMessageOpt = None,
    tool_prefix: ToolPrefixOpt = None,
) -> None:
    """Run the MCP server of one ANI level over a deployed lab (stdio by default; --transport http)."""
    if transport not in ("stdio", "http"):
        fail(f"unknown transport {transport!r}; use stdio or http", code=2)
    _token(token)
    _tool_prefix(tool_prefix)
    level = _level(ani, blocklist)
    from servers.common import ServerConfig, ServerSetupError, run_server
    from servers.registry import get_builder

    try:
        config = ServerConfig(
            lab=lab, budget_steps=budget_steps, trajectory=trajectory.resolve() if trajectory else None,
            blocklist=blocklist, devices=_devices(devices),
            bearer_token=token if transport == "http" else None, run_id=run_id, options=_options(option),
            **({"max_message_bytes": max_message_bytes} if max_message_bytes is not None else {}),
            **({"tool_prefix": tool_prefix} if tool_prefix else {}),
        )  # fmt: skip
        server = get_builder(level)(config)
    except ServerSetupError as e:
        _setup_failed(str(e), transport)
        return
    except ValueError as e:  # pydantic validation of the config
        fail(f"bad server configuration: {e}", code=2)
        return
    if token and transport == "stdio":
        err.print("note: --token only applies to --transport http", highlight=False)
    continued = server.episode.continued_note()
    if continued:
        err.print(continued, highlight=False, soft_wrap=True)
    try:
        run_server(server, transport, host=host, port=port, path=path)  # type: ignore[arg-type]
    except ServerSetupError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot serve on {host}:{port}: {e}")
    except KeyboardInterrupt:
        pass


def _setup_failed(message: str, transport: str) -> None:
    """The server cannot start: say why on stderr and exit 1. A stdio server started by a client
    (stdin is not a terminal) first answers the client's requests with the reason as a JSON-RPC
    error (:func:`servers.common.transport.answer_setup_error`), so that the client shows it,
    until the client goes away."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    if transport == "stdio" and not sys.stdin.isatty():
        from servers.common.transport import answer_setup_error

        answer_setup_error(message)
    raise typer.Exit(1)


def _server_command(use_sudo: bool) -> list[str]:
    """Absolute command that starts ``harness`` with this installation."""
    from harness import harness_command

    cmd = harness_command()
    return (["/usr/bin/sudo", "-n"] + cmd) if use_sudo else cmd


@friendly_errors
def mcp_config(
    ani: AniOpt,
    lab: LabOpt,
    client: Annotated[str, typer.Option("--client", help="claude-desktop or claude-code.")] = "claude-code",
    transport: TransportOpt = "stdio",
    name: Annotated[str | None, typer.Option("--name", help="Server name in the client (default anibench-<level>).")] = None,
    host: HostOpt = "127.0.0.1",
    port: ClientPortOpt = 8765,
    path: PathOpt = "/mcp",
    token: TokenOpt = None,
    trajectory: TrajectoryOpt = None,
    budget_steps: BudgetOpt = None,
    blocklist: BlocklistOpt = False,
    devices: DevicesOpt = None,
    sudo: Annotated[bool, typer.Option("--sudo", help="Start the server with `sudo -n` (the client does not run as root).")] = False,
    max_message_bytes: MaxMessageOpt = None,
    tool_prefix: ToolPrefixOpt = None,
) -> None:
    """Print the configuration block that attaches an MCP client to an ANI server (absolute paths).

    Claude Desktop starts stdio servers with a minimal environment, so the block carries PATH.
    For --transport http the block points at a server you start yourself with `harness serve
    --transport http` (Claude Desktop attaches remote servers through its Connectors UI instead).
    """
    _token(token)
    level = _level(ani, blocklist)
    _devices(devices)  # refuse an empty list here, not when the client starts the server
    _tool_prefix(tool_prefix)
    if client not in ("claude-desktop", "claude-code"):
        fail(f"unknown client {client!r}; use claude-desktop or claude-code", code=2)
    if transport not in ("stdio", "http"):
        fail(f"unknown transport {transport!r}; use stdio or http", code=2)
    if client == "claude-desktop" and transport == "http":
        fail("Claude Desktop's config file takes stdio servers only; add an HTTP server through its Connectors UI, "
             "or use --transport stdio", code=2)  # fmt: skip
    server_name = name or f"anibench-{level.lower()}"
    from substrate.lab import Lab

    if lab not in {r.name for r in Lab.list()}:
        err.print(f"note: no lab named {lab!r} is deployed yet (harness lab up --name {lab})", highlight=False)
    if os.geteuid() != 0 and not sudo:
        err.print("note: the server needs root (lab namespaces); add --sudo if the client does not run as root", highlight=False)
    if transport == "http":
        url = f"http://{host}:{port}{path}"
        entry: dict[str, Any] = {"type": "http", "url": url}
        if token:
            entry["headers"] = {"Authorization": f"Bearer {token}"}
        serve_args = ["serve", "--ani", level, "--lab", lab, "--transport", "http", "--host", host, "--port", str(port)]
        err.print("start the server first: " + shlex.join(_server_command(sudo) + serve_args + _common_args(
            trajectory, budget_steps, blocklist, devices, max_message_bytes, tool_prefix)) + (" --token ..." if token else ""),
            highlight=False, soft_wrap=True)  # fmt: skip
    else:
        cmd = _server_command(sudo) + ["serve", "--ani", level, "--lab", lab] + _common_args(
            trajectory, budget_steps, blocklist, devices, max_message_bytes, tool_prefix)  # fmt: skip
        env = {"PATH": SERVER_PATH}
        if os.environ.get("ANIBENCH_STATE_ROOT"):
            env["ANIBENCH_STATE_ROOT"] = os.environ["ANIBENCH_STATE_ROOT"]
        entry = {"command": cmd[0], "args": cmd[1:], "env": env}
        if client == "claude-code":
            entry = {"type": "stdio", **entry}
            err.print("or: claude mcp add --transport stdio " + shlex.join([server_name, "--", *cmd]), highlight=False, soft_wrap=True)
    block = {"mcpServers": {server_name: entry}}
    where = ("claude_desktop_config.json (Settings > Developer > Edit Config)" if client == "claude-desktop"
             else ".mcp.json in the project, or claude --mcp-config FILE --strict-mcp-config")  # fmt: skip
    err.print(f"# {where}", highlight=False)
    sys.stdout.write(json.dumps(block, indent=2) + "\n")


def _common_args(trajectory: Path | None, budget: int | None, blocklist: bool, devices: str | None,
                 max_message_bytes: int | None = None, tool_prefix: str | None = None) -> list[str]:  # fmt: skip
    args: list[str] = []
    if trajectory is not None:
        args += ["--trajectory", str(trajectory.resolve())]
    if budget is not None:
        args += ["--budget-steps", str(budget)]
    if blocklist:
        args.append("--blocklist")
    if devices:
        args += ["--devices", devices]
    if max_message_bytes is not None:
        args += ["--max-message-bytes", str(max_message_bytes)]
    if tool_prefix:
        args += ["--tool-prefix", tool_prefix]
    return args


def _tool_prefix(prefix: str | None) -> None:
    """Refuse a tool prefix the server would refuse, here rather than when the client starts it."""
    from servers.common import ServerConfig

    if prefix:
        try:
            ServerConfig(lab="x", tool_prefix=prefix)
        except ValueError:
            fail(f"--tool-prefix {prefix!r}: a letter, then at most 31 letters, digits, '_' or '-' (e.g. a1_)", code=2)
