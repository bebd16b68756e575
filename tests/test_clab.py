"""Containerlab import (substrate.clab), without a lab: the upstream frr01 example in both
dialects, Containerlab's inheritance rules, round trips with the export, name mapping and every
malformed construct's one-line error -- each checked against Containerlab's JSON Schema."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from substrate.clab import ClabError, from_spec, load
from substrate.clab.frrfiles import DaemonsFileError, parse_daemons_file
from substrate.clab.names import map_interface, map_nodes
from substrate.errors import TopologyError
from substrate.export import write_containerlab
from substrate.topology import Role, Topology
from tests.conftest import REPO, shared_data

HARNESS = [sys.executable, "-m", "harness.cli"]


def frr01() -> Path:
    return shared_data("containerlab", "frr01", "frr01.clab.yml")


@pytest.fixture(scope="module")
def clab_schema() -> dict:
    return json.loads(shared_data("containerlab", "clab.schema.json").read_text())


def with_frr_kind(schema: dict) -> dict:
    """The pinned schema plus the frr kind, which Containerlab added after that commit (PR #3382:
    kinds frr/frrouting, ``extras.frr.daemons``); nothing else is changed."""
    s = copy.deepcopy(schema)
    s["definitions"]["node-config"]["properties"]["kind"]["enum"] += ["frr", "frrouting"]
    s["properties"]["topology"]["properties"]["kinds"]["properties"]["frr"] = {"$ref": "#/definitions/node-config"}
    s["definitions"]["extras-config"]["properties"]["frr"] = {
        "type": "object", "properties": {"daemons": {"type": "array", "items": {"type": "string"}}},
        "additionalProperties": False,
    }  # fmt: skip
    return s


def _python_re(node: object) -> object:
    """The schema with its one non-Python regex construct (``\\p{N}\\p{L}``, Unicode classes of
    an address's zone suffix) written as Python's ``re`` says it (``\\w``)."""
    if isinstance(node, dict):
        return {k: _python_re(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_python_re(v) for v in node]
    return node.replace("\\p{N}\\p{L}", "\\w") if isinstance(node, str) else node


def schema_ok(schema: dict, doc: object) -> bool:
    return jsonschema.Draft202012Validator(_python_re(schema)).is_valid(json.loads(json.dumps(doc)))


def bare(topo: Topology) -> dict:
    """The model without the import's metadata and name (Containerlab names cannot hold ':')."""
    return topo.model_dump(exclude={"name": True, "nodes": {"__all__": {"source"}}})


# -- the upstream example ----------------------------------------------------------------------


def test_frr01_imports_as_containerlab_runs_it(clab_schema: dict) -> None:
    path = frr01()
    assert schema_ok(clab_schema, yaml.safe_load(path.read_text()))
    imp = load(path)
    topo = imp.topology
    assert [n.name for n in topo.nodes] == ["router1", "router2", "router3", "pc1", "pc2", "pc3"]
    for r in ("router1", "router2", "router3"):
        n = topo.node(r)
        assert n.role is Role.PE and n.self_configured  # each has a PC: a provider edge
        assert n.daemons == ("zebra", "staticd", "ospfd", "ldpd")  # daemons file: ospfd, ldpd; zebra, staticd always
        assert n.frr_files == {"frr.conf": (path.parent / r / "frr.conf").read_text()}
        assert n.source is not None and n.source.image == "quay.io/frrouting/frr:10.5.1" and n.source.kind == "linux"
        assert n.source.files["frr.conf"].endswith(f"{r}/frr.conf")
    pc1 = topo.node("pc1")
    assert pc1.role is Role.HOST and pc1.managed and pc1.source is not None and pc1.source.name == "PC1"
    assert pc1.hostname == "PC1"
    assert pc1.exec[1] == "ip addr add 192.168.11.2/24 dev eth1"
    text = path.read_text().splitlines()
    assert all(text[line - 1].strip() == f"- {cmd}" for cmd, line in zip(pc1.exec, pc1.source.exec_lines, strict=True))
    assert [(str(lk.a), str(lk.b)) for lk in topo.links][:2] == [("router1:eth1", "router2:eth1"), ("router1:eth2", "router3:eth1")]
    assert any("PC1 -> pc1" in n for n in imp.notes)


FRR_DIALECT = """\
name: frr01
topology:
  kinds:
    frr:
      image: quay.io/frrouting/frr:containerlab-10.7.1
  groups:
    hosts:
      kind: linux
      image: wbitt/network-multitool:3.22.2
  nodes:
    router1:
      kind: frr
      startup-config: router1/frr.conf
      extras:
        frr:
          daemons: [ospfd, ldpd]
    router2:
      kind: frr
      startup-config: router2/frr.conf
      extras:
        frr:
          daemons: [zebra, ospfd, ldpd]
    router3:
      kind: frrouting
      startup-config: |
{router3}
      extras:
        frr:
          daemons: [ldpd, ospfd, mgmtd]
{hosts}
  links:
{links}"""


def frr_dialect(tmp_path: Path) -> Path:
    """frr01 written for the frr kind: startup-config (a path, and inline for router3) and the
    daemon set in the node definitions; hosts and links as upstream."""
    src = frr01().parent
    for r in ("router1", "router2"):
        (tmp_path / r).mkdir()
        shutil.copy(src / r / "frr.conf", tmp_path / r / "frr.conf")
    up = src / "frr01.clab.yml"
    lines = up.read_text().splitlines()
    hosts = "\n".join(lines[lines.index("    PC1:"): lines.index("  links:")])
    links = "\n".join(lines[lines.index("  links:") + 1:])
    router3 = "\n".join("        " + ln if ln else "" for ln in (src / "router3" / "frr.conf").read_text().splitlines())
    p = tmp_path / "frr01-frr-kind.clab.yml"
    p.write_text(FRR_DIALECT.format(router3=router3, hosts=hosts, links=links) + "\n")
    return p


def test_the_frr_kind_dialect_gives_the_same_model(tmp_path: Path, clab_schema: dict) -> None:
    p = frr_dialect(tmp_path)
    doc = yaml.safe_load(p.read_text())
    assert not schema_ok(clab_schema, doc)  # the pinned schema predates the frr kind ...
    assert schema_ok(with_frr_kind(clab_schema), doc)  # ... which is all it lacks
    other = load(p).topology
    assert bare(other) == bare(load(frr01()).topology)
    assert other.node("router1").source.kind == "frr" and other.node("router3").source.kind == "frr"


def test_the_frr_kind_defaults(tmp_path: Path) -> None:
    p = tmp_path / "k.clab.yml"
    p.write_text("name: k\ntopology:\n  nodes:\n    r1: {kind: frr}\n")
    imp = load(p)
    r1 = imp.topology.node("r1")
    # no extras.frr.daemons: every daemon the kind knows that this FRR has; Containerlab's default frr.conf
    assert {"bgpd", "ospfd", "isisd", "ldpd", "pathd"} <= set(r1.frr_daemons) and "pim6d" not in r1.frr_daemons
    assert r1.frr_files == {"frr.conf": "frr defaults traditional\n!\nlog stdout\n!\n"}
    assert any("pim6d" in n and "sharpd" in n for n in imp.notes)


def test_container_limits_are_ignored_with_the_lab_limits_named(tmp_path: Path) -> None:
    """A node's cpu/memory give way to the lab's own node limits (every netns node has them)."""
    p = tmp_path / "lim.clab.yml"
    p.write_text("name: lim\ntopology:\n  nodes:\n    h1: {kind: linux, memory: 1Gb, cpu: 2, restart-policy: always}\n")
    notes = load(p).notes
    assert any("memory ignored" in n and "ANIBENCH_NODE_LIMITS" in n for n in notes), notes
    assert any("cpu ignored" in n and "ANIBENCH_NODE_LIMITS" in n for n in notes), notes
    assert any("restart-policy ignored: no effect on a netns node" in n for n in notes), notes


# -- Containerlab's inheritance ----------------------------------------------------------------

INHERIT = """\
name: inherit
topology:
  defaults:
    kind: linux
    image: defaults-image
    exec: [echo defaults, echo shared]
    sysctls: {net.ipv4.ip_forward: 0, net.ipv6.conf.all.forwarding: 0}
    labels: {anibench.role: host}
  kinds:
    linux:
      group: from-kind
      image: kind-image
      exec: [echo kind]
  groups:
    from-kind:
      exec: [echo group-of-kind, echo shared]
    routers:
      kind: frr
      image: group-image
      sysctls: {net.ipv4.ip_forward: 1}
      labels: {anibench.role: P}
  nodes:
    h1: {exec: [echo node]}
    h2: {group: other, image: node-image, mgmt-ipv4: 172.20.20.12, mgmt-ipv6: "3fff:172:20:20::12"}
    r1: {group: routers, exec: [echo node]}
  links:
    - endpoints: [h1:eth1, r1:eth1]
    - endpoints: [h2:eth1, r1:eth2]
"""


def test_inheritance_follows_containerlab(tmp_path: Path, clab_schema: dict) -> None:
    p = tmp_path / "inherit.clab.yml"
    p.write_text(INHERIT)
    assert schema_ok(with_frr_kind(clab_schema), yaml.safe_load(INHERIT))
    topo = load(p).topology
    h1, h2, r1 = topo.node("h1"), topo.node("h2"), topo.node("r1")
    # kind: node, else group, else defaults; group: node, else the kind's, else defaults
    assert (h1.source.kind, r1.source.kind) == ("linux", "frr")
    # one-value fields: node > group > kind > defaults (h1 is in group from-kind, set by kinds.linux.group)
    assert (h1.source.image, h2.source.image, r1.source.image) == ("kind-image", "node-image", "group-image")
    # lists: defaults, kind, group, node, duplicates dropped
    assert h1.exec == ("echo defaults", "echo shared", "echo kind", "echo group-of-kind", "echo node")
    assert h2.exec == ("echo defaults", "echo shared", "echo kind")
    assert r1.exec == ("echo defaults", "echo shared", "echo node")  # kinds.frr undefined, group routers has no exec
    # maps: merged, the more specific level wins
    assert r1.sysctls == {"net.ipv4.ip_forward": "1", "net.ipv6.conf.all.forwarding": "0"}
    assert r1.role is Role.P and h1.role is Role.HOST
    # management addresses: the node's own, kept as metadata
    assert (h2.source.mgmt_ipv4, h2.source.mgmt_ipv6, h1.source.mgmt_ipv4) == ("172.20.20.12", "3fff:172:20:20::12", "")


def test_binds_resolve_relative_to_the_file_and_the_most_specific_wins(tmp_path: Path) -> None:
    (tmp_path / "lab" / "r1").mkdir(parents=True)
    (tmp_path / "lab" / "common.conf").write_text("! group\n")
    (tmp_path / "lab" / "r1" / "frr.conf").write_text("! node\n")
    (tmp_path / "lab" / "r1" / "daemons").write_text("bgpd=yes\nisisd=no\n")
    (tmp_path / "lab" / "t.clab.yml").write_text(
        "name: t\ntopology:\n  groups:\n    rt:\n      kind: linux\n      image: quay.io/frrouting/frr:10.5.1\n"
        "      binds: [common.conf:/etc/frr/frr.conf]\n"
        "  nodes:\n    r1:\n      group: rt\n      binds: [__clabNodeName__/frr.conf:/etc/frr/frr.conf, "
        "__clabNodeName__/daemons:/etc/frr/daemons:ro]\n    r2: {group: rt}\n"
    )
    topo = from_spec(str(tmp_path / "lab" / "t.clab.yml")).topology  # resolved against the file, not the cwd
    assert topo.node("r1").frr_files == {"frr.conf": "! node\n"} and topo.node("r1").daemons == ("zebra", "staticd", "bgpd")
    assert topo.node("r2").frr_files == {"frr.conf": "! group\n"} and topo.node("r2").daemons == ("zebra", "staticd")


# -- round trips with the export ---------------------------------------------------------------


@pytest.mark.parametrize("spec", ["grid:5x5", "line:3", "ring:4:nohosts"])
def test_export_then_import_gives_the_same_model(tmp_path: Path, clab_schema: dict, spec: str) -> None:
    topo = Topology.from_spec(spec)
    path = write_containerlab(topo, "rt", tmp_path)
    assert schema_ok(clab_schema, yaml.safe_load(path.read_text()))
    back = load(path)
    assert bare(back.topology) == bare(topo)  # nodes, roles, router ids, links, daemon sets, configs
    assert not any(n.self_configured for n in back.topology.routers)  # the substrate's own underlay again
    assert back.notes == []


def test_brownfield_scenario_topology_round_trips(tmp_path: Path) -> None:
    from substrate.scenario import build, load_manifest

    sc = build(load_manifest(REPO / "manifests" / "srv6-brownfield.yaml"), seed=7, density=2)
    assert any(n.managed for n in sc.topology.hosts)  # tenant CEs: addressed by the scenario, not the base plan
    assert bare(load(write_containerlab(sc.topology, "bf", tmp_path)).topology) == bare(sc.topology)


def test_imported_lab_round_trips_and_edits_are_kept(tmp_path: Path, clab_schema: dict) -> None:
    first = load(frr01()).topology
    path = write_containerlab(first, "frr01", tmp_path / "a")
    assert schema_ok(clab_schema, yaml.safe_load(path.read_text()))
    assert bare(load(path).topology) == bare(first)
    # an exported underlay router whose frr.conf was edited keeps the edit: it is no longer the plain underlay
    grid = write_containerlab(Topology.from_spec("line:3"), "l3", tmp_path / "b")
    conf = tmp_path / "b" / "r2" / "frr.conf"
    conf.write_text(conf.read_text().replace(" spf-interval 1", " spf-interval 2"))
    r2 = load(grid).topology.node("r2")
    assert r2.self_configured and "spf-interval 2" in r2.frr_files["frr.conf"]


def test_topology_yaml_round_trip_and_cli_import(tmp_path: Path) -> None:
    topo = load(frr01()).topology
    out = tmp_path / "topo.yaml"
    r = subprocess.run([*HARNESS, "lab", "import", str(frr01()), "-o", str(out)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "PC1 -> pc1" in r.stderr and "harness lab up --topology" in r.stdout
    assert Topology.from_yaml(out) == topo
    with pytest.raises(TopologyError, match="Containerlab topology file"):
        Topology.from_yaml(frr01())  # the plain YAML reader points to the importer


# -- names -------------------------------------------------------------------------------------


def test_long_and_odd_names_map_deterministically() -> None:
    names = ["PC1", "router1", "spine-01.dc|east", "Leaf_With_A_Very_Long_Name_1", "Leaf_With_A_Very_Long_Name_2", "pc-1"]
    m = map_nodes(names)
    assert m == map_nodes(list(reversed(names)))  # order does not matter
    assert m["router1"] == "router1" and m["spine-01.dc|east"].startswith("spine01") and len(m["spine-01.dc|east"]) == 12
    assert m["PC1"] != m["pc-1"]  # both would be pc1: neither keeps it
    assert all(re.fullmatch(r"[a-z][a-z0-9]{0,11}", v) for v in m.values()) and len(set(m.values())) == len(names)
    assert map_interface("eth1") == "eth1"
    long = map_interface("ethernet-1-1-uplink-to-spine")
    assert len(long) <= 15 and long == map_interface("ethernet-1-1-uplink-to-spine") and long != map_interface("ethernet-1-1-uplink-to-spine2")
    assert len(map_interface("GigabitEthernet0/0/0/1")) <= 15 and "/" not in map_interface("GigabitEthernet0/0/0/1")


def test_renamed_interfaces_are_rewritten_in_frr_files(tmp_path: Path) -> None:
    p = tmp_path / "n.clab.yml"
    p.write_text(
        "name: n\ntopology:\n  nodes:\n"
        "    core-router-number-one:\n      kind: frr\n      startup-config: |\n"
        "        interface ethernet-1-1-to-edge\n         ip address 10.0.0.1/31\n        !\n"
        "        interface ethernet-1-1-to-edge2\n         ip address 10.0.0.3/31\n"
        "    edge:\n      kind: frr\n"
        "  links:\n    - endpoints: [core-router-number-one:ethernet-1-1-to-edge, edge:eth1]\n"
    )
    imp = load(p)
    core = imp.topology.node(map_nodes(["core-router-number-one", "edge"])["core-router-number-one"])
    new = map_interface("ethernet-1-1-to-edge")
    assert core.source.interfaces == {new: "ethernet-1-1-to-edge"} and core.hostname == "core-router-number-one"
    conf = core.frr_files["frr.conf"]
    assert f"interface {new}\n" in conf and "interface ethernet-1-1-to-edge2\n" in conf  # whole names only
    assert str(imp.topology.links[0].a) == f"{core.name}:{new}"


def test_daemons_file() -> None:
    daemons, ignored = parse_daemons_file("# comment\nzebra=no\nbgpd=yes\nospfd=no\nbgpd_options=\" -A 127.0.0.1\"\n")
    assert daemons == ("zebra", "staticd", "bgpd") and ignored == ["bgpd_options"]
    with pytest.raises(DaemonsFileError) as e:
        parse_daemons_file("bgpd=no\npim6d=yes\n")
    assert e.value.line == 2 and "pim6d=no" in str(e.value)


# -- malformed files: one line naming file, line, field and what to do -------------------------

BASE = """\
name: lab
topology:
  nodes:
    r1:
      kind: linux
      image: quay.io/frrouting/frr:10.5.1
      binds:
        - r1/frr.conf:/etc/frr/frr.conf
    r2:
      kind: frr
    h1:
      kind: linux
      image: alpine
      exec:
        - ip addr add 10.0.0.2/24 dev eth1
  links:
    - endpoints: ["r1:eth1", "r2:eth1"]
    - endpoints: ["h1:eth1", "r1:eth2"]
"""

#: (case, edit of BASE as (old, new), line the error must name, field, words of the remedy,
#: whether Containerlab's schema also rejects the file).
BAD = [
    ("kind", ("      kind: frr\n", "      kind: nokia_srlinux\n"), 10, "topology.nodes.r2.kind", "only kinds linux and frr", False),
    ("no kind", ("      kind: frr\n", "      image: x\n"), 9, "topology.nodes.r2", "set kind", False),
    ("bind source", ("r1/frr.conf:", "r1/missing.conf:"), 8, "topology.nodes.r1.binds[0]", "not found", False),
    ("bind target", ("/etc/frr/frr.conf", "/etc/hosts"), 8, "topology.nodes.r1.binds[0]", "only FRR files", False),
    ("bind form", ("r1/frr.conf:/etc/frr/frr.conf", "r1/frr.conf"), 8, "topology.nodes.r1.binds[0]", "SOURCE:DESTINATION", False),
    ("endpoint form", ('"r1:eth1", "r2:eth1"', '"r1-eth1", "r2:eth1"'), 17, "topology.links[0].endpoints[0]", "node:interface", True),
    ("unknown node", ('"r1:eth1", "r2:eth1"', '"r1:eth1", "r9:eth1"'), 17, "topology.links[0].endpoints[1]", "unknown node", False),
    ("endpoint twice", ('"h1:eth1", "r1:eth2"', '"h1:eth1", "r1:eth1"'), 18, "topology.links[1].endpoints[1]", "already used", False),
    ("eth0", ('"r1:eth1", "r2:eth1"', '"r1:eth0", "r2:eth1"'), 17, "topology.links[0].endpoints[0]", "management interface", False),
    ("host link", ('"h1:eth1", "r1:eth2"', '"host:veth9", "r1:eth2"'), 18, "topology.links[1].endpoints[0]", "never connects to the host", False),
    ("link type", ('    - endpoints: ["h1:eth1", "r1:eth2"]\n', '    - type: macvlan\n      endpoints: ["h1:eth1", "r1:eth2"]\n'),
     18, "topology.links[1].type", "not supported", False),
    ("self link", ('"h1:eth1", "r1:eth2"', '"r1:eth3", "r1:eth2"'), 18, "topology.links[1].endpoints", "two different nodes", False),
    ("links at top level", ("  links:\n", "links:\n"), 16, "links", "belongs under 'topology'", True),
    ("links in a node", ("    h1:\n", "    h1:\n      links: [r1]\n"), 12, "topology.nodes.h1.links", "topology.links", True),
    ("endpoints in topology", ("  links:\n", "  endpoints: []\n  links:\n"), 16, "topology.endpoints", "topology.links", True),
    ("unsupported field", ("      image: alpine\n", "      image: alpine\n      ports: [\"8080:80\"]\n"), 14, "topology.nodes.h1.ports", "remove it", False),
    ("typo", ("      image: alpine\n", "      imgae: alpine\n"), 13, "topology.nodes.h1.imgae", "unknown node field", True),
    ("exec shape", ("      exec:\n        - ip addr add 10.0.0.2/24 dev eth1\n", "      exec: ip addr add 10.0.0.2/24 dev eth1\n"),
     14, "topology.nodes.h1.exec", "must be a list", True),
    ("startup-config on linux", ("      image: alpine\n", "      image: alpine\n      startup-config: x.cfg\n"), 14,
     "topology.nodes.h1.startup-config", "no effect", False),
    ("startup-config missing", ("      kind: frr\n", "      kind: frr\n      startup-config: r2.conf\n"), 11,
     "topology.nodes.r2.startup-config", "not found", False),
    ("daemon unknown", ("      kind: frr\n", "      kind: frr\n      extras: {frr: {daemons: [ospfd, quaggad]}}\n"), 11,
     "topology.nodes.r2.extras.frr.daemons", "unknown FRR daemon", False),
    ("daemon missing here", ("      kind: frr\n", "      kind: frr\n      extras: {frr: {daemons: [pim6d]}}\n"), 11,
     "topology.nodes.r2.extras.frr.daemons", "remove it", False),
    ("sysctl", ("      image: alpine\n", "      image: alpine\n      sysctls: {kernel.pid_max: 100}\n"), 14,
     "topology.nodes.h1.sysctls.kernel.pid_max", "only net.*", False),
    ("duplicate key", ("      image: alpine\n", "      image: alpine\n      image: busybox\n"), 14, "topology.nodes.h1.image", "keep one", False),
    ("no name", ("name: lab\n", ""), 1, "name", "needs a name", True),
    ("nodes placement", ('    - endpoints: ["h1:eth1", "r1:eth2"]\n', '    - endpoints: ["h1:eth1", "r1:eth2"]\nnodes: {x: {kind: linux}}\n'),
     19, "nodes", "belongs under 'topology'", True),
    ("bad yaml", ("    r2:\n", "    r2: [\n"), None, "malformed YAML", "", True),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_malformed_files_get_one_line_errors(tmp_path: Path, clab_schema: dict, case: tuple) -> None:
    _name, (old, new), line, fld, remedy, schema_rejects = case
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "frr.conf").write_text("hostname r1\n")
    assert schema_ok(with_frr_kind(clab_schema), yaml.safe_load(BASE)) and load_ok(tmp_path, BASE)
    assert old in BASE
    text = BASE.replace(old, new, 1)
    p = tmp_path / "bad.clab.yml"
    p.write_text(text)
    with pytest.raises(ClabError) as e:
        load(p)
    msg = str(e.value)
    assert "\n" not in msg and re.match(rf"{re.escape(str(p))}:{line or '[0-9]+'}: ", msg), msg
    assert fld in msg and remedy in msg, msg
    if schema_rejects:  # what Containerlab's schema refuses, the importer refuses too
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            return
        assert not schema_ok(with_frr_kind(clab_schema), doc)


def load_ok(tmp_path: Path, text: str) -> bool:
    p = tmp_path / "ok.clab.yml"
    p.write_text(text)
    return load(p).topology.node("r1").self_configured


def test_daemons_file_errors_name_the_daemons_file_and_the_bind(tmp_path: Path) -> None:
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "daemons").write_text("bgpd=no\nsharpd=yes\n")
    p = tmp_path / "d.clab.yml"
    p.write_text("name: d\ntopology:\n  nodes:\n    r1:\n      kind: linux\n      binds: [r1/daemons:/etc/frr/daemons]\n")
    with pytest.raises(ClabError) as e:
        load(p)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'r1' / 'daemons'}:2: ") and "set sharpd=no" in msg and f"{p}:6" in msg


HOSTILE = [
    ('binds: ["/dev/zero:/etc/frr/frr.conf"]', "is not a regular file"),  # would never end
    ('binds: ["~no-such-user-anibench/x:/etc/frr/frr.conf"]', "cannot use the path"),
    ('exec: ["echo \\"unbalanced"]', "balance the quotes"),
    ("labels: {anibench.node-id: 0}", "router number 1..9999"),
    ("labels: {anibench.role: core}", "P, PE or host"),
    ("extras: {frr: {daemons: [ospfd]}}", "kind frr only"),
    ("sysctls: {net.ipv4.ip_forward: [1]}", "string or a number"),
]


@pytest.mark.parametrize(("setting", "says"), HOSTILE, ids=[h[1] for h in HOSTILE])
def test_hostile_settings_are_refused_in_one_line(tmp_path: Path, setting: str, says: str) -> None:
    p = tmp_path / "h.clab.yml"
    p.write_text(f"name: h\ntopology:\n  nodes:\n    r1:\n      kind: linux\n      image: frr\n      {setting}\n")
    with pytest.raises(ClabError) as e:
        load(p)
    assert str(e.value).startswith(f"{p}:7: topology.nodes.r1.") and says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("where", ["clab topology", "topology yaml", "bind", "startup-config"])
def test_files_that_are_not_regular_are_refused_without_reading(tmp_path: Path, where: str) -> None:
    """A FIFO (or /dev/zero, a socket) given as a file is refused before it is read: reading it
    would block for ever (a FIFO) or grow without bound (/dev/zero). Run in a child with a bound
    so that a regression fails instead of hanging the suite."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    if where == "clab topology":
        (tmp_path / "t.clab.yml").symlink_to(fifo)
        call, spec = "load", tmp_path / "t.clab.yml"
    elif where == "topology yaml":
        (tmp_path / "t.yaml").symlink_to(fifo)
        call, spec = "from_spec", tmp_path / "t.yaml"
    else:
        node = ("{kind: linux, binds: [in.fifo:/etc/frr/frr.conf]}" if where == "bind"
                else "{kind: frr, startup-config: in.fifo}")
        (tmp_path / "t.clab.yml").write_text(f"name: t\ntopology:\n  nodes:\n    r1: {node}\n")
        call, spec = "load", tmp_path / "t.clab.yml"
    code = f"from substrate.clab import {call}\ntry:\n    {call}({str(spec)!r})\nexcept Exception as e:\n    print(e)\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "not a regular file" in r.stdout and r.stdout.count("\n") == 1, r.stdout + r.stderr


def test_a_directory_bind_notes_what_it_skips_in_one_bounded_line(tmp_path: Path) -> None:
    d = tmp_path / "etc-frr"
    d.mkdir()
    (d / "frr.conf").write_text("hostname r1\n")
    for i in range(50):
        (d / f"junk{i:02d}").write_text("x\n")
    p = tmp_path / "d.clab.yml"
    p.write_text("name: d\ntopology:\n  nodes:\n    r1: {kind: linux, binds: [etc-frr:/etc/frr]}\n")
    imp = load(p)
    notes = [x for x in imp.notes if "not read" in x]
    assert len(notes) == 1 and "50 file(s)" in notes[0] and "junk00" in notes[0] and "45 more" in notes[0], imp.notes
    assert imp.topology.node("r1").self_configured


def test_yaml_bombs_and_deep_nesting_are_refused(tmp_path: Path) -> None:
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))
    (tmp_path / "bomb.clab.yml").write_text(bomb)
    (tmp_path / "deep.clab.yml").write_text("topology: " + "[" * 3000 + "]" * 3000 + "\n")
    for f, says in (("bomb", "aliases expanded"), ("deep", "nest")):
        with pytest.raises(ClabError, match=says):
            load(tmp_path / f"{f}.clab.yml")


def test_lab_record_keeps_imported_setup_beside_the_topology() -> None:
    """The record's topology has the fields every version of the model knows; an imported node's
    own set-up sits beside it (node_setup), so another checkout's cleanup can still read the record
    (and leave the live lab alone), and this version reads it back whole."""
    from substrate.record import LabRecord
    from substrate.topology import SETUP_FIELDS

    topo = load(frr01()).topology
    rec = LabRecord(name="x", owner_pid=1, created_at=0.0, topology=topo)
    doc = json.loads(rec.model_dump_json())
    assert all(not set(n) & set(SETUP_FIELDS) for n in doc["topology"]["nodes"])
    assert set(doc["node_setup"]) == {n.name for n in topo.nodes}
    assert LabRecord.model_validate_json(rec.model_dump_json()) == rec
    plain = LabRecord(name="y", owner_pid=1, created_at=0.0, topology=Topology.from_spec("line:2"))
    assert "node_setup" not in json.loads(plain.model_dump_json())


def test_level_instructions_describe_the_lab_served(tmp_path: Path) -> None:
    """A0/A1 instructions on an imported lab name what its routers run, not anibench's IS-IS/SRv6
    underlay (they used to describe IS-IS on frr01, which runs OSPF); generated labs keep theirs."""
    from servers.a0_shell.server import INSTRUCTIONS as A0_TEXT
    from servers.common import own_config_routers

    assert own_config_routers(Topology.from_spec("line:3")) is None
    said = own_config_routers(load(frr01()).topology)
    assert said is not None and "router1, router2, router3 run ospfd, ldpd (with zebra and staticd)" in said
    assert "isisd" not in said and "IS-IS underlay" in said  # (says there is none)
    # many routers: named up to a bound, the rest counted; different daemon sets apart
    nodes = "".join(f"    r{i:02d}: {{kind: frr, extras: {{frr: {{daemons: [{'bgpd' if i == 0 else 'ospfd'}]}}}}}}\n"
                    for i in range(15))
    p = tmp_path / "many.clab.yml"
    p.write_text(f"name: many\ntopology:\n  nodes:\n{nodes}")
    said = own_config_routers(load(p).topology) or ""
    assert "r00 runs bgpd" in said and "r01, r02" in said and "r12 and 2 more run ospfd" in said, said
    # mixed: an imported router beside underlay routers
    topo = Topology.from_spec("line:3:nohosts")
    r1 = topo.node("r1").model_copy(update={"frr_files": {"frr.conf": "router ospf\n"}, "daemons": ("zebra", "staticd", "ospfd")})
    mixed = topo.model_copy(update={"nodes": [r1 if n.name == "r1" else n for n in topo.nodes]})
    said = own_config_routers(mixed) or ""
    assert "r1 runs ospfd" in said and "Routers r2, r3 run anibench's IS-IS underlay" in said, said
    assert "isisd" in A0_TEXT  # the generated lab's text is unchanged
