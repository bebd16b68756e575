"""ANI level A0 (raw shell) against a real lab, through a real MCP client: in-process in both
protocol modes, over stdio (``harness serve``) and over streamable HTTP."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp.client.streamable_http import streamable_http_client

from servers.a0_shell.server import build_server
from servers.common import ServerConfig, ServerSetupError
from substrate import Lab, Topology
from tests.conftest import REPO, unique_name
from tests.servers_support import MODES, connect, data, http_server, records, stdio, text

pytestmark = [pytest.mark.lab, pytest.mark.anyio]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab.create(Topology.from_spec("line:3"), unique_name("t-a0")) as lab:
        yield lab


def server(lab: Lab, tmp_path: Path | None = None, **kw: object):  # noqa: ANN201
    """The level's server over ``lab``; every node is a device unless ``devices`` says otherwise
    (these tests exercise the hosts too; the routers-only default is tested on its own)."""
    traj = tmp_path / "trajectory.jsonl" if tmp_path is not None else None
    kw.setdefault("devices", "all")
    return build_server(ServerConfig(lab=lab.name, trajectory=traj, **kw), lab=lab)  # type: ignore[arg-type]


# -- tools, schemas, calls ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_tools_schemas_and_annotations(lab: Lab, mode: str) -> None:
    async with connect(server(lab), mode) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert set(tools) == {"list_devices", "run_shell", "read_output", "submit"}
    rs = tools["run_shell"]
    assert rs.input_schema["required"] == ["device", "command"]
    assert rs.input_schema["properties"]["timeout_s"]["anyOf"][0]["maximum"] == 120
    assert rs.output_schema is not None and "exit_status" in rs.output_schema["properties"]
    a = rs.annotations
    assert a is not None and (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint) == (False, True, False, False)
    ld = tools["list_devices"].annotations
    assert ld is not None and ld.read_only_hint and ld.idempotent_hint
    sub = tools["submit"].annotations
    assert sub is not None and sub.read_only_hint is False
    assert "description" in rs.model_dump() and "bash -c" in (rs.description or "")


@pytest.mark.parametrize("mode", MODES)
async def test_calls_and_errors(lab: Lab, mode: str, tmp_path: Path) -> None:
    s = server(lab, tmp_path, options={"max_output_bytes": 4096})
    async with connect(s, mode) as c:
        devs = data(await c.call_tool("list_devices", {}))["devices"]
        assert [d["name"] for d in devs] == ["r1", "r2", "r3", "h1", "h3"]
        assert devs[0]["interfaces"]["eth1"] == "r2:eth1"
        out = data(await c.call_tool("run_shell", {"device": "r2", "command": "hostname; vtysh -c 'show isis neighbor' | grep -c Up"}))
        assert out["exit_status"] == 0 and out["stdout"].split() == ["r2", "2"]
        out = data(await c.call_tool("run_shell", {"device": "h1", "command": "echo err >&2; exit 3"}))
        assert (out["exit_status"], out["stderr"]) == (3, "err\n")
        big = data(await c.call_tool("run_shell", {"device": "r1", "command": "head -c 100000 /dev/zero | tr '\\0' x"}))
        assert big["truncated"] and "bytes dropped: over the server's capture limit of 4096 bytes" in big["stdout"]
        assert len(big["stdout"]) < 4300
        cases = [
            ({"device": "r9", "command": "true"}, "unknown device 'r9'; devices: r1, r2, r3, h1, h3"),
            ({"device": "r1"}, "bad arguments for run_shell: command: Field required"),
            ({"device": "r1", "command": ""}, "command: String should have at least 1 character"),
            ({"device": "r1", "command": "true", "shell": "sh"}, "unexpected argument 'shell'"),
            ({"device": "r1", "command": "sleep 5", "timeout_s": 0.3}, "timeout: the command did not finish within 0.3 s"),
            ({"device": "r1", "command": "true", "timeout_s": 999}, "less than or equal to 120"),
            ({"device": "r1", "command": "echo a\x00b"}, "NUL character"),
            ({"device": ["r1"], "command": "true"}, "device: Input should be a valid string"),
        ]
        for args, msg in cases:
            r = await c.call_tool("run_shell", args)
            assert r.is_error and msg in text(r), (args, text(r))
        r = await c.call_tool("format_disk", {})
        assert r.is_error and "unknown tool 'format_disk'; tools: submit, read_output, list_devices, run_shell" in text(r)
    recs = records(tmp_path / "trajectory.jsonl")
    assert [r["seq"] for r in recs] == list(range(1, 14))
    assert [r["tool"] for r in recs[:5]] == ["list_devices", "run_shell", "run_shell", "run_shell", "run_shell"]
    assert [r["kind"] for r in recs[:5]] == ["read", "validation", "validation", "validation", "validation"]
    assert recs[1]["arguments"]["device"] == "r2" and not recs[1]["is_error"]
    assert all(r["client"] == {"name": "anibench-tests", "version": "1.2.3"} for r in recs)
    assert not any(r["is_error"] for r in recs[:4])
    assert all(r["is_error"] and r["tool_error"] and r["error"] and r["result"] is None for r in recs[4:])
    assert "timeout" in recs[8]["error"] and recs[8]["arguments"]["timeout_s"] == 0.3
    assert all(r["ended_at"] >= r["started_at"] and r["duration_s"] >= 0 for r in recs)
    assert json.loads(recs[1]["result"])["exit_status"] == 0  # the result as sent: compact JSON (issue 11)


async def test_budget_and_submit(lab: Lab, tmp_path: Path) -> None:
    s = server(lab, tmp_path, budget_steps=4)
    async with connect(s) as c:
        assert not (await c.call_tool("list_devices", {})).is_error
        r = await c.call_tool("submit", {"note": "x" * 5000})  # bad arguments still count as a step
        assert r.is_error and "note" in text(r)
        r = await c.call_tool("submit", {"note": "done"})
        assert data(r) == {"status": "submitted", "steps_used": 3, "budget_steps": 4}
        assert s.episode.ended.is_set() and s.episode.ended_reason == "submit"
        r = await c.call_tool("run_shell", {"device": "r1", "command": "touch /tmp/after-submit"})
        assert r.is_error and "the episode has ended: submit was called (call 3)" in text(r)
        r = await c.call_tool("list_devices", {})
        assert r.is_error and "the episode has ended" in text(r)
        assert len((await c.list_tools()).tools) == 4  # listing tools is not a step
    assert lab.exec("r1", ["ls", "/tmp/after-submit"]).returncode != 0  # refused calls never ran
    recs = records(tmp_path / "trajectory.jsonl")
    assert [(r["seq"], r["kind"], r["is_error"], r["refused"]) for r in recs] == [
        (1, "read", False, None), (2, "submit", True, None), (3, "submit", False, None),
        (4, "config", True, "episode_ended"), (5, "read", True, "episode_ended"),
    ]  # fmt: skip
    # the budget: calls past it are refused, and recorded
    s = server(lab, tmp_path / "b", budget_steps=2)
    async with connect(s, "auto") as c:
        for _ in range(2):
            assert not (await c.call_tool("list_devices", {})).is_error
        r = await c.call_tool("run_shell", {"device": "r1", "command": "touch /tmp/over-budget"})
        assert r.is_error and "step budget spent: this episode allows 2 tool calls and this is call 3" in text(r)
        r = await c.call_tool("submit", {})
        assert r.is_error and "step budget spent" in text(r)
    assert s.episode.ended_reason == "budget"
    assert lab.exec("r1", ["ls", "/tmp/over-budget"]).returncode != 0
    recs = records(tmp_path / "b" / "trajectory.jsonl")
    assert [r["refused"] for r in recs] == [None, None, "budget", "budget"]
    # a restarted server continues the episode from its trajectory (no budget reset by reconnecting)
    s = server(lab, tmp_path / "b", budget_steps=2)
    async with connect(s) as c:
        r = await c.call_tool("list_devices", {})
        assert r.is_error and "this is call 5" in text(r)


async def test_device_scope_and_setup_errors(lab: Lab, tmp_path: Path) -> None:
    async with connect(server(lab, devices=["r1", "h1"])) as c:
        assert [d["name"] for d in data(await c.call_tool("list_devices", {}))["devices"]] == ["r1", "h1"]
        r = await c.call_tool("run_shell", {"device": "r2", "command": "true"})
        assert r.is_error and "unknown device 'r2'; devices: r1, h1" in text(r)
    with pytest.raises(ServerSetupError, match="devices not in lab .*: zz; nodes: r1, r2"):
        server(lab, devices=["r1", "zz"])
    with pytest.raises(ServerSetupError, match="bad A0 options"):
        server(lab, options={"max_output_bytes": 10})
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(ServerSetupError, match="cannot use trajectory file"):
        build_server(ServerConfig(lab=lab.name, trajectory=tmp_path / "dir.jsonl"), lab=lab)
    with pytest.raises(ServerSetupError, match="no lab named 'gone-lab'"):
        build_server(ServerConfig(lab="gone-lab"))


# -- confinement of the shell ----------------------------------------------------------------------


async def test_shell_is_confined_to_its_node(lab: Lab) -> None:
    runs = REPO / "runs"
    made_runs = not runs.exists()
    run_dir = runs / f"t-a0-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir(parents=True)
    (run_dir / "hidden_tests.json").write_text('{"secret": "hidden test cases"}')
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: _accept_once(listener, accepted), daemon=True).start()
    try:
        async with connect(server(lab)) as c:

            async def sh(cmd: str, device: str = "r1") -> dict:
                return data(await c.call_tool("run_shell", {"device": device, "command": cmd}))

            # no host processes: only the node's own few, and the test's PID does not exist there
            ps = await sh("ps -eo comm")
            assert "pytest" not in ps["stdout"] and "python" not in ps["stdout"].replace("python3 -S", "")
            assert int((await sh("ls -d /proc/[0-9]* | wc -l"))["stdout"]) < 20
            assert (await sh(f"kill -0 {os.getpid()}"))["exit_status"] != 0
            # the harness's run directory and the lab records are not reachable
            for path in (run_dir / "hidden_tests.json", REPO / "pyproject.toml", Path("/run/anibench/labs")):
                r = await sh(f"cat {path} || ls {path}")
                assert r["exit_status"] != 0 and "hidden test cases" not in r["stdout"], path
            assert (await sh("find / -name hidden_tests.json 2>/dev/null | head -1"))["stdout"] == ""
            # no way into other namespaces or the host's mounts
            for cmd in ("ls /run/netns", "unshare -n true", "mount -t tmpfs x /mnt", "nsenter -t 1 -n true",
                        "ip netns exec anibench-x true", "cat /etc/shadow | grep -c ."):  # fmt: skip
                r = await sh(cmd)
                assert r["exit_status"] != 0 or r["stdout"].strip() in ("", "0"), (cmd, r)
            # the host's loopback services are not reachable (the node's 127.0.0.1 is its own)
            r = await sh(f"timeout 2 bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'")
            assert r["exit_status"] != 0 and not accepted
            # other nodes only over the lab's links: r1 reaches r3 through r2, and not once its link is down
            assert (await sh("ping -c 1 -W 1 fd00::3"))["exit_status"] == 0
            try:
                assert (await sh("ip link set eth1 down && ping -c 1 -W 1 fd00::3"))["exit_status"] != 0
                assert (await sh("ping -c 1 -W 1 fd00::3", device="h1"))["exit_status"] != 0
            finally:
                await sh("ip link set eth1 up")
                lab.wait_converged(timeout_s=30)
            # back once the link is: IS-IS converged, the route and neighbour entry may still be on
            # their way (one ping failed in a fresh-clone CI run); bounded poll, not one shot
            deadline = time.monotonic() + 30
            while (await sh("ping -c 1 -W 1 fd00::3"))["exit_status"] != 0:
                assert time.monotonic() < deadline, "r1 never reached r3 again after its link came back"
    finally:
        listener.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        if made_runs and not any(runs.iterdir()):
            runs.rmdir()


def _accept_once(listener: socket.socket, accepted: list[object]) -> None:
    try:
        conn, _ = listener.accept()
        accepted.append(conn)
        conn.close()
    except OSError:
        pass


# -- transports ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_stdio_harness_serve(lab: Lab, mode: str, tmp_path: Path) -> None:
    traj = tmp_path / "t.jsonl"
    async with connect(stdio("A0", lab.name, "--trajectory", str(traj), "--budget-steps", "5"), mode) as c:
        assert {t.name for t in (await c.list_tools()).tools} == {"list_devices", "run_shell", "read_output", "submit"}
        out = data(await c.call_tool("run_shell", {"device": "r3", "command": "hostname"}))
        assert out["stdout"] == "r3\n"
        r = await c.call_tool("run_shell", {"device": "nope", "command": "true"})
        assert r.is_error and "unknown device 'nope'" in text(r)
        assert data(await c.call_tool("submit", {}))["status"] == "submitted"
    recs = records(traj)
    assert [r["tool"] for r in recs] == ["run_shell", "run_shell", "submit"]
    assert recs[0]["client"]["name"] == "anibench-tests" and recs[0]["protocol_version"]


async def test_http_transport_token_and_rebinding_protection(lab: Lab) -> None:
    with http_server("A0", lab.name, "--token", "s3cret") as url:
        assert url.startswith("http://127.0.0.1:")
        async with httpx2.AsyncClient() as h:
            assert (await h.post(url, json={})).status_code == 401
            r = await h.post(url, json={}, headers={"Authorization": "Bearer s3cret", "Host": "attacker.example"})
            assert r.status_code in (403, 421)
            assert (await h.post(url, json={}, headers={"Authorization": "Bearer wrong"})).status_code == 401
            # a body that is not JSON gets the JSON-RPC parse error (stdio: tests/test_issue_10.py)
            r = await h.post(url, content=b"not json", headers={"Authorization": "Bearer s3cret", "Content-Type":
                             "application/json", "Accept": "application/json, text/event-stream"})  # fmt: skip
            assert r.status_code == 400 and r.json()["error"]["code"] == -32700
        for mode in MODES:
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret"}) as hc:
                async with connect(streamable_http_client(url, http_client=hc), mode) as c:
                    out = data(await c.call_tool("run_shell", {"device": "r2", "command": "hostname"}))
                    assert out["stdout"] == "r2\n"


async def test_oversized_results_are_cut_and_paged(lab: Lab, tmp_path: Path) -> None:
    # backslashes are escaped in the structured copy and twice in the text copy: 192 KiB of them
    # would make a message of about 1.1 MiB; it is cut to the bound, the rest read with read_output
    s = server(lab, tmp_path, max_message_bytes=8192)
    async with connect(s) as c:
        r = data(await c.call_tool("run_shell", {"device": "r1", "command": "head -c 196608 /dev/zero | tr '\\0' '\\\\'"}))
        m = re.search(r'read_output\(output_id="(out-\d+)", offset=(\d+)\)', r["stdout"][-200:])
        assert m and not r["truncated"] and "more characters" in r["stdout"]
        oid, off = m.group(1), int(m.group(2))
        got = r["stdout"][:off]
        while off is not None:
            page = data(await c.call_tool("read_output", {"output_id": oid, "offset": off}))
            got += page["text"]
            off = page["next_offset"]
        assert got == "\\" * 196608
        page = data(await c.call_tool("read_output", {"output_id": oid, "offset": 10, "max_chars": 5}))
        assert page == {"output_id": oid, "offset": 10, "text": "\\" * 5, "next_offset": 15, "total_chars": 196608}
        for args, frag in [({"output_id": "out-999"}, "unknown output id 'out-999'"),
                           ({"output_id": oid, "offset": 10**7}, "past the end"),
                           ({"output_id": oid, "offset": -1}, "offset")]:  # fmt: skip
            r = await c.call_tool("read_output", args)
            assert r.is_error and frag in text(r), text(r)
    assert all(rec["kind"] == "read" for rec in records(tmp_path / "trajectory.jsonl")[1:])
