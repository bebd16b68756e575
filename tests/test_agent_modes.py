"""Agent modes of the model-driven agent (issue 21): the pure parts (mode names, plan parsing,
prompt files), then each mode against the stand-in model endpoint on a real lab -- the call
sequence it produces with and without recovery, and the token budget that stops it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.agents.modes import all_modes, parse_mode, parse_plan, render_tools
from harness.agents.prompts import TEMPLATES, load
from harness.errors import AnibenchError
from harness.run import RunSpec, execute_run
from harness.tasks import make_variant
from tests.fake_openai import FakeOpenAI

# -- pure ------------------------------------------------------------------------------------------


def test_mode_names() -> None:
    assert all_modes() == ["single-turn", "single-turn-norecovery", "react", "react-norecovery", "planner-executor",
                           "planner-executor-norecovery"]
    assert parse_mode("React") == ("react", True) and str(parse_mode("planner-executor-norecovery")) == \
        "planner-executor-norecovery"
    with pytest.raises(AnibenchError, match="unknown agent mode 'multi-agent'; known: single-turn, "):
        parse_mode("multi-agent")


def test_plan_parsing() -> None:
    assert parse_plan("Plan:\n1. Read the topology.\n2) Add the route\n   on r1.\nStep 3: submit") == \
        ["Read the topology.", "Add the route on r1.", "submit"]
    assert parse_plan("just do it") == ["just do it"] and parse_plan("  \n") == []


def test_every_shipped_prompt_file_loads_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    for file in TEMPLATES:
        assert set(load(file)) == set(TEMPLATES[file])
    (tmp_path / "react.yaml").write_text("system: 'Hello {request}'\nnudge: go\n")
    with pytest.raises(AnibenchError, match=r"template 'system' uses \{request\}; it may use: \{server_instructions\}"):
        load("react", str(tmp_path))
    (tmp_path / "single-turn.yaml").write_text("system: hi\n")
    with pytest.raises(AnibenchError, match="missing template"):
        load("single-turn", str(tmp_path))
    from harness.agents.openai_agent import OpenAIAgent

    with pytest.raises(AnibenchError, match="template 'system' uses"):  # refused before any run
        OpenAIAgent(model="m", prompts=str(tmp_path))


def test_a_prompt_directory_that_cannot_be_what_was_meant_is_refused(tmp_path: Path) -> None:
    """``--agent-opt prompts=DIR`` with a typo in the directory or in a file name used to run the
    packaged prompts silently; a format spec that fails on text failed only mid-run."""
    from harness.agents.openai_agent import OpenAIAgent

    with pytest.raises(AnibenchError, match="prompts directory .*/nowhere does not exist"):
        OpenAIAgent(model="m", prompts=str(tmp_path / "nowhere"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(AnibenchError, match="holds none of the prompt files"):
        OpenAIAgent(model="m", prompts=str(tmp_path))
    (tmp_path / "react.yaml").write_text("system: 'Act.{server_instructions}'\nnudge: go\n")
    (tmp_path / "reactt.yaml").write_text("system: x\n")
    with pytest.raises(AnibenchError, match="reactt.yaml is not a prompt file; known: common.yaml"):
        OpenAIAgent(model="m", prompts=str(tmp_path))
    (tmp_path / "reactt.yaml").unlink()
    assert OpenAIAgent(model="m", prompts=str(tmp_path)).prompt_dir == str(tmp_path)
    (tmp_path / "single-turn.yaml").write_text("system: x\nrecover: 'failed: {error:d}'\n")
    with pytest.raises(AnibenchError, match="template 'recover' cannot be filled in: Unknown format code 'd'"):
        OpenAIAgent(model="m", mode="single-turn", prompts=str(tmp_path))


def test_planner_sees_each_tool_with_its_parameters() -> None:
    tools = [{"name": "run_shell", "description": "Run a command.\nMore.",
              "inputSchema": {"properties": {"device": {}, "command": {}, "timeout_s": {}}, "required": ["device", "command"]}},
             {"name": "submit", "description": "", "inputSchema": {}}]
    assert render_tools(tools) == "- run_shell(device, command, timeout_s?): Run a command.\n- submit()"


# -- against a real lab ----------------------------------------------------------------------------


LIST = ("list_devices", {})
BAD = ("run_shell", {"device": "r99", "command": "true"})  # unknown device: an error result
GOOD = ("run_shell", {"device": "r1", "command": "true"})
SUBMIT = ("submit", {})


def run_mode(lab, sc, mode: str, turns: list, run_dir: Path, **kw):  # noqa: ANN001, ANN201
    """An A0 onboarding run whose openai agent, in ``mode``, replays ``turns`` from the stand-in
    endpoint; returns the record, the tools called (in order) and the requests the model got."""
    v = make_variant("onboarding", sc, 0)
    with FakeOpenAI(turns) as fake:
        spec = RunSpec(campaign_id="t", run_key=f"t/{mode}/0", factor="mode", setting=mode, level="A0", agent="openai",
                       agent_options={"model": "m", "base_url": fake.url, "api_key": "k"}, mode=mode, density=1,
                       run_dir=run_dir, **kw)
        rec, _ = execute_run(lab, spec, v)
    calls = [json.loads(x) for x in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    return rec, [(c["tool"], c["arguments"].get("device")) for c in calls], fake.requests


def said(request: dict) -> str:
    return "\n".join(str(m.get("content") or "") for m in request["messages"])


@pytest.mark.lab
@pytest.mark.parametrize("recovery", [True, False])
def test_react_recovers_from_a_failed_call_or_stops_there(campaign_lab, tmp_path, recovery: bool) -> None:
    lab, sc = campaign_lab
    mode = "react" if recovery else "react-norecovery"
    rec, calls, requests = run_mode(lab, sc, mode, [[LIST], [BAD], [GOOD], [SUBMIT]], tmp_path)
    assert rec.mode == mode
    if recovery:
        assert calls == [("list_devices", None), ("run_shell", "r99"), ("run_shell", "r1"), ("submit", None)]
        assert "error: unknown device 'r99'" in said(requests[2])  # the error went back to the model
        assert rec.agent_stop == "submitted" and rec.completion_mode.value == "early_submission"
    else:
        assert calls == [("list_devices", None), ("run_shell", "r99")] and len(requests) == 2
        assert rec.agent_stop == "failed_call" and rec.completion_mode.value == "no_submission"
    # the system prompt is react's, with the A0 server's own instructions
    assert requests[0]["messages"][0]["content"].startswith("You are an intelligent agent for network operation")
    assert "The network interface says:" in requests[0]["messages"][0]["content"]


@pytest.mark.lab
@pytest.mark.parametrize("recovery", [True, False])
def test_single_turn_runs_one_sequence_without_feedback(campaign_lab, tmp_path, recovery: bool) -> None:
    lab, sc = campaign_lab
    mode = "single-turn" if recovery else "single-turn-norecovery"
    turns = [[LIST, BAD, GOOD, SUBMIT], [GOOD, SUBMIT]]
    rec, calls, requests = run_mode(lab, sc, mode, turns, tmp_path)
    # the sequence stops at the failed call: the calls after it never reach the server
    assert calls[:2] == [("list_devices", None), ("run_shell", "r99")]
    if recovery:
        assert calls[2:] == [("run_shell", "r1"), ("submit", None)] and len(requests) == 2
        second = requests[1]["messages"]
        assert "The call to run_shell failed: unknown device 'r99'" in second[-1]["content"]
        assert [m["content"] for m in second if m["role"] == "tool"][2:] == ["not executed: an earlier call of this turn failed"] * 2
        assert rec.agent_stop == "submitted"
    else:
        assert calls[2:] == [] and len(requests) == 1 and rec.agent_stop == "failed_call"


@pytest.mark.lab
@pytest.mark.parametrize("recovery", [True, False])
def test_planner_executor_replans_a_failed_step_or_stops(campaign_lab, tmp_path, recovery: bool) -> None:
    lab, sc = campaign_lab
    mode = "planner-executor" if recovery else "planner-executor-norecovery"
    turns = ["1. List the devices.\n2. Check r99.\n3. Submit.", [LIST], "Listed.", [BAD],
             "1. Check r1 instead.\n2. Submit.", [GOOD], "Checked.", [SUBMIT]]
    rec, calls, requests = run_mode(lab, sc, mode, turns, tmp_path)
    planner = [r for r in requests if "tools" not in r]  # the planner is offered no tool
    assert "Write the plan." in said(planner[0]) and "- run_shell(device, command, timeout_s?)" in said(planner[0])
    executor = [r for r in requests if "tools" in r]
    assert "Carry out step 1 of 3: List the devices." in said(executor[0])
    if recovery:
        assert calls == [("list_devices", None), ("run_shell", "r99"), ("run_shell", "r1"), ("submit", None)]
        replan = said(planner[1])
        assert "This step failed: Check r99." in replan and "unknown device 'r99'" in replan
        assert "Steps done:\n1. List the devices." in replan
        assert "Carry out step 1 of 2: Check r1 instead." in said(executor[-2])
        assert rec.agent_stop == "submitted"
        events = json.loads((tmp_path / "agent.json").read_text())["events"]
        assert [e["kind"] for e in events if e["kind"] in ("plan", "replan")] == ["plan", "replan"]
        assert not any(e["kind"] == "text" and e["text"].startswith("1.") for e in events)  # a plan is noted once
    else:
        assert calls == [("list_devices", None), ("run_shell", "r99")] and len(planner) == 1
        assert rec.agent_stop == "failed_call"


@pytest.mark.lab
@pytest.mark.parametrize("mode", ["react", "planner-executor"])
def test_the_token_budget_stops_the_run_as_budget_hit(campaign_lab, tmp_path, mode: str) -> None:
    """The stand-in endpoint bills 100*n prompt + 10 completion tokens for its n-th reply: with a
    budget of 250, the second reply (210 tokens, 320 in all) crosses it and is discarded."""
    lab, sc = campaign_lab
    turns = [[LIST], [GOOD], [SUBMIT]] if mode == "react" else ["1. List.\n2. Submit.", [LIST], "ok", [SUBMIT]]
    rec, calls, _ = run_mode(lab, sc, mode, turns, tmp_path, budget_tokens=250)
    assert calls == ([("list_devices", None)] if mode == "react" else [])
    assert (rec.tokens_in + rec.tokens_out, rec.budget_tokens) == (320, 250)
    assert rec.completion_mode.value == "budget_hit" and rec.budget_exhausted == "tokens"
    assert rec.agent_stop == "token_budget"


@pytest.mark.lab
def test_a_run_cut_at_the_wall_clock_cap_keeps_the_tokens_spent(campaign_lab, tmp_path) -> None:
    lab, sc = campaign_lab
    rec, calls, _ = run_mode(lab, sc, "react", [[LIST], 20.0], tmp_path, wall_cap_s=4)
    assert calls == [("list_devices", None)] and rec.completion_mode.value == "no_submission"
    assert rec.tokens_in + rec.tokens_out == 110 and rec.agent_stop == "deadline"
    assert "wall-clock cap of 4 s reached" in (tmp_path / "agent.json").read_text()


@pytest.mark.lab
def test_text_that_is_not_valid_unicode_is_recorded_reported_and_exported(campaign_lab, tmp_path) -> None:
    """A model may write a lone surrogate (``\\udcff``: valid JSON, not encodable as UTF-8) in a
    tool call's arguments or name. The server refuses such a call; the recorder used to fail on it,
    so the call was missing from the trajectory (and the report and the export failed on the
    agent's note of a malformed call holding one)."""
    from harness.export import export
    from harness.report import build_report
    from harness.report_html import to_html
    from harness.store import CampaignStore

    lab, sc = campaign_lab
    lone = "\udcff"
    turns = [[("run_shell", '{"device": "r1", "command": "echo \\udcff"}')],  # parsed: a lone surrogate
             [(f"list{lone}", {})],  # an unknown tool whose name holds one
             [("run_shell", '{"device": "r1", "command": "' + lone)],  # malformed, holding one
             [SUBMIT]]
    run_dir = tmp_path / "runs" / "react" / "v0"
    rec, calls, _ = run_mode(lab, sc, "react", turns, run_dir)
    recorded = [json.loads(x) for x in (run_dir / "trajectory.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [c["seq"] for c in recorded] == [1, 2, 3], "a call is missing from the trajectory"
    assert recorded[0]["arguments"]["command"] == "echo \\udcff" and recorded[0]["is_error"]
    assert recorded[1]["tool"] == "list\\udcff" and "unknown tool" in recorded[1]["error"]
    assert rec.steps == 3 and rec.agent_stop == "submitted"
    with CampaignStore(tmp_path / "db.sqlite") as store:
        store.create_campaign("t", {"factor": "mode", "ani": ["A0"], "agent": ["openai"], "mode": ["react"]})
        store.plan("t", [rec.run_key])
        store.mark_running(rec.run_key)
        store.save_result(rec)
        page = to_html(build_report(store, "t"))
        (tmp_path / "r.html").write_text(page, encoding="utf-8")
        assert "list\\udcff" in page and "malformed_call" in page
        out = tmp_path / "runs.jsonl"
        assert export(store, "t", "jsonl", out).written == 1
    (line,) = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    jsonschema_validate("jsonl", line)


def jsonschema_validate(fmt: str, doc: dict) -> None:
    import jsonschema

    from harness.export import shipped_schema

    jsonschema.Draft202012Validator(shipped_schema(fmt)).validate(doc)


# -- an endpoint that misbehaves -------------------------------------------------------------------


def test_replies_that_are_not_chat_completions_are_endpoint_errors() -> None:
    """The client library does not check the body: every shape an endpoint may answer is either a
    reply or one clear endpoint error (they used to escape as IndexError, TypeError, ...)."""
    import anyio

    from harness.agents.openai_agent import OpenAIAgent, _Endpoint

    def msg(m: str) -> bytes:
        return ('{"choices": [{"index": 0, "message": %s, "finish_reason": "stop"}]}' % m).encode()

    bodies: list = [b'{"id": "x", "choices": []}', b'{"id": "x"}', b"not json", b"[1, 2]", b"null", b'{"choices": "x"}',
                    msg("null"),
                    msg('{"role": "assistant", "content": null, "tool_calls": [{"id": null, "type": "function", '
                        '"function": null}, {"id": "c2", "type": "function", "function": {"name": null}}]}'),
                    b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}], '
                    b'"usage": {"prompt_tokens": "lots", "completion_tokens": 1}}']
    with FakeOpenAI(list(bodies)) as fake:
        endpoint = _Endpoint(OpenAIAgent(model="m", base_url=fake.url, api_key="k"))
        results = []
        for _ in bodies:
            try:
                results.append(anyio.run(endpoint.complete, [{"role": "user", "content": "x"}], None))
            except AnibenchError as e:
                results.append(str(e))
    assert all(isinstance(r, str) and r.startswith("model endpoint error: its reply") for r in results[:7]), results
    calls = results[7].tool_calls
    assert [c.name for c in calls] == ["", ""] and calls[0].id.startswith("call_") and calls[1].id == "c2"
    assert results[8].content == "hi" and not results[8].usage  # a count that is not a number: usage unknown


@pytest.mark.lab
def test_a_call_nested_too_deeply_is_malformed_and_an_endpoint_failure_keeps_the_tokens(campaign_lab, tmp_path) -> None:
    """Arguments nested deeper than the JSON parser goes used to crash the agent (RecursionError),
    losing the tokens, the events and the stop reason of the run."""
    lab, sc = campaign_lab
    deep = "[" * 100_000 + "]" * 100_000
    rec, calls, requests = run_mode(lab, sc, "react", [[("run_shell", deep)], [GOOD], b'{"choices": []}'], tmp_path)
    assert calls == [("run_shell", "r1")] and len(requests) == 3
    assert rec.tokens_in + rec.tokens_out == 320 and rec.agent_stop == "endpoint_error"
    agent = json.loads((tmp_path / "agent.json").read_text())
    assert "its reply has no choice" in agent["error"]
    malformed = [e for e in agent["events"] if e["kind"] == "malformed_call"]
    assert len(malformed) == 1 and "nested too deeply" in malformed[0]["text"]
    assert "error: the arguments are not valid JSON (nested too deeply)" in said(requests[1])


@pytest.mark.lab
def test_an_endpoint_that_reports_no_usage_cannot_run_under_a_token_budget(campaign_lab, tmp_path) -> None:
    """Without ``usage`` the adapter counted 0 tokens, so ``--budget-tokens`` was silently never
    enforced: such a run is now a failed run saying why; without a budget the run goes on and says
    that its tokens are not counted."""
    from harness.run import RunFailed

    lab, sc = campaign_lab
    v = make_variant("onboarding", sc, 0)
    for budget in (1000, None):
        with FakeOpenAI([[LIST], [SUBMIT]], usage=False) as fake:
            spec = RunSpec(campaign_id="t", run_key="t/react/0", factor="mode", setting="react", level="A0",
                           agent="openai", agent_options={"model": "m", "base_url": fake.url, "api_key": "k"},
                           mode="react", density=1, budget_tokens=budget, run_dir=tmp_path / str(budget))
            if budget is not None:
                with pytest.raises(RunFailed, match="reported no token usage, so the token budget of 1000 cannot be"):
                    execute_run(lab, spec, v)
                assert len(fake.requests) == 1  # its reply was not acted on
                continue
            rec, _ = execute_run(lab, spec, v)
        assert rec.agent_stop == "submitted" and rec.steps == 2 and rec.tokens_in + rec.tokens_out == 0
        events = json.loads((tmp_path / "None" / "agent.json").read_text())["events"]
        assert [e["kind"] for e in events].count("no_usage") == 1


@pytest.mark.lab
@pytest.mark.parametrize("mode", ["react", "planner-executor"])
def test_turns_that_make_no_call_count_against_the_step_budget(campaign_lab, tmp_path, mode: str) -> None:
    """A model that writes only malformed calls (react), or an executor that ends every step of a
    long plan without acting, never reached the server's step budget: it ran until the wall-clock
    cap (115 model calls in 15 s against a budget of 5 steps, found by a stand-in that never
    stops). Such turns are NetConfArena's null actions and count against the step budget."""
    lab, sc = campaign_lab
    malformed = [("run_shell", "{not json")]
    if mode == "react":  # two calls the server runs, then turns that make none
        turns = [[LIST], malformed, [GOOD], "just text"] + [malformed] * 200
    else:
        turns = ["\n".join(f"{i}. list the devices" for i in range(1, 200)), [LIST], "done"] + ["done"] * 400
    rec, calls, requests = run_mode(lab, sc, mode, turns, tmp_path, budget_steps=4, wall_cap_s=300)
    agent = json.loads((tmp_path / "agent.json").read_text())
    if mode == "react":
        assert calls == [("list_devices", None), ("run_shell", "r1")] and len(requests) == 4
        assert agent["null_actions"] == 2
    else:
        assert calls == [("list_devices", None)] and len(requests) == 1 + 2 + 3  # plan, step 1, steps 2-4
        assert agent["null_actions"] == 3
    assert rec.agent_stop == "step_budget" and rec.budget_exhausted == "steps"
    assert rec.completion_mode.value == "budget_hit"
