"""Protocol templates (issue 15 items 3-5): the file format and its errors, Algorithm 1, the value
registry, and one real-lab sample of `harness task validate` (the bench runs all:
bench/templates.py)."""

from __future__ import annotations

import ipaddress
import textwrap
from pathlib import Path

import pytest

from harness.templates import InstantiationRefused, TemplateError, parse_template
from harness.templates.instantiate import DEFAULT_INSTANCES, instantiate
from harness.templates.registry import ValueRegistry
from harness.templates.tasks import make_template_variant, templates

REPO = Path(__file__).resolve().parents[1]

GOOD = textwrap.dedent("""\
    id: demo
    family: isis
    title: demo
    parameters:
      link: {values: "core_links()"}
      metric: {range: [40, 60], step: 10}
      other: {values: "routers()", where: "other.name not in [link.a, link.b]"}
    prompt: "metric {{ metric }} on {{ link.a }}"
    test_cases:
      - {id: "m/{{ link.a }}", kind: output_check, params: {node: "{{ link.a }}", command: "show isis interface", contains: ["Metric: {{ metric }}"]}}
    reference:
      A0: {"{{ link.a }}": ["vtysh -c 'isis metric {{ metric }}'"]}
      A1: {"{{ link.a }}": ["interface {{ link.a_if }}", "isis metric {{ metric }}"]}
      A3-T: "cannot express: no IS-IS service class"
    """)


@pytest.fixture(scope="module")
def sc():
    from substrate.scenario import build, load_manifest

    return build(load_manifest(REPO / "tests" / "data" / "templates-small.yaml"), seed=7)


def _bad(text: str) -> str:
    with pytest.raises(TemplateError) as e:
        parse_template(text, "t.yaml")
    return str(e.value)


def test_the_library_has_twenty_templates_across_the_families() -> None:
    lib = templates()
    assert len(lib) >= 20
    assert {t.family for t in lib.values()} >= {"isis", "static", "policy", "bgp", "nftables", "nat", "srv6"}
    assert {"bgp-ce-session", "nat-source", "nat-port-forward"} <= set(lib)  # a session to a CE; two NAT forms
    for t in lib.values():
        assert t.cannot("A0") is None and t.cannot("A1") is None
        assert all(t.cannot(level) for level in ("A3-T", "A3-R", "A4")), f"{t.id}: a level neither written nor marked"
        assert "no reference solution written" not in (t.cannot("A2") or ""), f"{t.id}: A2 neither written nor marked"
    # A2 references (edit-config of the kernel, IS-IS and interface models) where the models say it
    assert {n for n, t in lib.items() if t.cannot("A2") is None} == {
        "isis-metric", "isis-overload", "isis-passive", "nat-source", "nft-acl-deny", "policy-sinkhole", "srv6-end-dt6",
        "srv6-end-dx6", "srv6-end-x", "srv6-locator-add", "static-blackhole", "static-floating", "static-tenant-lan"}
    assert all("no bgpd" in lib[n].cannot("A2") for n in lib if n.startswith("bgp-"))


@pytest.mark.parametrize(("text", "where"), [
    (GOOD.replace("family: isis\n", ""), "t.yaml:1: family: Field required"),
    (GOOD.replace("step: 10", "step: 0"), "t.yaml:6: parameters.metric.step"),
    (GOOD.replace("range: [40, 60]", "range: [60, 40]"), "t.yaml:6: parameters.metric"),
    (GOOD.replace('{values: "core_links()"}', '{values: "core_links()", choice: [1]}'), "t.yaml:5: parameters.link"),
    (GOOD.replace("other.name not in", "nosuch.name not in"), "t.yaml:7: parameters.other.where: unknown name(s) nosuch"),
    (GOOD.replace('"metric {{ metric }}', '"metric {{ metric '), "t.yaml:8: prompt: Jinja syntax error"),
    (GOOD.replace("  A1: {", "  A9: {"), "t.yaml:12: reference: unknown level 'A9'"),
    (GOOD.replace('"cannot express: no IS-IS service class"', '"cannot express:"'), "reference"),
    (GOOD.replace("  - {id:", "  - {idd:"), "t.yaml:10: test_cases.0"),
    (GOOD.replace("prompt: \"metric", "prompt: [\"metric").replace("{{ link.a }}\"\n", "{{ link.a }}\"]\n", 1), "prompt"),
    ("id: [unclosed\n", "t.yaml:2: YAML"),
    # a key given twice (YAML would keep the last silently), at the top and among the parameters
    (GOOD.replace("family: isis\n", "family: isis\nfamily: bgp\n"), "t.yaml:3: family: duplicate key (first at line 2)"),
    (GOOD.replace("  metric: {range", '  link: {values: "routers()"}\n  metric: {range'),
     "t.yaml:6: parameters.link: duplicate key (first at line 5)"),
    (GOOD.replace("kind: output_check", "kind: no_such_check"), "t.yaml:10: test_cases.0.kind: unknown check kind 'no_such_check'"),
    (GOOD.replace("reference:", '  - {id: "m/{{ link.a }}", kind: reach, params: {src: r1}}\nreference:'),
     "t.yaml:11: test_cases.1.id: duplicate test case id"),
    (GOOD.replace("{range: [40, 60], step: 10}", '{derive: "metric + 1"}'), "t.yaml:6: parameters.metric.derive: dependency cycle: metric depends on itself"),
    (GOOD.replace("test_cases:", "setup:\n  - {node: r1, sh: 'true', daemons: [bgpdx]}\ntest_cases:"),
     "t.yaml:10: setup.0.daemons: unknown FRR daemon(s) bgpdx"),
    ("!!python/object/apply:os.system ['true']\n", "t.yaml:1: YAML: could not determine a constructor"),
    # aliases: recursive (was a RecursionError), an alias bomb (was a hang), nesting too deep
    ("id: x\nparameters: &p {a: *p}\n", "t.yaml:2: YAML: recursive alias *p"),
    ("a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(f"{b}: &{b} [{','.join(['*' + a] * 10)}]\n" for a, b in zip("abc", "bcd"))
     + "e: [" + ",".join(["*d"] * 10) + "]\n", "t.yaml:4: YAML: more than 10000 nodes with aliases expanded"),
    ("a: " + "[" * 40 + "]" * 40 + "\n", "t.yaml:1: YAML: nested deeper than 32 levels"),
    (GOOD.replace("{range: [40, 60], step: 10}", "{range: [0, 1048576]}"),
     "t.yaml:6: parameters.metric: range [0, 1048576] with step 1 has 1048577 values; at most 2^20"),
    (GOOD.replace("  metric: {range", "  routers: {choice: [1]}\n  metric: {range"),
     "t.yaml:6: parameters.routers: parameter name 'routers' is a registry function's name"),
    (GOOD.replace("  metric: {range", "  usid: {choice: [1]}\n  metric: {range"),
     "t.yaml:6: parameters.usid: parameter name 'usid' is a registry function's name"),
    (GOOD.replace("  metric: {range", "  item: {choice: [1]}\n  metric: {range"),
     "t.yaml:6: parameters.item: parameter name 'item' is reserved for the harness"),
    (GOOD.replace("  metric: {range", "  none: {choice: [1]}\n  metric: {range"),
     "t.yaml:6: parameters.none: parameter name 'none' is a Jinja built-in name"),
    # a device check that would pass whatever the agent did: a misspelt predicate, none at all,
    # a string where a list goes (its characters were the strings to find), an unknown op
    (GOOD.replace("contains: [", "contain: ["), "t.yaml:10: test_cases.0.params.contain: unknown key 'contain' of output_check"),
    (GOOD.replace(', contains: ["Metric: {{ metric }}"]', ""), "t.yaml:10: test_cases.0.params: output_check needs a predicate"),
    (GOOD.replace('contains: ["Metric: {{ metric }}"]', 'contains: "Metric: 50"'),
     "t.yaml:10: test_cases.0.params.contains: contains is a list of strings, got str"),
    (GOOD.replace('contains: ["Metric: {{ metric }}"]', 'contains: []'), "t.yaml:10: test_cases.0.params: output_check needs a predicate"),
    (GOOD.replace('kind: output_check, params: {node: "{{ link.a }}", command: "show isis interface", contains: ["Metric: {{ metric }}"]',
                  'kind: json_value, params: {node: "{{ link.a }}", argv: [ip, -j, link], path: "0.mtu", op: equals, value: 1'),
     "t.yaml:10: test_cases.0.params.op: unknown op 'equals'"),
])
def test_a_malformed_template_gets_the_field_and_the_line(text: str, where: str) -> None:
    assert where in _bad(text)


def test_cycles_hidden_parameters_and_scenario_values_in_references_are_refused() -> None:
    cyc = GOOD.replace('{range: [40, 60], step: 10}', '{derive: "other.id"}').replace(
        'where: "other.name not in [link.a, link.b]"', 'where: "metric > 0"')
    assert "dependency cycle among metric, other" in _bad(cyc)
    hidden = GOOD.replace("step: 10}", "step: 10, hidden: true}")
    assert "uses hidden parameter(s) metric" in _bad(hidden)
    scen = GOOD.replace("\"isis metric {{ metric }}\"]}\n  A3-T", "\"isis metric {{ free_tables()[0] }}\"]}\n  A3-T")
    assert "uses registry function(s) free_tables" in _bad(scen)


def test_algorithm_1_is_seeded_resolves_in_dependency_order_and_respects_constraints(sc) -> None:
    t = parse_template(GOOD)
    a = [instantiate(t, sc, i) for i in range(DEFAULT_INSTANCES)]
    assert [x.parameters for x in a] == [instantiate(t, sc, i).parameters for i in range(DEFAULT_INSTANCES)]
    assert len({repr(x.parameters) for x in a}) > 1  # instances differ
    for x in a:
        p = x.parameters
        assert p["metric"] in (40, 50, 60) and p["other"]["name"] not in (p["link"]["a"], p["link"]["b"])
        assert x.reference["A1"] == {p["link"]["a"]: [f"interface {p['link']['a_if']}", f"isis metric {p['metric']}"]}
        assert x.reference["A3-T"] == "cannot express: no IS-IS service class"
        assert x.reference["A2"].startswith("cannot express: no reference solution written")
        assert x.test_cases[0].params["contains"] == [f"Metric: {p['metric']}"]
        assert len(x.damage_checks) == len(sc.invariants)


def test_an_unsatisfiable_template_is_refused_with_the_parameter_and_the_reason(sc) -> None:
    t = parse_template(GOOD.replace('other.name not in [link.a, link.b]', "other.name == 'r99'"))
    with pytest.raises(InstantiationRefused, match=r"parameter 'other': none of the 9 value\(s\) of its domain satisfies"):
        instantiate(t, sc, 0)
    t = parse_template(GOOD.replace("{range: [40, 60], step: 10}", "{choice: [40], distinct_from: ['40']}"))
    with pytest.raises(InstantiationRefused, match="parameter 'metric': each of the 1 value"):
        instantiate(t, sc, 0)
    bare = sc.model_copy(update={"ebgp_peerings": [], "layers": [x for x in sc.layers if x != "ebgp_peering"]})
    with pytest.raises(InstantiationRefused, match="requirements: the scenario has no ebgp_peering layer"):
        make_template_variant("bgp-med-out", bare, 0)
    nocap = ValueRegistry(sc, capabilities=frozenset({"zebra"}))
    with pytest.raises(InstantiationRefused, match="the devices lack isisd"):
        instantiate(templates()["isis-metric"], sc, 0, registry=nocap)


def _refused(sc, text: str, match: str) -> None:
    with pytest.raises(InstantiationRefused, match=match):
        instantiate(parse_template(text), sc, 0)


def test_an_instance_with_no_test_case_or_a_repeated_test_case_id_is_refused(sc) -> None:
    """An ``each`` that renders to no element left an instance of zero test cases, which any
    agent passes (score 1.0 with nothing done); an id without the element gave two test cases
    one id; a predicate rendered empty, no damage check left or an empty prompt likewise."""
    _refused(sc, GOOD.replace("  - {id:", "  - {each: \"[]\", id:"),
             "^template demo: test_cases: every test case's each gave no element")
    _refused(sc, GOOD.replace('  - {id: "m/{{ link.a }}",', '  - {each: "[1, 2]", id: "m/{{ link.a }}",'),
             r"^template demo: test_cases.0: test case id 'template/demo/m/r\d' rendered twice")
    _refused(sc, GOOD.replace('contains: ["Metric: {{ metric }}"]', 'contains: "{{ [] }}"'),
             r"^template demo: test_cases.0: params: output_check needs a predicate .* \(as rendered\)")
    _refused(sc, GOOD.replace("reference:", 'invalidates: ["{{ link.a[:0] }}*"]\nreference:'),
             r"^template demo: invalidates: the patterns \['\*'\] match every one")  # any damage would go unnoticed
    _refused(sc, GOOD.replace('prompt: "metric {{ metric }} on {{ link.a }}"', "prompt: \"{{ '' }}\""),
             "^template demo: prompt: the prompt renders to no text")


def test_a_search_that_would_not_end_is_refused(sc) -> None:
    """Two ranges of 2^20 values whose constraint nothing satisfies: each draw of the first
    re-checked the second's million candidates, 10,000 times (hours); refused after
    MAX_CHECKS candidates, naming the parameter."""
    from harness.templates import instantiate as inst

    t = parse_template(GOOD.replace("{range: [40, 60], step: 10}", "{range: [0, 999]}").replace(
        'where: "other.name not in [link.a, link.b]"', 'where: "other.name == link.a"').replace(
        "  other:", '  far: {range: [0, 999], where: "far > 5000"}\n  other:'))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inst, "MAX_CHECKS", 5000)
        with pytest.raises(InstantiationRefused, match="^template demo: parameter 'far': more than 5000 candidates checked"):
            instantiate(t, sc, 0)


def test_python_errors_in_expressions_name_the_field_and_the_template(sc) -> None:
    t = parse_template(GOOD.replace('"metric {{ metric }} on', '"metric {{ metric // (metric - metric) }} on'))
    with pytest.raises(InstantiationRefused, match=r"^template demo: prompt: rendering failed: ZeroDivisionError"):
        instantiate(t, sc, 0)
    t = parse_template(GOOD.replace('contains: ["Metric: {{ metric }}"]', 'contains: ["{{ metric < link.a }}"]'))
    with pytest.raises(InstantiationRefused, match=r"^template demo: test_cases.0: rendering failed: TypeError: '<' not supported"):
        instantiate(t, sc, 0)
    t = parse_template(GOOD.replace("other.name not in [link.a, link.b]", "(metric // 0) > 0"))
    with pytest.raises(InstantiationRefused, match=r"^template demo: parameter 'other': its constraint .* could not be "
                                                   r"evaluated: ZeroDivisionError"):
        instantiate(t, sc, 0)
    t = parse_template(GOOD.replace('"isis metric {{ metric }}"]}', '"isis metric {{ metric.x() }}"]}'))
    with pytest.raises(InstantiationRefused, match=r"^template demo: reference.A1: rendering failed: 'int object' has no attribute 'x'"):
        instantiate(t, sc, 0)


def test_algorithm_1_backs_up_and_keeps_what_it_drew_without_backing_up(sc) -> None:
    import random

    from harness.templates.instantiate import resolve_all

    # instances that need no backing up are Algorithm 1's plain draws, one Random(seed) in order
    t = parse_template(GOOD)
    for i in range(DEFAULT_INSTANCES):
        got = instantiate(t, sc, i)
        rng = random.Random(got.seed)
        reg = ValueRegistry(sc)
        link = rng.choice(reg.core_links())
        metric = rng.choice([40, 50, 60])
        other = rng.choice([r for r in reg.routers() if r["name"] not in (link["a"], link["b"])])
        assert got.parameters == {"link": link, "metric": metric, "other": other}
    # a draw that leaves a later domain empty is taken back: only a == 7 lets b through
    two = textwrap.dedent("""\
        id: demo
        family: isis
        title: demo
        parameters:
          a: {choice: [1, 2, 3, 4, 5, 6, 7, 8]}
          b: {choice: [40], where: "a == 7"}
        prompt: "{{ a }} {{ b }}"
        test_cases: [{id: x, kind: output_check, params: {node: r1, command: "show version", contains: ["{{ a }}"]}}]
        reference: {A0: {r1: ["true"]}, A1: {r1: ["true"]}}
        """)
    t = parse_template(two)
    firsts = [random.Random(f"template/demo/{sc.seed}/{i}").choice(range(1, 9)) for i in range(DEFAULT_INSTANCES)]
    assert any(f != 7 for f in firsts)  # the plain draw refused these (parameter 'b')
    assert [instantiate(t, sc, i).parameters["a"] for i in range(DEFAULT_INSTANCES)] == [7] * DEFAULT_INSTANCES
    # no combination: the first refusal met; the search is bounded
    t = parse_template(two.replace("a == 7", "a == 9"))
    with pytest.raises(InstantiationRefused, match=r"parameter 'b': none of the 1 value\(s\) of its domain satisfies 'a == 9'$"):
        instantiate(t, sc, 0)
    with pytest.raises(InstantiationRefused, match=r"parameter 'b': .*\(and no other combination found within 3 draws\)"):
        resolve_all(t, ValueRegistry(sc), "s", max_draws=3)


def test_a_malformed_file_is_left_out_of_the_library_with_its_error(tmp_path) -> None:
    from harness.templates.tasks import broken_templates

    (tmp_path / "demo.yaml").write_text(GOOD)
    (tmp_path / "latin.yaml").write_bytes(b"id: latin\nfamily: isis\ntitle: caf\xe9\n")
    assert list(templates(tmp_path)) == ["demo"]
    assert broken_templates(tmp_path) == {"latin": f"{tmp_path / 'latin.yaml'}:3: not UTF-8 text (byte 0xe9 at offset 33): "
                                                   "a template file is UTF-8 YAML"}
    assert broken_templates() == {}  # the shipped library


def test_the_registry_offers_free_values_and_real_transit_paths(sc) -> None:
    reg = ValueRegistry(sc)
    used = {s.dx4_function for s in sc.all_sites() if s.pe == "r8"} | {t.dt6_functions.get("r8") for t in sc.tenants}
    assert not set(reg.free_functions("r8")) & used
    tables = {t.table for t in sc.tenants}
    assert reg.free_tables() and not set(reg.free_tables()) & tables
    in_use = [ipaddress.ip_network(p) for x in sc.ebgp_peerings for p in [*x.announced, *x.advertise, *x.internal]
              if ipaddress.ip_network(p).prefixlen]
    for p in reg.free_prefixes6("2001:db8:1000::/36", 48):
        assert not any(ipaddress.ip_network(p).overlaps(u) for u in in_use)
    # 3x3 grid: r5 is the only transit between r2 and r8 (r1-r4-r7 and r3-r6-r9 are longer)
    assert {"via": "r5", "src": "r2", "dst": "r8", "src_if": "eth3"} in reg.transits()
    assert not any(t["via"] == "r5" and {t["src"], t["dst"]} == {"r2", "r4"} for t in reg.transits())


def test_every_template_instantiates_five_times_on_its_scenario(sc) -> None:
    for name in templates():
        vs = [make_template_variant(name, sc, i) for i in range(DEFAULT_INSTANCES)]
        assert all(v.test_cases and v.files["request.yaml"].startswith(f"template: {name}") for v in vs)
        # the ticket never reveals the test cases; the scripted operator renders the same reference from it
        from harness.templates.operator import reference_for, template_request

        for v in vs:
            tid, shown = template_request(v.files)
            assert reference_for(tid, shown, "A1") == v.reference["A1"]


def test_the_border_pe_gets_a_spare_circuit_without_a_seed_draw(monkeypatch) -> None:
    """When the l3vpn layer leaves no spare circuit on the peering's PE, the ebgp_peering layer
    cables one (bgp-ce-session was refused for every instance on the default manifest); it draws
    nothing from the seed: with ebgp_peering ahead of steering, firewall and floating IPs, their
    records are those of a build without the spare."""
    from substrate.scenario import build
    from substrate.scenario.layers import ebgp_peering
    from substrate.scenario.manifest import parse_manifest

    text = (REPO / "tests" / "data" / "templates-small.yaml").read_text().replace("spare_circuits: 5", "spare_circuits: 1")
    i, j = text.index("  - steering:"), text.index("  - ebgp_peering:")
    m = parse_manifest(text[:i] + text[j:] + text[i:j])
    sc = build(m, seed=1)
    pe = sc.ebgp_peerings[0].pe
    assert [sp.model_dump() for sp in sc.spares if sp.pe == pe] == [{"pe": pe, "pe_if": "eth7", "ce": "c12", "ce_if": "eth1"}]
    vs = [make_template_variant("bgp-ce-session", sc, k) for k in range(DEFAULT_INSTANCES)]
    assert {v.parameters["sp"]["ce"] for v in vs} == {"c12"}
    monkeypatch.setattr(ebgp_peering, "spare_for_pe", lambda sc, topo, pe: (topo, list(sc.spares)))
    plain = build(m, seed=1)
    assert not any(sp.pe == pe for sp in plain.spares)
    for f in ("tenants", "steering", "firewalls", "floating_ips", "ebgp_peerings", "route_leaks", "rate_limits"):
        assert getattr(sc, f) == getattr(plain, f), f
    assert sc.spares[:-1] == plain.spares


@pytest.mark.lab
def test_validate_a_sample_of_templates_in_a_real_lab(campaign_lab, tmp_path) -> None:
    """One instance of three families at A0 and A1 on the harness's shared lab: reference
    solution applied through the MCP server, every test case passes, no damage."""
    from harness.templates.validate import validate_template

    lab, sc = campaign_lab
    rows = []
    for name in ("isis-overload", "srv6-end-dt6", "nft-acl-deny", "nat-source"):
        rows += validate_template(lab, sc, name, ["A0", "A1"], tmp_path, instances=1, probe=False)  # probed below
    rows += validate_template(lab, sc, "policy-sinkhole", ["A2"], tmp_path, instances=1, probe=False)  # edit-config + commit
    assert [r.status for r in rows] == ["valid"] * 9, [(r.template, r.level, r.detail) for r in rows if r.status != "valid"]


@pytest.fixture(scope="module")
def templates_lab():
    """The templates' small brownfield (tests/data/templates-small.yaml, seed 7): the campaign
    grid plus the external eBGP peering, with a spare circuit on the border PE."""
    from substrate.scenario import build, load_manifest
    from substrate.scenario.deploy import deploy_scenario
    from tests.conftest import unique_name

    sc = build(load_manifest(REPO / "tests" / "data" / "templates-small.yaml"), seed=7)
    with deploy_scenario(sc, unique_name("t-tpl")) as lab:
        yield lab, sc


@pytest.mark.lab
def test_an_ebgp_session_to_a_customer_edge_validates_and_its_checks_can_fail(templates_lab, tmp_path) -> None:
    """bgp-ce-session: the CE's own bgpd (started by the setup step, spared by the stray
    killer) and the PE's new neighbor come up at A0 and A1 (A2 skipped: no bgpd model); with
    the setup alone (no PE change) the session test fails, and with an inbound route-map that
    lets everything in the received test fails on the unagreed prefix and the default route."""
    from harness.templates.validate import do_nothing_passes, validate_template
    from substrate.scenario.deploy import reset
    from substrate.scenario.observer import observe

    lab, sc = templates_lab
    rows = validate_template(lab, sc, "bgp-ce-session", ["A0", "A1", "A2"], tmp_path, instances=1)  # probe first
    assert [r.status for r in rows] == ["valid", "valid", "skipped"], [(r.level, r.detail) for r in rows]
    assert "no bgpd" in rows[2].detail
    v = make_template_variant("bgp-ce-session", sc, 0)
    p = v.parameters
    # test cases that pass with no agent (here: baseline invariants) are caught by the probe
    idle = v.model_copy(update={"test_cases": v.damage_checks[:3]})
    assert do_nothing_passes(lab, idle) == [x.id for x in v.damage_checks[:3]]
    # validate_template's probe already found that with reset and setup alone some test case fails;
    # the lab is in that state now (the probe above set it up): which ones
    by_id = {x.id.rsplit("/", 1)[1]: x for x in observe(lab, v.test_cases)}
    assert not by_id["session"].ok and not by_id["received"].ok
    # the session with a permissive inbound policy: the CE's extra prefix and default route get in
    lab.vtysh(p["sp"]["pe"], "configure terminal", f"interface {p['sp']['pe_if']}", f"ipv6 address {p['pe_ip']}/64", "exit",
              "route-map ANY permit 10", "exit", f"router bgp {p['x']['local_as']}",
              f"neighbor {p['ce_ip']} remote-as {p['ce_as']}", f"neighbor {p['ce_ip']} timers connect 1",
              "address-family ipv6 unicast", f"neighbor {p['ce_ip']} activate", f"neighbor {p['ce_ip']} route-map ANY in",
              f"neighbor {p['ce_ip']} route-map ANY out")
    by_id = {x.id.rsplit("/", 1)[1]: x for x in observe(lab, v.test_cases)}
    assert by_id["session"].ok, by_id["session"].detail
    assert not by_id["received"].ok and p["extra"] in by_id["received"].detail and "::/0" in by_id["received"].detail
    reset(lab)


# -- configuration F1 (issue 15 item 4) -----------------------------------------------------------


def test_a2_reads_isisd_beside_bgpd_policy() -> None:
    """A border PE's isisd answers its northbound XML with the library-level prefix-lists and
    route-maps first (frr-filter, frr-route-map: no A2 model); they are dropped, not the IS-IS
    data with them (the isis-* templates' A2 references on the border PE)."""
    from substrate.netconf.device import _without_policy

    xml = ('<lib xmlns="http://frrouting.org/yang/filter"><prefix-list><type>ipv6</type><name>P-IN</name></prefix-list></lib>'
           '<isis xmlns="http://frrouting.org/yang/isisd"><instance><area-tag>CORE</area-tag><vrf>default</vrf></instance></isis>')
    out = _without_policy(xml)
    assert "frrouting.org/yang/filter" not in out and "<area-tag>CORE</area-tag>" in out
    plain = '<isis xmlns="http://frrouting.org/yang/isisd"/>'
    assert _without_policy(plain) == plain


def test_a2_writes_interface_isis_levels_in_frr_84_order() -> None:
    """FRR 8.4 takes ``isis metric level-1 50`` (level first) but ``isis priority 64 level-1``
    (value first); the isis-metric template's A2 reference sets both levels' metric."""
    from substrate.netconf.device import _level_cli

    assert _level_cli("isis metric", "metric/level-1", "50") == "isis metric level-1 50"
    assert _level_cli("isis hello-interval", "hello/interval/level-2", "1") == "isis hello-interval level-2 1"
    assert _level_cli("isis priority", "priority/level-1", "64") == "isis priority 64 level-1"
    assert _level_cli("isis metric", "metric/level-1", None) == "no isis metric level-1"


def _state(node: str = "r1", **kw):
    from substrate.devstate import DeviceState

    return DeviceState(node=node, **kw)


def test_the_configuration_delta_is_normalised_per_daemon_kernel_object_and_nft_rule() -> None:
    from harness.config_f1 import config_delta

    base = _state(frr_daemons={"isisd": "frr version 8.4.4\n!\ninterface eth1\n ipv6 router isis CORE\nexit\n!\nend\n"},
                  routes6=["fcbb:bb00:1:e000::/64 encap seg6local action End.DT6 table 100 count dev sr0"],
                  rules6=["priority 1000 iif eth3 lookup 100"],
                  nft="table inet tenant_fw {\n\tchain t1 {\n\t\tip6 daddr fd10::/64 tcp dport 22 counter packets 4 bytes 9 drop\n\t}\n}")
    after = base.model_copy(update={
        "frr_daemons": {"isisd": "frr version 8.4.4\ninterface eth1\n ipv6 router isis CORE\n isis metric 40\nexit\n"},
        "rules6": [],
        "nft": "table inet tenant_fw {\n\tchain t1 {\n\t\tip6 daddr fd10::/64 tcp dport 22 counter packets 99 bytes 1 drop\n"
               "\t\tip6 daddr fd10::/64 tcp dport 23 drop\n\t}\n}"})
    assert config_delta({"r1": base}, {"r1": after}) == {
        "+ r1 frr isisd: interface eth1 | isis metric 40",
        "- r1 rule6 priority 1000 iif eth3 lookup 100",
        "+ r1 nft inet tenant_fw/t1: ip6 daddr fd10::/64 tcp dport 23 drop",
    }  # counters, banners and the unchanged SID are no change
    assert config_delta({"r1": base}, {"r1": base}) == set()


def test_configuration_f1_is_precision_over_the_agent_and_recall_over_the_reference() -> None:
    from harness.config_f1 import config_f1

    ref = {"+ r1 a", "+ r1 b"}
    assert config_f1(ref, ref).f1 == 1.0
    s = config_f1({"+ r1 a", "+ r1 c", "+ r1 d"}, ref)  # one of three right, one of two found
    assert (round(s.precision, 3), s.recall, round(s.f1, 3)) == (0.333, 0.5, 0.4)
    assert config_f1(set(), ref).f1 == 0.0 and config_f1({"+ r1 a"}, set()).f1 == 0.0
    assert config_f1(set(), set()).f1 == 1.0


@pytest.mark.lab
def test_config_f1_of_real_runs_rewards_the_reference_and_not_a_detour(campaign_lab, tmp_path) -> None:
    """On the shared lab: the scripted A1 reference scores F1 1.0; an agent that also leaves an
    unrelated change (an extra static route) loses precision, not recall; one that does half of
    the reference (one end of an IS-IS metric change) loses recall, not precision; the record and
    the run's config_delta.json carry it."""
    import json

    from harness.run import CONFIG_DELTA_FILE, config_f1_of_run, execute_run, input_digests
    from harness.templates.tasks import make_template_variant
    from tests.test_harness import ani_spec

    lab, sc = campaign_lab
    v = make_template_variant("static-blackhole", sc, 0)
    rec, _ = execute_run(lab, ani_spec("A1", "scripted", run_dir=tmp_path / "ref"), v)
    assert rec.task_pass and rec.config_f1 == 1.0 and rec.config_precision == 1.0
    delta = json.loads((tmp_path / "ref" / CONFIG_DELTA_FILE).read_text())
    assert delta["agent"] == delta["reference"] and delta["agent"]
    # the same change plus a detour, made out-of-band as an agent would leave it
    from substrate.scenario.deploy import reset

    reset(lab)
    pe = v.parameters["pe"]["name"]
    lab.vtysh(pe, "configure terminal", f"ipv6 route {v.parameters['prefix']} blackhole", "ipv6 route 2001:db8:3fff::/48 blackhole")
    (tmp_path / "detour").mkdir()
    score = config_f1_of_run(lab, v, input_digests(lab, v, []), tmp_path / "detour")
    assert score.recall == 1.0 and score.precision == 0.5 and round(score.f1, 3) == 0.667
    # less than the reference: the IS-IS metric on one end of the link only (the reference sets both)
    reset(lab)
    m = make_template_variant("isis-metric", sc, 0)
    link, metric = m.parameters["link"], m.parameters["metric"]
    lab.vtysh(link["a"], "configure terminal", f"interface {link['a_if']}", f"isis metric {metric}")
    (tmp_path / "half").mkdir()
    half = config_f1_of_run(lab, m, input_digests(lab, m, []), tmp_path / "half")
    delta = json.loads((tmp_path / "half" / CONFIG_DELTA_FILE).read_text())
    assert delta["agent"] == [f"+ {link['a']} frr isisd: interface {link['a_if']} | isis metric {metric}"], delta
    assert half.precision == 1.0 and half.recall == 0.5 and round(half.f1, 3) == 0.667, delta
    # a customer-side setup step that fails: the reference delta is refused, not measured without it
    from harness.config_f1 import REFERENCE_DIR, reference_delta

    with pytest.raises(RuntimeError, match=f"a setup step failed on {pe}, so the reference delta cannot be measured"):
        reference_delta(lab, "setup-fails", [], [(pe, ["false"])])
    assert not (lab.dir / REFERENCE_DIR / "setup-fails.json").exists()


def test_an_explicit_manifest_is_honoured_by_the_task_commands() -> None:
    """``--manifest manifests/srv6-brownfield.yaml`` was silently replaced by the templates'
    small manifest (the default's value could not be told from an explicit one)."""
    from harness.cli.campaign import DEFAULT_MANIFEST, TEMPLATE_MANIFEST, task_manifest

    assert task_manifest(True, DEFAULT_MANIFEST, None) == (DEFAULT_MANIFEST, 2)
    assert task_manifest(True, None, None) == (TEMPLATE_MANIFEST, 1)
    assert task_manifest(True, None, 3) == (TEMPLATE_MANIFEST, 3)
    assert task_manifest(False, None, None) == (DEFAULT_MANIFEST, 2)
    assert task_manifest(False, "x.yaml", 1) == ("x.yaml", 1)


def test_a_campaign_of_the_scripted_agent_skips_the_levels_a_template_cannot_express(tmp_path) -> None:
    """``harness campaign --task isis-metric --agent scripted`` stopped with "unknown task class
    'isis-metric'"; it names each level the template cannot express, with the reason, and runs
    the others (here none is left: refused before any lab is deployed)."""
    from typer.testing import CliRunner

    from harness.cli import app
    from harness.tasks import skipped_levels

    assert skipped_levels("bgp-med-out", ["A0", "A1+blocklist", "A2", "A3-T"]) == {
        "A2": "cannot express: " + templates()["bgp-med-out"].cannot("A2"),
        "A3-T": "cannot express: " + templates()["bgp-med-out"].cannot("A3-T")}
    res = CliRunner().invoke(app, ["campaign", "--ani", "A3-T,A4", "--task", "isis-metric", "--agent", "scripted",
                                   "--variants", "1", "--db", str(tmp_path / "c.db"), "--results", str(tmp_path / "r")])
    out = " ".join(res.output.split())
    assert res.exit_code != 0, out
    assert "skipped A3-T: the scripted agent has no reference solution of isis-metric at this level (cannot express: " \
           "A3-T's catalog has service classes" in out
    assert "skipped A4:" in out and "no level of --ani A3-T,A4 can express a reference solution of isis-metric" in out


def test_a_template_that_binds_a_sid_or_adds_a_rule_keeps_that_routers_check_with_its_own_addition(sc) -> None:
    """A template's ``expects`` adds its own SID route (or rule) to the router's whole-state
    check, which stays a damage check: the task may add exactly that (issue 36: invalidating the
    check let a backdoor SID or a leaking rule on the task's PE pass). An ``expects`` naming no
    such check is refused at instantiation."""
    from substrate.scenario.observer import rendered_rule_shape, rendered_sid_shape

    for name, kind, field in (("srv6-end-dt6", "local_sids", "sids"), ("srv6-end-x", "local_sids", "sids"),
                              ("policy-sinkhole", "policy_rules", "rules")):
        v = make_template_variant(name, sc, 0)
        (chk,) = [i for i in v.damage_checks if i.kind == kind and i.id.startswith(f"device/{v.reference['A0'] and next(iter(v.reference['A0']))}/")
                  and (kind != "policy_rules" or i.params["family"] == 6)]
        base = next(i for i in sc.invariants if i.id == chk.id)
        added = chk.params[field][len(base.params[field]):]
        assert len(added) == 1 and chk.params[field][:len(base.params[field])] == base.params[field], (name, added)
        shape = rendered_sid_shape(added[0]) if kind == "local_sids" else rendered_rule_shape(6, added[0])
        assert shape and "?" not in shape and "-1:" not in shape, (name, shape)
    t = templates()["srv6-end-dt6"].model_copy(update={"expects": {"device/{{ site.pe }}/nft_tables": ["x"]}})
    from harness.templates.instantiate import instantiate
    from harness.templates.schema import InstantiationRefused

    with pytest.raises(InstantiationRefused, match="expects 'device/r[0-9]+/nft_tables': no damage check"):
        instantiate(t, sc, 0)
