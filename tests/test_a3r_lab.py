"""A3-R (issue 13): the source of truth, the reconciler and the MCP server, in one real lab (the
small brownfield: 3x3 grid, module scope, put back at its baseline after each test). No fixed
sleep: every wait polls the expected state with a bound."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servers.a3_intent.catalog import natural_key
from servers.a3_intent.transaction import Engine
from servers.a3_reconciled import reconciler as rc
from servers.a3_reconciled.source import Repo
from servers.common import ServerConfig
from substrate import Lab, controllers
from substrate.record import pid_alive
from substrate.scenario import Scenario
from substrate.scenario.deploy import reset
from substrate.scenario.observer import observe
from tests.a3t_support import SLOW_MACHINE, bf, damage_other_tenant, everything, lab, sc  # noqa: F401 - fixtures
from tests.servers_support import connect, data, text

pytestmark = [pytest.mark.lab, pytest.mark.anyio]
#: t1s2 (PE r1, port eth4) and its tenant route on r1's tenant table.
SITE = "t1s2"
#: The steering policy of t3 (ingress r2, waypoint r5): no other record depends on it.
POLICY = "sp1"


def poll(what: str, cond: Callable[[], bool], timeout_s: float = 120.0) -> None:
    """Wait until ``cond()`` holds (re-checked as fast as it runs, bounded)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)  # poll interval, not a wait for an outcome


def a3r(lab: Lab, tmp_path: Path, **options: Any):  # noqa: ANN201
    from servers.a3_reconciled.server import build_server

    opts = {**SLOW_MACHINE, "interval_s": 1.0, **options}
    return build_server(ServerConfig(lab=lab.name, trajectory=tmp_path / "t.jsonl", devices="all", options=opts), lab=lab)


def status(lab: Lab) -> rc.ReconcileStatus:
    return rc.read_status(lab, Engine(lab).records.epoch())


def site_route(lab: Lab, sc: Scenario) -> tuple[str, str]:
    """(PE, ``ip -6 route`` line) of SITE's prefix in its tenant table on its PE."""
    site = next(s for s in sc.all_sites() if s.id == SITE)
    route = next(r for r in sc.node_config[site.pe].routes6 if r.startswith(site.prefix6))
    return site.pe, route


def has(lab: Lab, node: str, route: str) -> bool:
    words = route.split()
    table = words[words.index("table") + 1] if "table" in words else "main"
    r = lab.exec(node, ["ip", "-6", "route", "show", "table", table, words[0]], timeout_s=10)
    return bool(r.stdout.strip())


async def test_drift_reverted_and_reconciler_lifecycle(lab: Lab, sc: Scenario, tmp_path: Path) -> None:
    """An out-of-band delete is reverted by the reconciler within a bounded number of periods; the
    reconcile is recorded with its drift. submit made while the repair's transaction is in flight
    waits for it (bounded) and stops the reconciler: nothing is left half-applied and the result
    says so; closing the server after it stops nothing more."""
    pe, route = site_route(lab, sc)
    srv = a3r(lab, tmp_path)
    eng = Engine(lab)
    try:
        pid = int(controllers.info(lab.dir, rc.CONTROLLER)["pid"])  # type: ignore[index]
        poll("the first reconcile", lambda: status(lab).reconciles >= 1)
        async with connect(srv) as c:
            s0 = data(await c.call_tool("reconcile_status", {}))
            assert s0["reconciler_running"] and "devices: reconciled -- they carry HEAD" in s0["summary"], s0
            words = route.split()
            lab.exec(pe, ["ip", "-6", "route", "del", *words[: words.index("table") + 2]], timeout_s=10)
            assert not has(lab, pe, route)
            before = status(lab).reconciles
            poll("the repair in flight", lambda: bool(eng.journal.unfinished()))
            sub = data(await c.call_tool("submit", {}))
            # submit waited for the repair's transaction: finished, the route back, the reconciler stopped
            assert not eng.journal.unfinished() and has(lab, pe, route), sub
            assert not pid_alive(pid) and controllers.info(lab.dir, rc.CONTROLLER) is None
            assert "The reconciler finished its in-flight reconcile and stopped" in sub["network"], sub
            assert f"The devices carry HEAD (commit {Repo(lab).head()[:12]})" in sub["network"], sub  # type: ignore[index]
        st = status(lab)
        assert st.drift_events >= 1 and st.reconciles - before <= 10
        rec = next(r for r in rc.read_log(lab, st.epoch, 20) if r.drift)
        assert pe in rec.drift and rec.result == "drift_reverted" and pe in rec.devices, rec
    finally:
        srv.close()
    assert not pid_alive(pid) and controllers.info(lab.dir, rc.CONTROLLER) is None


async def test_invalid_record_refused_without_commit(lab: Lab, tmp_path: Path) -> None:
    """A record that does not validate (schema) or that the planner refuses (a circuit in use) is
    refused with its field path and nothing is committed."""
    srv = a3r(lab, tmp_path, reconciler=False)
    try:
        async with connect(srv) as c:
            n0 = data(await c.call_tool("history", {}))["total"]
            r = await c.call_tool("write_record", {"service_class": "tenant_site", "id": "t3s9",
                                                   "spec": {"tenant": "t3", "pe": "r2", "pe_interface": "eth5", "prefix6": "nope"}})
            assert r.is_error and "spec.prefix6" in text(r), text(r)
            assert Repo(lab).read("tenant_site", "t3s9") is None
            # valid schema, refused by the planner: the circuit of t1s1 is in use
            data(await c.call_tool("write_record", {"service_class": "tenant_site", "id": "t3s9",
                                                    "spec": {"tenant": "t3", "pe": "r1", "pe_interface": "eth3", "prefix6": "auto"}}))
            r = await c.call_tool("commit", {"message": "onboard t3s9"})
            assert r.is_error and "records/tenant_site/t3s9.yaml: spec.pe_interface" in text(r), text(r)
            assert data(await c.call_tool("history", {}))["total"] == n0
            data(await c.call_tool("discard", {}))
            assert data(await c.call_tool("diff", {}))["changed"] == []
    finally:
        srv.close()


async def test_adversarial_calls_change_nothing(lab: Lab, tmp_path: Path) -> None:
    """The adversarial audit's calls (issue 13): a commit message with a NUL or a terminal escape,
    record names that try to leave the records directory, a revert to commits that do not exist
    or are not commits, and a deeply nested patch are each refused with a plain error (never an
    internal one), and no commit is made."""
    srv = a3r(lab, tmp_path, reconciler=False)
    deep: dict[str, Any] = {}
    cur = deep
    for _ in range(150):
        cur["a"] = cur = {}
    try:
        async with connect(srv) as c:
            n0 = data(await c.call_tool("history", {}))["total"]
            data(await c.call_tool("patch_record", {"service_class": "tenant", "id": "t1", "patch": {"name": "renamed"}}))
            calls = [("commit", {"message": "bad\x00msg"}, "U+0000 at position 3"),
                     ("commit", {"message": "\x1b[2Jcleared"}, "U+001B at position 0"),
                     ("revert", {"commit": "00000000"}, "no commit '00000000'"),
                     ("revert", {"commit": "HEAD^{tree}"}, "no commit"),
                     ("revert", {"commit": "--orphan"}, "not a commit"),
                     ("revert", {"commit": "HEAD", "message": "\x00"}, "U+0000"),
                     ("read_record", {"service_class": "tenant", "id": "../../etc/passwd"}, "no record was read"),
                     ("delete_record", {"service_class": "tenant", "id": "t1/../t2"}, "not a valid tenant id"),
                     ("write_record", {"service_class": "../tenant", "id": "t9", "spec": {"name": "x"}}, "unknown service class"),
                     ("patch_record", {"service_class": "tenant", "id": "t1", "patch": deep}, "spec.a: unexpected field")]
            for name, args, want in calls:
                r = await c.call_tool(name, args)
                assert r.is_error and want in text(r) and "internal error" not in text(r), (name, text(r))
            assert data(await c.call_tool("history", {}))["total"] == n0
            assert Repo(lab).read("tenant", "t1") is not None and not list((Repo(lab).dir.parent).glob("*.yaml"))
            data(await c.call_tool("discard", {}))
    finally:
        srv.close()


async def test_commit_while_a_reconcile_runs_converges_to_head(lab: Lab, tmp_path: Path) -> None:
    """Commits made while the reconciler is applying the one before (the audit's 'commit during a
    reconcile'): each is planned against what is applied, none is lost, and the network ends at
    HEAD with the last commit's records."""
    srv = a3r(lab, tmp_path)
    eng = Engine(lab)
    try:
        async with connect(srv) as c:
            data(await c.call_tool("delete_record", {"service_class": "steering_policy", "id": POLICY}))
            first = data(await c.call_tool("commit", {"message": f"remove {POLICY}"}))
            poll("the first commit being applied", lambda: bool(eng.journal.unfinished()) or status(lab).applied_commit == first["commit"])
            data(await c.call_tool("patch_record", {"service_class": "tenant", "id": "t1", "patch": {"name": "renamed"}}))
            second = data(await c.call_tool("commit", {"message": "rename t1"}))
            poll("HEAD applied", lambda: status(lab).applied_commit == second["commit"], 240)
            st = data(await c.call_tool("reconcile_status", {}))
            assert st["head"] == second["commit"] and st["failed_commit"] is None, st
        inv, _ = eng.inventory()
        assert POLICY not in {x.id for x in inv.steering} and inv.tenant("t1").name == "renamed"
    finally:
        srv.close()


async def test_a_lab_reset_never_loses_a_commit_silently(lab: Lab, tmp_path: Path) -> None:
    """A commit and a lab reset (issue 35, the reconciler attack's F3: a commit made while
    ``harness lab reset`` ran was acknowledged, then lost when the reset made the repository
    again). A commit acknowledged before a reset is discarded with the epoch, and reconcile_status
    names it; a commit made while a reset runs waits for it, then refuses, saying the working change
    went with the reset; nothing is ever acknowledged and lost."""
    import anyio

    from substrate.locks import BASELINE_LOCK, holder_of
    from substrate.scenario.deploy import reset

    srv = a3r(lab, tmp_path, reconciler=False)
    try:
        async with connect(srv) as c:
            data(await c.call_tool("patch_record", {"service_class": "tenant", "id": "t1", "patch": {"name": "renamed"}}))
            before = data(await c.call_tool("commit", {"message": "rename t1"}))
            assert reset(lab).exact
            st = data(await c.call_tool("reconcile_status", {}))
            assert st["reset_notice"] and f"{before['commit'][:12]} (rename t1)" in st["reset_notice"], st
            assert st["reset_notice"] in st["summary"], st

            data(await c.call_tool("patch_record", {"service_class": "tenant", "id": "t1", "patch": {"name": "again"}}))
            async with anyio.create_task_group() as tg:
                done: list[Any] = []

                async def run_reset() -> None:
                    done.append(await anyio.to_thread.run_sync(reset, lab))

                tg.start_soon(run_reset)
                while not (holder_of(lab.dir, BASELINE_LOCK) or "").startswith("lab reset"):
                    assert not done, "the reset ended before it was seen holding the lab"
                    await anyio.sleep(0.02)  # poll interval
                during = await c.call_tool("commit", {"message": "rename t1 again"})
                assert done and done[0].exact, "the commit returned while the reset still held the lab"
            assert during.is_error and "the lab was reset to its baseline" in text(during) and "nothing was committed" in text(during), text(during)
            log = data(await c.call_tool("history", {}))["commits"]
            assert len(log) == 1 and log[0]["message"].startswith("baseline"), log
            st = data(await c.call_tool("reconcile_status", {}))
            assert st["reset_notice"] and "the working change" in st["reset_notice"], st
    finally:
        srv.close()


async def test_a_new_site_leaves_no_drift_behind(lab: Lab, tmp_path: Path) -> None:
    """A committed new site (IPv6 and IPv4 prefixes on a PE port) applies, and the reconcile after
    it finds nothing to revert: the routes the kernel makes from the site's addresses (prefix,
    local, broadcast, anycast) are not foreign (they were, in the capture's /32 and /128 form, and
    the repair that deleted them broke the tenant's IPv4: its validation rolled it back)."""
    srv = a3r(lab, tmp_path, reconciler=False)
    try:
        async with connect(srv) as c:
            data(await c.call_tool("write_record", {"service_class": "tenant_site", "id": "t3s3", "spec": {
                "tenant": "t3", "pe": "r6", "pe_interface": "eth4", "prefix6": "auto", "prefix4": "auto"}}))  # fmt: skip
            cm = data(await c.call_tool("commit", {"message": "onboard t3s3"}))
        rec = rc.Reconciler(lab, options=rc.EngineOptions(holder="test", **SLOW_MACHINE))
        applied = rec.reconcile_once("commit")
        assert applied.result == "applied" and status(lab).applied_commit == cm["commit"], applied.message
        after = rec.reconcile_once("change")
        assert after.result == "in_sync" and not after.drift, (after.result, after.drift, after.message)
    finally:
        srv.close()


async def test_hand_made_bad_commit_is_refused_and_never_applied(lab: Lab, tmp_path: Path) -> None:
    """A commit made with git behind A3-R's back, holding a record with a YAML alias and one with
    a NUL character: the reconcile fails naming the commit, each file and field; nothing reaches
    the devices; the tools read the bad record with a clear error."""
    before = everything(lab)
    srv = a3r(lab, tmp_path, reconciler=False)
    try:
        repo = Repo(lab)
        rec = rc.Reconciler(lab)
        rec.reconcile_once("start")
        good = status(lab).applied_commit
        (repo.dir / "records" / "tenant_site" / "t3s9.yaml").write_text("tenant: &t t3\npe: r2\npe_interface: *t\nprefix6: auto\n")
        (repo.dir / "records" / "tenant" / "t9.yaml").write_text('name: "bad\\0"\n')
        repo.git("add", "-A", "records")
        repo.git("commit", "-q", "-m", "by hand")
        bad = repo.head()
        r = rec.reconcile_once("commit")
        assert r.result == "failed" and not r.devices, r
        assert f"commit {bad[:12]} holds records that do not validate (never applied)" in r.message, r.message  # type: ignore[index]
        assert "records/tenant_site/t3s9.yaml: spec: not a valid YAML record: YAML alias *t is not accepted" in r.message, r.message
        assert "records/tenant/t9.yaml: spec." in r.message and "U+0000" in r.message, r.message
        st = status(lab)
        assert st.applied_commit == good and st.failed_commit == bad and not st.failed_transient
        async with connect(srv) as c:
            e = await c.call_tool("read_record", {"service_class": "tenant_site", "id": "t3s9"})
            assert e.is_error and "alias *t is not accepted" in text(e), text(e)
            s = data(await c.call_tool("reconcile_status", {}))
            assert "never applied" in (s.get("failed_message") or ""), s
    finally:
        srv.close()
    after = everything(lab)
    changed = {n: before[n].diff(after[n]) for n in before if not before[n].same_as(after[n])}
    assert not changed, changed


async def test_commit_then_revert_restores_the_network(lab: Lab, tmp_path: Path) -> None:
    """Deleting a steering policy's record changes the network once reconciled; reverting to the
    baseline commit brings every device back to its state before (full device state)."""
    before = everything(lab)
    srv = a3r(lab, tmp_path)
    try:
        async with connect(srv) as c:
            base = data(await c.call_tool("history", {}))["commits"][0]["commit"]
            data(await c.call_tool("delete_record", {"service_class": "steering_policy", "id": POLICY}))
            cm = data(await c.call_tool("commit", {"message": f"remove {POLICY}"}))
            assert cm["devices_to_change"]
            st = data(await c.call_tool("wait", {"seconds": 120}))
            assert st["applied_commit"] == cm["commit"], st
            mid = everything(lab)
            assert set(cm["devices_to_change"]) <= {n for n in before if not before[n].same_as(mid[n])}
            rv = data(await c.call_tool("revert", {"commit": base[:10]}))
            st = data(await c.call_tool("wait", {"seconds": 120}))
            assert st["applied_commit"] == rv["commit"], st
            log = data(await c.call_tool("history", {"limit": 5}))["commits"]
            assert [x["message"] for x in log[:2]] == [f"revert to {base[:12]}", f"remove {POLICY}"]
    finally:
        srv.close()
    after = everything(lab)
    changed = {n: before[n].diff(after[n]) for n in before if not before[n].same_as(after[n])}
    assert not changed, changed


async def test_kill9_mid_apply_then_restart_converges(lab: Lab, tmp_path: Path) -> None:
    """The server's reconciler killed with SIGKILL at its first device change (as soon as its
    transaction is seen journaled): its supervisor restarts it (logged in supervisor.jsonl, counted in
    reconcile_status), and two starts racing that restart never make a second reconciler; the
    restarted one finishes (undoes) the transaction, then applies the commit. The commit is never
    reported applied while anything is half-applied, and the network converges."""
    import threading

    srv = a3r(lab, tmp_path)
    eng = Engine(lab)
    try:
        async with connect(srv) as c:
            pid = int(controllers.info(lab.dir, rc.CONTROLLER)["pid"])  # type: ignore[index]
            data(await c.call_tool("delete_record", {"service_class": "steering_policy", "id": POLICY}))
            cm = data(await c.call_tool("commit", {"message": f"remove {POLICY}"}))
            # journaled before its first device command: killed at (or just after) its first device change
            poll("the transaction journaled", lambda: bool(eng.journal.unfinished()), 120)
            os.kill(pid, signal.SIGKILL)
            poll("the reconciler gone", lambda: not pid_alive(pid), 30)
            assert eng.journal.unfinished()
            got: list[int] = []
            racers = [threading.Thread(target=lambda: got.append(rc.start(lab, owner_pid=os.getpid(), interval_s=1.0,
                                                                          options=SLOW_MACHINE))) for _ in range(2)]  # fmt: skip
            for t in racers:
                t.start()
            for t in racers:
                t.join(120)
            assert len(got) == 2 and got[0] == got[1], got
            deadline = time.monotonic() + 240
            while status(lab).applied_commit != cm["commit"]:
                assert time.monotonic() < deadline, "the commit was not applied after the restart"
                time.sleep(0.2)  # poll interval
            assert not eng.journal.unfinished()  # reported applied only once nothing is half-applied
            st = data(await c.call_tool("reconcile_status", {}))
            assert st["restarts"] == 1 and st["reconciler_running"] and st["reconciler_down"] is None, st
            sup = (Path(lab.dir) / "a3r" / rc.SUPERVISOR_LOG).read_text().splitlines()
            assert len(sup) == 1 and '"killed by signal 9"' in sup[0], sup
            mine = [p for p in Path("/proc").glob("[0-9]*") if "servers.a3_reconciled.reconciler " in (cl := _cmdline(p))
                    and f" {lab.name} " in cl and pid_alive(int(p.name))]  # fmt: skip
            assert len(mine) == 1, [_cmdline(p) for p in mine]
        inv, _ = eng.inventory()
        assert POLICY not in {x.id for x in inv.steering}
        bad = [v for v in observe(lab, inv.invariants) if not v.ok]
        assert not bad, bad[:3]
        poll("no drift left", lambda: (r := rc.read_log(lab, status(lab).epoch, 1)) != [] and not r[0].drift, 60)
    finally:
        srv.close()
        rc.stop(lab)


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_quiet_periods_skip_the_scan_and_a_port_down_is_still_seen(lab: Lab, sc: Scenario) -> None:
    """Nothing changing: periods pass without a device scan (quiet_periods grows, no reconcile);
    a port set down out of band is seen by the change watch (netlink) at the next period, long
    before the full check (full_every 1000), and reverted."""
    site = next(s for s in sc.all_sites() if s.id == SITE)
    pid = rc.start(lab, owner_pid=os.getpid(), interval_s=1.0, options=SLOW_MACHINE, full_every=1000)
    try:
        poll("the first reconcile", lambda: status(lab).reconciles >= 1)
        q0 = status(lab).quiet_periods
        poll("quiet periods counted", lambda: status(lab).quiet_periods >= q0 + 3, 120)
        n1 = status(lab).reconciles
        lab.check([lab.exec(site.pe, ["ip", "link", "set", site.pe_if, "down"], timeout_s=10)])
        poll("the port back up", lambda: "UP" in lab.exec(site.pe, ["ip", "-br", "link", "show", site.pe_if],
                                                           timeout_s=10).stdout.split()[1:2], 120)  # fmt: skip
        poll("the reconcile recorded", lambda: status(lab).drift_events >= 1 and status(lab).reconciles > n1)
        rec = next(r for r in rc.read_log(lab, status(lab).epoch, 20) if r.drift)
        assert rec.trigger == "change" and site.pe in rec.drift and rec.result == "drift_reverted", rec
        assert f"kernel change on {site.pe}" in rec.message, rec
    finally:
        rc.stop(lab)
    assert not pid_alive(pid)


def breakage(sc: Scenario, kind: str) -> Any:
    """A troubleshooting breakage of ``kind`` (harness.troubleshooting.CATALOG) drawn on ``sc``."""
    import random

    from harness.troubleshooting import CATALOG

    b = CATALOG[kind](sc, random.Random(1))
    assert b is not None, kind
    return b


def fw_chain(lab: Lab, node: str, chain: str) -> list[str]:
    """The rules of ``chain`` of ``inet tenant_fw`` on ``node``, in order (counters dropped)."""
    r = lab.exec(node, ["nft", "list", "chain", "inet", "tenant_fw", chain], timeout_s=10)
    return [ln.strip() for ln in r.stdout.splitlines() if "tcp dport" in ln]


def isis_on(lab: Lab, node: str, interface: str) -> bool:
    from substrate.frr import ISIS_TAG

    text = lab.vtysh(node, "show running-config").stdout
    assert f"interface {interface}" in text, text[:300]  # a command FRR refuses would read as the line gone
    block = text.split(f"interface {interface}\n", 1)[1].split("exit", 1)[0]
    return f"ipv6 router isis {ISIS_TAG}" in block


def test_drift_below_the_records_is_reverted(lab: Lab, sc: Scenario) -> None:
    """Drift the rendering owns but no record names is reverted within a bounded number of
    periods (issue 13: drift is everything the rendering owns): a drop rule inserted ahead of a
    tenant's accept (a copy of the chain's own drop: a set of lines would not see it), and
    ``no ipv6 router isis`` on a core port (an underlay line); the reconcile records both, and the
    services they broke work again."""
    fw, isis = breakage(sc, "firewall_shadow"), breakage(sc, "isis_interface_removed")
    node, chain = fw.detail["node"], fw.detail["chain"]
    rules = fw_chain(lab, node, chain)
    pid = rc.start(lab, owner_pid=os.getpid(), interval_s=1.0, options=SLOW_MACHINE)
    try:
        poll("the first reconcile", lambda: status(lab).reconciles >= 1)
        d0 = status(lab).drift_events
        for step in fw.steps + isis.steps:
            lab.check([lab.exec(step.node, step.argv, timeout_s=20)])
        assert fw_chain(lab, node, chain) != rules and not isis_on(lab, isis.detail["node"], isis.detail["interface"])
        poll("the chain and the IS-IS line back", lambda: fw_chain(lab, node, chain) == rules
             and isis_on(lab, isis.detail["node"], isis.detail["interface"]), 180)  # fmt: skip
        poll("the reconcile recorded", lambda: status(lab).drift_events > d0 and status(lab).last is not None
             and status(lab).last.result in ("in_sync", "drift_reverted"))  # fmt: skip
        recs = [r for r in rc.read_log(lab, status(lab).epoch, 30) if r.drift]
        lines = [ln for r in recs for ls in r.drift.values() for ln in ls]
        assert any(ln.startswith(f"nft inet tenant_fw extra: chain {chain} / ") and ln.endswith("drop") for ln in lines), lines
        assert f"FRR line missing: interface {isis.detail['interface']} / ipv6 router isis CORE" in lines, lines
        assert all(r.result == "drift_reverted" for r in recs if r.repair_change_id), recs
        inv = [i for i in sc.invariants if fw.is_test(i) or isis.is_test(i)]
        deadline = time.monotonic() + 60
        while bad := [v for v in observe(lab, inv) if not v.ok]:  # the IS-IS adjacency takes its hold time
            assert time.monotonic() < deadline, bad[:3]
    finally:
        rc.stop(lab)
    assert not pid_alive(pid)


def test_the_reconciler_owns_the_whole_device(lab: Lab, sc: Scenario) -> None:
    """State no record renders is drift too (issue 13: the reconciler owns the device): a foreign
    nft table (and one named like the probe table's with a drop chain), an FRR top-level line (the
    concurrent writer's route), a foreign FRR stanza and a foreign line in a core interface's
    stanza, a prohibit rule, a blackhole route in the main table, an address on lo and a core
    port's MTU. Report-only mode lists each and changes nothing; revert mode lists each in its
    drift report and removes it. The observer's probe table and the loss and latency faults'
    tables (below the ANI on purpose) are left alone, judged by their content."""
    from substrate.faults import Fault, _record, clear, inject
    from substrate.scenario.observer import _ARRIVAL_RULESET

    node = "r1"
    core = [lk.endpoint_of(node).interface for lk in sc.topology.core_links() if node in (lk.a.node, lk.b.node)]
    fault_node = next(lk.peer_of(node).node for lk in sc.topology.core_links() if node in (lk.a.node, lk.b.node))
    fault_ifs = [lk.endpoint_of(fault_node).interface for lk in sc.topology.core_links() if fault_node in (lk.a.node, lk.b.node)]
    mtu0 = lab.exec(node, ["cat", f"/sys/class/net/{core[0]}/mtu"], timeout_s=10).stdout.strip()
    faults = [Fault(id="f1", kind="loss", step=1, duration_steps=1, target={"node": node, "interface": core[0], "percent": 0}),
              Fault(id="f2", kind="latency", step=1, duration_steps=1, target={"node": fault_node, "interface": fault_ifs[0], "delay_ms": 50}),
              Fault(id="f3", kind="concurrent_writer", step=1, duration_steps=1, target={"node": node})]  # fmt: skip
    evil = "table inet anibench_probe_evil {\n chain c {\n  type filter hook input priority 0; policy drop;\n }\n}\n"
    cmds = [["nft", "add", "table", "inet", "drift_extra"], ["nft", "-f", "-"], ["ip", "-6", "rule", "add", "pref", "5", "prohibit"],
            ["ip", "-6", "route", "add", "blackhole", "fcbb:bb00:8::/48"], ["ip", "addr", "add", "fd99:dead::1/128", "dev", "lo"],
            ["ip", "link", "set", core[1], "mtu", "1400"],
            ["vtysh", "-c", "configure terminal", "-c", "route-map DRIFT permit 10", "-c", "exit", "-c", f"interface {core[0]}",
             "-c", "bandwidth 1000"]]  # fmt: skip
    want = ["nft table extra: inet drift_extra", "nft table extra: inet anibench_probe_evil", "rule extra: ip -6 rule priority 5 prohibit",
            "route extra: ip -6 route blackhole fcbb:bb00:8::/48 metric 1024", "address extra: fd99:dead::1/128 dev lo",
            f"link differs: {core[1]} mtu 1400 (baseline {mtu0})", "FRR stanza extra: route-map DRIFT permit 10",
            f"FRR line extra: interface {core[0]} / bandwidth 1000"]  # fmt: skip
    try:
        for f in faults:
            inject(lab, f, {})
        _record(lab, faults)
        for probe in (node, fault_node):
            lab.check([lab.exec(probe, ["nft", "-f", "-"], input=_ARRIVAL_RULESET, timeout_s=10)])
        for c in cmds:
            lab.check([lab.exec(node, c, input=evil if c == ["nft", "-f", "-"] else None, timeout_s=20)])
        writer = next(ln for ln in lab.vtysh(node, "show running-config").stdout.splitlines() if ln.startswith("ipv6 route 2001:db8:ffff"))
        want.append(f"FRR stanza extra: {writer}")

        reported = rc.Reconciler(lab, mode="report", options=rc.EngineOptions(holder="test", **SLOW_MACHINE)).reconcile_once("change")
        lines = [ln for ls in reported.drift.values() for ln in ls]
        assert reported.result == "drift_reported" and not reported.devices, reported
        assert not [w for w in want if w not in lines], "\n".join(lines)
        assert not [ln for ln in lines if "anibench_probe\n" in ln + "\n" or "anibench_fault" in ln or "mangle" in ln], lines
        # report-only: nothing reverted
        assert "drift_extra" in lab.exec(node, ["nft", "list", "tables"], timeout_s=10).stdout
        assert "prohibit" in lab.exec(node, ["ip", "-6", "rule"], timeout_s=10).stdout
        assert "route-map DRIFT" in lab.vtysh(node, "show running-config").stdout

        # the MTU cut drops the peer's padded IS-IS hellos: the adjacency goes down once its hold
        # time passes. The repair restores the MTU and its validation waits (bounded) for the
        # adjacency to come back up; judged at once, the repair was rolled back (issue 13, the
        # flaky failure of this test: "r1 has no IS-IS adjacency to r4 on eth2")
        adj = next(i for i in sc.invariants if i.kind == "isis_adjacency" and i.params["node"] == node
                   and i.params["interface"] == core[1])
        poll("the IS-IS adjacency on the port with the cut MTU to go down", lambda: not observe(lab, [adj])[0].ok, 60)
        r = rc.Reconciler(lab, options=rc.EngineOptions(holder="test", **SLOW_MACHINE)).reconcile_once("change")
        assert r.result == "drift_reverted" and node in r.devices, f"{r.result}: {r.message} (devices {r.devices})"
        shown = [ln for ls in r.drift.values() for ln in ls]
        assert not [w for w in want if w not in shown], shown  # the drift report, made before the repair
        left = rc.Reconciler(lab).drift_of(Engine(lab).inventory()[0])
        assert not left, left
        nft = lab.exec(node, ["nft", "list", "tables"], timeout_s=10).stdout
        assert "drift_extra" not in nft and "anibench_probe_evil" not in nft, nft
        assert f"anibench_fault_loss_{core[0]}" in nft and "inet anibench_probe" in nft, nft  # below the ANI: kept
        assert "mangle" in lab.exec(fault_node, ["nft", "list", "tables"], timeout_s=10).stdout
        assert "prohibit" not in lab.exec(node, ["ip", "-6", "rule"], timeout_s=10).stdout
        assert "fd99:dead" not in lab.exec(node, ["ip", "addr", "show", "dev", "lo"], timeout_s=10).stdout
        assert lab.exec(node, ["cat", f"/sys/class/net/{core[1]}/mtu"], timeout_s=10).stdout.strip() == mtu0
        frr = lab.vtysh(node, "show running-config").stdout
        assert "route-map DRIFT" not in frr and "bandwidth 1000" not in frr and writer not in frr, frr
    finally:
        for f in faults:
            with contextlib.suppress(Exception):
                clear(lab, f, {})
        _record(lab, [])
        for probe in (node, fault_node):
            lab.exec(probe, ["nft", "delete", "table", "inet", "anibench_probe"], timeout_s=10)


def test_neighbours_nexthops_and_qdiscs_below_the_records_are_drift(lab: Lab, sc: Scenario) -> None:
    """The reconciler owns the objects no service renders too (issue 35, the reconciler attack's
    F1 and F2): a permanent neighbour entry pinning a CE's address to another MAC, a proxy entry, a
    nexthop object, a clsact (where a tc program hooks in) and a root qdisc on a customer port no service
    shapes. Each is drift, the static neighbour is seen by the change watch before any full check
    (full_every 1000), and a revert removes every one; an address label (no repair undoes it) is
    reported and left."""
    site = next(s for s in sc.all_sites() if s.id == SITE)
    pe, port = site.pe, site.pe_if
    ce_addr = str(ipaddress.ip_network(site.prefix6)[2])  # the CE's address (PE ::1, CE ::2)
    cmds = [["ip", "-6", "neigh", "replace", ce_addr, "dev", port, "lladdr", "02:de:ad:be:ef:01", "nud", "permanent"],
            ["ip", "-6", "neigh", "add", "proxy", "fd99:beef::1", "dev", port],
            ["ip", "nexthop", "add", "id", "4242", "dev", port],
            ["tc", "qdisc", "add", "dev", port, "clsact"],
            ["tc", "qdisc", "replace", "dev", port, "root", "pfifo", "limit", "1"],
            ["ip", "-6", "addrlabel", "add", "prefix", "fd99:beef::/64", "label", "77"]]  # fmt: skip
    want = [f"neighbor extra: ip -6 neigh {ce_addr} dev {port} lladdr 02:de:ad:be:ef:01 nud permanent",
            f"neighbor extra: ip -6 neigh proxy fd99:beef::1 dev {port}", f"nexthop extra: ip nexthop id 4242 dev {port}",
            f"ingress qdisc differs: {port} clsact (baseline none)", f"root qdisc differs: {port} pfifo (baseline default)",
            "state differs from the baseline (no repair undoes it): address labels, static multicast addresses or MPTCP endpoints"]  # fmt: skip
    assert port not in (sc.node_config[pe].qdiscs or {}), "the test needs a port no service shapes"
    pid = rc.start(lab, owner_pid=os.getpid(), interval_s=1.0, options=SLOW_MACHINE, full_every=1000)
    try:
        poll("the first reconcile", lambda: status(lab).reconciles >= 1)
        q0 = status(lab).quiet_periods
        poll("a quiet period", lambda: status(lab).quiet_periods > q0, 120)
        lab.check([lab.exec(pe, cmds[0], timeout_s=10)])  # the static neighbour alone: the watch must see it
        poll("the pinned neighbour reverted", lambda: "02:de:ad:be:ef:01" not in lab.exec(pe, ["ip", "-6", "neigh", "show", "dev", port],
                                                                                         timeout_s=10).stdout, 120)  # fmt: skip
        poll("the repair recorded", lambda: any(r.drift for r in rc.read_log(lab, status(lab).epoch, 20)))
        rec = next(r for r in rc.read_log(lab, status(lab).epoch, 20) if r.drift)
        assert rec.trigger == "change" and rec.result == "drift_reverted", rec
        assert want[0] in rec.drift[pe], rec.drift
    finally:
        rc.stop(lab)
    assert not pid_alive(pid)
    try:
        for c in cmds:
            lab.check([lab.exec(pe, c, timeout_s=10)])
        reported = rc.Reconciler(lab, mode="report", options=rc.EngineOptions(holder="test", **SLOW_MACHINE)).reconcile_once("change")
        lines = reported.drift.get(pe, [])
        assert reported.result == "drift_reported" and not [w for w in want if w not in lines], "\n".join(lines)
        r = rc.Reconciler(lab, options=rc.EngineOptions(holder="test", **SLOW_MACHINE)).reconcile_once("change")
        assert r.result == "drift_reverted" and pe in r.devices, f"{r.result}: {r.message}"
        left = rc.Reconciler(lab).drift_of(Engine(lab).inventory()[0])
        assert left == {pe: [want[-1]]}, left
        assert "02:de:ad" not in lab.exec(pe, ["ip", "-6", "neigh", "show", "dev", port], timeout_s=10).stdout
        assert "fd99:beef::1" not in lab.exec(pe, ["ip", "-6", "neigh", "show", "proxy"], timeout_s=10).stdout
        assert "4242" not in lab.exec(pe, ["ip", "nexthop", "show"], timeout_s=10).stdout
        qd = lab.exec(pe, ["tc", "qdisc", "show", "dev", port], timeout_s=10).stdout
        assert "clsact" not in qd and "pfifo" not in qd, qd
        again = rc.Reconciler(lab, options=rc.EngineOptions(holder="test", **SLOW_MACHINE)).reconcile_once("change")
        assert again.result == "failed" and "no device command of the rendering undoes" in again.message, again
    finally:
        lab.exec(pe, ["ip", "-6", "addrlabel", "del", "prefix", "fd99:beef::/64", "label", "77"], timeout_s=10)


def test_routes_disguised_by_protocol_or_table_and_link_flags_are_drift(lab: Lab, sc: Scenario) -> None:
    """What the reconciler attack hid from it (issue 35, findings 1-4): a blackhole marked ``proto
    kernel`` (the kernel's own class), one marked ``proto isis`` beside zebra's IS-IS route to the
    same locator (FRR's class, dynamic), one in the ``local`` table (no table but main was
    compared) and ARP turned off on a customer port (only up and MTU were compared). Each broke
    tenants while the reconciler said in sync. Each is drift now, a revert removes every one and
    the scenario's invariants hold again; the lab reset removes the FRR-marked one too."""
    site = next(s for s in sc.all_sites() if s.id == SITE)
    pe, port = site.pe, site.pe_if
    from substrate.addressing import locator

    far = sorted((r.name for r in sc.topology.routers if r.name != pe), key=natural_key)
    loc = {r.name: str(locator(r.node_id)) for r in sc.topology.routers if r.name in far[-2:]}
    site_net = str(ipaddress.ip_network(site.prefix6))
    cmds = [["ip", "-6", "route", "add", "blackhole", loc[far[-1]], "proto", "kernel", "metric", "1"],
            ["ip", "-6", "route", "add", "blackhole", loc[far[-2]], "proto", "isis", "metric", "1"],
            ["ip", "-6", "route", "add", "blackhole", site_net, "table", "local"],
            ["ip", "link", "set", port, "arp", "off"]]  # fmt: skip
    want = [f"route extra: ip -6 route blackhole {loc[far[-1]]}", f"route extra: ip -6 route blackhole {loc[far[-2]]}",
            f"route extra: ip -6 route blackhole {site_net}", f"link differs: {port} arp off (baseline on)"]  # fmt: skip
    try:
        for c in cmds:
            lab.check([lab.exec(pe, c, timeout_s=10)])
        broken = [v.id for v in observe(lab, sc.invariants) if not v.ok]
        assert broken, "the attack broke nothing: this test would not show the repair"
        reported = rc.Reconciler(lab, mode="report", options=rc.EngineOptions(holder="test", **SLOW_MACHINE)).reconcile_once("change")
        lines = reported.drift.get(pe, [])
        assert not [w for w in want if not any(ln.startswith(w) for ln in lines)], "\n".join(lines)
        r = rc.Reconciler(lab, options=rc.EngineOptions(holder="test", **SLOW_MACHINE)).reconcile_once("change")
        assert r.result == "drift_reverted" and pe in r.devices, f"{r.result}: {r.message}"
        assert not rc.Reconciler(lab).drift_of(Engine(lab).inventory()[0])
        poll("the invariants hold again", lambda: all(v.ok for v in observe(lab, sc.invariants)), 60)
        # the lab reset removes a route of an FRR protocol beside zebra's own as well
        lab.check([lab.exec(pe, cmds[1], timeout_s=10)])
        rep = reset(lab)
        assert rep.exact, rep.residual
        assert "blackhole" not in lab.exec(pe, ["ip", "-6", "route", "show", loc[far[-2]]], timeout_s=10).stdout
    finally:
        lab.exec(pe, ["ip", "link", "set", port, "arp", "on"], timeout_s=10)
        for c in cmds[:3]:
            lab.exec(pe, [*c[:3], "del", *c[4:]], timeout_s=10)


def test_kernel_made_routes_and_link_local_addresses_taken_away_are_drift(lab: Lab, sc: Scenario) -> None:
    """The second reconciler attack (issue 35, findings 4 and 5): ``ip route del local A table
    local`` (the PE stops answering for its own circuit address) and a core port's link-local
    address deleted (the IS-IS adjacency over it goes down) were in sync for the reconciler. Both
    are drift now (``route missing``, ``address missing``) and the revert puts them back."""
    site = next(s for s in sc.all_sites() if s.id == SITE)
    pe, port = site.pe, site.pe_if
    pe_addr = str(ipaddress.ip_network(site.prefix6)[1])
    core = next(lk.endpoint_of(pe).interface for lk in sc.topology.core_links() if pe in (lk.a.node, lk.b.node))
    ll = next(a["local"] for a in json.loads(lab.exec(pe, ["ip", "-6", "-j", "addr", "show", "dev", core, "scope", "link"],
                                                      timeout_s=10).stdout)[0]["addr_info"])  # fmt: skip
    try:
        lab.check([lab.exec(pe, ["ip", "-6", "route", "del", "local", pe_addr, "dev", port, "table", "local"], timeout_s=10),
                   lab.exec(pe, ["ip", "-6", "addr", "del", f"{ll}/64", "dev", core], timeout_s=10)])  # fmt: skip
        reported = rc.Reconciler(lab, mode="report", options=rc.EngineOptions(holder="test", **SLOW_MACHINE)).reconcile_once("change")
        lines = reported.drift.get(pe, [])
        assert any(ln.startswith(f"route missing: ip -6 route local {pe_addr}/128 table local") for ln in lines), lines
        assert any(ln.startswith(f"address missing: {ll}/64 dev {core}") for ln in lines), lines
        r = rc.Reconciler(lab, options=rc.EngineOptions(holder="test", **SLOW_MACHINE)).reconcile_once("change")
        assert r.result == "drift_reverted", f"{r.result}: {r.message}"
        assert not rc.Reconciler(lab).drift_of(Engine(lab).inventory()[0]).get(pe)
        assert lab.exec(pe, ["ip", "-6", "route", "show", "table", "local", pe_addr], timeout_s=10).stdout.strip()
        poll("the invariants hold again", lambda: all(v.ok for v in observe(lab, sc.invariants)), 90)
    finally:
        lab.exec(pe, ["ip", "-6", "addr", "replace", f"{ll}/64", "dev", core, "scope", "link"], timeout_s=10)


def test_srv6_sysctl_and_tunsrc_drift_is_seen_in_ip_terms_and_reverted(lab: Lab) -> None:
    """Drift of the SRv6 state and of what the baseline set below the records (issue 35, the attack):
    on a PE an End.DT6 SID pointed at another tenant's table, an H.Encaps.Red route given another
    segment, an End.DX4 SID deleted, a foreign SID added, the locator's End SID replaced by a plain
    End (no NEXT-C-SID flavor), IPv4 forwarding off and the encapsulation source changed; on a P
    router IPv6 forwarding off, a port's seg6_enabled off and its own End SID's flavor lengths
    changed. Report-only lists each -- SRv6 routes as iproute2 shows them on either data plane
    (``encap seg6``/``seg6local``, never the eBPF data plane's ``encap bpf``) -- and revert mode
    puts every device back to its state before (full device state, FRR included).

    Before the fix the locator's End SID (replaced or deleted), every sysctl outside the services'
    and the encapsulation source were not drift: a plain End on the locator breaks every uSID
    container through the router, and the reconciler reported the device in sync."""
    from substrate.devstate import capture

    pe, p = "r1", "r5"
    st = capture(lab, pe, frr=False, timeout_s=60)
    routes = st.routes6
    dt6 = next(r for r in routes if "action End.DT6 table" in r)
    dx4 = next(r for r in routes if "action End.DX4" in r)
    encap = next(r for r in routes if "encap seg6 mode encap.red segs" in r and " table " in r)
    loc = next(r for r in routes if "action End flavors next-csid" in r and r.split()[0].endswith("::/48"))
    p_sid = next(r for r in capture(lab, p, frr=False, timeout_s=60).routes6 if "action End flavors next-csid" in r and "nflen 32" in r)
    table = dt6.split("table ")[1].split()[0]
    seg = encap.split("segs ")[1].split()[0]
    other_seg = seg[:-3] + ("1::" if not seg.endswith("1::") else "2::")
    foreign_sid = dt6.split("::/64")[0].rsplit(":", 1)[0] + ":e0ff::/64"
    before = everything(lab)
    cmds = {pe: [["ip", "-6", "route", "replace", dt6.split()[0], "encap", "seg6local", "action", "End.DT6", "table", str(int(table) + 1), "dev", "sr0"],
                 ["ip", "-6", "route", "replace", *encap.split()[:3], "encap", "seg6", "mode", "encap.red", "segs", other_seg, "dev", "sr0"],
                 ["ip", "-6", "route", "del", dx4.split()[0]],
                 ["ip", "-6", "route", "add", foreign_sid, "encap", "seg6local", "action", "End.DT6", "table", table, "dev", "sr0"],
                 ["ip", "-6", "route", "replace", loc.split()[0], "metric", "1", "encap", "seg6local", "action", "End", "dev", "sr0"],
                 ["sysctl", "-qw", "net.ipv4.ip_forward=0"], ["ip", "sr", "tunsrc", "set", "fd00::99"]],
            p: [["sysctl", "-qw", "net.ipv6.conf.all.forwarding=0"], ["sysctl", "-qw", "net.ipv6.conf.eth1.seg6_enabled=0"],
                ["ip", "-6", "route", "replace", p_sid.split()[0], "metric", "1024", "encap", "seg6local", "action", "End", "flavors",
                 "next-csid", "lblen", "32", "nflen", "16", "dev", "sr0"]]}  # fmt: skip
    want = {pe: [f"route differs: ip -6 route {dt6}", f"route differs: ip -6 route {encap}", f"route missing: ip -6 route {dx4}",
                 f"route differs: ip -6 route {loc}", "sysctl differs: net/ipv4/ip_forward = 0 (baseline 1)",
                 "tunsrc differs: fd00::99 (baseline ::)"],
            p: [f"route differs: ip -6 route {p_sid}", "sysctl differs: net/ipv6/conf/all/forwarding = 0 (baseline 1)",
                "sysctl differs: net/ipv6/conf/eth1/seg6_enabled = 0 (baseline 1)"]}  # fmt: skip
    for node, cs in cmds.items():
        for c in cs:
            lab.check([lab.exec(node, c, timeout_s=20)])
    opts = rc.EngineOptions(holder="test", **SLOW_MACHINE)
    reported = rc.Reconciler(lab, mode="report", options=opts).reconcile_once("change")
    assert reported.result == "drift_reported" and not reported.devices, reported
    got = rc.Reconciler(lab, mode="report", options=opts).drift_of(Engine(lab).inventory()[0])  # whole (the record cuts long lists)
    for node, lines in want.items():
        assert not [w for w in lines if w not in got.get(node, [])], (node, got.get(node))
    assert any(ln.startswith(f"route extra: ip -6 route {foreign_sid} ") and "encap seg6local action End.DT6" in ln for ln in got[pe]), got[pe]
    srv6 = [ln for ls in got.values() for ln in ls if ln.startswith("route ")]
    assert srv6 and not [ln for ln in srv6 if " bpf" in ln or "encap seg6" not in ln], srv6
    r = rc.Reconciler(lab, options=opts).reconcile_once("change")
    assert r.result == "drift_reverted" and {pe, p} <= set(r.devices), f"{r.result}: {r.message} (devices {r.devices})"
    assert not rc.Reconciler(lab).drift_of(Engine(lab).inventory()[0])
    after = everything(lab)
    changed = {n: before[n].diff(after[n]) for n in before if not before[n].same_as(after[n])}
    assert not changed, changed


def test_failed_repair_of_foreign_stanzas_restores_them_whole(lab: Lab, sc: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A repair that removes foreign multi-line FRR stanzas and then fails active validation is
    rolled back, and every FRR daemon of the device is back to its configuration before the
    repair, every nested line included (issue 13: the undo put back only a stanza's first line):
    a route-map entry with its match and set lines (zebra and isisd carry it), an IS-IS instance
    with its lines (isisd only) and several lines of a core interface's stanza."""
    from substrate.devstate import frr_daemons_differ

    node = "r1"
    port = next(lk.endpoint_of(node).interface for lk in sc.topology.core_links() if node in (lk.a.node, lk.b.node))
    lab.check([lab.vtysh(node, "configure terminal", "route-map DRIFT2 permit 10", "match ipv6 address prefix-list DRIFTPL",
                         "set metric 42", "set tag 7", "exit", "router isis DRIFT", "is-type level-2-only",
                         "lsp-gen-interval 3", "exit", f"interface {port}", "bandwidth 1000", "description drift-test", "end")])
    before = lab.frr_daemon_configs(node)
    assert "set metric 42" in before["zebra"] and "router isis DRIFT" in before["isisd"], before
    rec = rc.Reconciler(lab, options=rc.EngineOptions(holder="test", **SLOW_MACHINE))
    real = rec.engine._settled
    # active validation of the repair fails: every check that held before it fails after it
    monkeypatch.setattr(rec.engine, "_settled", lambda verdicts, invs: [v.model_copy(update={"ok": False, "detail": "forced by the test"})
                                                                        for v in real(verdicts, invs)])  # fmt: skip
    r = rec.reconcile_once("change")
    assert r.result == "failed" and r.repair_change_id and node in r.drift, f"{r.result}: {r.message}"
    shown = r.drift[node]
    assert "FRR stanza extra: route-map DRIFT2 permit 10" in shown and "FRR stanza extra: router isis DRIFT" in shown, shown
    change = rec.engine.records.change(r.repair_change_id)
    assert change is not None and change["status"] == "rolled_back", change
    after = lab.frr_daemon_configs(node)
    assert not frr_daemons_differ(before, after), {d: (before.get(d), after.get(d)) for d in frr_daemons_differ(before, after)}


def test_undoing_a_created_stanza_leaves_no_empty_head(lab: Lab) -> None:
    """The mirror of the test above, on the journal's own machinery: a change that creates a
    multi-line FRR stanza (a route-map entry with match and set lines) and a line in an existing
    interface's stanza, undone, leaves every FRR daemon as before -- no bare ``route-map X permit
    10`` left behind."""
    from substrate import journal as jr
    from substrate.devstate import frr_daemons_differ
    from substrate.scenario.apply import ConfigDelta, frr_lines

    node = "r1"
    port = next(ln.split()[1] for ln in lab.vtysh(node, "show running-config").stdout.splitlines() if ln.startswith("interface eth"))
    changes = [("route-map UNDO permit 10", "match ipv6 address prefix-list UNDOPL", True),
               ("route-map UNDO permit 10", "set metric 42", True), (f"interface {port}", "bandwidth 1000", True)]
    delta = ConfigDelta(node=node, frr_changes=changes, frr=frr_lines(changes))
    before = lab.frr_daemon_configs(node)
    journal = jr.Journal(lab, "test")
    entry = journal.begin("t1", [jr.snapshot(lab, node, delta, capture_timeout_s=30)], holder="test", payload={})
    try:
        assert jr.run_script(lab, entry, node, entry.device(node).script, 60) is None
        assert "set metric 42" in lab.vtysh(node, "show running-config").stdout
        rep = jr.undo(lab, entry, capture_timeout_s=30, device_timeout_s=60)
        assert rep.complete, rep.residual()
    finally:
        journal.mark(entry, "rolled_back")
    after = lab.frr_daemon_configs(node)
    assert not frr_daemons_differ(before, after), {d: after.get(d) for d in frr_daemons_differ(before, after)}


def _empty_heads(conf: str) -> list[str]:
    """Stanza heads of an frr.conf with no line under them (a head followed at once by exit or !)."""
    lines = conf.splitlines()
    return [x for x, nxt in zip(lines, lines[1:], strict=False) if x.strip() and not x.startswith((" ", "!"))
            and x.strip() not in ("exit", "end") and nxt.strip() in ("exit", "!") and not x.startswith(("frr ", "hostname", "log ", "service ", "username "))]


async def test_a_removed_service_leaves_nothing_in_the_startup_configuration(lab: Lab, sc: Scenario, tmp_path: Path) -> None:
    """The forward path of a removal (issue 35): a site deleted from the records and reconciled goes
    from the PE's startup configuration too -- from each stanza of its port (a deployed frr.conf has
    the port's underlay stanza and its service stanza), with no empty stanza head left -- so a crash
    and restart of the PE's FRR daemons, which load that file, does not bring the deleted site's
    address back. (Before: the line stayed in the second stanza and came back with the restart.)"""
    from substrate.faults import restart_daemons
    from substrate.frr import STARTUP_CONFIG

    site = next(s for s in sc.all_sites() if s.id == SITE)
    addr = f"{site.prefix6.split('/')[0]}1/64"
    conf0 = lab.exec(site.pe, ["cat", STARTUP_CONFIG], timeout_s=10).stdout
    assert f" ipv6 address {addr}" in conf0, conf0
    srv = a3r(lab, tmp_path, reconciler=False)
    try:
        async with connect(srv) as c:
            fw = [f.id for f in sc.firewalls if f.tenant == site.tenant]
            for f in fw:  # its rules name the site: removed with it
                data(await c.call_tool("delete_record", {"service_class": "firewall_rule_set", "id": f}))
            data(await c.call_tool("delete_record", {"service_class": "tenant_site", "id": SITE}))
            cm = data(await c.call_tool("commit", {"message": f"decommission {SITE}"}))
        r = rc.Reconciler(lab, options=rc.EngineOptions(holder="test", **SLOW_MACHINE)).reconcile_once("commit")
        assert r.result == "applied" and status(lab).applied_commit == cm["commit"], (r.result, r.message)
    finally:
        srv.close()
    conf = lab.exec(site.pe, ["cat", STARTUP_CONFIG], timeout_s=10).stdout
    assert addr not in conf, conf
    assert _empty_heads(conf) == _empty_heads(conf0), (_empty_heads(conf), conf)
    assert lab.kill_daemon(site.pe, "zebra")
    restart_daemons(lab, site.pe, ["zebra"])
    poll("zebra answering", lambda: lab.vtysh(site.pe, "show running-config").ok, 60)
    running = lab.vtysh(site.pe, "show running-config").stdout
    assert addr not in running, running
    assert addr.split("/")[0] not in lab.exec(site.pe, ["ip", "-6", "addr", "show", "dev", site.pe_if], timeout_s=10).stdout


def test_held_lock_makes_the_reconciler_wait_and_retry(lab: Lab, sc: Scenario) -> None:
    """The held-lock fault on the drifted device: the reconcile waits (the engine's bounded lock
    wait), records ``retry`` naming the lock, and is retried; once the lock is released the drift
    is reverted (issue 13, item 2)."""
    from substrate.faults import Fault, clear, inject

    pe, route = site_route(lab, sc)
    pid = rc.start(lab, owner_pid=os.getpid(), interval_s=1.0, options={**SLOW_MACHINE, "lock_timeout_s": 1.0})
    locks: dict[str, Any] = {}
    f = Fault(id="f1", kind="held_lock", step=1, duration_steps=1, target={"node": pe})
    try:
        poll("the first reconcile", lambda: status(lab).reconciles >= 1)
        inject(lab, f, locks)
        words = route.split()
        lab.check([lab.exec(pe, ["ip", "-6", "route", "del", *words[: words.index("table") + 2]], timeout_s=10)])
        poll("a reconcile retried for the lock", lambda: any(r.result == "retry" and "lock" in r.message
                                                             for r in rc.read_log(lab, status(lab).epoch, 10)))  # fmt: skip
        assert not has(lab, pe, route)
        n = status(lab).reconciles
        poll("retried again", lambda: status(lab).reconciles >= n + 2)
        assert not has(lab, pe, route)  # nothing got past the held lock
        clear(lab, f, locks)
        poll("the drift reverted after the release", lambda: has(lab, pe, route))
        poll("the reconcile recorded", lambda: (r := rc.read_log(lab, status(lab).epoch, 1)) != [] and r[0].result != "retry")
    finally:
        clear(lab, f, locks)
        rc.stop(lab)
    assert not pid_alive(pid)


def test_daemon_killed_mid_reconcile_is_retried(lab: Lab, sc: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """isisd killed on the drifted router after the reconcile read the drift and before it
    repairs it (a daemon crash mid-reconcile): the reconcile does not die and does not record
    success; once the daemon is back (restarted as watchfrr would) the next reconcile converges
    with no drift left (issue 13, item 2)."""
    from substrate.faults import restart_daemons

    isis = breakage(sc, "isis_interface_removed")
    node, port = isis.detail["node"], isis.detail["interface"]
    rec = rc.Reconciler(lab, options=rc.EngineOptions(holder="test", **SLOW_MACHINE))
    assert rec.reconcile_once("start").result in ("in_sync", "drift_reverted")
    real = rec.engine.repair
    killed: list[bool] = []

    def repair(*a: Any, **kw: Any) -> Any:
        if not killed:
            killed.append(lab.kill_daemon(node, "isisd"))
        return real(*a, **kw)

    monkeypatch.setattr(rec.engine, "repair", repair)
    try:
        for step in isis.steps:
            lab.check([lab.exec(step.node, step.argv, timeout_s=20)])
        r = rec.reconcile_once("change")
        assert killed == [True]
        assert r.result in ("retry", "failed") and node in r.drift, r
        assert not isis_on(lab, node, port)
    finally:
        if lab.daemon_pid(node, "isisd") is None:
            restart_daemons(lab, node, ["isisd"])
    r = rec.reconcile_once("retry")
    assert r.result in ("drift_reverted", "in_sync"), r
    poll("the IS-IS line back", lambda: isis_on(lab, node, port), 60)
    assert not rec.drift_of(rec.engine.inventory()[0])


def test_reconciler_does_not_outlive_its_owner(lab: Lab) -> None:
    """A reconciler whose owner (the server that started it) dies exits by itself; one left running
    is stopped by the lab's controller clean-up (what Lab.destroy and harness lab cleanup call)."""
    import subprocess

    owner = subprocess.Popen(["sleep", "600"])
    try:
        pid = rc.start(lab, owner_pid=owner.pid, interval_s=60.0, options=SLOW_MACHINE)
        owner.kill()
        owner.wait()
        poll("the orphaned reconciler gone", lambda: not pid_alive(pid), 60)
        assert controllers.info(lab.dir, rc.CONTROLLER) is None
        pid = rc.start(lab, owner_pid=os.getpid(), interval_s=60.0, options=SLOW_MACHINE)
        # its record says how long a stop waits for its reconcile in progress (from the options it
        # runs with) and how what a kill would leave is recovered; the recovery runs (nothing to do)
        record = controllers.info(lab.dir, rc.CONTROLLER)
        assert record is not None and record["stop_timeout_s"] == rc.reconcile_bound_s(rc.EngineOptions(**SLOW_MACHINE)), record
        assert record["recover"][3:5] == [lab.name, "--recover"] and controllers.run_recovery(record) is None, record
        assert controllers.stop_all(lab.dir, orphans_only=True) == 0 and pid_alive(pid)
        assert controllers.stop_all(lab.dir) == 1 and not pid_alive(pid)
    finally:
        owner.kill()
        rc.stop(lab)


def a3r_call(rng: Any) -> tuple[str, dict[str, Any]]:
    """A random, mostly malformed A3-R tool call (never a valid mutation of the desired state)."""
    from tests.test_servers_fuzz import junk, junk_str, maybe_extra

    k = rng.random()
    cls = rng.choice(["tenant_site", "tenant", "floating_ip", "nosuch", "../x", junk_str(rng)[:30]])
    iid = rng.choice(["t1s1", "t3s9", "../../etc/passwd", "", "x" * 100, junk_str(rng)[:40]])
    if k < 0.05:
        return junk_str(rng)[:50], maybe_extra(rng, {})
    if k < 0.1:
        return "submit", {"note": rng.choice(["n" * rng.randint(4001, 9000), 5, [1], {"a": 1}])}
    if k < 0.25:
        return rng.choice(["list_records", "diff", "reconcile_status", "history"]), maybe_extra(
            rng, rng.choice([{}, {"service_class": cls}, {"limit": rng.choice([0, -1, 10**9, "x"])}]))
    if k < 0.35:
        return "read_record", maybe_extra(rng, {"service_class": cls, "id": iid})
    if k < 0.55:  # an invalid spec always: a junk value for a required field
        spec = {"tenant": "t3", "pe": "r2", "pe_interface": "eth5", "prefix6": junk(rng) if rng.random() < 0.9 else None}
        if rng.random() < 0.3:
            spec = junk(rng)
        return "write_record", maybe_extra(rng, {"service_class": cls, "id": iid, "spec": spec})
    if k < 0.7:
        return "patch_record", maybe_extra(rng, {"service_class": cls, "id": iid,
                                                  "patch": rng.choice([{"pe": junk(rng)}, {"prefix6": "zz"}, junk(rng)])})
    if k < 0.8:
        return "delete_record", maybe_extra(rng, {"service_class": rng.choice(["nosuch", junk_str(rng)[:30]]), "id": iid})
    if k < 0.88:
        return "commit", maybe_extra(rng, {"message": rng.choice(["", junk_str(rng), "m" * 3000, None, 5])})
    if k < 0.95:
        return "revert", maybe_extra(rng, {"commit": rng.choice(["HEAD", "zzzz", "-x", "--all", junk_str(rng)[:80], 3])})
    return "wait", maybe_extra(rng, {"seconds": rng.choice([-1, 1e9, "five", None, [1]])})


@pytest.mark.slow
async def test_fuzz_a3r(lab: Lab, tmp_path: Path) -> None:
    """1,000 random and malformed calls: the server never dies, results match their schemas, no
    desired-state mutation is accepted, no commit is made, the network is unchanged."""
    from tests.test_servers_fuzz import fuzz

    try:
        await fuzz(lab, tmp_path, "A3-R", a3r_call, mutating={"commit", "revert", "submit"})
        # the lab is at a fresh baseline (reset after each test): the server made the repository
        # again, and the baseline is its only commit
        assert Repo(lab).count() == 1
    finally:
        rc.stop(lab)


def a4_call(rng: Any) -> tuple[str, dict[str, Any]]:
    """A random, mostly malformed A4 tool call (never a valid change set: every op names a site that
    does not exist, or is malformed)."""
    from tests.test_servers_fuzz import junk, junk_str, maybe_extra

    k = rng.random()
    bad_op = rng.choice([{"op": "delete", "service_class": "tenant_site", "id": "t9s9"},
                         {"op": "modify", "service_class": "tenant_site", "id": "t9s8", "spec": {"pe": junk(rng)}},
                         {"op": "create", "service_class": rng.choice(["tenant_site", "nosuch", junk_str(rng)[:20]]),
                          "id": junk_str(rng)[:30], "spec": junk(rng)},
                         {"op": junk_str(rng)[:10], "service_class": "tenant", "id": "t1"}, junk(rng)])  # fmt: skip
    if k < 0.05:
        return junk_str(rng)[:50], maybe_extra(rng, {})
    if k < 0.1:
        return "submit", {"note": rng.choice(["n" * rng.randint(4001, 9000), 5, [1], {"a": 1}])}
    if k < 0.3:
        return rng.choice(["list_service_classes", "reconcile_status", "history", "get_change"]), maybe_extra(
            rng, rng.choice([{}, {"limit": rng.choice([0, -1, 10**9, "x"])}, {"change_id": junk_str(rng)[:30]}]))
    if k < 0.45:
        return rng.choice(["list_services", "get_service"]), maybe_extra(
            rng, {"service_class": rng.choice(["tenant_site", "x", junk_str(rng)[:20]]), "id": junk_str(rng)[:40],
                  "filter": rng.choice([None, junk(rng), {"tenant": "t1"}])})
    ops = rng.choice([[bad_op], [bad_op] * rng.randint(2, 60), bad_op, junk(rng), []])
    return rng.choice(["plan_change_set", "apply_change_set"]), maybe_extra(rng, {"ops": ops})


@pytest.mark.slow
async def test_fuzz_a4(lab: Lab, tmp_path: Path) -> None:
    """1,000 random and malformed A4 calls (issue 35): the server never dies, results match their
    schemas, no change set is applied, nothing is committed, the network is unchanged."""
    from tests.test_servers_fuzz import fuzz

    try:
        await fuzz(lab, tmp_path, "A4", a4_call, mutating={"apply_change_set", "submit"})
        assert Repo(lab).count() == 1
    finally:
        rc.stop(lab)


BIG = 1_000_000


def oversized(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Argument sets for a tool of input ``schema`` (issue 35, the attack): each parameter in turn
    given a 1 MB string, a 1 MB-keyed object, a 100,000-item list or a 10**30 number -- whichever
    its type is not, and the oversized value of its own type -- the rest left out; and one set with
    a 1 MB unexpected argument."""
    props = schema.get("properties", {})
    values = ["v" * BIG, {"k" * BIG: 1}, [0] * 100_000, 10**30]
    out = [{p: v} for p in props for v in values]
    out.append({"x" * BIG: "y" * BIG})
    return out


async def test_oversized_input_on_every_a3r_and_a4_tool_is_a_short_error(lab: Lab, tmp_path: Path) -> None:
    """Every tool of A3-R and of A4 given oversized arguments, one parameter at a time (a 1 MB string,
    a 1 MB key, a 100,000-item list, 10**30): each call is refused with an MCP error saying what was
    wrong in at most a few thousand characters, or answered within its schema; the server stays up;
    nothing is committed and no device changes. (Before: a 1 MB value of a record field or of a
    change set's spec was echoed whole, a 40,000-character error.)"""
    import jsonschema

    before = everything(lab)
    for level, make in (("A3-R", a3r), ("A4", a4)):
        srv = make(lab, tmp_path, reconciler=False)
        try:
            async with connect(srv) as c:
                tools = {t.name: t for t in (await c.list_tools()).tools}
                n0 = data(await c.call_tool("history", {}))["total"]
                for name, tool in sorted(tools.items()):
                    if name == "submit":
                        continue
                    for args in oversized(tool.input_schema):
                        r = await c.call_tool(name, args)
                        said = text(r)
                        assert len(said) <= 4000, (level, name, list(args), len(said), said[:300])
                        if r.is_error:
                            assert said.strip() and "internal error" not in said, (level, name, said[:300])
                        else:
                            jsonschema.validate(r.structured_content, tool.output_schema)
                assert data(await c.call_tool("history", {}))["total"] == n0, level
                assert len((await c.call_tool("list_service_classes" if level == "A4" else "list_records", {})).content) >= 1
        finally:
            srv.close()
    after = everything(lab)
    changed = {n: before[n].diff(after[n]) for n in before if not before[n].same_as(after[n])}
    assert not changed, changed


async def test_two_clients_on_two_servers_commit_at_once(lab: Lab, tmp_path: Path) -> None:
    """Two agents at once (issue 35, the attack): two A3-R servers on one lab, a client each, each
    renaming its own tenant and committing, four times, concurrently. The shared working tree and
    repository are serialized: no call fails but for "nothing to commit" (the other client's
    commit took the change along), no commit is lost or broken, and HEAD holds both last names."""
    import anyio

    srv1, srv2 = a3r(lab, tmp_path / "1", reconciler=False), a3r(lab, tmp_path / "2", reconciler=False)
    errors: list[str] = []
    try:
        async with connect(srv1) as c1, connect(srv2) as c2:
            n0 = data(await c1.call_tool("history", {}))["total"]

            async def agent(c: Any, tenant: str, tag: str) -> None:
                for i in range(4):
                    r = await c.call_tool("patch_record", {"service_class": "tenant", "id": tenant, "patch": {"name": f"{tag}{i}"}})
                    if r.is_error:
                        errors.append(text(r))
                    r = await c.call_tool("commit", {"message": f"{tenant} is {tag}{i}"})
                    if r.is_error and "nothing to commit" not in text(r):
                        errors.append(text(r))

            async with anyio.create_task_group() as tg:
                tg.start_soon(agent, c1, "t1", "a")
                tg.start_soon(agent, c2, "t2", "b")
            assert not errors, errors
            log = data(await c2.call_tool("history", {"limit": 20}))
            assert n0 < log["total"] <= n0 + 8, log
    finally:
        srv1.close()
        srv2.close()
    repo = Repo(lab)
    head = repo.desired_at("HEAD")
    assert head["tenant"]["t1"]["name"] == "a3" and head["tenant"]["t2"]["name"] == "b3", head["tenant"]
    assert repo.status() == []
    for c in repo.git("log", "--format=%H").split():
        assert repo.desired_at(c)["tenant"], c  # every commit holds valid records


async def test_a_revert_is_one_step_for_another_client(lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """revert holds the repository from its checkout to its commit (issue 35, two clients at once):
    another client's write issued while the revert has checked out the old records waits, and is
    neither swept into the revert commit nor lost -- it stays the working change. (Before: the lock
    was let go between the checkout and the commit, and the other client's record went into the
    commit named "revert to ...".) The revert's checkout is held open until the other write has
    landed in the working tree or a bound has passed; only the buggy path lets it land."""
    import threading

    import anyio

    from servers.a3_reconciled import server as a3r_server

    srv = a3r(lab, tmp_path, reconciler=False)
    real = a3r_server.check_message
    started = threading.Event()

    def held_open(message: str) -> None:
        # called by the revert's commit step, after its checkout: the point where the lock was let go
        real(message)
        if message.startswith("revert to "):
            started.set()
            t2 = Repo(lab).dir / "records" / "tenant" / "t2.yaml"  # read as a file: no lock taken
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and "name: other" not in t2.read_text():
                time.sleep(0.1)  # poll interval: the other client's write, if it can get in

    try:
        async with connect(srv) as c1, connect(srv) as c2:
            base = data(await c1.call_tool("history", {}))["commits"][0]["commit"]
            data(await c1.call_tool("patch_record", {"service_class": "tenant", "id": "t1", "patch": {"name": "renamed"}}))
            data(await c1.call_tool("commit", {"message": "rename t1"}))
            monkeypatch.setattr(a3r_server, "check_message", held_open)
            out: dict[str, Any] = {}

            async def revert() -> None:
                out["revert"] = data(await c1.call_tool("revert", {"commit": base[:10]}))

            async def other() -> None:
                await anyio.to_thread.run_sync(lambda: started.wait(60))
                out["write"] = data(await c2.call_tool("patch_record", {"service_class": "tenant", "id": "t2", "patch": {"name": "other"}}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(revert)
                tg.start_soon(other)
            assert started.is_set()
            log = data(await c1.call_tool("history", {"limit": 1}))["commits"][0]
            assert log["commit"] == out["revert"]["commit"] and log["files"] == ["M records/tenant/t1.yaml"], log
            assert data(await c1.call_tool("diff", {}))["changed"] == ["M records/tenant/t2.yaml"]
            data(await c1.call_tool("discard", {}))
    finally:
        srv.close()


# -- A4: typed intent recorded in the source of truth (same lab) ------------------------------------


def a4(lab: Lab, tmp_path: Path, **options: Any):  # noqa: ANN201
    from servers.a4_reconciled_intent.server import build_server

    opts = {**SLOW_MACHINE, "interval_s": 1.0, **options}
    return build_server(ServerConfig(lab=lab.name, trajectory=tmp_path / "t4.jsonl", devices="all", options=opts), lab=lab)


async def test_a4_apply_is_a_commit_and_applied(lab: Lab, tmp_path: Path) -> None:
    """An A4 apply_change_set is one commit (its message names the operations) that the network
    carries once the call returns; the same change set again changes nothing and commits nothing.
    The lab's reconciler runs beside it (the reconcile lock keeps them apart)."""
    srv = a4(lab, tmp_path)
    try:
        async with connect(srv) as c:
            n0 = data(await c.call_tool("history", {}))["total"]
            ops = [{"op": "delete", "service_class": "steering_policy", "id": POLICY}]
            res = data(await c.call_tool("apply_change_set", {"ops": ops}))
            assert res["status"] == "applied" and res["commit"] and res["revert_commit"] is None, res["message"]
            assert f"Committed to the source of truth as {res['commit'][:12]}; the devices carry it" in res["message"], res["message"]
            log = data(await c.call_tool("history", {}))
            assert log["total"] == n0 + 1
            assert log["commits"][0]["commit"] == res["commit"]
            assert log["commits"][0]["message"] == f"apply_change_set: delete steering_policy {POLICY}"
            assert log["commits"][0]["files"] == [f"D records/steering_policy/{POLICY}.yaml"]
            st = data(await c.call_tool("reconcile_status", {}))
            assert st["applied_commit"] == st["head"] == res["commit"], st
            inv, _ = Engine(lab).inventory()
            assert POLICY not in {x.id for x in inv.steering}
            # what a run record counts (harness.run): this epoch's reconciles, the apply's among them
            assert rc.counts(lab)[0] >= 1 and rc.counts(lab)[0] == status(lab).reconciles
            again = data(await c.call_tool("apply_change_set", {"ops": ops}))
            assert again["status"] == "no_change" and again["commit"] is None, again["message"]
            assert data(await c.call_tool("history", {}))["total"] == n0 + 1
            # malformed input: MCP errors, nothing committed
            for bad in ([{"op": "create", "service_class": "tenant_site", "spec": {"tenant": "t3", "prefix6": "nope"}}],
                        [{"op": "explode", "service_class": "tenant", "id": "t1"}], "not a list", [5],
                        [{"op": "delete", "service_class": "tenant_site", "id": "t9s9"}]):
                r = await c.call_tool("apply_change_set", {"ops": bad})
                assert r.is_error, (bad, text(r))
            r = await c.call_tool("apply_change_set", {"ops": [{"op": "create", "service_class": "tenant_site", "id": "t3s9",
                                                                "spec": {"tenant": "t3", "pe": "r2", "pe_interface": "eth5", "prefix6": "nope"}}]})
            assert r.is_error and "ops[0].spec.prefix6" in text(r), text(r)
            assert data(await c.call_tool("history", {}))["total"] == n0 + 1
    finally:
        srv.close()


async def test_an_a4_apply_keeps_an_a3r_clients_edits_and_its_pending_commit(lab: Lab, tmp_path: Path) -> None:
    """A3-R and A4 on one lab (issue 35, the reconciler attack's findings 6 and 7): an A4 apply
    wiped an A3-R client's uncommitted edits, and an A3-R commit not yet applied was silently
    undone by the next A4 commit (planned on what the network carried). Now the edits are set
    aside and put back (the A4 result says so), and a pending HEAD is reconciled first, so the
    A4 commit is made on top of it."""
    r3 = a3r(lab, tmp_path / "r", reconciler=False)
    r4 = a4(lab, tmp_path / "4", reconciler=False)
    try:
        async with connect(r3) as c3, connect(r4) as c4:
            data(await c3.call_tool("delete_record", {"service_class": "steering_policy", "id": POLICY}))
            assert data(await c3.call_tool("diff", {}))["changed"] == [f"D records/steering_policy/{POLICY}.yaml"]
            res = data(await c4.call_tool("apply_change_set", {"ops": [{"op": "modify", "service_class": "tenant", "id": "t1",
                                                                         "spec": {"name": "renamed"}}]}))  # fmt: skip
            assert res["status"] == "applied", res["message"]
            assert "working change" in res["message"] and "put back" in res["message"], res["message"]
            assert data(await c3.call_tool("diff", {}))["changed"] == [f"D records/steering_policy/{POLICY}.yaml"]
            pending = data(await c3.call_tool("commit", {"message": f"remove {POLICY}"}))
            res = data(await c4.call_tool("apply_change_set", {"ops": [{"op": "modify", "service_class": "tenant", "id": "t1",
                                                                         "spec": {"name": "again"}}]}))  # fmt: skip
            assert res["status"] == "applied", res["message"]
            log = data(await c4.call_tool("history", {"limit": 3}))["commits"]
            assert [x["commit"] for x in log[1:2]] == [pending["commit"]], log
            assert log[0]["files"] == ["M records/tenant/t1.yaml"], log[0]
            inv, _ = Engine(lab).inventory()
            assert POLICY not in {x.id for x in inv.steering} and inv.tenant("t1").name == "again"
    finally:
        r3.close()
        r4.close()


A4_CHILD = """
import sys, anyio
from pathlib import Path
from mcp import Client
from servers.common import ServerConfig
from servers.a4_reconciled_intent.server import build_server
lab, traj = sys.argv[1], sys.argv[2]
async def main():
    srv = build_server(ServerConfig(lab=lab, trajectory=Path(traj), devices="all",
                                    options={"interval_s": 1.0, "capture_timeout_s": 30.0, "device_timeout_s": 60.0}))
    async with Client(srv, mode="legacy") as c:
        print("ready", flush=True)
        await c.call_tool("apply_change_set", {"ops": [{"op": "delete", "service_class": "steering_policy", "id": sys.argv[3]}]})
anyio.run(main)
"""


async def test_a4_server_killed_mid_apply_then_a_new_server_converges(lab: Lab, tmp_path: Path) -> None:
    """kill -9 of the A4 server itself in the middle of apply_change_set (issue 35, the attack: at A4
    the apply runs in the server, not in the reconciler): its commit is in the history and its
    transaction journaled half-applied; its reconciler exits with its owner. The next A4 server's
    reconciler undoes the transaction and applies HEAD: the network carries the commit, nothing
    is left half-applied, every invariant holds, and a second reconciler never runs."""
    import subprocess
    import sys

    from tests.conftest import REPO

    eng = Engine(lab)
    repo = Repo(lab)
    out = tmp_path / "child.log"
    with open(out, "w") as log_:
        child = subprocess.Popen([sys.executable, "-c", A4_CHILD, lab.name, str(tmp_path / "child.jsonl"), POLICY], cwd=REPO,
                                 stdout=log_, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        poll("the A4 apply journaled", lambda: bool(eng.journal.unfinished()) or child.poll() is not None, 180)
        assert child.poll() is None, out.read_text()
        rpid = int(controllers.info(lab.dir, rc.CONTROLLER)["pid"])  # type: ignore[index]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    head = repo.head()
    assert head is not None and repo.git("log", "-1", "--format=%s").strip() == f"apply_change_set: delete steering_policy {POLICY}"
    assert eng.journal.unfinished()  # cut half-way
    poll("its reconciler gone with its owner", lambda: not pid_alive(rpid), 60)
    srv = a4(lab, tmp_path)
    try:
        poll("HEAD applied by the new server's reconciler", lambda: status(lab).applied_commit == head, 240)
        assert not eng.journal.unfinished()
        async with connect(srv) as c:
            st = data(await c.call_tool("reconcile_status", {}))
            assert st["head"] == st["applied_commit"] == head and st["failed_commit"] is None, st
        inv, _ = eng.inventory()
        assert POLICY not in {x.id for x in inv.steering}
        bad = [v for v in observe(lab, inv.invariants) if not v.ok]
        assert not bad, bad[:3]
        mine = [p for p in Path("/proc").glob("[0-9]*") if "servers.a3_reconciled.reconciler " in (cl := _cmdline(p))
                and f" {lab.name} " in cl and pid_alive(int(p.name))]  # fmt: skip
        assert len(mine) == 1, [_cmdline(p) for p in mine]
    finally:
        srv.close()


async def test_a4_failed_validation_is_reverted_in_history_and_on_devices(lab: Lab, sc: Scenario, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A change set whose (deliberately wrong) rendering removes another tenant's route fails active
    validation: it is rolled back on the devices, and the history keeps the change's commit and its
    revert; HEAD's records are the previous ones and every device equals its previous state."""
    key = damage_other_tenant(monkeypatch, sc)
    before = everything(lab)
    srv = a4(lab, tmp_path, reconciler=False)
    repo = Repo(lab)
    try:
        async with connect(srv) as c:
            base = data(await c.call_tool("history", {}))["commits"][0]["commit"]
            ops = [{"op": "create", "service_class": "tenant_site", "id": "t3s3",
                    "spec": {"tenant": "t3", "pe": "r6", "pe_interface": "eth4", "prefix6": "auto"}}]
            res = data(await c.call_tool("apply_change_set", {"ops": ops}))
            assert res["status"] == "rolled_back", res["message"]
            assert res["commit"] and res["revert_commit"] and f"reverted by commit {res['revert_commit'][:12]}" in res["message"]
            # A3-T's "Nothing was committed" is false here (a commit was made, then reverted): the devices are named instead
            assert "Nothing was committed" not in res["message"] and "No device change was kept" in res["message"], res["message"]
            assert key in {f["id"] for f in res["validation"]["failed"]}
            log = data(await c.call_tool("history", {"limit": 3}))["commits"]
            assert [x["commit"] for x in log] == [res["revert_commit"], res["commit"], base]
            assert log[1]["message"] == "apply_change_set: create tenant_site t3s3"
            assert log[0]["message"].startswith(f"revert {res['commit'][:12]}: not applied")
            st = data(await c.call_tool("reconcile_status", {}))
            assert st["applied_commit"] == st["head"] == res["revert_commit"], st
        assert repo.desired_at("HEAD") == repo.desired_at(base)
        assert "t3s3" in repo.desired_at(res["commit"])["tenant_site"]
    finally:
        srv.close()
    after = everything(lab)
    changed = {n: before[n].diff(after[n]) for n in before if not before[n].same_as(after[n])}
    assert not changed, changed


# -- the "reconciler down" notice in every result (A3-R and A4) --------------------------------------


async def test_reconciler_down_reaches_every_tool_result(lab: Lab, tmp_path: Path) -> None:
    """Killed with SIGKILL past its supervisor's bound (max_restarts=0), the reconciler is down, and
    every tool result of A3-R and of A4 says so -- in its structured result (``reconciler_down``:
    since when, how it died, restarts so far, that it is not restarted) and in its text, an error's
    text included; once a reconciler runs again, the notice is gone.

    Was a non-strict xfail (issue 13): after test_fuzz_a3r it failed, because the fuzz helper never
    closed its server, whose supervisor (5 restarts) restarted the reconciler the fuzz test stopped
    and again the one this test kills -- so none was down. The helper closes its server now; the
    first assertion below would see such a leftover supervisor's reconciler."""
    assert controllers.info(lab.dir, rc.CONTROLLER) is None, "a reconciler of an earlier test still runs"
    for level, make, tool, args, bad in (("A3-R", a3r, "list_records", {}, ("read_record", {"service_class": "tenant_site", "id": "t9s9"})),
                                         ("A4", a4, "list_service_classes", {}, ("get_service", {"id": "t9s9"}))):  # fmt: skip
        srv = make(lab, tmp_path, max_restarts=0)
        try:
            async with connect(srv) as c:
                assert "reconciler_down" not in data(await c.call_tool(tool, args)), level
                pid = int(controllers.info(lab.dir, rc.CONTROLLER)["pid"])  # type: ignore[index]
                os.kill(pid, signal.SIGKILL)
                poll("the supervisor seeing it down", lambda: (s := rc.read_supervisor(lab)) is not None and s.down, 30)
                r = await c.call_tool(tool, args)
                note = data(r)["reconciler_down"]
                # a reconciler another server of this lab started (the lab's one reconciler) is no child of
                # ours: its status cannot be known, and the notice says so instead of "exited with status 0"
                assert note["why"] in (f"killed by signal 9 (pid {pid})", f"ended (how cannot be known: this process did not start it) (pid {pid})") \
                    and note["restarts"] == 0, (level, note)
                assert note["will_restart"] is False and note["since"] <= time.time() and note["since_utc"], (level, note)
                assert len(note["message"]) <= rc.DOWN_NOTICE_CHARS and "will not restart it" in note["message"], note
                assert "The reconciler is down since" in text(r), (level, text(r))
                err = await c.call_tool(*bad)
                assert err.is_error and "[The reconciler is down since" in text(err), (level, text(err))
                st = data(await c.call_tool("reconcile_status", {}))
                assert st["reconciler_down"] == {**note, "message": st["reconciler_down"]["message"]} and not st["reconciler_running"]
                assert "The reconciler is down since" in st["summary"], st["summary"]
                rc.start(lab, owner_pid=os.getpid(), interval_s=1.0, options=SLOW_MACHINE)
                r = await c.call_tool(tool, args)
                assert "reconciler_down" not in data(r) and "reconciler is down" not in text(r), (level, text(r))
        finally:
            srv.close()
            rc.stop(lab)
