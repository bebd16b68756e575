"""Issue 11 -- third-party agents in practice: what a user hits with real MCP clients, CLI agents
and ``harness serve``. Each item of the issue is a test here, against real labs and real stdio and
HTTP servers (a CLI agent and an LLM endpoint are stood in for by tests/fake_cli_agent.py and
tests/fake_openai.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import AnibenchError
from tests.conftest import REPO

HARNESS = [sys.executable, "-m", "harness.cli"]
SMALL_CAMPAIGN = REPO / "tests" / "data" / "small-campaign.yaml"


# -- 2: command templates are checked before anything is deployed ---------------------------------


@pytest.mark.parametrize(("template", "why"), [
    ("agent --env ${HOME}", "unknown placeholder {HOME}"),
    ("agent --json {\"a\": 1}", "unmatched '{'"),
    ("agent }", "Single '}' encountered"),
    ("agent {", "Single '{' encountered"),
    ("agent {prompt!r}", "unknown placeholder {prompt!r}"),
    ("agent {prompt:>9}", "unknown placeholder {prompt:>9}"),
    ("agent {}", "unknown placeholder {}"),
    ("agent {prompt.upper}", "unknown placeholder {prompt.upper}"),
    ("agent 'unclosed", "No closing quotation"),
    ("   ", "empty"),
])
def test_a_bad_command_template_is_refused_when_the_agent_is_made(template: str, why: str) -> None:
    from harness.agents.command import CommandAgent

    with pytest.raises(AnibenchError, match=__import__("re").escape(why)) as e:
        CommandAgent(template=template)
    assert "\n" not in str(e.value)
    if "placeholder" in why or "{" in why:
        assert "{{" in str(e.value)  # says how to write a literal brace


def test_literal_braces_are_written_twice() -> None:
    from harness.agents.command import CommandAgent

    a = CommandAgent(template="""agent --json '{{"a": {{"b": 1}}}}' --home '${{HOME}}' {prompt_file}""")
    assert [w.format(prompt_file="/p") for w in a.words] == ["agent", "--json", '{"a": {"b": 1}}', "--home", "${HOME}", "/p"]


def test_campaign_refuses_a_bad_template_in_one_line_before_any_lab(tmp_path: Path) -> None:
    db = tmp_path / "r" / "db.sqlite"
    r = subprocess.run([*HARNESS, "campaign", "--ani", "A1", "--agent", "command", "--agent-opt",
                        "template=/bin/echo ${HOME} }", "--variants", "1", "--manifest", str(SMALL_CAMPAIGN),
                        "--db", str(db), "--results", str(tmp_path / "runs")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: command template word"), r.stderr
    assert not db.exists() and not (tmp_path / "runs").exists()  # nothing was started


# -- 1: an agent that crashes is recorded as an agent error, with its exit status ------------------


def _campaign_of(tmp_path: Path, records: list) -> tuple:
    from harness.report import build_report
    from harness.store import CampaignStore

    store = CampaignStore(tmp_path / "db.sqlite")
    store.create_campaign("t", {"factor": "ani"})
    store.plan("t", [r.run_key for r in records])
    for r in records:
        store.mark_running(r.run_key)
        store.save_result(r)
    return store, build_report(store, "t")


@pytest.mark.lab
def test_an_agent_that_crashes_is_an_agent_error_not_a_clean_failure(campaign_lab, tmp_path: Path) -> None:
    import sqlite3

    from harness.campaign import summary_line
    from harness.report import render_rich, run_table
    from harness.run import RunSpec, execute_run
    from harness.tasks import make_variant

    lab, sc = campaign_lab
    v = make_variant("onboarding", sc, 0)

    def run(template: str, k: int):
        spec = RunSpec(campaign_id="t", run_key=f"t/A1/{k}", factor="ani", setting="A1", level="A1", agent="command",
                       agent_options={"template": template}, density=1, run_dir=tmp_path / f"v{k}")
        return execute_run(lab, spec, v)[0].model_copy(update={"variant": k})  # three variants of one setting

    crashed = run("/bin/false", 0)
    killed = run(f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'", 1)
    idle = run("/bin/true", 2)
    assert crashed.agent_error == "agent process exited with status 1" and crashed.agent_exit_status == 1
    assert crashed.agent_log == str((tmp_path / "v0" / "agent.log").resolve())
    assert killed.agent_error == "agent process killed by signal 9 (SIGKILL)" and killed.agent_exit_status == -9
    assert idle.agent_error is None and idle.agent_exit_status == 0  # chose to do nothing: no agent error
    for r in (crashed, idle):
        assert r.outcome_label.value == "clean_failure"
    line = summary_line(crashed)
    assert "AGENT ERROR: agent process exited with status 1" in line and str(tmp_path / "v0" / "agent.log") in line
    assert "AGENT ERROR" not in summary_line(idle)

    store, rep = _campaign_of(tmp_path, [crashed, killed, idle])
    (cell,) = rep.cells
    assert cell.n == 3 and cell.agent_errors == 2 and cell.completion.n == 3
    assert "2 ended with an agent error" in rep.headline and any(n.startswith("agent errors:") for n in rep.notes)
    rows = {r[1]: r for r in run_table(rep).rows}
    assert rows["v0"][2] == "clean failure, agent error" and rows["v2"][2] == "clean failure"
    assert "agent error: agent process exited with status 1 (log: " in rows["v0"][-1]
    assert rep.tables()[0].columns[2].name == "agent errors" and rep.tables()[0].rows[0][2] == "2"
    assert json.loads(rep.to_json())["cells"][0]["agent_errors"] == 2
    render_rich(rep.tables()[0])
    store.close()
    con = sqlite3.connect(tmp_path / "db.sqlite")  # the store's columns, for SQL users
    got = dict(con.execute("SELECT run_key, agent_exit_status FROM runs WHERE agent_error IS NOT NULL").fetchall())
    assert got == {"t/A1/0": 1, "t/A1/1": -9}
    con.close()


# -- 8: an external agent's tokens are "not measured", not 0 ----------------------------------------


def test_external_agents_tokens_are_not_measured_in_the_report(tmp_path: Path) -> None:
    from harness.report import NOT_MEASURED, run_table
    from harness.report_html import to_html
    from tests.test_store import make_record

    recs = [make_record("t", "A1", 0, agent="command", tokens_in=0, tokens_out=0),
            make_record("t", "A1", 1, agent="command", tokens_in=0, tokens_out=0)]
    store, rep = _campaign_of(tmp_path, recs)
    assert rep.cells[0].cost["tokens"] == {"mean": None, "median": None}
    assert [r.tokens for r in rep.runs] == [None, None]
    assert {row[6] for row in run_table(rep).rows} == {NOT_MEASURED}
    cost = next(t for t in rep.tables() if t.key == "cost")
    assert cost.rows[0][2] == NOT_MEASURED
    page = to_html(rep)
    assert "not measured" in page and "0 / 0" not in page
    store.close()


# -- 3 and 4: {serve_command}, {serve_url}; a short serve command that carries the run id ----------

FAKE = f"{sys.executable} {REPO / 'tests' / 'fake_cli_agent.py'}"


@pytest.mark.lab
@pytest.mark.parametrize("form", ["mcp_config", "serve_command", "serve_url"])
def test_agents_that_take_a_config_a_command_or_a_url_run_without_a_wrapper(campaign_lab, tmp_path: Path,
                                                                           form: str) -> None:
    from harness.run import RunSpec, execute_run
    from harness.tasks import make_variant
    from servers.common import read_trajectory

    lab, sc = campaign_lab
    v = make_variant("onboarding", sc, 0)
    template = {"mcp_config": f"{FAKE} {{mcp_config}}", "serve_command": f"{FAKE} --stdio {{serve_command}}",
                "serve_url": f"{FAKE} --url {{serve_url}} --token {{serve_token}}"}[form]
    spec = RunSpec(campaign_id="t", run_key=f"t/A1/{form}", factor="ani", setting="A1", level="A1", agent="command",
                   agent_options={"template": template}, density=1, run_dir=tmp_path)
    rec, _ = execute_run(lab, spec, v)
    assert rec.agent_error is None and rec.steps == 2, (tmp_path / "agent.log").read_text()
    calls = read_trajectory(tmp_path / "trajectory.jsonl")
    assert [c["tool"] for c in calls] == ["get_topology", "submit"]
    assert {c["run_id"] for c in calls} == {f"t/A1/{form}"}  # item 4: campaign trajectories carry the run id
    args = json.loads((tmp_path / "mcp.json").read_text())["mcpServers"]["anibench"]["args"]
    assert "--devices" not in args and "--transport" not in args  # defaults left out
    assert args[args.index("--run-id") + 1] == f"t/A1/{form}"
    if form == "serve_url":
        log = (tmp_path / "server.log").read_text()
        assert "listening on http://127.0.0.1:" in log
        assert calls[0]["client"]["name"] == "mcp"  # the agent's own client, over HTTP


def test_a_template_cannot_name_both_servers() -> None:
    from harness.agents.command import CommandAgent

    with pytest.raises(AnibenchError, match="both the stdio server .* and the HTTP server"):
        CommandAgent(template="agent --stdio {serve_command} --url {serve_url}")
    assert CommandAgent(template="agent --url {serve_url}").http
    assert not CommandAgent(template="agent --literal {{serve_url}} {mcp_config}").http  # a literal, not the server


# -- the tools a level offers, listed by a real client ---------------------------------------------------


def _tools(lab, level: str, **config: object) -> tuple[list, str]:  # noqa: ANN001
    """(tools, instructions) of a level's server on ``lab``, listed by a real in-process MCP client."""
    import anyio
    from mcp import Client

    from servers.common import ServerConfig
    from servers.registry import build_server

    async def listed(server):  # noqa: ANN001, ANN202
        async with Client(server, mode="legacy") as c:
            return (await c.list_tools()).tools, c.instructions or ""

    server = build_server(level, ServerConfig(lab=lab.name, **config))
    try:
        return anyio.run(listed, server)
    finally:
        server.close()


# -- 10: two levels attached to one client: --tool-prefix ----------------------------------------------


@pytest.mark.lab
@pytest.mark.anyio
async def test_two_levels_in_one_client_with_tool_prefixes(line3, tmp_path: Path) -> None:
    import re

    from mcp import StdioServerParameters

    from tests.servers_support import connect, data, text

    blocks = {}
    for level, prefix in (("A0", "a0_"), ("A1", "a1_")):
        r = subprocess.run([*HARNESS, "mcp-config", "--ani", level, "--lab", line3.name, "--tool-prefix", prefix,
                            "--trajectory", str(tmp_path / f"{level}.jsonl"), "--max-message-bytes", "8192"],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        (entry,) = json.loads(r.stdout)["mcpServers"].values()
        blocks[level] = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"])
    async with connect(blocks["A0"]) as a0, connect(blocks["A1"]) as a1:
        names0 = [t.name for t in (await a0.list_tools()).tools]
        names1 = [t.name for t in (await a1.list_tools()).tools]
        assert not set(names0) & set(names1)
        assert all(n.startswith("a0_") for n in names0) and all(n.startswith("a1_") for n in names1)
        assert "a0_submit" in names0 and "a1_submit" in names1 and "a1_get_topology" in names1
        assert "a1_submit" in (a1.instructions or "")
        assert data(await a1.call_tool("a1_get_topology", {}))
        r = await a1.call_tool("get_topology", {})  # the unprefixed name is not a tool of this server
        assert r.is_error and "unknown tool 'get_topology'" in text(r)
        big = data(await a0.call_tool("a0_run_shell", {"device": "r1", "command": "seq 1 20000"}))
        m = re.search(r'a0_read_output\(output_id="(out-\d+)", offset=(\d+)\)', big["stdout"])
        assert m, big["stdout"][-300:]
        page = data(await a0.call_tool("a0_read_output", {"output_id": m.group(1), "offset": int(m.group(2))}))
        assert page["text"]
        assert data(await a0.call_tool("a0_submit", {}))["status"] == "submitted"
    from servers.common import read_trajectory

    assert [c["tool"] for c in read_trajectory(tmp_path / "A0.jsonl")] == ["a0_run_shell", "a0_read_output", "a0_submit"]


@pytest.mark.parametrize("prefix", ["1a", "a b", "a" * 40, "a/"])
def test_a_bad_tool_prefix_is_refused_at_start(prefix: str) -> None:
    for cmd in ("serve", "mcp-config"):
        r = subprocess.run([*HARNESS, cmd, "--ani", "A1", "--lab", "nolab", "--tool-prefix", prefix],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--tool-prefix" in r.stderr, r.stderr


# -- 9: HTTP: no error code when no credentials were sent (RFC 6750 section 3.1) -----------------------


@pytest.mark.lab
@pytest.mark.anyio
async def test_a_request_without_credentials_gets_a_challenge_without_an_error_code(line3) -> None:
    import httpx2

    from tests.servers_support import http_server

    init = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    with http_server("A0", line3.name, "--token", "s3cret") as url:
        async with httpx2.AsyncClient() as h:
            r = await h.post(url, json=init, headers=accept)
            assert r.status_code == 401
            challenge = r.headers["www-authenticate"]
            assert challenge.startswith("Bearer") and "error" not in challenge, challenge
            assert "error" not in r.json() and "Bearer" in r.json()["error_description"]
            r = await h.post(url, json=init, headers={**accept, "Authorization": "Bearer wrong"})
            assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]
            r = await h.post(url, json=init, headers={**accept, "Authorization": "bearer wrong"})  # scheme: any case
            assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]
            for other in ("Basic eDp5", "Token s3cret", "Bearer"):  # an unsupported method: no credentials (3.1)
                r = await h.post(url, json=init, headers={**accept, "Authorization": other})
                challenge = r.headers["www-authenticate"]
                assert r.status_code == 401 and "error" not in challenge, (other, challenge)


# -- 11: a server that cannot start says why through the protocol ------------------------------------


@pytest.mark.lab
@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_stdio_server_that_cannot_start_says_why_to_the_client(line3, mode: str) -> None:
    from tests.servers_support import connect, stdio

    with pytest.raises(Exception) as e:  # noqa: PT011 - whatever the SDK raises, the reason must be in it
        async with connect(stdio("A3-T", line3.name), mode) as c:
            await c.list_tools()

    def flat(x: BaseException) -> str:
        return str(x) + "".join(flat(y) for y in getattr(x, "exceptions", []))

    shown = flat(e.value)
    assert "anibench cannot serve: A3-T needs a lab deployed from a scenario" in shown, shown


@pytest.mark.lab
def test_the_setup_error_is_a_json_rpc_error_and_the_server_exits_1_when_the_client_leaves(line3) -> None:
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
              "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": "x", "method": "tools/list"}]
    r = subprocess.run([*HARNESS, "serve", "--ani", "A1", "--lab", "no-such-lab-i11"], cwd=REPO, timeout=60,
                       input="".join(json.dumps(x) + "\n" for x in lines) + "not json\n", capture_output=True, text=True)
    answers = [json.loads(x) for x in r.stdout.splitlines()]
    assert [a["id"] for a in answers] == [1, "x", None] and r.returncode == 1
    assert all(a["error"]["code"] == -32603 and "no-such-lab-i11" in a["error"]["message"] for a in answers[:2])
    assert answers[2]["error"]["code"] == -32700
    assert "no-such-lab-i11" in r.stderr


# -- 5 and 6: tool lists and results as an agent reads them, sized for real clients ---------------------


@pytest.mark.lab
@pytest.mark.parametrize("level", ["A0", "A1", "A2", "A3-T", "A3-R", "A4"])
def test_tool_lists_as_an_agent_reads_them(campaign_lab, level: str) -> None:
    """Item 6: descriptions dedented, without trailing spaces or source citations. Item 5: valid
    and compact schemas (no pydantic titles; A3-T's ops written once per tool, still precise).
    A3-R and A4 (issue 35) under the same bound (their servers without a reconciler: the list
    does not depend on it)."""
    import jsonschema

    from servers.a3_intent import catalog as cat

    lab, _sc = campaign_lab
    tools, _ = _tools(lab, level, **({"options": {"reconciler": False}} if level in ("A3-R", "A4") else {}))
    for t in tools:
        texts = [t.description or ""] + [str(p.get("description", "")) for p in t.input_schema.get("properties", {}).values()]
        for text in texts:
            assert text and text == text.strip(), (t.name, text[:80])
            assert not [ln for ln in text.splitlines() if ln != ln.rstrip() or ln.startswith("    ")], (t.name, text)
            for citation in ("Source:", "Sources:", "NetConfArena", "draft section", "draft 5.", "substrate."):
                assert citation not in text, (t.name, citation, text)
        jsonschema.Draft202012Validator.check_schema(t.input_schema)
        assert '"title"' not in json.dumps(t.input_schema) + json.dumps(t.output_schema or {}), t.name
    size = sum(len(t.model_dump_json(by_alias=True, exclude_none=True)) for t in tools)
    assert size < 50_000, size  # A3-T was 61.5 KB (issue 11), every level else is far below
    if level == "A3-T":
        plan = next(t for t in tools if t.name == "plan_change_set")
        v = jsonschema.Draft202012Validator(plan.input_schema)
        offered = {m["properties"]["service_class"]["const"] for m in plan.input_schema["properties"]["ops"]["items"]["anyOf"]}
        assert offered and not list(v.iter_errors({"ops": [op for ops in cat.EXAMPLES.values() for op in ops
                                                           if op["service_class"] in offered]}))
        assert list(v.iter_errors({"ops": [{"op": "delete", "service_class": "tenant_site", "id": "t1s1", "spec": {}}]}))
        assert len(json.dumps(plan.input_schema, separators=(",", ":"))) < 12_500  # inlined: 17.6 KB


@pytest.mark.lab
@pytest.mark.anyio
async def test_results_are_compact_and_bounded_well_inside_client_limits(campaign_lab) -> None:
    from mcp import Client

    from servers.common import ServerConfig
    from servers.common.paging import CUT_MARKER, DEFAULT_MAX_MESSAGE_BYTES, message_bytes
    from servers.registry import build_server

    lab, _sc = campaign_lab
    assert DEFAULT_MAX_MESSAGE_BYTES == 40 * 1024
    server = build_server("A1", ServerConfig(lab=lab.name))
    try:
        async with Client(server, mode="legacy") as c:
            topo = await c.call_tool("get_topology", {})
            body = topo.content[0].text
            assert "\n" not in body and json.loads(body) == topo.structured_content  # compact JSON text
            r1 = topo.structured_content["nodes"][0]
            assert isinstance(r1["interfaces"], dict) and "links" not in topo.structured_content
            every = await c.call_tool("get_running_config", {"devices": lab.routers()})
            assert message_bytes(every, 2) <= DEFAULT_MAX_MESSAGE_BYTES and len(every.content[0].text) < 24_000
            cut = [d for d, txt in every.structured_content.items() if CUT_MARKER.search(txt)]
            assert cut  # the rest is paged, never dropped
            m = CUT_MARKER.search(every.structured_content[cut[0]])
            page = await c.call_tool("read_output", {"output_id": m.group(1), "offset": int(m.group(2))})
            assert not page.is_error and page.structured_content["text"]
    finally:
        server.close()


# -- 1 (attack): a process the agent leaves behind ends with the run ------------------------------


@pytest.mark.parametrize("script", [
    "sleep 600 & echo $! > child.pid; exit 0",  # exits cleanly, leaves a child
    "sleep 600 & echo $! > child.pid; exit 3",  # crashes, leaves a child
    "(trap '' TERM; exec sleep 600) & echo $! > child.pid; exit 0",  # the child ignores SIGTERM
])
def test_processes_the_agent_left_running_end_with_its_run(tmp_path: Path, script: str, monkeypatch) -> None:
    import time

    from harness.agents import command
    from harness.agents.base import AgentContext

    end_group = getattr(command, "_end_group", None)
    if end_group is not None:  # reach the SIGKILL step without waiting the 10 s grace
        monkeypatch.setattr(command, "_end_group", lambda pgid: end_group(pgid, grace_s=0.5))
    agent = command.CommandAgent(template=f"sh -c {json.dumps(script)}")
    agent._run(AgentContext(level="A1", prompt="p", files={}, workdir=tmp_path, serve_argv=["true"],
                            deadline=time.monotonic() + 120))
    pid = int((tmp_path / "files" / "child.pid").read_text())
    try:
        end = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < end:  # a killed orphan is reaped by init
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists(), f"the agent's child {pid} outlived the run"
    finally:
        subprocess.run(["kill", "-9", str(pid)], capture_output=True)  # never leave it behind, even on failure


def test_the_runs_http_server_dying_under_the_agent_fails_the_run(tmp_path: Path) -> None:
    """The harness's own HTTP server exiting during the run is not the agent's result: the run
    fails (like an agent that could not start) instead of being stored as an agent error or a
    clean failure. The server is stood in for by a process that says it listens, then exits 7."""
    import time

    from harness.agents import command
    from harness.agents.base import AgentContext

    dies = ["sh", "-c", "echo listening on http://127.0.0.1:9/mcp; exit 7"]
    agent = command.CommandAgent(template="sh -c 'sleep 1; exit 0' {serve_url}")
    out = agent._run(AgentContext(level="A1", prompt="p", files={}, workdir=tmp_path, serve_argv=dies,
                                  deadline=time.monotonic() + 120))
    assert out.run_failed and "HTTP server exited with status 7" in out.error, out
