"""Task classes beyond site changes (issue 15 items 1-2): troubleshooting, steering, firewall and
floating-IP changes -- variants (pure), the scripted operator's planning (pure), and a small
real-lab sample on the shared campaign_lab (bench/task_classes.py runs every variant and level)."""

from __future__ import annotations

import pytest

from harness.agents.troubleshoot import (
    interface_blocks,
    isis_fix,
    nat_fix,
    rule_fixes,
    shadow_fixes,
    sid_fix,
    await_reconciled,
    tenant_table,
)
from harness.errors import AnibenchError
from harness.run import RunSpec, execute_run
from harness.tasks import TASK_CLASSES, TaskClass, make_variant, register_task, skipped_levels, variant_skips
from harness.troubleshooting import CATALOG
from substrate.scenario import build, load_manifest
from tests.conftest import REPO

MANIFEST = REPO / "tests" / "data" / "small-campaign.yaml"
NEW = ("troubleshooting", "steering-change", "firewall-change", "floating-ip-change")


def _sc():  # noqa: ANN202
    return build(load_manifest(MANIFEST), seed=7)


def test_registry_lists_every_class_and_refuses_a_second_of_a_name() -> None:
    assert set(NEW) <= set(TASK_CLASSES) and list(TASK_CLASSES)[:3] == ["onboarding", "change-set", "decommissioning"]
    with pytest.raises(AnibenchError, match="registered twice"):
        register_task(TaskClass(name="onboarding", prompt="", make=lambda *a: None))  # type: ignore[arg-type,return-value]
    with pytest.raises(AnibenchError, match="unknown task class 'nope'; known: onboarding"):
        make_variant("nope", _sc(), 0)
    assert skipped_levels("troubleshooting", ["A1+blocklist", "A3-T"]) == {"A3-T": TASK_CLASSES["troubleshooting"].inexpressible["A3-T"]}


def test_campaign_help_lists_every_registered_task_class(monkeypatch) -> None:
    """``harness campaign --help`` named three of the seven classes (new-user finding, issue 34):
    its ``--task`` help is read off the registry when shown, a class registered later included."""
    from typer.testing import CliRunner

    from harness.cli import app

    monkeypatch.setitem(TASK_CLASSES, "late-class", TaskClass(name="late-class", prompt="", make=lambda *a: None))  # type: ignore[arg-type,return-value]
    res = CliRunner().invoke(app, ["campaign", "--help"], env={"COLUMNS": "200"})
    words = " ".join(w for w in res.output.split() if w != "\u2502")
    assert res.exit_code == 0, res.output
    assert f"Task class: {', '.join(TASK_CLASSES)}; or a protocol template" in words


@pytest.mark.parametrize("task_class", NEW)
def test_variants_are_deterministic_hidden_and_split(task_class: str) -> None:
    sc = _sc()
    a, b = make_variant(task_class, sc, 0), make_variant(task_class, _sc(), 0)
    assert a == b and a.prompt == make_variant(task_class, sc, 1).prompt == TASK_CLASSES[task_class].prompt
    assert a.test_cases and a.damage_checks
    blob = a.prompt + "".join(a.files.values())
    assert not any(tc.id in blob for tc in a.test_cases)
    ids = [i.id for i in a.test_cases] + [i.id for i in a.damage_checks]
    assert len(ids) == len(set(ids))  # a check is a test case or a damage check, never both


def test_troubleshooting_covers_the_catalog_and_tells_only_the_symptom() -> None:
    sc = _sc()
    vs = [make_variant("troubleshooting", sc, v) for v in range(len(CATALOG))]
    assert [v.breakage["kind"] for v in vs] == list(CATALOG)
    for v in vs:
        assert v.setup, v.breakage  # the breakage is applied by the harness, out of band
        req = v.files["request.yaml"]
        # the report names no cause: no command, SID, rule, protocol or breakage kind
        for word in ("seg6", "rule", "isis", "nft", "dnat", "fcbb", "ip ", "table", v.breakage["kind"]):
            assert word not in req.lower(), (word, req)
    sid = vs[0].breakage["sid"]
    # an invariant about the broken SID is a test case whatever its service (here: addressing's)
    assert any(i.params.get("sid") == sid for i in vs[0].test_cases)
    assert not any(i.params.get("sid") == sid for i in vs[0].damage_checks)
    # the reconciler reverts every breakage of the catalog (issue 13): no level skips one
    assert all(variant_skips(v, ["A0", "A1", "A3-R", "A4"]) == {} for v in vs), [v.breakage["no_reference"] for v in vs]


def test_steering_firewall_floating_variants_state_the_change() -> None:
    sc = _sc()
    st = [make_variant("steering-change", sc, v) for v in (0, 1)]
    assert [v.ops[0]["op"] for v in st] == ["create", "modify"]
    # the path over IPv6, and over IPv4 where the sites carry it (issue 19)
    # (beside the SID and table checks of what the change adds on the waypoint and the ingress PE)
    paths = [{t.params["family"] for t in v.test_cases if t.kind == "steered_path"} for v in st]
    assert all(6 in p for p in paths) and {4, 6} in paths, paths
    assert all({t.kind for t in v.test_cases} <= {"steered_path", "sid_bound", "table_routes", "local_sids"} for v in st)
    fw = make_variant("firewall-change", sc, 0)
    got = {(t.params["expect"], t.params["family"]) for t in fw.test_cases if t.id.startswith("task/")}
    assert {("allow", 6), ("deny", 6), ("allow", 4)} <= got
    fips = [make_variant("floating-ip-change", sc, v) for v in (0, 1)]
    assert [v.ops[0]["op"] for v in fips] == ["create", "modify"]
    assert all(any(t.kind == "reach_at" for t in v.test_cases) for v in fips)


# -- the scripted operator's troubleshooting plans (pure) -------------------------------------------


def test_shadowing_drop_rules_are_found_and_the_policy_is_kept() -> None:
    listing = """table inet tenant_fw {
	chain t1 { # handle 3
		ip daddr 10.0.0.0/24 tcp dport 3306 drop # handle 9
		ip6 daddr fd10::/64 tcp dport 3306 drop # handle 8
		ip6 saddr fd10:0:0:4::/64 ip6 daddr fd10::/64 tcp dport 3306 accept # handle 4
		ip6 daddr fd10::/64 tcp dport 3306 drop # handle 5
		ip daddr 10.0.0.0/24 tcp dport 3306 drop # handle 6
	}
}"""
    flows = [(6, "fd10:0:0:4::2", "fd10::2")]
    assert shadow_fixes(listing, "t1", flows, 3306) == ["nft delete rule inet tenant_fw t1 handle 8"]
    # an IPv4 copy ahead of the policy's own drop goes; the policy's drop stays
    assert shadow_fixes(listing, "t1", [(4, None, "10.0.0.2")], 3306) == ["nft delete rule inet tenant_fw t1 handle 9"]
    # a flow the policy drops is left alone
    assert shadow_fixes(listing, "t1", [(6, "fd10:0:0:9::2", "fd10::2")], 3306) == ["nft delete rule inet tenant_fw t1 handle 8"]
    assert shadow_fixes(listing.replace("# handle 8", "# handle 8x"), "t1", [(6, "fd10:0:0:9::2", "fd10::2")], 3306) == []


def test_nat_rule_sid_rule_and_isis_repairs() -> None:
    nat = """table ip fip { # handle 2
	chain prerouting_dnat { # handle 2
		type nat hook prerouting priority dstnat; policy accept;
		iifname "eth7" ip daddr 198.51.100.10 dnat to 10.0.1.2 # handle 5
	}
}"""
    assert nat_fix(nat, "198.51.100.10", "10.0.0.2") == (
        "nft replace rule ip fip prerouting_dnat handle 5 iifname eth7 ip daddr 198.51.100.10 dnat to 10.0.0.2")
    assert nat_fix(nat, "198.51.100.10", "10.0.1.2") is None
    main = [{"dst": "fcbb:bb00:4:e000::/64", "encap": "seg6local", "action": "End"}]
    assert sid_fix("r4", 0xE000, 101, main) == (
        "ip -6 route replace fcbb:bb00:4:e000::/64 metric 1024 encap seg6local action End.DT6 table 101 count dev sr0")
    main[0].update(action="End.DT6", table="101")
    assert sid_fix("r4", 0xE000, 101, main) is None
    assert rule_fixes("r9", {"eth3": True}, 100, [], [{"iif": "eth3", "table": "100"}]) == [
        "ip -6 rule add priority 1000 iif eth3 lookup 100"]
    mine = interface_blocks("interface eth3\n description to r7\nexit\n!\n")
    theirs = interface_blocks("interface eth1\n description to r4\n ipv6 router isis CORE\n isis network point-to-point\nexit\n")
    assert isis_fix("r4", mine, "r7", theirs) == ["interface eth3", "ipv6 router isis CORE", "isis network point-to-point", "exit"]
    assert isis_fix("r7", theirs, "r4", mine) == []


def test_the_tenant_table_is_read_off_each_pes_own_ports() -> None:
    # t5's sites: s1 on r2 eth5, s2 on r3 eth4; on r2, eth4 is t1's circuit (table 101): a port
    # name means a circuit only on its own PE (troubleshooting variant 4 wrote t5's prefix into 101)
    sites = {"t5s1": {"site": "t5s1", "pe": "r2", "pe_port": "eth5"}, "t5s2": {"site": "t5s2", "pe": "r3", "pe_port": "eth4"}}
    rules6 = {"r2": [{"priority": 1000, "iif": "eth4", "table": "101"}, {"priority": 1000, "iif": "eth5", "table": "105"}],
              "r3": [{"priority": 1000, "iif": "eth4", "table": "105"}]}
    assert tenant_table(sites, rules6) == 105
    assert tenant_table(sites, {"r2": rules6["r2"][:1], "r3": []}) is None  # only another tenant's eth4 on r2


@pytest.mark.anyio
async def test_the_wait_for_the_reconcilers_repair_is_bounded_by_time_and_spaced() -> None:
    from harness.agents.base import Reply

    class Status:  # reconcile_status on a fake clock: in sync from ``at`` seconds on
        def __init__(self, at: float) -> None:
            self.now, self.at, self.calls, self.pauses = 0.0, at, 0, []

        async def call(self, name: str, args: dict) -> Reply:
            assert name == "reconcile_status"
            self.calls += 1
            ok = self.now >= self.at
            return Reply(ok=True, text="", data={"in_sync": ok, "recent": [{"result": "drift_reverted"}] if ok else []})

        async def sleep(self, s: float) -> None:
            self.pauses.append(s)
            self.now += s

    # a repair of ~60 s (the reconciler's pre-check pings the broken tenant until timeout) is waited for
    st = Status(at=61.0)
    assert await await_reconciled(st, clock=lambda: st.now, sleep=st.sleep)  # type: ignore[arg-type]
    assert st.calls == 8 and st.pauses == [10.0] * 7
    # never in sync: 300 s, polls 10 s apart, one last poll at the bound (31 calls: inside 40 steps)
    st = Status(at=float("inf"))
    assert not await await_reconciled(st, clock=lambda: st.now, sleep=st.sleep)  # type: ignore[arg-type]
    assert st.now == 300.0 and st.calls == 31 and set(st.pauses) == {10.0}
    st = Status(at=float("inf"))
    assert not await await_reconciled(st, timeout_s=25.0, clock=lambda: st.now, sleep=st.sleep)  # type: ignore[arg-type]
    assert st.pauses == [10.0, 10.0, 5.0] and st.calls == 4


# -- the scripted operator's firewall and floating-IP splice (pure) ---------------------------------


def test_a_shared_table_gets_the_rendering_difference_and_keeps_other_tenants() -> None:
    from harness.agents.service_devices import NftTable, nft_commands, nft_splice, nft_text

    device = NftTable.parse("inet tenant_fw", """table inet tenant_fw { # handle 4
	chain forward { # handle 1
		type filter hook forward priority filter; policy accept;
		oifname "eth3" jump t1 # handle 5
		oifname "eth4" jump t2 # handle 6
	}
	chain t1 { # handle 2
		ip6 daddr fd10::/64 tcp dport 22 drop # handle 7
	}
	chain t2 { # handle 3
		ip6 daddr fd20::/64 tcp dport 80 drop # handle 8
	}
}""")
    assert device.handles == {"forward": [5, 6], "t1": [7], "t2": [8]}
    head = "table inet tenant_fw {\n\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n"
    before = head + '\t\toifname "eth3" jump t1\n\t}\n\tchain t1 {\n\t\tip6 daddr fd10::/64 tcp dport 22 drop\n\t}\n}\n'
    after = head + ('\t\toifname "eth3" jump t1\n\t}\n\tchain t1 {\n\t\tip6 saddr fd11::/64 ip6 daddr fd10::/64 tcp dport 80 accept\n'
                    '\t\tip6 daddr fd10::/64 tcp dport 22 drop\n\t\tip6 daddr fd10::/64 tcp dport 80 drop\n\t}\n}\n')
    new = nft_splice(device.table, before, after, "inet tenant_fw")
    chains = {c["name"]: c["rules"] for c in new["chains"]}
    assert chains["t2"] == ["ip6 daddr fd20::/64 tcp dport 80 drop"]  # the other tenant's chain is kept
    assert chains["t1"] == ["ip6 saddr fd11::/64 ip6 daddr fd10::/64 tcp dport 80 accept", "ip6 daddr fd10::/64 tcp dport 22 drop",
                            "ip6 daddr fd10::/64 tcp dport 80 drop"]  # in the rendering's order
    assert 'oifname "eth4" jump t2' in nft_text("inet tenant_fw", new)
    assert nft_commands(device, new) == [
        "nft insert rule inet tenant_fw t1 position 7 ip6 saddr fd11::/64 ip6 daddr fd10::/64 tcp dport 80 accept",
        "nft add rule inet tenant_fw t1 ip6 daddr fd10::/64 tcp dport 80 drop"]
    # the rule the after-rendering drops goes, by handle; a table left empty goes
    assert nft_commands(device, nft_splice(device.table, after, before, "inet tenant_fw")) == []
    gone = nft_splice(nft_splice(None, None, before, "inet tenant_fw"), before, None, "inet tenant_fw")
    assert gone is None
    moved = nft_splice(device.table, before, before.replace("dport 22", "dport 23"), "inet tenant_fw")
    assert nft_commands(device, moved) == ["nft delete rule inet tenant_fw t1 handle 7",
                                           "nft add rule inet tenant_fw t1 ip6 daddr fd10::/64 tcp dport 23 drop"]


def _facts_of(cfg):  # noqa: ANN001, ANN202 - a rendering's rules and SIDs as iproute2 JSON shows them
    from harness.agents.scripted import PeFacts

    def rule(line: str) -> dict:
        w = line.split()
        d = {"priority": int(w[1]), "table": w[w.index("lookup") + 1]}
        for k, key in (("iif", "iif"), ("fwmark", "fwmark"), ("to", "dst")):
            if k in w:
                d[key] = w[w.index(k) + 1]
        return d

    routes6 = []
    for line in cfg.routes6:
        w = line.split()
        if "seg6local" in w:
            d = {"dst": w[0], "encap": "seg6local", "action": w[w.index("action") + 1]}
            for k in ("table", "nh4"):
                if k in w:
                    d[k] = w[w.index(k) + 1]
            routes6.append(d)
    return PeFacts(rules6=[rule(x) for x in cfg.rules6], routes6=routes6, rules4=[rule(x) for x in cfg.rules4])


def test_the_device_level_firewall_and_floating_plans_follow_the_layers_rendering() -> None:
    """The A0-A2 derivation, fed with what the scenario's rendering puts on the devices, asks for
    exactly what the A3-T planner's device delta asks for in the tables and routes it touches."""
    from harness.agents.service_devices import (FIP_TABLE, FW_TABLE, HAIRPIN_TABLE, Border, NftTable, find_border,
                                                plan_firewall, plan_floating)
    from harness.service_tasks import expected_after
    import csv
    import io

    import yaml

    sc = _sc()
    for name, v in (("firewall-change", 0), ("floating-ip-change", 0), ("floating-ip-change", 1)):
        tv = make_variant(name, sc, v)
        req = yaml.safe_load(tv.files["request.yaml"])
        sites = list(csv.DictReader(io.StringIO(tv.files["sites.csv"])))
        after, _ = expected_after(sc, tv.ops)
        want = {n: after.node_config.get(n) for n in after.node_config}
        if name == "firewall-change":
            tables = {pe: NftTable.parse(FW_TABLE, sc.node_config[pe].nft.get(FW_TABLE, "")) for pe in {s["pe"] for s in sites}}
            got = plan_firewall(req, sites, tables)
            for pe, d in got.items():
                assert d.nft[FW_TABLE].split() == want[pe].nft[FW_TABLE].split(), pe
            continue
        facts = {n: _facts_of(c) for n, c in sc.node_config.items() if n.startswith("r")}
        pe, dx4, nh4 = find_border(facts)
        assert pe == sc.external.border_pe
        fip = NftTable.parse(FIP_TABLE, sc.node_config[pe].nft.get(FIP_TABLE, ""))
        # every PE of the tenant's IPv4 sites translates the address (issue 36)
        hairpins = {p: NftTable.parse(HAIRPIN_TABLE, sc.node_config[p].nft.get(HAIRPIN_TABLE, ""))
                    for p in {s["pe"] for s in sites if s.get("prefix4")}}
        got = plan_floating(req, sites, facts, Border(pe=pe, dx4_function=dx4, nh4=nh4, pe_if=sc.external.pe_if,
                                                      rules4=facts[pe].rules4, fip=fip), hairpins)
        assert got and got[pe].nft[FIP_TABLE].split() == want[pe].nft[FIP_TABLE].split()
        # the hairpin of every PE of the tenant's IPv4 sites (issues 19, 36), changed or not
        for p in hairpins:
            have = got[p].nft.get(HAIRPIN_TABLE) if p in got and HAIRPIN_TABLE in got[p].nft else sc.node_config[p].nft.get(HAIRPIN_TABLE)
            assert (have or "").split() == (want[p].nft.get(HAIRPIN_TABLE) or "").split(), p


# -- real lab: a sample (bench/task_classes.py and harness task validate run every variant) ----------


def _spec(level: str, agent: str, tmp_path, **kw: object) -> RunSpec:  # noqa: ANN001
    return RunSpec(campaign_id="t", run_key=f"t/{level}", factor="ani", setting=level, level=level, agent=agent,
                   density=1, run_dir=tmp_path, **kw)  # type: ignore[arg-type]


@pytest.mark.lab
def test_a_breakage_is_a_clean_failure_when_nothing_is_done_and_repaired_by_the_reference(campaign_lab, tmp_path) -> None:
    lab, sc = campaign_lab
    v = make_variant("troubleshooting", sc, 1)  # a site's policy rules deleted
    rec, _ = execute_run(lab, _spec("A1", "command", tmp_path / "none", agent_options={"template": "true"}), v)
    assert rec.outcome_label.value == "clean_failure" and rec.test_cases_passed < rec.test_cases_total, rec.violated_invariants
    rec, verdicts = execute_run(lab, _spec("A1", "scripted", tmp_path / "a1"), v)
    assert rec.task_pass and rec.damage_free, [x.id for x in verdicts if not x.ok]


@pytest.mark.lab
@pytest.mark.parametrize(("task_class", "variant", "level"), [
    ("steering-change", 0, "A1"), ("firewall-change", 0, "A3-T"), ("floating-ip-change", 0, "A3-T"),
    # the device-level references (harness.agents.steering_ops, harness.agents.service_devices)
    ("steering-change", 1, "A0"), ("steering-change", 1, "A2"),  # a modify: the new waypoint's lowest free function
    ("firewall-change", 0, "A0"), ("firewall-change", 0, "A1"), ("firewall-change", 0, "A2"),
    ("floating-ip-change", 0, "A0"), ("floating-ip-change", 1, "A1"), ("floating-ip-change", 1, "A2"),
    ("floating-ip-change", 0, "A2"),  # an add: a new mark rule, which the model holds as nft prints it
    # troubleshooting through the A2 models: a wrong SID behaviour, a floating IP's NAT to the wrong CE
    ("troubleshooting", 0, "A2"), ("troubleshooting", 4, "A2"),
])
def test_service_change_reference_passes_without_damage(campaign_lab, tmp_path, task_class: str, variant: int, level: str) -> None:
    lab, sc = campaign_lab
    v = make_variant(task_class, sc, variant)
    rec, verdicts = execute_run(lab, _spec(level, "scripted", tmp_path), v)
    assert rec.task_pass and rec.damage_free, [x.id for x in verdicts if not x.ok]


@pytest.mark.lab
@pytest.mark.parametrize(("task_class", "variant"), [("steering-change", 1), ("firewall-change", 0), ("floating-ip-change", 1)])
def test_a_service_change_left_undone_fails_its_test_cases(campaign_lab, tmp_path, task_class: str, variant: int) -> None:
    """Not vacuous: the hidden test cases fail when the operator does nothing."""
    lab, sc = campaign_lab
    v = make_variant(task_class, sc, variant)
    rec, _ = execute_run(lab, _spec("A1", "command", tmp_path, agent_options={"template": "true"}), v)
    assert rec.test_cases_passed < rec.test_cases_total and rec.damage_free, rec.violated_invariants


def test_a_floating_ip_moved_off_a_protected_site_takes_its_outside_deny_checks_with_it() -> None:
    """Found by `task validate floating-ip-change` (default manifest, seed 8, variant 1): the
    external host's deny check on t1s8:8080 through fip1 (issue 19) stayed in A3-T's validation
    scope after fip1 moved to t1s7, so the move was rolled back as a regression. The rule set's
    flows from outside derive from the floating IPs, so the set counts as changed."""
    from pathlib import Path

    from servers.a3_intent.catalog import parse_ops
    from servers.a3_intent.inventory import expected_found
    from servers.a3_intent.planner import plan
    from substrate.scenario import build, load_manifest

    sc = build(load_manifest(Path(__file__).parents[1] / "manifests/srv6-brownfield.yaml"), seed=8, density=2)
    v = make_variant("floating-ip-change", sc, 1)
    assert v.ops[0]["op"] == "modify"
    fip = next(f for f in sc.floating_ips if f.id == v.ops[0]["id"])
    old_outside = [i for i in sc.invariants if "/outside/" in i.id and i.params.get("dst") == fip.address]
    assert old_outside, "the variant no longer moves a floating IP off a protected site: pick another"
    p = plan(sc, parse_ops(v.ops), expected_found(sc))
    scope = {i.id: i for i in p.invariants}
    assert f"firewall/{fip.tenant}" in p.changed_services
    assert not [i.id for i in old_outside if scope.get(i.id) == i]
    assert {i.id for i in v.test_cases} >= {f"floating_ip/{fip.id}/reach", f"floating_ip/{fip.id}/nat"}


def test_every_service_ticket_variant_is_one_its_planner_accepts() -> None:
    """A drawn variant whose change set the planner refuses is no task (bench/sensitivity.py
    stopped on floating-ip-change variant 2 of small-campaign: the site drawn, t3s1, has the IPv4
    prefix of t1s1 on the border PE, which the floating-IP layer refuses). make_variant plans
    every variant (harness.service_tasks.expected_after raises on a refusal), over several
    variants and scenario seeds of the manifests the benches use."""
    from substrate.scenario import build, load_manifest

    for manifest, seeds in ((REPO / "tests" / "data" / "small-campaign.yaml", (7, 3, 9)),
                            (REPO / "manifests" / "srv6-brownfield.yaml", (7, 8))):
        for seed, density in ((s, d) for s in seeds for d in (1, 2)):
            sc = build(load_manifest(manifest), seed=seed, density=density)
            for name in ("steering-change", "firewall-change", "floating-ip-change"):
                for v in range(6):
                    make_variant(name, sc, v)  # raises AnibenchError on a refused change set
