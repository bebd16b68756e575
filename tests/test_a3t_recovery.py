"""Issue 20: A3-T transactions survive their own server's death and undo only what they did.

Each reproduction of the issue against a real lab (the small brownfield: 3x3 grid, 91
invariants). A server is a real ``harness serve --ani A3-T`` process spoken to over stdio; it is
killed (SIGKILL) at a moment found by polling the devices, never after a fixed sleep. Every test
ends with every device equal to its state before the change or after it (full device state,
kernel and FRR) and with the change record saying which.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from servers.a3_intent import transaction as txn_mod
from servers.a3_intent.inventory import Records
from substrate import Lab
from substrate import journal as jr
from substrate.devstate import DeviceState
from substrate.faults import Fault, FaultInjector, draw_schedule
from substrate.scenario import Scenario
from substrate.scenario.deploy import reset
from substrate.scenario.observer import observe
from tests.a3t_support import SLOW_MACHINE, bf, everything, lab, on_validation, sc, server  # noqa: F401 - fixtures
from tests.conftest import REPO
from tests.servers_support import HARNESS, connect, data, text

pytestmark = [pytest.mark.lab, pytest.mark.anyio]
#: Onboarding on the spare circuit r6:eth4 (CE c8), IPv4 too: touches r1, r2, r6 and c8.
ONBOARD = [{"op": "create", "service_class": "tenant_site", "id": "t3s3",
            "spec": {"tenant": "t3", "pe": "r6", "pe_interface": "eth4", "prefix4": "auto"}}]  # fmt: skip



def differing(a: dict[str, DeviceState], b: dict[str, DeviceState]) -> list[str]:
    return [n for n in a if not a[n].same_as(b[n])]


def poll(what: str, cond: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait until ``cond()`` holds (no fixed sleep: re-checks as fast as the check runs)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


def has_route(lab: Lab, node: str, dst: str, fam: int = 6) -> bool:
    r = lab.exec(node, ["ip", f"-{fam}", "route", "show", "table", "all", dst], timeout_s=5)
    return bool(r.stdout.strip())


class Serve:
    """``harness serve --ani A3-T`` over stdio, spoken to in raw JSON-RPC (so that a call can be
    sent and the process killed before it answers)."""

    def __init__(self, lab: Lab, *extra: str):
        opts = [x for k, v in SLOW_MACHINE.items() if f"{k}=" not in " ".join(extra) for x in ("-o", f"{k}={v:g}")]
        self.p = subprocess.Popen([*HARNESS, "serve", "--ani", "A3-T", "--lab", lab.name, "--devices", "all", *opts, *extra],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
        self.n = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "issue-20", "version": "1"}})  # fmt: skip
        self.read()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg: dict[str, Any]) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps(msg) + "\n")
        self.p.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> int:
        self.n += 1
        self.send({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        return self.n

    def call(self, tool: str, args: dict[str, Any]) -> int:
        return self.request("tools/call", {"name": tool, "arguments": args})

    def read(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        assert line, f"server exited: {self.p.stderr.read() if self.p.stderr else ''}"
        return json.loads(line)

    def kill(self) -> None:
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait()
        self.close()

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            self.p.wait(10)
        for s in (self.p.stdin, self.p.stdout, self.p.stderr):
            if s:
                s.close()


def killed_once(lab: Lab, what: str, cond: Callable[[], bool]) -> None:
    """A server applies ONBOARD and is killed (SIGKILL) as soon as ``cond()`` holds."""
    srv = Serve(lab)
    try:
        srv.call("apply_change_set", {"ops": ONBOARD})
        poll(what, cond)
        srv.kill()
    finally:
        srv.close()


async def after_state(lab: Lab, ops: list[dict[str, Any]]) -> tuple[dict[str, DeviceState], dict[str, Any]]:
    """Every device's state after ``ops`` applied cleanly (then the lab is reset to its baseline)."""
    async with connect(server(lab)) as c:
        res = data(await c.call_tool("apply_change_set", {"ops": ops}))
    assert res["status"] == "applied", res["message"]
    after = everything(lab)
    assert reset(lab).exact
    return after, res


async def recovered(lab: Lab, change_id: str) -> dict[str, Any]:
    """A new server starts (finishing what the dead one left) and tells what became of the change."""
    async with connect(server(lab)) as c:
        return data(await c.call_tool("get_change", {"change_id": change_id}))


def ends(now: dict[str, DeviceState], before: dict[str, DeviceState], after: dict[str, DeviceState]) -> set[str]:
    """Which of the two states the devices are in: {'before'} (every device the change set
    touches is as before it), {'after'}, or more (some device is in neither, or they disagree)."""
    out = set()
    for n in now:
        b, a = now[n].same_as(before[n]), now[n].same_as(after[n])
        if not (a and b):
            out.add("before" if b else "after" if a else f"neither ({n})")
    return out


# -- 1: killed after the push, before the commit ----------------------------------------------------


async def test_killed_after_the_push_is_rolled_back_by_the_next_server(lab: Lab, sc: Scenario) -> None:
    after, res = await after_state(lab, ONBOARD)
    sid = res["ops"][0]["allocated"]["dt6_sid@r6"]
    before = everything(lab)
    killed_once(lab, "the new End.DT6 SID on r6", lambda: has_route(lab, "r6", sid))
    entry = jr.Journal(lab, "a3t").get("c1")
    assert entry is not None and entry.phase in ("applying", "validating")  # the dead server's unfinished transaction
    got = await recovered(lab, "c1")
    assert got["status"] == "rolled_back" and "stopped in phase" in got["recovery"], got
    now = everything(lab)
    assert ends(now, before, after) == {"before"}, differing(before, now)
    assert jr.Journal(lab, "a3t").get("c1").phase == "rolled_back"  # type: ignore[union-attr]
    # the circuit is free again and the same change set applies
    async with connect(server(lab)) as c:
        circ = data(await c.call_tool("list_services", {"service_class": "attachment_circuit", "filter": {"id": "r6:eth4"}}))
        assert circ["items"][0]["status"] == "free"
        again = data(await c.call_tool("apply_change_set", {"ops": ONBOARD}))
        assert again["status"] == "applied" and again["change_id"] == "c2", again["message"]
    assert differing(after, everything(lab)) == []


# -- 2: killed during the rollback ----------------------------------------------------------------------

DROP_PINGS = ("table inet issue20 {\n chain input {\n  type filter hook input priority 0; policy accept;\n"
              "  icmpv6 type echo-request drop\n  icmp type echo-request drop\n }\n}\n")  # fmt: skip


async def test_killed_during_the_rollback_is_finished_by_the_next_server(lab: Lab) -> None:
    after, res = await after_state(lab, ONBOARD)
    prefix = res["ops"][0]["allocated"]["prefix6"]
    lab.check([lab.exec("c8", ["nft", "-f", "-"], input=DROP_PINGS)])  # the customer's CE drops pings: validation fails
    before = everything(lab)
    srv = Serve(lab)
    try:
        srv.call("apply_change_set", {"ops": ONBOARD})
        poll("the change on r1", lambda: has_route(lab, "r1", prefix))
        poll("r1 rolled back", lambda: not has_route(lab, "r1", prefix))
        srv.kill()
    finally:
        srv.close()
    assert jr.Journal(lab, "a3t").get("c1").phase == "rolling_back"  # type: ignore[union-attr]
    got = await recovered(lab, "c1")
    assert got["status"] == "rolled_back" and got["rollback"]["complete"], got
    now = everything(lab)
    assert ends(now, before, after) == {"before"}, differing(before, now)
    assert "issue20" in now["c8"].nft  # the customer's own table was not the change set's: left alone


# -- the device scripts of a dead server ------------------------------------------------------------------


async def test_device_scripts_left_running_by_a_dead_server_are_killed_then_undone(lab: Lab) -> None:
    """r6's vtysh hangs (its vtysh.conf is a FIFO nobody writes: the kernel part of r6's script
    ran, its FRR part waits) when the server dies: the next server kills the script and everything
    it started, and undoes every device -- a script finishing later would redo the change."""
    after, res = await after_state(lab, ONBOARD)
    prefix = res["ops"][0]["allocated"]["prefix6"]
    before = everything(lab)
    lab.check([lab.sh("r6", "cd /etc/frr && mv vtysh.conf vtysh.conf.issue20 && mkfifo vtysh.conf")])
    try:
        srv = Serve(lab, "-o", "device_timeout_s=120")
        try:
            srv.call("apply_change_set", {"ops": ONBOARD})
            poll("the change on r1", lambda: has_route(lab, "r1", prefix))
            poll("r6's script waiting in vtysh", lambda: "vtysh" in lab.exec("r6", ["ps", "-eo", "comm"]).stdout)
            srv.kill()
        finally:
            srv.close()
        assert "vtysh" in lab.exec("r6", ["ps", "-eo", "comm"]).stdout  # the dead server's script lives on in r6
        got = await recovered(lab, "c1")
        assert got["status"] == "rolled_back" and got["rollback"]["complete"], got
        assert "device scripts still running were killed (r6:" in got["recovery"], got["recovery"]
        assert "vtysh" not in lab.exec("r6", ["ps", "-eo", "comm"]).stdout
    finally:
        lab.check([lab.sh("r6", "cd /etc/frr && rm -f vtysh.conf && mv vtysh.conf.issue20 vtysh.conf")])
    now = everything(lab)
    assert ends(now, before, after) == {"before"}, differing(before, now)


# -- killed after the commit point: completed ---------------------------------------------------------


async def test_killed_after_the_commit_point_is_completed_by_the_next_server(lab: Lab) -> None:
    """r6's startup configuration is a FIFO nobody writes, so the server hangs right after the
    commit point (writing it); killed there, the change is completed by the next server."""
    after, _res = await after_state(lab, ONBOARD)
    before = everything(lab)
    lab.check([lab.sh("r6", "cd /etc/frr && mv frr.conf frr.conf.issue20 && mkfifo frr.conf")])
    fifo = True
    try:
        srv = Serve(lab, "-o", "device_timeout_s=120")
        try:
            srv.call("apply_change_set", {"ops": ONBOARD})
            poll("the commit", lambda: Records(lab).state().version == 1)
            poll("r6's startup configuration being read", lambda: "cat" in lab.exec("r6", ["ps", "-eo", "comm"]).stdout.split())
            srv.kill()
        finally:
            srv.close()
        assert jr.Journal(lab, "a3t").get("c1").phase == "validating"  # type: ignore[union-attr]
        lab.check([lab.sh("r6", "cd /etc/frr && rm -f frr.conf && mv frr.conf.issue20 frr.conf")])
        fifo = False
        got = await recovered(lab, "c1")
    finally:
        if fifo:
            lab.sh("r6", "cd /etc/frr && rm -f frr.conf && mv frr.conf.issue20 frr.conf")
    assert got["status"] == "applied" and "had committed it" in got["recovery"], got
    assert "device commands still running were killed (r6:" in got["recovery"]  # its read of the FIFO
    assert "cat" not in lab.exec("r6", ["ps", "-eo", "comm"]).stdout.split()
    assert jr.Journal(lab, "a3t").get("c1").phase == "committed"  # type: ignore[union-attr]
    now = everything(lab)
    assert ends(now, before, after) == {"after"}, differing(after, now)
    assert "ip address 10.0.4.1/24" in lab.exec("r6", ["cat", "/etc/frr/frr.conf"]).stdout  # saved for the next restart


# -- 3: the rollback undoes the change, not the faults ------------------------------------------------------


async def test_rollback_leaves_faults_cleared_meanwhile_alone(lab: Lab, sc: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link-down and an 80% loss on r2 (a device the change touches) are cleared while the change
    is validated; the change is rolled back (its CE drops pings): the link stays up, the loss table
    stays gone, and every invariant passes afterwards."""
    core = [ln for ln in sc.topology.links_of("r2") if sc.topology.node(ln.peer_of("r2").node).is_router]
    ifs = [ln.endpoint_of("r2").interface for ln in core]
    inj = FaultInjector(lab, [
        Fault(id="f1", kind="link_down", step=1, duration_steps=1, target={"node": "r2", "interface": ifs[0]}),
        Fault(id="f2", kind="loss", step=1, duration_steps=1, target={"node": "r2", "interface": ifs[1], "percent": 80}),
    ])  # fmt: skip
    baseline = everything(lab)
    lab.check([lab.exec("c8", ["nft", "-f", "-"], input=DROP_PINGS)])
    inj.on_step(1)
    on_validation(monkeypatch, inj.clear)
    try:
        async with connect(server(lab)) as c:
            res = data(await c.call_tool("apply_change_set", {"ops": ONBOARD}))
    finally:
        inj.clear()
    assert res["status"] == "rolled_back" and res["rollback"]["complete"], res["message"]
    assert inj.active() == [] and not (lab.dir / "faults.json").read_text().strip("[]")
    now = everything(lab)
    assert all(now["r2"].links[i].up for i in ifs) and "anibench_fault_loss" not in now["r2"].nft
    lab.check([lab.exec("c8", ["nft", "delete", "table", "inet", "issue20"])])
    lab.wait_converged(timeout_s=60)
    assert differing(baseline, everything(lab)) == []
    assert [v.id for v in observe(lab, sc.invariants) if not v.ok] == []


# -- 7: a zebra crash keeps what A3-T committed ---------------------------------------------------------------


async def test_zebra_crash_and_restart_keep_committed_changes(lab: Lab, sc: Scenario) -> None:
    async with connect(server(lab)) as c:
        res = data(await c.call_tool("apply_change_set", {"ops": ONBOARD}))
    assert res["status"] == "applied", res["message"]
    new_sc, _ = Records(lab).inventory()
    inj = FaultInjector(lab, [Fault(id="f1", kind="daemon_crash", step=1, duration_steps=1, target={"node": "r6", "daemon": "zebra"})])
    inj.on_step(1)
    assert lab.daemon_pid("r6", "zebra") is None
    inj.on_step(2)
    assert "zebra, staticd, isisd restarted" in inj.events[-1].detail
    lab.wait_converged(timeout_s=60)
    assert "ip address 10.0.4.1/24" in lab.vtysh("r6", "show running-config").stdout
    assert [v.id for v in observe(lab, new_sc.invariants) if not v.ok] == []
    # and a reset after a zebra crash converges (it restarts every daemon of the router)
    lab.kill_daemon("r6", "zebra")
    rep = reset(lab)
    assert rep.exact and {"r6:zebra", "r6:isisd", "r6:staticd"} <= set(rep.restarted_daemons)


def test_daemon_crash_fault_draws_zebra_too(sc: Scenario) -> None:
    drawn = {f.target["daemon"] for seed in range(40)
             for f in draw_schedule(seed, 0.5, 20, sc.topology, kinds=("daemon_crash",))}  # fmt: skip
    assert drawn == {"zebra", "isisd", "staticd"}


# -- 4: delete and create again ---------------------------------------------------------------------------


async def test_delete_and_create_again_is_idempotent(lab: Lab, sc: Scenario) -> None:
    """[delete t3s2, create t3s2] -- t3s2 has an End.DX4 SID, an accept rule of fw-t3 and sp1
    steering to it: with its own spec nothing changes; moved that way to another circuit it keeps
    its prefixes and references, and every re-apply changes nothing."""
    old = sc.site("t3s2")
    same = [{"op": "delete", "service_class": "tenant_site", "id": "t3s2"},
            {"op": "create", "service_class": "tenant_site", "id": "t3s2",
             "spec": {"tenant": "t3", "pe": old.pe, "pe_interface": old.pe_if, "prefix4": "auto"}}]  # fmt: skip
    move = json.loads(json.dumps(same))
    move[1]["spec"].update(pe="r6", pe_interface="eth4")
    before = everything(lab)
    async with connect(server(lab)) as c:
        res = data(await c.call_tool("apply_change_set", {"ops": same}))
        assert res["status"] == "no_change" and res["devices"] == [], res["message"]
        first = data(await c.call_tool("apply_change_set", {"ops": move}))
        assert first["status"] == "applied", first["message"]
        svc = data(await c.call_tool("get_service", {"id": "t3s2"}))
        sids = (svc["allocated"]["dx4_sid"], svc["allocated"]["dt6_sid"])
        assert (svc["spec"]["prefix6"], svc["spec"]["prefix4"]) == (old.prefix6, old.prefix4) and svc["device_state"]["in_sync"]
        assert "fw-t3 (firewall rule)" in svc["referenced_by"] and "sp1 (steering dst_site)" in svc["referenced_by"]
        for _ in range(2):
            again = data(await c.call_tool("apply_change_set", {"ops": move}))
            assert again["status"] == "no_change" and again["already_applied_as"] == first["change_id"], again["message"]
            svc = data(await c.call_tool("get_service", {"id": "t3s2"}))
            assert (svc["allocated"]["dx4_sid"], svc["allocated"]["dt6_sid"]) == sids
        fw = data(await c.call_tool("get_service", {"id": "fw-t3"}))
        assert {"action": "accept", "dst_site": "t3s1", "port": 8080, "src_site": "t3s2"} in fw["spec"]["rules"]
    new_sc, _ = Records(lab).inventory()
    assert [v.id for v in observe(lab, new_sc.invariants) if not v.ok] == []
    assert differing(before, everything(lab))  # the move did happen


# -- 5: drift in normalized forms, both ways --------------------------------------------------------------


async def test_drift_is_exact_both_ways(lab: Lab, sc: Scenario) -> None:
    border = sc.external.border_pe  # type: ignore[union-attr]
    table = sc.tenant("t3").table
    async with connect(server(lab)) as c:
        # a clean baseline: a plan touching the border PE (its nft prints 'meta mark set 0x00000100') warns of nothing
        fip = {"op": "create", "service_class": "floating_ip", "spec": {"site": "t3s2"}}
        plan = data(await c.call_tool("plan_change_set", {"ops": [fip]}))
        assert border in [d["device"] for d in plan["devices"]] and plan["warnings"] == []
        for sid in ("t3s2", "fip1", "fw-t3", "sp1", "t3"):
            assert data(await c.call_tool("get_service", {"id": sid}))["device_state"]["in_sync"], sid
        # state added in the tenant's table, and an FRR line lost, behind A3-T's back
        lab.check([lab.exec("r1", ["ip", "-6", "route", "add", "fd10:0:0:77::/64", "table", str(table), "dev", "eth6"]),
                   lab.vtysh("r1", "configure terminal", "interface eth6", "no ip address 10.0.3.1/24")])  # fmt: skip
        svc = data(await c.call_tool("get_service", {"id": "t3s2"}))
        lines = svc["device_state"]["differences"]["r1"]
        assert not svc["device_state"]["in_sync"]
        assert f"route extra: ip -6 route fd10:0:0:77::/64 table {table} metric 1024 dev eth6" in lines
        assert "FRR line missing: interface eth6 / ip address 10.0.3.1/24" in lines
        plan = data(await c.call_tool("plan_change_set", {"ops": ONBOARD}))
        warn = next(w for w in plan["warnings"] if w.startswith("r1 differs"))
        assert "route extra" in warn and "FRR line missing: interface eth6 / ip address 10.0.3.1/24" in warn


# -- 6: cancellation ----------------------------------------------------------------------------------------


def blocked_until_cancelled(monkeypatch: pytest.MonkeyPatch, where: str) -> threading.Event:
    """Hold the transaction at ``where`` ('validation': before the commit point, 'startup config':
    after it) until the server has seen the client's cancellation. Returns an event set when the
    transaction gets there."""
    reached = threading.Event()
    cancels: list[threading.Event] = []
    real_apply = txn_mod.Engine.apply

    def apply(self: Any, *a: Any, cancel: threading.Event | None = None, **kw: Any) -> Any:
        assert cancel is not None
        cancels.append(cancel)
        return real_apply(self, *a, cancel=cancel, **kw)

    def hold() -> None:
        reached.set()
        assert cancels[-1].wait(120), "the cancellation never reached the transaction"

    monkeypatch.setattr(txn_mod.Engine, "apply", apply)
    if where == "validation":
        on_validation(monkeypatch, hold)
    else:
        real_persist = jr.persist_frr

        def held_persist(*a: Any, **kw: Any) -> Any:
            hold()
            return real_persist(*a, **kw)

        monkeypatch.setattr(jr, "persist_frr", held_persist)
    return reached


@pytest.mark.parametrize("where", ["validation", "startup config"])
async def test_a_cancelled_apply_is_undone_or_reported_committed(lab: Lab, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    after, _ = await after_state(lab, ONBOARD)
    before = everything(lab)
    reached = blocked_until_cancelled(monkeypatch, where)
    async with connect(server(lab)) as c:
        scope = anyio.CancelScope()

        async def call() -> None:
            with scope:
                await c.call_tool("apply_change_set", {"ops": ONBOARD})
                raise AssertionError("the call was answered")

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            assert await anyio.to_thread.run_sync(reached.wait, 120)
            scope.cancel()  # the client gives up: it sends notifications/cancelled
        deadline = time.monotonic() + 120
        while (r := await c.call_tool("get_change", {"change_id": "latest"})).is_error:  # the outcome is recorded at the end
            assert time.monotonic() < deadline, text(r)
        got = data(r)
    now = everything(lab)
    if where == "validation":
        assert got["status"] == "cancelled" and got["rollback"]["complete"], got
        assert "cancelled: the client cancelled the call before the commit point" in got["message"]
        assert ends(now, before, after) == {"before"} and Records(lab).state().version == 0
    else:
        assert got["status"] == "applied" and "cancelled the call after the commit point" in got["message"], got["message"]
        assert ends(now, before, after) == {"after"} and Records(lab).state().version == 1


# -- 8: regressions are judged, pre-existing failures are warnings --------------------------------------------


async def test_a_fault_already_there_is_a_warning_not_a_rollback(lab: Lab, sc: Scenario) -> None:
    """A core link of r2 (a device the change touches) is down before the apply: its adjacency
    invariant is in the validation scope and fails, before and after; the change commits."""
    core = next(ln for ln in sc.topology.links_of("r2") if sc.topology.node(ln.peer_of("r2").node).is_router)
    port = core.endpoint_of("r2").interface
    lab.check([lab.exec("r2", ["ip", "link", "set", port, "down"])])
    try:
        async with connect(server(lab)) as c:
            res = data(await c.call_tool("apply_change_set", {"ops": ONBOARD}))
    finally:
        lab.check([lab.exec("r2", ["ip", "link", "set", port, "up"])])
    assert res["status"] == "applied", res["message"]
    already = [f["id"] for f in res["validation"]["already_failing"]]
    assert f"underlay/adjacency/r2:{port}" in already and res["validation"]["failed"] == []
    assert res["validation"]["pre_checked"] > 0 and "already failing before it" in res["message"]
    assert any("failed before this change set already" in w for w in res["warnings"])


async def test_the_scripted_operator_retries_a_change_refused_for_a_transient_reason(
        lab: Lab, sc: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The site PE's FRR is frozen during the first apply (the server cannot read it: refused,
    "retry later"); the competent operator pauses, retries, and the change is made."""
    from harness.agents.base import AgentContext
    from harness.agents.scripted import ScriptedAgent
    from harness.tasks import make_variant

    v = make_variant("onboarding", sc, 0)
    for step in v.setup:
        lab.check([lab.exec(step.node, step.argv)])
    pe = v.changes.add[0].pe
    zebra = lab.daemon_pid(pe, "zebra")
    assert zebra is not None
    real = txn_mod.Engine.apply
    calls: list[int] = []

    def frozen_once(self: Any, *a: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            return real(self, *a, **kw)
        lab.check([lab.exec(pe, ["kill", "-STOP", str(zebra)])])
        try:
            return real(self, *a, **kw)
        finally:
            lab.check([lab.exec(pe, ["kill", "-CONT", str(zebra)])])

    monkeypatch.setattr(txn_mod.Engine, "apply", frozen_once)
    srv = server(lab, tmp_path, devices=lab.routers())
    ctx = AgentContext(level="A3-T", prompt=v.prompt, files=v.files, workdir=tmp_path, server=srv)
    out = await ScriptedAgent().run(ctx)
    assert out.error is None, out.error
    applies = [json.loads(x) for x in (tmp_path / "trajectory.jsonl").read_text().splitlines()]
    applies = [c for c in applies if c["tool"] == "apply_change_set"]
    assert len(applies) >= 2 and applies[0]["tool_error"] and "Retry later" in applies[0]["error"], applies
    assert '"status":"applied"' in applies[-1]["result"]  # the result as sent: compact JSON (issue 11)
    assert [x.id for x in observe(lab, v.test_cases) if not x.ok] == []


# -- a lab reset while a change set is in progress ----------------------------------------------------------


def blocked_lock_waits(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set when anyone waits for a held configuration lock (substrate.locks retries)."""
    import substrate.locks as locks_mod

    waiting = threading.Event()

    class Clock:
        monotonic = staticmethod(time.monotonic)
        strftime = staticmethod(time.strftime)

        @staticmethod
        def sleep(s: float) -> None:
            waiting.set()
            time.sleep(s)

    monkeypatch.setattr(locks_mod, "time", Clock)
    return waiting


async def test_a_lab_reset_waits_for_a_transaction_in_progress(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reset starts when the change set has read its devices and is about to change them: it
    waits for the transaction (it takes the devices' configuration locks), then puts the
    baseline back -- not a change applied over the new baseline that no record knows."""
    base = everything(lab)
    waiting = blocked_lock_waits(monkeypatch)
    done: list[Any] = []
    real_begin = jr.Journal.begin

    def begin(self: jr.Journal, *a: Any, **kw: Any) -> jr.Entry:
        t = threading.Thread(target=lambda: done.append(reset(lab)))
        t.start()
        poll("the reset done or waiting for a lock", lambda: bool(done) or waiting.is_set(), 120)
        return real_begin(self, *a, **kw)

    monkeypatch.setattr(jr.Journal, "begin", begin)
    async with connect(server(lab)) as c:
        res = data(await c.call_tool("apply_change_set", {"ops": ONBOARD}))
    assert res["status"] == "applied", res["message"]
    poll("the reset", lambda: bool(done), 300)
    assert done[0].exact, done[0].residual
    assert differing(base, everything(lab)) == [] and Records(lab).state().version == 0
    async with connect(server(lab)) as c:  # the circuit is free: the same change set applies again
        assert data(await c.call_tool("apply_change_set", {"ops": ONBOARD}))["status"] == "applied"


async def test_a_change_set_planned_before_a_lab_reset_is_refused(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab is reset after the change set was planned on the old records, before its devices
    are locked: it changes nothing and says so (its commit would go to records the reset dropped)."""
    base = everything(lab)
    real_plan = txn_mod.Engine._plan

    def plan_then_reset(self: Any, *a: Any, **kw: Any) -> Any:
        out = real_plan(self, *a, **kw)
        assert reset(lab).exact
        return out

    monkeypatch.setattr(txn_mod.Engine, "_plan", plan_then_reset)
    async with connect(server(lab)) as c:
        r = await c.call_tool("apply_change_set", {"ops": ONBOARD})
    assert r.is_error and "the lab was reset to its baseline while this change set was being planned" in text(r), text(r)
    assert differing(base, everything(lab)) == [] and Records(lab).state().version == 0


# -- a full disk under the journal -------------------------------------------------------------------------


class SmallDisk:
    """A tmpfs of ``size`` mounted over the lab's journal directory (unmounted on exit)."""

    def __init__(self, lab: Lab, size: str):
        self.dir = lab.dir / jr.JOURNAL_DIR
        self.dir.mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "anibench-test", str(self.dir)], check=True)

    def fill(self) -> None:
        """Fill it to the last byte."""
        with open(self.dir / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass

    def files(self) -> dict[str, jr.Entry | None]:
        return {p.name: jr._read(p) for p in self.dir.iterdir() if p.name != "filler"}

    def __enter__(self) -> SmallDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", str(self.dir)], check=True)


async def test_a_journal_that_does_not_fit_touches_nothing(lab: Lab) -> None:
    """The journal's file system has 8 KiB, less than the entry: write(2) writes what fits and
    returns its count; a short entry must never be taken for a written one."""
    before = everything(lab)
    with SmallDisk(lab, "8k") as disk:
        async with connect(server(lab)) as c:
            r = await c.call_tool("apply_change_set", {"ops": ONBOARD})
        assert r.is_error and "No space left on device" in text(r) and "nothing was changed" in text(r), text(r)
        assert disk.files() == {}  # neither a short entry nor a temporary file
    assert differing(before, everything(lab)) == []


@pytest.mark.parametrize("when", ["journaled", "committed"])
async def test_a_disk_full_during_the_transaction_still_ends_it(lab: Lab, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """The journal's file system fills up right after the entry is written (then every phase
    mark fails: the change set is undone) or right after the commit point (it stays committed):
    either way the devices end in one state, and the result says the journal could not be written."""
    after, _ = await after_state(lab, ONBOARD)
    before = everything(lab)
    with SmallDisk(lab, "1m") as disk:
        if when == "journaled":
            real_begin = jr.Journal.begin

            def begin(self: jr.Journal, *a: Any, **kw: Any) -> jr.Entry:
                e = real_begin(self, *a, **kw)
                disk.fill()
                return e

            monkeypatch.setattr(jr.Journal, "begin", begin)
        else:
            real_commit = Records.commit

            def commit(self: Records, *a: Any, **kw: Any) -> None:
                real_commit(self, *a, **kw)
                disk.fill()

            monkeypatch.setattr(Records, "commit", commit)
        async with connect(server(lab)) as c:
            res = data(await c.call_tool("apply_change_set", {"ops": ONBOARD}))
        assert any("No space left on device" in w and "the journal still shows an earlier phase" in w for w in res["warnings"]), res
        assert all(e is not None for e in disk.files().values())  # the entry is whole, at its last phase written
    now = everything(lab)
    if when == "journaled":
        assert res["status"] == "rolled_back" and res["rollback"]["complete"], res["message"]
        assert ends(now, before, after) == {"before"}, differing(before, now)
    else:
        assert res["status"] == "applied", res["message"]
        assert ends(now, before, after) == {"after"}, differing(after, now)


# -- a damaged journal entry ---------------------------------------------------------------------------------


async def test_a_damaged_journal_entry_is_said_and_cleared_by_reset(lab: Lab, sc: Scenario) -> None:
    """The entry of a dead server's transaction is cut in half (damaged outside the journal,
    which only renames whole files in): the next server cannot finish what it recorded, and says
    so wherever the half-done change shows (a rejected plan, get_change) instead of staying
    silent; a lab reset puts the devices back and removes the entry."""
    async with connect(server(lab)) as c:
        prefix = data(await c.call_tool("plan_change_set", {"ops": ONBOARD}))["ops"][0]["allocated"]["prefix6"]
    killed_once(lab, "the change on r1", lambda: has_route(lab, "r1", prefix))
    path = lab.dir / jr.JOURNAL_DIR / "a3t-c1.json"
    path.write_text(path.read_text()[:1000])
    async with connect(server(lab)) as c:
        r = await c.call_tool("plan_change_set", {"ops": ONBOARD})
        assert r.is_error and "the circuit is in use outside A3-T" in text(r), text(r)
        assert "Note: the journal entry of change c1 (a3t-c1.json) cannot be read (not a journal entry" in text(r), text(r)
        r = await c.call_tool("get_change", {"change_id": "c1"})
        assert r.is_error and "that change may be half-done" in text(r) and "a lab reset puts every device back" in text(r)
    rep = reset(lab)
    assert rep.exact and any(n.startswith("unreadable journal entry a3t-c1.json removed") for n in rep.notes), rep.notes
    assert not path.exists()


# -- killed during recovery ----------------------------------------------------------------------------------


async def test_a_recovery_killed_half_way_is_finished_and_told_by_the_next(lab: Lab) -> None:
    """Server A dies while validating; server B, recovering it at start, dies half-way through the
    undo (r6's vtysh hangs: its vtysh.conf is made a FIFO nobody writes); server C finishes the
    undo, kills B's scripts, and its record names who died where -- every device ends as before."""
    after, res = await after_state(lab, ONBOARD)
    prefix = res["ops"][0]["allocated"]["prefix6"]
    before = everything(lab)
    phase = lambda: getattr(jr.Journal(lab, "a3t").get("c1"), "phase", None)  # noqa: E731
    vtysh_waits = lambda: "vtysh" in lab.exec("r6", ["ps", "-eo", "comm"]).stdout  # noqa: E731
    a = Serve(lab)
    try:
        a.call("apply_change_set", {"ops": ONBOARD})
        poll("A validating", lambda: phase() == "validating", 120)
        a.kill()
    finally:
        a.close()
    lab.check([lab.sh("r6", "cd /etc/frr && mv vtysh.conf vtysh.conf.issue20 && mkfifo vtysh.conf")])
    try:
        opts = [x for k, v in {**SLOW_MACHINE, "device_timeout_s": 120}.items() for x in ("-o", f"{k}={v:g}")]
        b = subprocess.Popen([*HARNESS, "serve", "--ani", "A3-T", "--lab", lab.name, "--devices", "all", *opts],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)  # fmt: skip
        try:
            poll("B's recovery: r1 undone", lambda: not has_route(lab, "r1", prefix), 120)
            poll("B's undo waiting in r6's vtysh", vtysh_waits)
        finally:
            b.kill()
            b.wait()
            b.stdin.close()  # type: ignore[union-attr]
    finally:
        lab.check([lab.sh("r6", "cd /etc/frr && rm -f vtysh.conf && mv vtysh.conf.issue20 vtysh.conf")])
    entry = jr.Journal(lab, "a3t").get("c1")
    assert entry is not None and entry.phase == "rolling_back", entry
    got = await recovered(lab, "c1")
    assert got["status"] == "rolled_back" and got["rollback"]["complete"], got
    assert (f"A3-T server pid {b.pid} had begun it (recovery by A3-T server pid {b.pid}: A3-T server pid {a.p.pid} stopped in "
            "phase validating) and stopped before finishing; its device scripts still running were killed (r6:") in got["recovery"], got
    now = everything(lab)
    assert ends(now, before, after) == {"before"}, differing(before, now)


# -- a client that cancels and goes away -----------------------------------------------------------------------


async def test_a_client_that_cancels_and_leaves_does_not_cut_the_transaction(lab: Lab) -> None:
    """The client cancels apply_change_set once the change shows on r1 and closes the session: the
    server must not exit before the transaction ends (it did, mid-rollback: 'cannot schedule new
    futures after interpreter shutdown', every touched device left changed, no record)."""
    after, res = await after_state(lab, ONBOARD)
    prefix = res["ops"][0]["allocated"]["prefix6"]
    before = everything(lab)
    srv = Serve(lab)
    try:
        rid = srv.call("apply_change_set", {"ops": ONBOARD})
        poll("the change on r1", lambda: has_route(lab, "r1", prefix))
        srv.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid, "reason": "gave up"}})
        srv.p.stdin.close()  # type: ignore[union-attr]
        srv.p.wait(600)
    finally:
        srv.close()
    entry = jr.Journal(lab, "a3t").get("c1")
    assert entry is not None and entry.finished, entry
    rec = Records(lab).change("c1")
    assert rec is not None and rec["status"] in ("cancelled", "applied"), rec
    now = everything(lab)
    want = "before" if rec["status"] == "cancelled" else "after"
    assert ends(now, before, after) == {want}, differing(before if want == "before" else after, now)
