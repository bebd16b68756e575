"""``harness serve`` and ``harness mcp-config`` (no lab needed)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.servers_support import HARNESS


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HARNESS, *args], capture_output=True, text=True, cwd=REPO, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, **env} if env else None)  # fmt: skip


def test_mcp_config_claude_desktop_block_has_absolute_paths_and_path(tmp_path: Path) -> None:
    r = run("mcp-config", "--ani", "a1", "--lab", "demo", "--client", "claude-desktop",
            "--trajectory", "rel/t.jsonl", "--budget-steps", "40", "--blocklist")  # fmt: skip
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout)["mcpServers"]["anibench-a1"]
    assert Path(entry["command"]).is_absolute() and Path(entry["command"]).exists()
    args = entry["args"]
    assert args[:5] == ["serve", "--ani", "A1", "--lab", "demo"] or args[2:7] == ["serve", "--ani", "A1", "--lab", "demo"]
    traj = args[args.index("--trajectory") + 1]
    assert Path(traj).is_absolute() and traj.endswith("rel/t.jsonl")
    assert args[args.index("--budget-steps") + 1] == "40" and "--blocklist" in args
    assert "/usr/sbin" in entry["env"]["PATH"] and "type" not in entry


def test_mcp_config_claude_code_stdio_and_http() -> None:
    r = run("mcp-config", "--ani", "A0", "--lab", "demo", "--client", "claude-code")
    entry = json.loads(r.stdout)["mcpServers"]["anibench-a0"]
    assert entry["type"] == "stdio" and "claude mcp add --transport stdio anibench-a0 --" in r.stderr
    r = run("mcp-config", "--ani", "A1", "--lab", "demo", "--transport", "http", "--port", "9000", "--token", "tk", "--name", "lab1")
    entry = json.loads(r.stdout)["mcpServers"]["lab1"]
    assert entry == {"type": "http", "url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer tk"}}
    assert "serve --ani A1 --lab demo --transport http" in r.stderr


def test_cli_errors_are_one_line_and_stdout_stays_clean() -> None:
    r = run("mcp-config", "--ani", "A9", "--lab", "demo")
    assert r.returncode == 2 and "unknown ANI level 'A9'; registered: A0, A1" in r.stderr and r.stdout == ""
    r = run("mcp-config", "--ani", "A1", "--lab", "demo", "--client", "claude-desktop", "--transport", "http")
    assert r.returncode == 2 and "Connectors" in r.stderr
    # a stdio server that cannot start says why on stderr and writes nothing to stdout (MCP's channel)
    r = run("serve", "--ani", "A1", "--lab", "no-such-lab-xyz")
    assert r.returncode == 1 and "no lab named 'no-such-lab-xyz'" in r.stderr and r.stdout == ""
    r = run("serve", "--ani", "A1", "--lab", "x", "--transport", "carrier-pigeon")
    assert r.returncode == 2 and "unknown transport" in r.stderr
    r = run("serve", "--ani", "A0", "--lab", "x", "-o", "novalue")
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr
    r = run("serve", "--ani", "A1", "--lab", "x", "-o", "max_wait_s=30", "-o", "nosuch=1")
    assert r.returncode == 1 and "bad A1 options: nosuch" in r.stderr and "known options: vtysh_timeout_s" in r.stderr


@pytest.mark.lab
def test_serving_beyond_loopback_needs_a_token(line3) -> None:  # noqa: ANN001
    # refused before anything binds: a lab must not be reachable from other machines unguarded
    r = run("serve", "--ani", "A1", "--lab", line3.name, "--transport", "http", "--host", "0.0.0.0", "--port", "0")
    assert r.returncode == 1 and "give a bearer token (--token)" in r.stderr, r.stderr


def test_empty_tokens_are_refused_at_start() -> None:
    """Issue 17 / issue 11 item 9: an empty bearer token would guard nothing."""
    for args, env in ((("serve", "--ani", "A0", "--lab", "x", "--transport", "http", "--token", ""), None),
                      (("serve", "--ani", "A0", "--lab", "x", "--transport", "http", "--token", "  "), None),
                      (("mcp-config", "--ani", "A0", "--lab", "x", "--transport", "http", "--token", ""), None),
                      (("serve", "--ani", "A0", "--lab", "x", "--transport", "http"), {"ANIBENCH_MCP_TOKEN": " "})):  # fmt: skip
        r = run(*args, env=env)
        assert r.returncode == 2 and "is empty: give a real token" in r.stderr and r.stdout == "", (args, r.stderr)
    from servers.common import ServerConfig

    with pytest.raises(ValueError, match="bearer token is empty"):
        ServerConfig(lab="x", bearer_token="")


def test_mcp_config_passes_the_message_bound() -> None:
    r = run("mcp-config", "--ani", "A1", "--lab", "x", "--max-message-bytes", "32768")
    args = json.loads(r.stdout)["mcpServers"]["anibench-a1"]["args"]
    assert args[-2:] == ["--max-message-bytes", "32768"]
    r = run("serve", "--ani", "A1", "--lab", "x", "--max-message-bytes", "100")
    assert r.returncode == 2 and "--max-message-bytes" in r.stderr


def test_ports_are_range_checked() -> None:
    """An out-of-range port is refused by the option parser (exit 2, no traceback), for serve and mcp-config."""
    for args in (("serve", "--ani", "A0", "--lab", "x", "--transport", "http", "--port", "99999"),
                 ("serve", "--ani", "A0", "--lab", "x", "--transport", "http", "--port", "-1"),
                 ("mcp-config", "--ani", "A0", "--lab", "x", "--transport", "http", "--port", "65536"),
                 ("mcp-config", "--ani", "A0", "--lab", "x", "--transport", "http", "--port", "0")):
        r = run(*args)
        assert r.returncode == 2 and "Invalid value for '--port'" in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == "", args
    r = run("mcp-config", "--ani", "A0", "--lab", "x", "--transport", "http", "--port", "65535")
    assert r.returncode == 0 and json.loads(r.stdout)["mcpServers"]["anibench-a0"]["url"] == "http://127.0.0.1:65535/mcp"


@pytest.mark.lab
def test_serve_continues_or_refuses_an_existing_trajectory(line3, tmp_path: Path) -> None:  # noqa: ANN001
    """Same level and lab: the episode continues and the server says so at start; another level or
    lab: refused in one line naming the file."""
    import anyio

    from servers.common import ServerConfig
    from servers.registry import build_server
    from tests.servers_support import connect, text

    traj = tmp_path / "t.jsonl"

    async def episode() -> None:
        srv = build_server("A0", ServerConfig(lab=line3.name, trajectory=traj))
        async with connect(srv) as c:
            await c.call_tool("list_devices", {})
            await c.call_tool("submit", {})
        srv.close()
        again = build_server("A0", ServerConfig(lab=line3.name, trajectory=traj))
        async with connect(again) as c:
            r = await c.call_tool("list_devices", {})
            assert r.is_error and "submit was called (call 2)" in text(r) and str(tmp_path) not in text(r)  # issue 11 item 7
        again.close()

    anyio.run(episode)
    # stdin at EOF: the stdio server starts, says what it continues, and stops
    r = run("serve", "--ani", "A0", "--lab", line3.name, "--trajectory", str(traj))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert f"continuing the episode recorded in {traj}: 3 call(s) so far, submitted at call 2" in r.stderr, r.stderr
    r = run("serve", "--ani", "A1", "--lab", line3.name, "--trajectory", str(traj))
    assert r.returncode == 1 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"trajectory file {traj} holds an episode of level A0 on lab {line3.name}, not A1" in r.stderr
    other = tmp_path / "other.jsonl"
    other.write_text(traj.read_text().replace(f'"lab":"{line3.name}"', '"lab":"another-lab"'))
    r = run("serve", "--ani", "A0", "--lab", line3.name, "--trajectory", str(other))
    assert r.returncode == 1 and "holds an episode of level A0 on lab another-lab" in r.stderr, r.stderr
    assert traj.read_text().count("\n") == 3  # nothing was appended by the refused servers


@pytest.mark.lab
def test_default_devices_are_the_routers(line3) -> None:  # noqa: ANN001
    """Without --devices every level exposes the routers only (hosts stay topology context, not
    targets); --devices all exposes every node."""
    import anyio

    from servers.common import ServerConfig
    from servers.registry import build_server
    from substrate.devstate import capture
    from tests.servers_support import connect, data, stdio, text

    before = capture(line3, "h1")

    async def check() -> None:
        async with connect(build_server("A0", ServerConfig(lab=line3.name))) as c:
            assert [d["name"] for d in data(await c.call_tool("list_devices", {}))["devices"]] == ["r1", "r2", "r3"]
            r = await c.call_tool("run_shell", {"device": "h1", "command": "touch /tmp/agent-was-here"})
            assert r.is_error and "unknown device 'h1'; devices: r1, r2, r3" in text(r)
        # over stdio, as a client attached with `harness mcp-config` output (no --devices) would start it
        async with connect(stdio("A1", line3.name)) as c:
            topo = data(await c.call_tool("get_topology", {}))
            managed = {n["name"]: n["managed"] for n in topo["nodes"]}
            assert managed == {"r1": True, "r2": True, "r3": True, "h1": False, "h3": False}
            r = await c.call_tool("apply_config", {"commands": {"h1": "ip -6 route add fd00:96::/64 dev eth1"}})
            assert r.is_error and "unknown device 'h1'" in text(r)
        async with connect(stdio("A1", line3.name, "--devices", "all")) as c:
            r = await c.call_tool("execute_validation", {"commands": {"h1": "ip -6 route show"}})
            assert not r.is_error, text(r)
        async with connect(build_server("A0", ServerConfig(lab=line3.name, devices="all"))) as c:
            names = [d["name"] for d in data(await c.call_tool("list_devices", {}))["devices"]]
            assert names == ["r1", "r2", "r3", "h1", "h3"]

    anyio.run(check)
    assert capture(line3, "h1").same_as(before) and line3.exec("h1", ["ls", "/tmp/agent-was-here"]).returncode != 0
    r = run("mcp-config", "--ani", "A1", "--lab", line3.name)
    assert "--devices" not in json.loads(r.stdout)["mcpServers"]["anibench-a1"]["args"]
    r = run("serve", "--ani", "A1", "--lab", line3.name, "--devices", " , ")
    assert r.returncode == 2 and "--devices needs node names, or 'all'" in r.stderr
    assert "'all' = every node" in " ".join(w for w in run("serve", "--help").stdout.split() if w != "│")


def test_blocklist_is_refused_on_levels_without_one() -> None:
    for args in (("serve", "--ani", "A0", "--lab", "x", "--blocklist"), ("serve", "--ani", "a3-t", "--lab", "x", "--blocklist"),
                 ("mcp-config", "--ani", "A0", "--lab", "x", "--blocklist")):
        r = run(*args)
        assert r.returncode == 2 and r.stdout == "", args
        assert r.stderr.strip().startswith("error: --blocklist applies to A1 only; level A") and len(r.stderr.splitlines()) == 1, r.stderr
    r = run("mcp-config", "--ani", "A1", "--lab", "x", "--blocklist")
    assert r.returncode == 0 and "--blocklist" in json.loads(r.stdout)["mcpServers"]["anibench-a1"]["args"]
