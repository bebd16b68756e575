"""ANI level A1 (bounded wrapper, NetConfArena's compact interface) against a real lab, through
a real MCP client: in-process in both protocol modes and over stdio (``harness serve``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from servers.a1_wrapper.server import build_server
from servers.common import ServerConfig
from substrate import Lab, Topology
from substrate.devstate import capture
from tests.conftest import unique_name
from tests.servers_support import MODES, connect, data, records, stdio, text

pytestmark = [pytest.mark.lab, pytest.mark.anyio]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab.create(Topology.from_spec("line:3"), unique_name("t-a1")) as lab:
        yield lab


def server(lab: Lab, tmp_path: Path | None = None, **kw: object):  # noqa: ANN201
    """The level's server over ``lab``; every node is a device unless ``devices`` says otherwise
    (these tests exercise the hosts too; the routers-only default is tested on its own)."""
    traj = tmp_path / "trajectory.jsonl" if tmp_path is not None else None
    kw.setdefault("devices", "all")
    return build_server(ServerConfig(lab=lab.name, trajectory=traj, **kw), lab=lab)  # type: ignore[arg-type]


def states(lab: Lab, *nodes: str) -> dict:
    return {n: capture(lab, n) for n in nodes}


def unchanged(lab: Lab, before: dict) -> bool:
    return all(capture(lab, n).same_as(s) for n, s in before.items())


# -- tools and reads ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_tools_schemas_and_annotations(lab: Lab, mode: str) -> None:
    async with connect(server(lab), mode) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert set(tools) == {"get_topology", "get_running_config", "apply_config", "execute_validation", "rollback", "wait",
                          "read_output", "submit"}  # fmt: skip
    hints = {n: (t.annotations.read_only_hint, t.annotations.destructive_hint, t.annotations.idempotent_hint)  # type: ignore[union-attr]
             for n, t in tools.items()}  # fmt: skip
    assert hints == {
        "get_topology": (True, False, True), "get_running_config": (True, False, True),
        "apply_config": (False, True, False), "execute_validation": (True, False, True),
        "rollback": (False, True, True), "wait": (True, False, True), "submit": (False, False, False),
        "read_output": (True, False, True),
    }  # fmt: skip
    cmds = tools["apply_config"].input_schema["properties"]["commands"]
    assert cmds["type"] == "object" and {s.get("type") for s in cmds["additionalProperties"]["anyOf"]} == {"string", "array"}
    assert tools["wait"].input_schema["properties"]["seconds"]["maximum"] == 60
    assert "snapshot" in (tools["apply_config"].description or "") and "unchanged" in (tools["apply_config"].description or "")


async def test_topology_and_running_config(lab: Lab) -> None:
    async with connect(server(lab)) as c:
        topo = data(await c.call_tool("get_topology", {}))
        r1 = topo["nodes"][0]
        assert (r1["name"], r1["role"], r1["loopback"], r1["locator"]) == ("r1", "PE", "fd00::1", "fcbb:bb00:1::/48")
        assert r1["interfaces"]["eth1"] == "r2:eth1" and topo["nodes"][3]["role"] == "host"
        cfg = data(await c.call_tool("get_running_config", {"devices": ["r1", "h1"]}))
        assert set(cfg) == {"r1", "h1"}
        assert "router isis CORE" in cfg["r1"] and "net 49.0001.0000.0000.0001.00" in cfg["r1"]
        assert "ip -6 route add fcbb:bb00:1::/48 metric 1 encap seg6local action End flavors next-csid" in cfg["r1"]
        assert "nftables ruleset" in cfg["r1"] and "h1: host (no FRR)" in cfg["h1"] and "fd00:1:1::2/64" in cfg["h1"]
        one = data(await c.call_tool("get_running_config", {"devices": "r2"}))
        assert list(one) == ["r2"]
        r = await c.call_tool("get_running_config", {"devices": ["r1", "r9", "x"]})
        assert r.is_error and "unknown devices 'r9', 'x'; devices: r1, r2, r3, h1, h3" in text(r)


# -- apply, snapshot, rollback ------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_apply_config_echo_snapshot_and_rollback(lab: Lab, mode: str, tmp_path: Path) -> None:
    before = states(lab, "r1", "h1")
    s = server(lab, tmp_path)
    commands = {
        "r1": "router isis CORE\nlsp-gen-interval 2\nspf-interval 1 10\nexit\nipv6 route fd00:97::/64 fd00::3\n"
              "ip -6 route add fd00:98::/64 encap seg6 mode encap segs fcbb:bb00:3:e000:: dev eth1 table 100\n"
              "nft add table inet anibench_t",
        "h1": ["ip -6 route add fd00:96::/64 dev eth1", "ip -6 route add fd00:96::/64 dev eth1"],
    }  # fmt: skip
    async with connect(s, mode) as c:
        reply = data(await c.call_tool("apply_config", {"commands": commands}))
        # partly applied: not an error, and the summary (first in the text) names what was refused
        assert reply["summary"] == (
            "PARTLY APPLIED: 1 of 8 command(s) REJECTED and not applied (r1: spf-interval 1 10: % Unknown command: "
            "spf-interval 1 10); the other 7 accepted: 5 changed the device, 2 already in effect (no change)")
        res = reply["devices"]
        r1, h1 = res["r1"], res["h1"]
        assert r1["echo"].startswith("r1# configure terminal\nr1(config)# router isis CORE\nr1(config-router)# lsp-gen-interval 2\n")
        assert "r1(config-router)# spf-interval 1 10\n% Unknown command: spf-interval 1 10\nr1(config-router)# exit\n" in r1["echo"]
        assert "r1(kernel)# nft add table inet anibench_t" in r1["echo"]
        assert r1["rejected"] == [{"command": "spf-interval 1 10", "message": "% Unknown command: spf-interval 1 10"}]
        assert r1["applied"] == ["lsp-gen-interval 2", "ipv6 route fd00:97::/64 fd00::3", commands["r1"].splitlines()[5],
                                 "nft add table inet anibench_t"]  # fmt: skip
        assert r1["unchanged"] == ["router isis CORE"] and r1["snapshot_id"].startswith("r1@")
        # the same route twice: the second is already there (not added again, not an error)
        assert h1["applied"] == ["ip -6 route add fd00:96::/64 dev eth1"] == h1["unchanged"] and h1["rejected"] == []
        # out of band: the device really changed
        assert "ipv6 route fd00:97::/64 fd00::3" in lab.vtysh("r1", "show running-config").stdout
        assert "encap seg6" in lab.exec("r1", ["ip", "-6", "route", "show", "table", "100"]).stdout
        assert "anibench_t" in lab.exec("r1", ["nft", "list", "tables"]).stdout
        # rollback puts every item back exactly
        for dev in ("r1", "h1"):
            rb = data(await c.call_tool("rollback", {"device": dev, "snapshot_id": res[dev]["snapshot_id"]}))
            assert rb["complete"] and rb["changed"] and rb["residual"] == [] and rb["undo_snapshot_id"].startswith(f"{dev}@")
        assert unchanged(lab, before)
        # rolling back the rollback re-applies the change
        rb2 = data(await c.call_tool("rollback", {"device": "h1", "snapshot_id": rb["undo_snapshot_id"]}))
        assert rb2["complete"] and "fd00:96::/64" in lab.exec("h1", ["ip", "-6", "route"]).stdout
        data(await c.call_tool("rollback", {"device": "h1", "snapshot_id": res["h1"]["snapshot_id"]}))
        for args, msg in [
            ({"device": "r1", "snapshot_id": "r1@99"}, "unknown snapshot 'r1@99' for r1; snapshots of r1: r1@1, r1@2"),
            ({"device": "r1", "snapshot_id": res["h1"]["snapshot_id"]}, "belongs to device 'h1', not 'r1'"),
            ({"device": "r3", "snapshot_id": "r3@1"}, "no snapshot of r3 exists yet"),
            ({"device": "r7", "snapshot_id": "r7@1"}, "unknown device 'r7'"),
        ]:
            r = await c.call_tool("rollback", args)
            assert r.is_error and msg in text(r), text(r)
    assert unchanged(lab, before)
    recs = records(tmp_path / "trajectory.jsonl")
    first = recs[0]
    # a partly applied call is no MCP error (tool_error), but it is an error action (is_error), with the refusals
    assert (first["tool"], first["kind"], first["is_error"], first["tool_error"]) == ("apply_config", "config", True, False)
    assert "PARTLY APPLIED" in first["result"] and "% Unknown command: spf-interval" in first["result"]
    assert first["rejected"][0] == "r1: spf-interval 1 10: % Unknown command: spf-interval 1 10"
    assert len(first["rejected"]) == 1
    assert first["arguments"] == {"commands": commands}
    assert [r["kind"] for r in recs[1:4]] == ["config"] * 3 and not any(r["is_error"] for r in recs[1:4])


async def test_apply_config_error_flag_is_truthful_and_matches_the_record(lab: Lab, tmp_path: Path) -> None:
    """Every command refused by the device: an MCP error that still carries the echo, recorded as
    an error; every command accepted: neither. The record's tool_error is the MCP isError."""
    s = server(lab, tmp_path)
    delete = {"r1": ["nft delete table inet tenant_fw"]}
    async with connect(s) as c:
        assert "tenant_fw" not in lab.exec("r1", ["nft", "list", "tables"]).stdout
        r = await c.call_tool("apply_config", {"commands": delete})
        assert r.is_error and r.structured_content is None
        head, body = text(r).split("\n", 1)
        assert head.startswith("NOTHING APPLIED: 1 of 1 command(s) REJECTED (r1: nft delete table inet tenant_fw: Error: ")
        assert head.endswith("). Fix the rejected commands and send them again") and json.loads(body)["summary"] == head
        got = json.loads(body)["devices"]["r1"]
        assert got["applied"] == [] and got["echo"].startswith("r1(kernel)# nft delete table inet tenant_fw\n")
        assert got["rejected"][0]["command"] == "nft delete table inet tenant_fw" and "No such file" in got["rejected"][0]["message"]
        # create it, then the same delete is accepted: not an error
        add = data(await c.call_tool("apply_config", {"commands": {"r1": ["nft add table inet tenant_fw"]}}))
        assert add["summary"] == "applied: all 1 command(s) accepted; 1 changed the device"
        assert add["devices"]["r1"]["applied"] == ["nft add table inet tenant_fw"]
        assert "tenant_fw" in lab.exec("r1", ["nft", "list", "tables"]).stdout
        gone = data(await c.call_tool("apply_config", {"commands": delete}))
        assert gone["devices"]["r1"]["rejected"] == [] and "tenant_fw" not in lab.exec("r1", ["nft", "list", "tables"]).stdout
        # refused on every device of a multi-device call: still an error
        r = await c.call_tool("apply_config", {"commands": {**delete, "r2": ["nft delete table inet tenant_fw"]}})
        assert r.is_error and set(json.loads(text(r).split("\n", 1)[1])["devices"]) == {"r1", "r2"}
    recs = records(tmp_path / "trajectory.jsonl")
    assert [(x["is_error"], x["tool_error"]) for x in recs] == [(True, True), (False, False), (False, False), (True, True)]
    assert "NOTHING APPLIED" in recs[0]["error"] and any("r1: nft delete table inet tenant_fw" in x for x in recs[0]["rejected"])
    assert recs[3]["rejected"] and all(x.startswith(("r1: ", "r2: ")) for x in recs[3]["rejected"])


async def test_disallowed_commands_apply_nothing(lab: Lab, tmp_path: Path) -> None:
    before = states(lab, "r1", "r2", "h3")
    async with connect(server(lab, tmp_path)) as c:
        r = await c.call_tool("apply_config", {"commands": {
            "r1": "interface eth1\nisis metric 30",  # fine on its own
            "r2": "router isis CORE\nlsp-gen-interval 3\nrouter isis CORE; reboot\nwrite memory",
            "h3": "ip -6 route add fd00:95::/64 dev eth1 && reboot\nipv6 route fd00::/64 eth1",
        }})  # fmt: skip
        msg = text(r)
        assert r.is_error and msg.startswith("NOTHING APPLIED: these commands are not allowed")
        for frag in ("r2 command 3 'router isis CORE; reboot': not an allowed", "r2 command 4 'write memory'",
                     "h3 command 1", "h3 command 2 'ipv6 route fd00::/64 eth1': h3 is a host and runs no FRR",
                     "allowed ip forms"):  # fmt: skip
            assert frag in msg, frag
        for args, frag in [
            ({"commands": "router isis CORE"}, "commands: Input should be a valid dictionary"),
            ({"commands": {}}, "commands must map device names to commands"),
            ({"commands": {"r1": [1, 2]}}, "Input should be a valid string"),
            ({"commands": {"r1": "x" * 600}}, "longer than 512 characters"),
            ({"commands": {"r1": ["interface eth1"] * 501}}, "too many commands (501)"),
            ({"commands": {"zz": "x", "r1": "y"}}, "unknown device 'zz'"),
            ({}, "commands: Field required"),
        ]:
            r = await c.call_tool("apply_config", args)
            assert r.is_error and frag in text(r), (args, text(r))
    assert unchanged(lab, before)
    assert all(rec["is_error"] and rec["kind"] == "config" for rec in records(tmp_path / "trajectory.jsonl"))


async def test_blocklist_ablation(lab: Lab) -> None:
    before = states(lab, "r3")
    change = {"commands": {"r3": "interface eth2\nshutdown"}}  # the link to host h3
    async with connect(server(lab, blocklist=True)) as c:
        r = await c.call_tool("apply_config", change)
        assert r.is_error and "blocked by the destructive-command blocklist ('shutdown': takes the interface down)" in text(r)
        r = await c.call_tool("apply_config", {"commands": {"r3": "nft flush ruleset"}})
        assert r.is_error and "blocklist" in text(r)
    assert unchanged(lab, before)
    async with connect(server(lab)) as c:  # without the ablation the allowlist lets it through
        res = data(await c.call_tool("apply_config", change))["devices"]["r3"]
        assert res["rejected"] == []
        assert "state DOWN" in lab.exec("r3", ["ip", "link", "show", "eth2"]).stdout
        assert data(await c.call_tool("rollback", {"device": "r3", "snapshot_id": res["snapshot_id"]}))["complete"]
    assert unchanged(lab, before)


async def test_config_lock_held_is_reported(lab: Lab) -> None:
    before = states(lab, "r2")
    async with connect(server(lab, options={"lock_timeout_s": 0.3})) as c:
        with lab.config_lock(["r2"], holder="the fault injector"):
            r = await c.call_tool("apply_config", {"commands": {"r2": "router isis CORE\nlsp-gen-interval 3"}})
        assert r.is_error and "the configuration of r2 is locked by the fault injector" in text(r)
        assert unchanged(lab, before)
        res = data(await c.call_tool("apply_config", {"commands": {"r2": "router isis CORE\nlsp-gen-interval 3"}}))
        data(await c.call_tool("rollback", {"device": "r2", "snapshot_id": res["devices"]["r2"]["snapshot_id"]}))
    assert unchanged(lab, before)


# -- validation, wait, timeouts -------------------------------------------------------------------


async def test_execute_validation(lab: Lab, tmp_path: Path) -> None:
    before = states(lab, "r1", "h1")
    async with connect(server(lab, tmp_path, options={"probe_timeout_s": 1.0})) as c:
        res = data(await c.call_tool("execute_validation", {"commands": {
            "r1": "show isis neighbor\nshow running-config | include isis passive\nshow bogus\nip -6 route show table main\n"
                  "nft list ruleset",
            "h1": ["ping -c 2 fd00:1:3::2", "traceroute -m 4 fd00:1:3::2"],
        }}))["devices"]  # fmt: skip
        out = res["r1"]["output"]
        assert out.startswith("r1# show isis neighbor\nArea CORE:") and " r2 " in out
        assert "r1# show running-config | include isis passive\n isis passive\n isis passive" in out
        assert "r1# show bogus\n% Unknown command: show bogus" in out
        assert "fcbb:bb00:3::/48" in out and "r1# nft list ruleset" in out
        assert res["r1"]["rejected"] == [{"command": "show bogus", "message": "% Unknown command: show bogus"}]
        h1 = res["h1"]["output"]
        assert "h1# ping -i 0.2 -W 1 -c 2 fd00:1:3::2" in h1 and "0% packet loss" in h1 and "fd00:1:3::2" in h1
        # a probe past its deadline is killed and reported; it was the only command: the call fails
        r = await c.call_tool("execute_validation", {"commands": {"r1": "traceroute -w 5 -q 3 -m 30 fd00:1:3::99"}})
        assert r.is_error and text(r).startswith("NOTHING RUN: 1 of 1 command(s) REJECTED (r1: traceroute")
        res = json.loads(text(r).split("\n", 1)[1])
        assert "% timed out" in res["devices"]["r1"]["output"]
        assert res["devices"]["r1"]["rejected"][0]["message"] == "timed out after 1 s"
        for args, frag in [
            ({"commands": {"r1": "configure terminal"}}, "not a read-only command"),
            ({"commands": {"r1": "ip -6 route add fd00::/64 dev eth1"}}, "not an allowed ipread form"),
            ({"commands": {"h1": "show version"}}, "h1 is a host and runs no FRR"),
            ({"commands": {"r1": "ping -c 50 fd00::3"}}, "an integer from 1 to 10"),
            ({"commands": {"r1": "show ip route | bash -i"}}, "only one filter is allowed"),
        ]:
            r = await c.call_tool("execute_validation", args)
            assert r.is_error and frag in text(r), (args, text(r))
        assert data(await c.call_tool("wait", {"seconds": 0.1})) == {"status": "0.1 seconds elapsed"}
        r = await c.call_tool("wait", {"seconds": 600})
        assert r.is_error and "less than or equal to 60" in text(r)
    assert unchanged(lab, before)
    recs = records(tmp_path / "trajectory.jsonl")
    assert [(r["kind"], r["is_error"], r["tool_error"]) for r in recs[:2]] == [("validation", True, False),
                                                                             ("validation", True, True)]
    assert recs[-2]["kind"] == "wait" and not recs[-2]["is_error"]


# -- episode, recorder, stdio ---------------------------------------------------------------------


async def test_budget_submit_and_recorder(lab: Lab, tmp_path: Path) -> None:
    s = server(lab, tmp_path, budget_steps=3, run_id="run-42")
    async with connect(s, "auto") as c:
        data(await c.call_tool("get_topology", {}))
        assert (await c.call_tool("apply_config", {"commands": {"r1": "bogus"}})).is_error
        assert data(await c.call_tool("submit", {"note": "nothing to do"}))["steps_used"] == 3
        r = await c.call_tool("get_topology", {})
        assert r.is_error and "the episode has ended" in text(r)
    recs = records(tmp_path / "trajectory.jsonl")
    assert [(r["seq"], r["tool"], r["kind"], r["is_error"], r["refused"]) for r in recs] == [
        (1, "get_topology", "read", False, None), (2, "apply_config", "config", True, None),
        (3, "submit", "submit", False, None), (4, "get_topology", "read", True, "episode_ended"),
    ]  # fmt: skip
    assert all(r["run_id"] == "run-42" and r["level"] == "A1" and r["client"]["name"] == "anibench-tests" for r in recs)
    assert json.loads(recs[2]["result"])["status"] == "submitted"


@pytest.mark.parametrize("mode", MODES)
async def test_stdio_harness_serve_with_blocklist(lab: Lab, mode: str, tmp_path: Path) -> None:
    traj = tmp_path / "t.jsonl"
    before = states(lab, "r2")
    async with connect(stdio("A1", lab.name, "--trajectory", str(traj), "--blocklist", "--budget-steps", "10"), mode) as c:
        assert len((await c.list_tools()).tools) == 8
        assert data(await c.call_tool("get_topology", {}))["nodes"][1]["name"] == "r2"
        r = await c.call_tool("apply_config", {"commands": {"r2": "no router isis CORE"}})
        assert r.is_error and "blocklist" in text(r) and "removes the IS-IS underlay" in text(r)
        res = data(await c.call_tool("execute_validation", {"commands": {"r2": "show isis neighbor"}}))
        assert res["devices"]["r2"]["output"].count(" Up ") == 2
    assert unchanged(lab, before)
    recs = records(traj)
    assert [r["tool"] for r in recs] == ["get_topology", "apply_config", "execute_validation"]
    assert recs[1]["is_error"] and recs[1]["client"]["version"] == "1.2.3"
