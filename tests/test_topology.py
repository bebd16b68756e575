"""Unit tests of the topology model (no lab)."""

from __future__ import annotations

import pytest

from substrate.errors import TopologyError
from substrate.topology import Role, Topology


def test_grid_5x5_roles_links_and_hosts() -> None:
    t = Topology.from_spec("grid:5x5")
    assert len(t.routers) == 25
    assert len(t.core_links()) == 2 * 5 * 4  # 20 horizontal + 20 vertical
    pes = {n.name for n in t.routers if n.role is Role.PE}
    ps = {n.name for n in t.routers if n.role is Role.P}
    assert ps == {"r7", "r8", "r9", "r12", "r13", "r14", "r17", "r18", "r19"}
    assert len(pes) == 16
    assert {h.name for h in t.hosts} == {"h" + p[1:] for p in pes}
    for h in t.hosts:
        gw, _ = t.gateway_of(h.name)
        assert gw.name == "r" + h.name[1:] and gw.role is Role.PE
    # corner r1 has two core links then its host link: eth1, eth2, eth3
    assert [lk.endpoint_of("r1").interface for lk in t.links_of("r1")] == ["eth1", "eth2", "eth3"]
    assert t.node("r13").node_id == 13


def test_line_ring_and_nohosts() -> None:
    t = Topology.from_spec("line:4")
    assert [n.role for n in t.routers] == [Role.PE, Role.P, Role.P, Role.PE]
    assert t.neighbors("r2") == ["r1", "r3"]
    ring = Topology.from_spec("ring:5:nohosts")
    assert not ring.hosts and len(ring.links) == 5
    assert sorted(ring.neighbors("r1")) == ["r2", "r5"]


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("mesh:4", "unknown topology spec"),
        ("grid:5", "grid needs RxC"),
        ("line:1", "between 2 and"),
        ("ring:2", "between 3 and"),
        ("line:3x3", "takes one size"),
    ],
)
def test_bad_specs_give_clear_errors(spec: str, needle: str) -> None:
    with pytest.raises(TopologyError, match=needle):
        Topology.from_spec(spec)


def test_yaml_form_with_auto_interfaces(tmp_path) -> None:
    f = tmp_path / "tri.yaml"
    f.write_text(
        "name: tri\nnodes:\n  r1: {role: PE}\n  r2: {role: P}\n  r3: {role: PE}\n  h1: {role: host}\n"
        "links:\n  - [r1:eth5, r2]\n  - [r2, r3]\n  - {endpoints: [r3, r1], metric: 50}\n  - [h1, r1]\n"
    )
    t = Topology.from_spec(str(f))
    assert t.name == "tri"
    assert [lk.endpoint_of("r1").interface for lk in t.links_of("r1")] == ["eth5", "eth1", "eth2"]
    assert t.links[2].metric == 50


@pytest.mark.parametrize(
    "body,needle",
    [
        ("nodes:\n  r1: {role: PE}\nlinks:\n  - [r1, r9]\n", "unknown node 'r9'"),
        ("nodes:\n  r1: {role: PE}\n  r2: {role: P}\nlinks:\n  - [r1:eth1, r2]\n  - [r1:eth1, r2:eth7]\n", "used by more than one"),
        ("nodes:\n  r1: {role: PE}\n  r2: {role: P}\nlinks:\n  - [r1:eth0, r2]\n", "reserved"),
        ("nodes:\n  r1: {role: boss}\n", "role"),
        ("nodes:\n  R1: {role: P}\n", "name"),
        ("nodes:\n  h1: {role: host}\n", "host h1 has no link"),
        ("nodes: [\n", "malformed YAML at line"),
        ("links: []\n", "expected a mapping with 'nodes'"),
    ],
)
def test_bad_yaml_is_refused(tmp_path, body: str, needle: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(body)
    with pytest.raises(TopologyError, match=needle):
        Topology.from_yaml(f)


def test_interface_names_fit_ifnamsiz() -> None:
    with pytest.raises(TopologyError):
        Topology.build("x", [{"name": "r1", "role": "P"}, {"name": "r2", "role": "P"}], [["r1:averyveryverylongname", "r2"]])
