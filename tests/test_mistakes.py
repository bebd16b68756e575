"""The noisy agent's mistake catalog (harness.agents.mistakes): each kind's rendering, pure (no
lab). The sensitivity of the oracle to them is measured by bench/sensitivity.py."""

from __future__ import annotations

import pytest

from harness.agents.mistakes import (INEXPRESSIBLE, KINDS, DeviceEnv, Mistakes, device_mistake, intent_mistake,
                                     noisy_ops, typo)
from harness.agents.scripted import intent_ops, read_request
from harness.tasks import apply_changes, make_variant
from substrate.scenario import build, load_manifest
from substrate.scenario.apply import config_delta
from tests.conftest import REPO


@pytest.fixture(scope="module")
def change_set():  # noqa: ANN201
    """The change-set variant 0 of the small campaign scenario: r9 loses two sites' circuits
    and gains two (removals, additions, FRR address lines, new SIDs)."""
    sc = build(load_manifest(REPO / "tests" / "data" / "small-campaign.yaml"), seed=7)
    v = make_variant("change-set", sc, 0)
    after = apply_changes(sc, v.changes)
    t = after.tenant(v.changes.tenant)
    deltas = {n: config_delta(n, sc.node_config.get(n), after.node_config.get(n)) for n in sorted(t.dt6_functions)}
    return sc, v, t, deltas


def _env(level: str, t, sc) -> DeviceEnv:  # noqa: ANN001
    other = next(x for x in sc.tenants if x.id != t.id)
    rules = {pe: [{"priority": 1000, "iif": "eth9", "table": str(other.table)},
                  {"priority": 1000, "iif": "eth8", "table": str(t.table)}] for pe in t.dt6_functions}
    return DeviceEnv(level=level, pes=sorted(t.dt6_functions), table=t.table, rules6=rules,
                     used={pe: {0xE000} for pe in t.dt6_functions})


def test_typo_changes_one_digit_of_the_prefix() -> None:
    assert typo("fd10:0:0:6::/64") == "fd10:0:0:106::/64"
    assert typo("10.0.4.0/24") == "10.1.4.0/24"
    with pytest.raises(ValueError):
        typo("not a prefix")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", ["A0", "A2"])
def test_each_device_kind_renders_a_different_change_and_leaves_the_plan_alone(change_set, kind: str, level: str) -> None:
    sc, _v, t, deltas = change_set
    d = deltas["r9"]
    before = (list(d.removals), list(d.additions), list(d.frr))
    m = device_mistake(kind, d, "r9", _env(level, t, sc))
    assert (list(d.removals), list(d.additions), list(d.frr)) == before  # a copy is rendered
    if (kind, level) in INEXPRESSIBLE:
        assert m is None
        return
    assert m is not None
    changed = (m.delta.removals, m.delta.additions, m.delta.frr) != before or m.target != "r9" or not m.commit
    assert changed, kind


def test_device_renderings_say_what_the_mistake_is(change_set) -> None:
    sc, _v, t, deltas = change_set
    env = _env("A0", t, sc)
    d = deltas["r9"]
    other = next(x for x in sc.tenants if x.id != t.id)

    def diff(kind: str) -> tuple[set[str], set[str]]:
        m = device_mistake(kind, d, "r9", env)
        new = set(m.delta.removals + m.delta.additions + m.delta.frr)
        old = set(d.removals + d.additions + d.frr)
        return new - old, old - new

    plus, minus = diff("spec_deviation")
    assert len(plus) == len(minus) == 1 and typo(next(iter(minus)).split()[3]) in next(iter(plus))
    assert device_mistake("wrong_device", d, "r9", env).target in set(t.dt6_functions) - {"r9"}
    m = device_mistake("wrong_config_mode", d, "r9", env)  # an interface line ahead of its stanza
    assert m.delta.frr[0].split()[-2] == "address" and not m.delta.frr[0].startswith("interface")
    plus, minus = diff("wrong_family")
    assert [x[:3] for x in minus] != [x[:3] for x in plus] and " rule " in f" {next(iter(plus))} "
    plus, _ = diff("overwrite_shared_key")
    assert any("fcbb:bb00:9:e000::/64" in x and "seg6local" in x for x in plus)
    m = device_mistake("forgotten_cleanup", d, "r9", env)
    assert not m.delta.removals and not any(x.startswith("no ") for x in m.delta.frr)
    assert device_mistake("overbroad_delete", d, "r9", env).delta.removals[0] == f"-6 route flush table {t.table}"
    plus, _ = diff("wrong_table")
    assert any(f"table {other.table}" in x or f"lookup {other.table}" in x for x in plus)
    assert device_mistake("uncommitted", d, "r9", DeviceEnv(level="A2", pes=env.pes, table=t.table)).commit is False
    plus, _ = diff("other_tenant")
    assert plus == {f"-6 rule del priority 1000 iif eth9 lookup {other.table}"}


def test_device_kinds_are_not_expressed_where_the_change_cannot_carry_them(change_set) -> None:
    sc, _v, t, deltas = change_set
    env = DeviceEnv(level="A1", pes=["r1"], table=t.table)
    only_add = deltas["r1"]  # r1 only gains the tenant: nothing to clean up
    assert not only_add.removals
    assert device_mistake("forgotten_cleanup", only_add, "r1", env) is None
    assert device_mistake("wrong_device", only_add, "r1", env) is None  # no other PE known
    assert device_mistake("other_tenant", only_add, "r1", env) is None  # no other tenant's rule read
    assert device_mistake("overwrite_shared_key", only_add, "r1", env) is None  # no function in use
    assert device_mistake("uncommitted", only_add, "r1", env) is None  # A1 has no commit step
    assert device_mistake("overbroad_delete", only_add, "r1", env) is None  # its table is not live there yet


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", ["A3-T", "A3-R"])
def test_each_intent_kind_renders_a_different_change_set(change_set, kind: str, level: str) -> None:
    sc, v, t, _d = change_set
    req = read_request(v.files)
    ops = intent_ops(req)
    others = [{"id": s.id, "tenant": s.tenant} for s in sc.all_sites() if s.tenant != t.id]
    got = [intent_mistake(kind, i, ops, req.sites, others, level) for i in range(len(ops))]
    assert ops == intent_ops(req)  # a copy is rendered
    if (kind, level) in INEXPRESSIBLE:
        assert got == [None] * len(ops)
        return
    i, m = next((i, m) for i, m in enumerate(got) if m is not None)
    assert m.ops != [ops[i]] or m.unapplied, kind
    if kind == "other_tenant":
        assert {"op": "delete", "service_class": "tenant_site", "id": others[0]["id"]} in m.ops
    if kind == "wrong_table":
        assert m.ops[0]["spec"]["tenant"] != t.id


def test_a_forced_kind_is_made_once_at_a_drawn_place_or_recorded_inexpressible(change_set) -> None:
    sc, v, t, _d = change_set
    req = read_request(v.files)
    ops = intent_ops(req)
    first = Mistakes(0.0, 5, kind="spec_deviation")
    out, unapplied = noisy_ops(ops, req.sites, [], "A3-T", first)
    assert len(first.made) == 1 and not unapplied and out != ops
    again = Mistakes(0.0, 5, kind="spec_deviation")
    assert noisy_ops(ops, req.sites, [], "A3-T", again)[0] == out  # the place is drawn from the seed
    none = Mistakes(0.0, 5, kind="wrong_config_mode")
    assert noisy_ops(ops, req.sites, [], "A3-T", none) == (ops, False)
    assert none.made == [] and none.inexpressible == ["wrong_config_mode"]
    with pytest.raises(ValueError, match="unknown mistake kind"):
        Mistakes(0.0, 1, kind="typo")


def test_noisy_agent_refuses_an_unknown_kind() -> None:
    from harness.agents.scripted import NoisyAgent
    from harness.errors import AnibenchError

    assert NoisyAgent(rate="0", kind="wrong_table").kind == "wrong_table"
    with pytest.raises(AnibenchError, match="unknown mistake kind"):
        NoisyAgent(kind="fat_finger")


def test_mistakes_on_another_tenants_object_never_pick_the_tickets_tenant() -> None:
    """A firewall ticket's op names no tenant (a modify of the rule set), and the sites its
    reader lists may hold the ticket's own first: ``wrong_table`` and ``other_tenant`` still pick
    another tenant (before, ``wrong_table`` could "move" the rule set into its own tenant: a
    no-op the sensitivity bench counted as a miss)."""
    ops = [{"op": "modify", "service_class": "firewall_rule_set", "id": "fw-t3",
            "spec": {"rules": [{"src_site": None, "dst_site": "t3s1", "port": 22, "action": "drop"}]}}]
    others = [{"id": "t3s1", "tenant": "t3"}, {"id": "t3s2", "tenant": "t3"}, {"id": "t5s1", "tenant": "t5"}]
    wrong = intent_mistake("wrong_table", 0, ops, [], others, "A3-T", tenant="t3")
    assert wrong is not None and wrong.ops[0]["spec"]["tenant"] == "t5"
    other = intent_mistake("other_tenant", 0, ops, [], others, "A3-T", tenant="t3")
    assert other is not None and other.ops[1] == {"op": "delete", "service_class": "tenant_site", "id": "t5s1"}
    only_own = others[:2]
    assert intent_mistake("wrong_table", 0, ops, [], only_own, "A3-T", tenant="t3") is None
    assert intent_mistake("other_tenant", 0, ops, [], only_own, "A3-T", tenant="t3") is None
    # a create names its tenant in the spec: that one is never picked either
    create = [{"op": "create", "service_class": "tenant_site", "id": "t3s9", "spec": {"tenant": "t3", "pe": "r1"}}]
    assert intent_mistake("wrong_table", 0, create, [], others, "A3-R").ops[0]["spec"]["tenant"] == "t5"
    out, _ = noisy_ops(ops, [], others, "A3-T", Mistakes(0.0, 1, kind="other_tenant"), tenant="t3")
    assert out[1]["id"] == "t5s1"


# -- issue 36: the service tickets' and the troubleshooting repairs' mistakes -------------------------


_SITES = [{"site": "t1s1", "pe": "r1", "pe_port": "eth3", "prefix6": "fd10:0:0:1::/64", "prefix4": "10.0.1.0/24"},
          {"site": "t1s2", "pe": "r3", "pe_port": "eth3", "prefix6": "fd10:0:0:2::/64", "prefix4": "10.0.2.0/24"},
          {"site": "t1s3", "pe": "r7", "pe_port": "eth4", "prefix6": "fd10:0:0:3::/64", "prefix4": ""},
          {"site": "t1s4", "pe": "r9", "pe_port": "eth3", "prefix6": "fd10:0:0:4::/64", "prefix4": "10.0.4.0/24"}]


@pytest.mark.parametrize("cls", ["steering-change", "firewall-change", "floating-ip-change"])
@pytest.mark.parametrize("variant", [0, 1])
def test_each_ticket_kind_changes_a_value_the_request_fixed(cls: str, variant: int) -> None:
    """On the small campaign scenario's service tickets, every kind :func:`ticket_mistake`
    renders changes the ticket (a copy; the original is left alone) and keeps it one the
    operator can plan: the same keys, the values it replaces taken from the tenant's sites."""
    import csv
    import io

    import yaml

    from harness.agents.mistakes import ticket_mistake

    sc = build(load_manifest(REPO / "tests" / "data" / "small-campaign.yaml"), seed=7)
    v = make_variant(cls, sc, variant)
    req = yaml.safe_load(v.files["request.yaml"])
    sites = list(csv.DictReader(io.StringIO(v.files["sites.csv"])))
    keep = yaml.safe_dump(req)
    rendered = 0
    for kind in KINDS:
        wrong = ticket_mistake(kind, req, sites, [{"id": "x", "tenant": "t9"}])
        assert yaml.safe_dump(req) == keep
        if wrong is None:
            continue
        rendered += 1
        assert wrong != req and set(wrong) == set(req), kind
        site_ids = {s["site"] for s in sites}
        for k in ("dst_site", "to_site"):
            if k in wrong:
                assert wrong[k] in site_ids, (kind, wrong[k])
    assert rendered >= 1


def test_service_ticket_renderings_say_what_the_mistake_is() -> None:
    from harness.agents.mistakes import ticket_mistake, typo_address

    steer = {"service_class": "steering_policy", "action": "create", "policy": "sp2", "tenant": "t1", "ingress_pe": "r1",
             "dst_site": "t1s2", "waypoint": "r5"}
    assert ticket_mistake("spec_deviation", steer, _SITES)["waypoint"] == "r6"
    assert ticket_mistake("spec_deviation", dict(steer, waypoint="r2"), _SITES)["waypoint"] == "r4"  # r3, r1: the policy's
    assert ticket_mistake("wrong_device", steer, _SITES)["ingress_pe"] == "r7"
    modify = dict(steer, action="modify", was_waypoint="r2")
    assert ticket_mistake("wrong_device", modify, _SITES)["waypoint"] == "r7"
    old = [{"src_site": "t1s2", "dst_site": "t1s1", "port": 22, "action": "accept"},
           {"src_site": None, "dst_site": "t1s1", "port": 22, "action": "drop"}]
    new = [{"src_site": "t1s2", "dst_site": "t1s1", "port": 80, "action": "accept"},
           {"src_site": None, "dst_site": "t1s1", "port": 80, "action": "drop"}]
    fw = {"service_class": "firewall_rule_set", "action": "modify", "rule_set": "fw-t1", "tenant": "t1", "rules": old + new}
    assert [r["port"] for r in ticket_mistake("spec_deviation", fw, _SITES)["rules"]] == [22, 22, 23, 23]
    assert {r["dst_site"] for r in ticket_mistake("wrong_device", fw, _SITES)["rules"][2:]} == {"t1s3"}
    assert ticket_mistake("overwrite_shared_key", fw, _SITES)["rules"] == new
    assert ticket_mistake("overbroad_delete", fw, _SITES)["rules"] == new
    assert ticket_mistake("overwrite_shared_key", dict(fw, rules=new), _SITES) is None
    wt = ticket_mistake("wrong_table", fw, _SITES, [{"id": "t2s1", "tenant": "t2"}])
    assert (wt["tenant"], wt["rule_set"]) == ("t2", "fw-t2")
    fip = {"service_class": "floating_ip", "action": "add", "floating_ip": "fip2", "address": "198.51.100.11",
           "tenant": "t1", "to_site": "t1s1"}
    assert ticket_mistake("spec_deviation", fip, _SITES)["address"] == typo_address("198.51.100.11") == "198.51.100.43"
    assert ticket_mistake("wrong_device", fip, _SITES)["to_site"] == "t1s2"
    assert ticket_mistake("spec_deviation", dict(fip, action="move", from_site="t1s4"), _SITES) is None
    for kind in ("wrong_family", "forgotten_cleanup", "uncommitted", "other_tenant", "wrong_config_mode"):
        assert all(ticket_mistake(kind, t, _SITES) is None for t in (steer, fw, fip)), kind


def test_fix_renderings_say_what_the_mistake_is() -> None:
    """Each kind made in a troubleshooting repair (pure), and the kinds a repair cannot carry."""
    from harness.agents.mistakes import FixEnv, fix_mistake

    env = FixEnv(level="A0", routers=["r1", "r3"], rules6={"r1": [{"priority": 1000, "iif": "eth3", "table": "100"},
                                                                 {"priority": 1000, "iif": "eth5", "table": "101"}]},
                 own_ports={"r1": {"eth3"}})
    rule = ["ip -6 rule add priority 1000 iif eth3 lookup 100", "ip -4 rule add priority 1000 iif eth3 lookup 100"]
    route = ["ip -6 route replace fd10:0:0:1::/64 table 100 metric 1024 dev eth3"]
    nat = ["nft replace rule ip fip prerouting_dnat handle 7 iifname eth9 ip daddr 198.51.100.10 dnat to 10.0.1.2"]
    shadow = ["nft delete rule inet tenant_fw t1 handle 12"]
    isis = ["interface eth2", "ipv6 router isis 1"]

    def fm(kind, kernel=(), frr=(), level="A0"):  # noqa: ANN001, ANN202
        return fix_mistake(kind, list(kernel), list(frr), [], "r1", FixEnv(**{**env.__dict__, "level": level}))

    assert "fd10:0:0:101::/64" in fm("spec_deviation", route).kernel[0]
    assert "dnat to 10.0.1.34" in fm("spec_deviation", nat).kernel[0]
    assert fm("spec_deviation", shadow) is None
    assert fm("wrong_device", rule).device == "r3"
    assert fm("wrong_config_mode", frr=isis).frr == ["ipv6 router isis 1", "interface eth2"]
    assert " table " not in fm("wrong_config_mode", route).kernel[0]
    assert fm("wrong_family", rule[:1]).kernel == ["ip -4 rule add priority 1000 iif eth3 lookup 100"]
    assert fm("wrong_family", rule) is None  # the IPv4 rule is there already: a flip would only repeat it
    assert fm("overwrite_shared_key", rule) is None
    assert fm("forgotten_cleanup", ["ip -6 rule del priority 1000 iif eth3 lookup 7", *rule]).kernel == rule
    assert fm("forgotten_cleanup", shadow) is None  # a repair that only deletes: nothing would be left of it
    assert fm("overbroad_delete", shadow).kernel == ["nft flush chain inet tenant_fw t1"]
    assert fm("overbroad_delete", route).kernel[0] == "ip -6 route flush table 100"
    assert "lookup 101" in fm("wrong_table", rule).kernel[0]
    assert fm("uncommitted", rule) is None and fm("uncommitted", rule, level="A2").commit is False
    assert fm("other_tenant", rule).kernel[-1] == "ip -6 rule del priority 1000 iif eth5 lookup 101"
    assert fm("other_tenant", nat).kernel[-1] == "ip -6 rule del priority 1000 iif eth5 lookup 101"


def test_forced_kind_in_a_stream_of_changes_is_placed_once_or_recorded_inexpressible() -> None:
    m = Mistakes(0.0, 3, kind="wrong_table")
    assert m.one(lambda k: False) is None
    assert m.one(lambda k: True) == "wrong_table"
    m.record("wrong_table", "r1")
    assert m.one(lambda k: True) is None
    m.finish()
    assert m.inexpressible == []
    none = Mistakes(0.0, 3, kind="wrong_table")
    none.one(lambda k: False)
    none.finish()
    assert none.inexpressible == ["wrong_table"]
    # a kind placed on the ticket is not placed again on the devices
    placed = Mistakes(0.0, 3, kind="spec_deviation")
    placed.record("spec_deviation", "sp2")
    assert placed.choose(3, lambda i, k: True) == [None, None, None] and placed.inexpressible == []


def test_device_nft_renderings_keep_removed_rules_or_drop_the_new_ipv4_half() -> None:
    from harness.agents.mistakes import _nft_rules
    from substrate.scenario.apply import ConfigDelta

    now = ("table inet tenant_fw {\n\tchain t1 {\n\t\tip6 daddr fd10:0:0:1::2 tcp dport 22 drop\n"
           "\t\tip daddr 10.0.1.2 tcp dport 22 drop\n\t}\n}\n")
    new = ("table inet tenant_fw {\n\tchain t1 {\n\t\tip6 daddr fd10:0:0:1::2 tcp dport 80 drop\n"
           "\t\tip daddr 10.0.1.2 tcp dport 80 drop\n\t}\n}\n")
    env = DeviceEnv(level="A0", pes=["r1", "r3"], table=-1, nft_now={"r1": {"inet tenant_fw": now}})
    d = ConfigDelta(node="r1", nft={"inet tenant_fw": new})
    kept = device_mistake("forgotten_cleanup", d, "r1", env)
    assert len(_nft_rules("inet tenant_fw", kept.delta.nft["inet tenant_fw"])["t1"]) == 4
    one = device_mistake("wrong_family", d, "r1", env)
    assert _nft_rules("inet tenant_fw", one.delta.nft["inet tenant_fw"])["t1"] == ["ip6 daddr fd10:0:0:1::2 tcp dport 80 drop"]
    assert device_mistake("wrong_family", ConfigDelta(node="r1", nft={"inet tenant_fw": now}), "r1", env) is None
