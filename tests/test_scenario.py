"""Unit tests of manifests and scenario generation (pure: no lab)."""

from __future__ import annotations

import ipaddress
import json
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
import yaml

from substrate.scenario import ManifestError, build, load_manifest, parse_manifest
from substrate.scenario.apply import config_delta
from substrate.scenario.manifest import manifest_json_schema
from tests.conftest import REPO

MANIFEST = REPO / "manifests" / "srv6-brownfield.yaml"
SMALL = REPO / "tests" / "data" / "small-brownfield.yaml"


def test_same_manifest_and_seed_give_byte_identical_scenarios(tmp_path: Path) -> None:
    m = load_manifest(MANIFEST)
    a, b = build(m, seed=7, density=2).to_json(), build(load_manifest(MANIFEST), seed=7, density=2).to_json()
    assert a == b
    assert build(m, seed=8, density=2).to_json() != a
    assert build(m, seed=7, density=3).to_json() != a


def test_reference_manifest_has_every_class_and_about_25_routers() -> None:
    sc = build(load_manifest(MANIFEST))
    from substrate.topology import Role

    assert len([r for r in sc.topology.routers if r.role is not Role.EXTERNAL]) == 25
    assert [r.name for r in sc.topology.routers if r.role is Role.EXTERNAL] == ["xr1"]  # the external AS (ebgp_peering)
    from substrate.scenario.layers import registry

    assert sc.layers == [c.name for c in registry()]  # every registered class, in registry order
    kinds = Counter(i.kind for i in sc.invariants)
    for kind in ("reach", "isolated", "steered_path", "tcp_verdict", "isis_adjacency", "sid_bound", "fib_has", "nft_rule",
                 "rate", "shaper", "bgp_session", "bgp_routes"):
        assert kinds[kind] > 0, kind
    # every service instance has invariants, and invariant ids are unique
    services = {i.service for i in sc.invariants}
    assert {f"l3vpn/{t.id}" for t in sc.tenants if len(t.sites) > 1} <= services
    assert {f"steering/{p.id}" for p in sc.steering} <= services
    assert {f"route_leak/{x.id}" for x in sc.route_leaks} <= services and sc.route_leaks
    assert {f"rate_limit/{x.id}" for x in sc.rate_limits} <= services and sc.rate_limits
    assert {f"ebgp_peering/{x.id}" for x in sc.ebgp_peerings} <= services and sc.ebgp_peerings
    assert len({i.id for i in sc.invariants}) == len(sc.invariants)


def test_density_scales_instances_not_topology() -> None:
    m = load_manifest(MANIFEST)
    d1, d3 = build(m, density=1), build(m, density=3)
    assert len(d1.topology.routers) == len(d3.topology.routers)
    assert len(d3.tenants) == 3 * len(d1.tenants)
    assert len(d3.route_leaks) > len(d1.route_leaks) > 0
    assert len(d3.rate_limits) == 3 * len(d1.rate_limits) > 0
    assert len(d3.ebgp_peerings[0].announced) > len(d1.ebgp_peerings[0].announced)
    assert len(d3.ebgp_peerings[0].advertise) == 3 * len(d1.ebgp_peerings[0].advertise)
    assert len(d3.invariants) > 2 * len(d1.invariants) - 200


def test_shared_resources_and_traps() -> None:
    sc = build(load_manifest(MANIFEST), seed=7, density=3)
    sites = sc.all_sites()
    # skewed load: the busiest PE carries several times the sites of the median PE
    load = Counter(s.pe for s in sites).most_common()
    assert load[0][1] >= 3 * load[len(load) // 2][1]
    # overlap: some prefix is used by two tenants, never twice on one PE nor within a tenant
    by_prefix: dict[str, list] = {}
    for s in sites:
        by_prefix.setdefault(s.prefix6, []).append(s)
    shared = [v for v in by_prefix.values() if len({s.tenant for s in v}) > 1]
    assert shared
    for v in by_prefix.values():
        assert len({s.pe for s in v}) == len(v) and len({s.tenant for s in v}) == len(v)
    # adjacency: freshly allocated prefixes are consecutive /64s of the pool
    fresh = sorted({ipaddress.IPv6Network(s.prefix6) for s in sites}, key=lambda n: int(n.network_address))
    assert int(fresh[1].network_address) - int(fresh[0].network_address) == 1 << 64
    # SID functions are shared per PE: DT6 and DX4 of different tenants on one PE never collide
    for pe in {s.pe for s in sites}:
        fns = [fn for t in sc.tenants for p, fn in t.dt6_functions.items() if p == pe]
        fns += [s.dx4_function for s in sites if s.pe == pe and s.dx4_function is not None]
        assert len(fns) == len(set(fns))


def test_schema_export_validates_the_shipped_manifests() -> None:
    schema = manifest_json_schema()
    for path in (MANIFEST, SMALL):
        jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(path.read_text()))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate({"name": "x", "topology": "line:3", "layers": [{"nope": {}}]})
    json.dumps(schema)


BASE = "name: m\ntopology: grid:3x3:nohosts\nlayers:\n"


@pytest.mark.parametrize(
    "text,needle",
    [
        (BASE + "  - underlay\n  - cloud\n", r"line 5, layers\[1\]: unknown layer 'cloud'; registered service classes: underlay, addressing, l3vpn"),
        (BASE + "  - underlay\n  - l3vpn\n", r"line 5, layers\[1\]: layer 'l3vpn' needs 'addressing' before it"),
        (BASE + "  - underlay\n  - underlay\n", r"appears twice"),
        (BASE + "  - underlay\n  - addressing\n  - l3vpn:\n      sitez: 3\n",
         r"line 7, layers\[2\].l3vpn.sitez: Extra inputs are not permitted"),
        (BASE + "  - underlay\n  - addressing\n  - l3vpn:\n      sites: many\n", r"line 7, layers\[2\].l3vpn.sites"),
        ("name: m\ntopology: grid:3x3\ndensity: 0\nlayers: [underlay]\n", r"line 3, density: Input should be greater"),
        ("name: m\ntopology: grid:3x3\nlayers: [underlay\n", r"line 4: malformed YAML"),
        ("name: m\ntopolgy: grid:3x3\nlayers: [underlay]\n", r"line 2, topolgy: Extra inputs.*also line 1, topology: Field required"),
    ],
)
def test_bad_manifests_name_field_and_line(text: str, needle: str) -> None:
    with pytest.raises(ManifestError, match=needle):
        parse_manifest(text)


def test_density_that_does_not_fit_the_pools_names_the_field() -> None:
    m = parse_manifest(BASE + "  - underlay\n  - addressing: {prefix4: 10.0.0.0/23}\n  - l3vpn: {ipv4_share: 1.0, sites: [4, 4]}\n")
    with pytest.raises(ManifestError, match=r"pools.prefix4: .*density 2 does not fit the pools"):
        build(m, density=2)
    m = parse_manifest(BASE + "  - underlay\n  - addressing: {tables: [100, 102]}\n  - l3vpn\n")
    with pytest.raises(ManifestError, match=r"layers.l3vpn.tenants_per_density: density 2 needs 6 tables"):
        build(m, density=2)
    with pytest.raises(ManifestError, match="topology"):
        build(parse_manifest("name: m\ntopology: mesh:3\nlayers: [underlay]\n"))


def test_config_delta_changes_only_what_the_inventory_changed() -> None:
    sc = build(load_manifest(SMALL))
    t = next(t for t in sc.tenants if len({s.pe for s in t.sites}) > 1)
    site = t.sites[-1]
    from substrate.scenario import render_scenario

    after = sc.model_copy(deep=True)
    after.tenant(t.id).sites = [s for s in after.tenant(t.id).sites if s.id != site.id]
    after.firewalls = [f for f in after.firewalls if f.tenant != t.id]
    after.steering = [p for p in after.steering if p.dst_site != site.id]
    after.floating_ips = [f for f in after.floating_ips if f.site != site.id]
    cfg_b, cfg_a = sc.node_config, render_scenario(after)
    d = config_delta(site.pe, cfg_b.get(site.pe), cfg_a.get(site.pe))
    text = "\n".join(d.describe())
    assert f"rule del priority 1000 iif {site.pe_if} lookup {t.table}" in text
    from substrate.scenario.layers.l3vpn import ce_iface

    assert d.frr[:2] == [f"interface {site.pe_if}", f"no ipv6 address {ce_iface(site.prefix6, 1)}"]
    assert f"~ frr: no ipv6 address {ce_iface(site.prefix6, 1)}" in text
    other = next(s for s in t.sites if s.pe != site.pe)
    d2 = config_delta(other.pe, cfg_b.get(other.pe), cfg_a.get(other.pe))
    assert any(site.prefix6 in x and "route del" in x for x in d2.removals)
    untouched = [n for n in cfg_b if n not in {site.pe, other.pe} and cfg_b[n] == cfg_a.get(n)]
    assert untouched and all(config_delta(n, cfg_b[n], cfg_a[n]).empty() for n in untouched)


def _line_manifest(tmp_path: Path, routers: int) -> Path:
    """The small brownfield's manifest on a ``line:N`` base, with a few steering policies asked for."""
    data = yaml.safe_load(SMALL.read_text())
    data["name"], data["topology"] = f"small-line{routers}", f"line:{routers}:nohosts"
    data["layers"] = [{"steering": {"per_density": 3}} if isinstance(x, dict) and "steering" in x else x
                      for x in data["layers"]]
    path = tmp_path / f"line{routers}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("routers", [3, 4])
def test_steering_waypoint_is_never_the_ingress_or_egress_pe_on_a_small_base(tmp_path: Path, routers: int) -> None:
    m = load_manifest(_line_manifest(tmp_path, routers))
    policies = []
    for seed in range(12):
        try:
            sc = build(m, seed=seed, density=1)
        except ManifestError as e:  # a seed whose tenants all sit on one PE: nothing to steer
            assert "no tenant has sites on two PEs" in str(e)
            continue
        for p in sc.steering:
            policies.append(p)
            assert p.waypoint not in (p.ingress_pe, sc.site(p.dst_site).pe), p
            # on a line the only routers besides the two end PEs are the P routers in between
            assert p.waypoint in {f"r{i}" for i in range(2, routers)}, p
            inv = next(i for i in sc.invariants if i.id == f"steering/{p.id}/path")
            assert inv.params["node"] == p.waypoint
    assert len(policies) >= 6


def test_steering_refuses_a_base_with_no_router_between_the_pes(tmp_path: Path) -> None:
    m = load_manifest(_line_manifest(tmp_path, 2))
    refused = 0
    for seed in range(6):
        with pytest.raises(ManifestError, match=r"layers.steering.per_density: no (router to steer through|tenant has)") as e:
            build(m, seed=seed, density=1)
        refused += "router to steer through" in str(e.value)
    assert refused  # some seed has a tenant on both PEs, and its only flows cannot be steered
    # without the steering layer the same base builds
    data = yaml.safe_load((tmp_path / "line2.yaml").read_text())
    data["layers"] = [x for x in data["layers"] if not (isinstance(x, dict) and "steering" in x)]
    assert not build(parse_manifest(yaml.safe_dump(data, sort_keys=False)), seed=0).steering


def test_a_bad_density_argument_is_blamed_on_the_argument_not_the_manifest(tmp_path: Path) -> None:
    import subprocess
    import sys

    with pytest.raises(ManifestError, match=r"^--density: density must be >= 1, got 0$"):
        build(load_manifest(MANIFEST), density=0)
    r = subprocess.run([sys.executable, "-m", "harness.cli", "scenario", "build", "-m", str(MANIFEST), "-o",
                        str(tmp_path / "s.json"), "--density", "0", "--no-verify"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "Invalid value for '--density'" in r.stderr and "line" not in r.stderr, r.stderr
    assert not (tmp_path / "s.json").exists()
    r = subprocess.run([sys.executable, "-m", "harness.cli", "scenario", "build", "-m", str(MANIFEST), "-o",
                        str(tmp_path / "s.json"), "--seed", "-1", "--no-verify"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "Invalid value for '--seed'" in r.stderr, r.stderr
    assert not (tmp_path / "s.json").exists()


def test_scenario_show_takes_a_manifest_too() -> None:
    """A new user's first try, ``harness scenario show manifests/srv6-brownfield.yaml``, said
    "invalid Scenario: Invalid JSON"; it builds the manifest and lists every layer's instances."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "harness.cli", "scenario", "show", str(REPO / "manifests" / "srv6-brownfield.yaml")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "built from manifest" in r.stdout and "ebgp_peering (1)" in r.stdout and "route_leak" in r.stdout, r.stdout


def test_firewall_invariants_are_worded_in_english() -> None:
    verdicts = [i for i in build(load_manifest(MANIFEST), seed=7, density=2).invariants if i.kind == "tcp_verdict"]
    assert {i.params["expect"] for i in verdicts} == {"allow", "deny"}
    for i in verdicts:
        word = {"allow": "is allowed (", "deny": "is denied ("}[i.params["expect"]]
        assert word in i.description and "denyed" not in i.description, i.description
