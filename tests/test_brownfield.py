"""Real-lab tests of the brownfield: deploy verification, non-vacuous invariants, exact reset,
faults and their clearing."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from substrate import Lab
from substrate.devstate import capture_many
from substrate.faults import Fault, FaultInjector, clear_all, draw_schedule
from substrate.locks import ConfigLockHeld
from substrate.paths import NETNS_PREFIX
from substrate.scenario import Invariant, Scenario, build, load_manifest
from substrate.scenario.deploy import ScenarioInvalid, deploy_scenario, load_baseline, reset
from substrate.scenario.layers.l3vpn import segs
from substrate.scenario.observer import observe
from tests.conftest import REPO, reachable, unique_name

pytestmark = pytest.mark.lab
SMALL = REPO / "tests" / "data" / "small-brownfield.yaml"


@pytest.fixture(scope="module")
def bf() -> Iterator[tuple[Lab, Scenario]]:
    sc = build(load_manifest(SMALL))
    lab = deploy_scenario(sc, unique_name("t-bf"))
    try:
        yield lab, sc
    finally:
        lab.destroy()


def failing(lab: Lab, invs: list[Invariant]) -> list[str]:
    return [v.id for v in observe(lab, invs) if not v.ok]


def test_deployed_scenario_passes_every_invariant_with_evidence(bf) -> None:
    lab, sc = bf
    verdicts = observe(lab, sc.invariants)
    assert [v.id for v in verdicts if not v.ok] == []
    assert len(verdicts) == len(sc.invariants) > 50
    v = next(v for v in verdicts if v.kind == "reach")
    assert v.evidence and v.evidence[0].command.startswith("ping") and v.evidence[0].exit_code == 0
    assert set(load_baseline(lab)) == set(lab.node_names())


# -- non-vacuity: break each kind's service on purpose, the invariant must fail -------------------


def _first(sc: Scenario, kind: str, pred: Callable[[Invariant], bool] = lambda i: True) -> Invariant:
    return next(i for i in sc.invariants if i.kind == kind and pred(i))


def _site_by_ce(sc: Scenario, ce: str):
    return next(s for s in sc.all_sites() if s.ce == ce)


def _site_by_addr(sc: Scenario, addr: str):
    return next(s for s in sc.all_sites() if s.prefix6.split("::")[0] in addr or (s.prefix4 and addr.startswith(s.prefix4.rsplit(".", 1)[0] + ".")))


def break_reach(lab: Lab, sc: Scenario) -> Invariant:
    inv = _first(sc, "reach", lambda i: i.params["family"] == 6 and i.service.startswith("l3vpn"))
    src = _site_by_ce(sc, inv.params["src"])
    dst = next(s for s in sc.tenant(src.tenant).sites if inv.params["dst"].startswith(s.prefix6.split("/")[0][:-1]))
    t = sc.tenant(src.tenant)
    lab.check([lab.exec(src.pe, ["ip", "-6", "route", "del", dst.prefix6, "table", str(t.table)])])
    return inv


def break_isolated(lab: Lab, sc: Scenario) -> Invariant:
    inv = _first(sc, "isolated")
    a_site = _site_by_ce(sc, inv.params["src"])
    b_site = sc.site(inv.id.rsplit("-x-", 1)[1])  # id: l3vpn/<t>/isolated/<src site>-x-<other tenant's site>
    ta, tb = sc.tenant(a_site.tenant), sc.tenant(b_site.tenant)

    def leak(pe: str, table: int, prefix: str, to_site, to_tenant) -> None:
        if to_site.pe == pe:
            argv = ["ip", "-6", "route", "replace", prefix, "table", str(table), "dev", to_site.pe_if]
        else:
            argv = ["ip", "-6", "route", "replace", prefix, "table", str(table), "encap", "seg6", "mode", "encap.red",
                    "segs", segs(sc, to_site.pe, to_tenant.dt6_functions[to_site.pe]), "dev", "sr0"]
        lab.check([lab.exec(pe, argv)])

    leak(a_site.pe, ta.table, b_site.prefix6, b_site, tb)  # A can send to B's site
    leak(b_site.pe, tb.table, a_site.prefix6, a_site, ta)  # and B's replies come back
    return inv


def break_isolated_v4(lab: Lab, sc: Scenario) -> Invariant:
    """The IPv4 twin: leak the two sites' IPv4 prefixes into each other's tables (End.DX4)."""
    inv = _first(sc, "isolated", lambda i: i.params["family"] == 4)
    a_site = _site_by_ce(sc, inv.params["src"])
    b_site = sc.site(inv.id.rsplit("-x-", 1)[1].removesuffix("/4"))
    ta, tb = sc.tenant(a_site.tenant), sc.tenant(b_site.tenant)

    def leak(pe: str, table: int, to_site) -> None:  # noqa: ANN001
        if to_site.pe == pe:
            argv = ["ip", "-4", "route", "replace", to_site.prefix4, "table", str(table), "dev", to_site.pe_if]
        else:
            argv = ["ip", "-4", "route", "replace", to_site.prefix4, "table", str(table), "encap", "seg6", "mode",
                    "encap.red", "segs", segs(sc, to_site.pe, to_site.dx4_function), "dev", "sr0"]
        lab.check([lab.exec(pe, argv)])

    leak(a_site.pe, ta.table, b_site)  # A can send to B's site
    leak(b_site.pe, tb.table, a_site)  # and B's replies come back
    return inv


def break_steering(lab: Lab, sc: Scenario) -> Invariant:
    inv = _first(sc, "steered_path")
    p = sc.steering[0]
    t, dst = sc.tenant(p.tenant), sc.site(p.dst_site)
    lab.check([lab.exec(p.ingress_pe, ["ip", "-6", "route", "replace", dst.prefix6, "table", str(t.table), "metric", "1024",
                                       "encap", "seg6", "mode", "encap.red", "segs", segs(sc, dst.pe, t.dt6_functions[dst.pe]),
                                       "dev", "sr0"])])
    return inv


def break_fw_deny(lab: Lab, sc: Scenario) -> Invariant:
    inv = _first(sc, "tcp_verdict", lambda i: i.params["expect"] == "deny")
    dst = _site_by_addr(sc, inv.params["dst"])
    lab.check([lab.exec(dst.pe, ["nft", "delete", "table", "inet", "tenant_fw"])])
    return inv


def break_fw_allow(lab: Lab, sc: Scenario) -> Invariant:
    inv = _first(sc, "tcp_verdict", lambda i: i.params["expect"] == "allow")
    dst = _site_by_addr(sc, inv.params["dst"])
    lab.check([lab.exec(dst.pe, ["nft", "insert", "rule", "inet", "tenant_fw", "forward", "tcp", "dport",
                                 str(inv.params["port"]), "drop"])])
    return inv


def break_adjacency(lab: Lab, sc: Scenario) -> Invariant:
    inv = _first(sc, "isis_adjacency")
    lab.check([lab.exec(inv.params["node"], ["ip", "link", "set", inv.params["interface"], "down"])])
    return inv


def break_sid(lab: Lab, sc: Scenario) -> Invariant:
    inv = _first(sc, "sid_bound", lambda i: i.params["action"] == "End.DT6")
    lab.check([lab.exec(inv.params["node"], ["ip", "-6", "route", "del", inv.params["sid"]])])
    return inv


def break_fib(lab: Lab, sc: Scenario) -> Invariant:
    inv = _first(sc, "fib_has")
    assert lab.kill_daemon(inv.params["node"], "isisd")
    return inv


def break_nat(lab: Lab, sc: Scenario) -> Invariant:
    inv = _first(sc, "nft_rule")
    lab.check([lab.exec(inv.params["node"], ["nft", "delete", "table", "ip", "fip"])])
    return inv


@pytest.mark.parametrize("breaker", [break_reach, break_isolated, break_isolated_v4, break_steering, break_fw_deny, break_fw_allow,
                                     break_adjacency, break_sid, break_fib, break_nat], ids=lambda f: f.__name__)
def test_breaking_a_service_fails_its_invariant_and_reset_repairs_it(bf, breaker) -> None:
    lab, sc = bf
    inv = breaker(lab, sc)
    if inv.kind in ("isis_adjacency", "fib_has"):
        # control-plane failures show after the IS-IS hold time (3 s); poll, bounded
        import time

        deadline = time.monotonic() + 15
        while not failing(lab, [inv]) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert failing(lab, [inv]) == [inv.id], f"{inv.id} did not notice {breaker.__name__}"
    rep = reset(lab)
    assert rep.exact, rep.residual
    bad = [v for v in observe(lab, sc.invariants) if not v.ok]
    assert bad == [], [(v.id, v.detail, [e.output for e in v.evidence], rep.stages) for v in bad]


# -- reset ----------------------------------------------------------------------------------


def test_reset_puts_several_mutated_nodes_back_exactly(bf) -> None:
    lab, sc = bf
    base = load_baseline(lab)
    t = sc.tenants[0]
    s = t.sites[0]
    other_link = next(lk for lk in lab.topology.core_links() if s.pe not in (lk.a.node, lk.b.node))
    lab.check([
        lab.sh(s.pe, f"ip -6 route flush table {t.table}; ip -6 rule flush; nft flush ruleset; ip link del sr0"),
        lab.vtysh(s.pe, "configure terminal", "router isis CORE", "no metric-style"),
        lab.sh(s.ce, f"ip addr flush dev {s.ce_if}"),
        lab.exec(other_link.a.node, ["ip", "link", "del", other_link.a.interface]),  # a veth gone from both ends
        lab.sh("r5", "ip -6 route add 2001:db8:1::/64 dev sr0; sysctl -qw net.ipv6.conf.all.forwarding=0"),
    ])
    rep = reset(lab)
    assert rep.exact, rep.residual
    assert f"{other_link.a}--{other_link.b}" in rep.repaired_links
    assert {r.node for r in rep.restored} >= {s.pe, s.ce, "r5"}
    now = capture_many(lab)
    assert [n for n in lab.node_names() if not now[n].same_as(base[n])] == []
    assert failing(lab, sc.invariants) == []
    # the PE's own traffic works again too (ip rule flush had removed the main-table rule)
    assert reachable(lab, s.pe, "fd00::5")


def test_reset_of_an_untouched_lab_changes_nothing(bf) -> None:
    lab, _ = bf
    rep = reset(lab)
    assert rep.restored == [] and rep.exact


def test_reset_kills_what_an_agent_left_running_and_keeps_frr(bf) -> None:
    lab, sc = bf
    s = sc.tenants[0].sites[0]
    pid_files = " ".join(f"/run/frr/{d}.pid" for d in lab.state(s.pe).daemons)
    daemons_before = lab.sh(s.pe, f"cat {pid_files}").stdout.split()
    # a background loop (as an A0 shell could leave) that keeps re-breaking the customer's circuit
    lab.check([lab.sh(s.pe, f"nohup sh -c 'while true; do ip link set {s.pe_if} down; sleep 0.2; done' "
                             ">/dev/null 2>&1 & echo $! > /run/frr/helper.pid; echo $! > /run/frr/bgpd.pid; "
                             "echo note > /tmp/notes.txt"),
               lab.sh(s.ce, "nohup sleep 1000 >/dev/null 2>&1 &")])
    rep = reset(lab)
    assert rep.exact, rep.residual
    assert {k.split(":")[0] for k in rep.killed_processes} == {s.pe, s.ce}
    assert any(k.endswith(":sh") for k in rep.killed_processes) and any(k.endswith(":sleep") for k in rep.killed_processes)
    # nothing but init and the FRR daemons is left in the PE, and the daemons are the same processes
    left = lab.sh(s.pe, 'for d in /proc/[0-9]*; do echo "${d#/proc/}"; done').stdout.split()
    assert len(set(left) - {"1"} - set(daemons_before)) == 1  # the listing shell itself
    assert lab.sh(s.pe, f"cat {pid_files}").stdout.split() == daemons_before
    assert failing(lab, sc.invariants) == []
    assert '"operstate":"UP"' in lab.exec(s.pe, ["ip", "-j", "link", "show", s.pe_if]).stdout  # not re-broken
    assert reset(lab).killed_processes == []
    # a PID file written by the agent protects nothing, and what it left in /tmp is gone
    assert lab.exec(s.pe, ["ls", "-A", "/tmp"]).stdout.strip() == ""
    lab.exec(s.pe, ["rm", "-f", "/run/frr/helper.pid", "/run/frr/bgpd.pid"])


def test_reset_puts_back_frr_files_a_write_memory_changed(bf) -> None:
    """Found by an audit: `write memory` left the change in /etc/frr/frr.conf, where the next
    daemon restart (a fault) would load it again in another run."""
    lab, sc = bf
    pe = sc.tenants[0].sites[0].pe
    before = lab.exec(pe, ["cat", "/etc/frr/frr.conf"]).stdout
    lab.check([lab.vtysh(pe, "configure terminal", "router isis CORE", "set-overload-bit", "end", "write memory")])
    assert "set-overload-bit" in lab.exec(pe, ["cat", "/etc/frr/frr.conf"]).stdout
    rep = reset(lab)
    assert rep.exact and f"{pe}:/etc/frr/frr.conf" in rep.frr_files_restored
    assert lab.exec(pe, ["cat", "/etc/frr/frr.conf"]).stdout == before
    assert "set-overload-bit" not in lab.vtysh(pe, "show running-config").stdout
    assert reset(lab).frr_files_restored == []


def test_cli_check_and_reset(bf) -> None:
    lab, sc = bf
    harness = [sys.executable, "-m", "harness.cli.__main__"]
    r = subprocess.run([*harness, "lab", "check", lab.name], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0 and f"{len(sc.invariants)}/{len(sc.invariants)} invariants pass" in r.stdout
    inv = break_sid(lab, sc)
    r = subprocess.run([*harness, "lab", "check", lab.name, "--failed"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1 and "FAIL" in r.stdout and inv.params["node"] in r.stdout
    r = subprocess.run([*harness, "lab", "reset", lab.name], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0 and "1 node(s) restored" in r.stdout, r.stdout + r.stderr


def test_scenario_with_a_failing_invariant_is_refused_and_nothing_is_left() -> None:
    sc = build(load_manifest(SMALL))
    bad = Invariant(id="bogus/reach", kind="reach", service="bogus",
                    params={"src": sc.all_sites()[0].ce, "dst": "fd10:dead::2", "family": 6})
    sc = sc.model_copy(update={"invariants": [*sc.invariants, bad]})
    name = unique_name("t-bad")
    with pytest.raises(ScenarioInvalid, match=r"1 baseline invariant\(s\) failed: bogus/reach"):
        deploy_scenario(sc, name)
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{NETNS_PREFIX}{name}-" not in out


# -- faults ---------------------------------------------------------------------------------


def test_fault_schedule_is_drawn_from_the_seed_alone() -> None:
    topo = build(load_manifest(SMALL)).topology
    a = draw_schedule(11, 0.3, 40, topo)
    assert a == draw_schedule(11, 0.3, 40, topo)
    assert a != draw_schedule(12, 0.3, 40, topo)
    assert draw_schedule(11, 0.0, 40, topo) == []
    assert 4 <= len(a) <= 25  # Bernoulli(0.3) over 40 steps: mean 12
    assert {f.kind for f in draw_schedule(5, 1.0, 60, topo)} == {"link_down", "loss", "freeze", "daemon_crash",
                                                                 "held_lock", "concurrent_writer", "latency",
                                                                 "pool_exhaustion"}
    with pytest.raises(ValueError, match="per agent step"):
        draw_schedule(1, 1.5, 10, topo)


def _one(kind: str, **target) -> FaultInjector:
    return Fault(id="f1", kind=kind, step=1, duration_steps=2, target=target)


def _loss(lab: Lab, node: str, iface: str) -> float:
    """Loss seen by the peer pinging ``node`` across the link: the replies leave through ``iface``
    (a sender's own egress drops are reported to it as send errors, not as loss)."""
    lk = next(lk for lk in lab.topology.links_of(node) if lk.endpoint_of(node).interface == iface)
    peer = lk.peer_of(node)
    out = lab.exec(node, ["ip", "-6", "-o", "addr", "show", "dev", iface, "scope", "link"]).stdout
    ll = out.split()[3].split("/")[0]
    r = lab.exec(peer.node, ["ping", "-6", "-n", "-q", "-c", "40", "-i", "0.01", "-W", "0.3", f"{ll}%{peer.interface}"],
                 timeout_s=20)
    import re

    m = re.search(r"([\d.]+)% packet loss", r.stdout)
    assert m, r.stdout + r.stderr
    return float(m.group(1))


def test_faults_take_effect_and_clear(bf) -> None:
    lab, sc = bf
    adj = _first(sc, "isis_adjacency")
    node, iface = adj.params["node"], adj.params["interface"]
    import time

    def until(pred, bound=15.0) -> bool:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.2)
        return False

    # link down: the adjacency drops, and comes back once cleared
    inj = FaultInjector(lab, [_one("link_down", node=node, interface=iface, peer=adj.params["neighbor"])])
    assert [e.action for e in inj.on_step(1)] == ["inject"]
    assert until(lambda: failing(lab, [adj]) == [adj.id])
    assert [e.action for e in inj.on_step(3)] == ["clear"]  # duration 2 steps
    assert until(lambda: failing(lab, [adj]) == [])
    # loss: most packets on that link are lost, none after clearing
    assert _loss(lab, node, iface) == 0
    inj = FaultInjector(lab, [_one("loss", node=node, interface=iface, percent=80)])
    assert [e.action for e in inj.on_step(1)] == ["inject"]
    assert _loss(lab, node, iface) >= 40
    inj.clear()
    assert _loss(lab, node, iface) == 0
    # freeze: the router's FRR stops answering; it answers again after
    inj = FaultInjector(lab, [_one("freeze", node="r5")])
    assert [e.action for e in inj.on_step(1)] == ["inject"]
    assert lab.vtysh("r5", "show version", timeout_s=2).timed_out
    inj.clear()
    assert lab.vtysh("r5", "show version").ok
    # daemon crash: isisd gone, then restarted with its configuration
    inj = FaultInjector(lab, [_one("daemon_crash", node="r5", daemon="isisd")])
    inj.on_step(1)
    assert lab.daemon_pid("r5", "isisd") is None
    inj.on_step(5)
    assert lab.daemon_pid("r5", "isisd") is not None
    assert "router isis CORE" in lab.vtysh("r5", "show running-config").stdout
    # held lock: ANI mutation paths cannot take the device's lock, then they can
    pe = sc.all_sites()[0].pe
    inj = FaultInjector(lab, [_one("held_lock", node=pe)])
    inj.on_step(1)
    with pytest.raises(ConfigLockHeld, match=r"locked by another session \(fault f1\)"):
        with lab.config_lock([pe], holder="test", timeout_s=0.3):
            pass
    inj.clear()
    with lab.config_lock([pe], holder="test", timeout_s=0.3):
        pass
    # concurrent writer: someone else's change appears in the device's configuration, then goes
    inj = FaultInjector(lab, [_one("concurrent_writer", node=pe)])
    inj.on_step(1)
    assert "2001:db8:ffff:1::/64 blackhole" in lab.vtysh(pe, "show running-config").stdout
    inj.clear()
    assert "2001:db8:ffff:1::/64" not in lab.vtysh(pe, "show running-config").stdout
    assert all(e.action != "error" for e in inj.events)
    lab.wait_converged(timeout_s=30)
    assert failing(lab, sc.invariants) == []


def _rtt_ms(lab: Lab, node: str, iface: str) -> float:
    """Mean round-trip time, in ms, of pings from ``node``'s peer to ``node`` across the link."""
    lk = next(lk for lk in lab.topology.links_of(node) if lk.endpoint_of(node).interface == iface)
    peer = lk.peer_of(node)
    ll = lab.exec(node, ["ip", "-6", "-o", "addr", "show", "dev", iface, "scope", "link"]).stdout.split()[3].split("/")[0]
    r = lab.exec(peer.node, ["ping", "-6", "-n", "-q", "-c", "5", "-i", "0.05", "-W", "2", f"{ll}%{peer.interface}"],
                 timeout_s=20)
    import re

    m = re.search(r"= [\d.]+/([\d.]+)/", r.stdout)
    assert m, r.stdout + r.stderr
    return float(m.group(1))


def _fault_routes(lab: Lab, node: str) -> int:
    from substrate.faults import FAULT_PROTOS

    return sum(len(lab.exec(node, ["ip", "-6", "route", "show", "table", "all", "proto", str(p)]).stdout.splitlines())
               for p in FAULT_PROTOS.values())


def test_latency_and_pool_exhaustion_take_effect_and_clear_even_after_a_crash(bf) -> None:
    from substrate import faults

    lab, sc = bf
    adj = _first(sc, "isis_adjacency")
    node, iface = adj.params["node"], adj.params["interface"]
    pe = sc.tenants[0].sites[0].pe
    assert _rtt_ms(lab, node, iface) < 50
    inj = FaultInjector(lab, [_one("latency", node=node, interface=iface, delay_ms=200),
                              Fault(id="f2", kind="pool_exhaustion", step=1, duration_steps=2,
                                    target={"node": pe, "pool": "functions"})])
    evs = inj.on_step(1)
    assert [e.action for e in evs] == ["inject", "inject"], evs
    assert 190 <= _rtt_ms(lab, node, iface) < 1000  # one way delayed: the replies leave through iface
    assert failing(lab, [adj]) == []  # IS-IS frames are not IP: the adjacency stays up
    functions = lab.exec(pe, ["ip", "-6", "route", "show", "proto", str(faults.FAULT_PROTOS["functions"])]).stdout
    assert _fault_routes(lab, pe) > 4000 and "seg6local action End" in functions and "none is left" in evs[1].detail
    assert [e.action for e in inj.on_step(3)] == ["clear", "clear"]
    assert _rtt_ms(lab, node, iface) < 50 and _fault_routes(lab, pe) == 0
    assert not faults._delay_pids(lab, inj.schedule[0])
    # both pools of one PE taken at once: clearing one leaves the other taken
    inj = FaultInjector(lab, [Fault(id=f"f{k}", kind="pool_exhaustion", step=1, duration_steps=d,
                                    target={"node": pe, "pool": pool})
                              for k, d, pool in ((3, 1, "tables"), (4, 2, "functions"))])
    assert [e.action for e in inj.on_step(1)] == ["inject", "inject"]
    assert [e.action for e in inj.on_step(2)] == ["clear"] and _fault_routes(lab, pe) > 4000
    assert [e.action for e in inj.on_step(3)] == ["clear"] and _fault_routes(lab, pe) == 0
    # the run crashed with both active: the delay line and the routes are left for reset to clear
    inj = FaultInjector(lab, [_one("latency", node=node, interface=iface, delay_ms=100),
                              Fault(id="f2", kind="pool_exhaustion", step=1, duration_steps=2,
                                    target={"node": pe, "pool": "tables"})])
    assert [e.action for e in inj.on_step(1)] == ["inject", "inject"]
    assert _fault_routes(lab, pe) == 100 and faults._delay_pids(lab, inj.schedule[0])
    crashed = dict(faults._DELAY_LINES)  # the injecting process is gone: nobody stops its delay line
    faults._DELAY_LINES.clear()
    del inj
    rep = reset(lab)
    assert all(p.wait(10) is not None for p in crashed.values())  # killed by the reset (reaped here)
    assert rep.exact and [n for n in rep.notes if n.startswith("fault")] == [
        f"fault a crashed run left cleared: {node} {iface}: delay removed",
        f"fault a crashed run left cleared: {pe}: pools.tables released"], rep.notes
    assert _rtt_ms(lab, node, iface) < 50 and _fault_routes(lab, pe) == 0
    assert not faults._delay_pids(lab, Fault(id="f1", kind="latency", step=1, duration_steps=1,
                                             target={"node": node, "interface": iface, "delay_ms": 100}))


def test_faults_left_by_a_crashed_run_are_cleared(bf) -> None:
    lab, sc = bf
    adj = _first(sc, "isis_adjacency")
    inj = FaultInjector(lab, [_one("link_down", node=adj.params["node"], interface=adj.params["interface"])])
    inj.on_step(1)
    del inj  # the run "crashed": nobody clears it
    assert "state DOWN" in lab.exec(adj.params["node"], ["ip", "link", "show", adj.params["interface"]]).stdout
    assert clear_all(lab)
    assert "state DOWN" not in lab.exec(adj.params["node"], ["ip", "link", "show", adj.params["interface"]]).stdout
    assert reset(lab).exact


def test_cleanup_clears_faults_a_crashed_run_left_on_a_kept_lab() -> None:
    import os

    name = unique_name("t-flt")
    code = (
        "import os; from substrate import Lab, Topology; from substrate.faults import Fault, FaultInjector; "
        f"lab = Lab.create(Topology.from_spec('line:2:nohosts'), {name!r}, detached=True); "
        "FaultInjector(lab, [Fault(id='f1', kind='link_down', step=1, duration_steps=5, "
        "target={'node': 'r1', 'interface': 'eth1'})]).on_step(1); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)
    lab = Lab.attach(name)
    try:
        assert "state DOWN" in lab.exec("r1", ["ip", "link", "show", "eth1"]).stdout
        r = subprocess.run([sys.executable, "-m", "harness.cli", "lab", "cleanup"], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
        said = " ".join(r.stdout.split())
        kept = said.split("kept running: ")[1].split(";")[0].split(", ")
        assert name in kept and "faults cleared: r1 eth1 up" in said, said
        assert "state DOWN" not in lab.exec("r1", ["ip", "link", "show", "eth1"]).stdout
        assert not (lab.dir / "faults.json").exists() and os.path.isdir(lab.dir)
    finally:
        lab.destroy()
