"""Containerlab export, validated against Containerlab's published JSON Schema."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from substrate.export import to_containerlab, write_containerlab
from substrate.topology import Topology
from tests.conftest import shared_data


@pytest.fixture(scope="module")
def clab_schema() -> dict:
    return json.loads(shared_data("containerlab", "clab.schema.json").read_text())


def _validate(schema: dict, doc: dict) -> None:
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_schema_accepts_upstream_example_and_rejects_nonsense(clab_schema: dict) -> None:
    # the validator is not vacuous: Containerlab's own frr01 passes, a broken file does not
    example = yaml.safe_load(shared_data("containerlab", "frr01", "frr01.clab.yml").read_text())
    _validate(clab_schema, example)
    with pytest.raises(jsonschema.ValidationError):
        _validate(clab_schema, {"name": "x", "topology": {"nodes": {"r1": {"kind": "no-such-kind"}}}})


@pytest.mark.parametrize("spec", ["grid:5x5", "line:3", "ring:4:nohosts"])
def test_export_validates_against_containerlab_schema(clab_schema: dict, spec: str) -> None:
    topo = Topology.from_spec(spec)
    doc, files = to_containerlab(topo, "demo")
    _validate(clab_schema, json.loads(json.dumps(doc)))
    assert set(doc["topology"]["nodes"]) == {n.name for n in topo.nodes}
    assert len(doc["topology"]["links"]) == len(topo.links)
    for r in topo.routers:
        conf = files[f"{r.name}/frr.conf"]
        assert f"hostname {r.name}" in conf and "router isis CORE" in conf
        assert "isisd=yes" in files[f"{r.name}/daemons"]
        assert any("seg6local action End flavors next-csid" in c for c in doc["topology"]["nodes"][r.name]["exec"])


def test_write_containerlab_writes_bound_files(tmp_path, clab_schema: dict) -> None:
    path = write_containerlab(Topology.from_spec("line:3"), "l3", tmp_path)
    doc = yaml.safe_load(path.read_text())
    _validate(clab_schema, doc)
    for node in doc["topology"]["nodes"].values():
        for bind in node.get("binds", []):
            assert (tmp_path / bind.split(":")[0]).is_file()
    assert doc["topology"]["links"][0] == {"endpoints": ["r1:eth1", "r2:eth1"]}


def test_scenario_services_are_exported(clab_schema: dict) -> None:
    from substrate.scenario import build, load_manifest
    from tests.conftest import REPO

    sc = build(load_manifest(REPO / "tests" / "data" / "small-brownfield.yaml"))
    doc, files = to_containerlab(sc.topology, "bf", services=sc.node_config)
    _validate(clab_schema, json.loads(json.dumps(doc)))
    site = sc.all_sites()[0]
    pe = doc["topology"]["nodes"][site.pe]
    assert any("End.DT6" in c for c in pe["exec"]) and any(c.startswith("ip -6 rule add") for c in pe["exec"])
    assert f"interface {site.pe_if}" in files[f"{site.pe}/frr.conf"]
    assert any(c.startswith("ip addr add") for c in doc["topology"]["nodes"][site.ce]["exec"])
    fw = next(n for n, cfg in sc.node_config.items() if "inet tenant_fw" in cfg.nft)
    assert f"{fw}/nft-inet-tenant_fw.nft" in files and any("nft -f" in c for c in doc["topology"]["nodes"][fw]["exec"])
