"""Digests of everything the service classes decide, for proving that a refactoring of the
classes changes no behaviour (issue 18: "the existing classes move behind the registry with
identical behaviour").

``python -m tests.behaviour_digests > tests/data/behaviour-digests.json`` writes the reference;
it was first written on branch ``integ`` before the service classes moved behind the registry,
and ``tests/test_service_classes.py`` compares today's digests with it. Covered:

- scenario files (``Scenario.to_json``) of the six-class manifest and the small test manifest
  for several seeds and densities;
- the A3-T catalog (ops JSON Schema, every class's create/modify schema, its description) and
  the plans of a fixed list of change sets on the small scenario -- accepted (effects,
  allocations, device deltas, validation scope, new records) and refused (every problem);
- task variants of every task class (request files, setup, test cases, damage checks).
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SIX = REPO / "tests" / "data" / "six-classes.yaml"
SMALL = REPO / "tests" / "data" / "small-brownfield.yaml"


def _h(obj: Any) -> str:
    text = obj if isinstance(obj, str) else json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _op(op: str, cls: str, iid: str | None = None, **spec: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"op": op, "service_class": cls}
    if iid is not None:
        d["id"] = iid
    if op != "delete":
        d["spec"] = spec
    return d


#: The catalog classes of the six service classes the reference was computed with.
SIX_CLASSES = ("tenant", "tenant_site", "steering_policy", "firewall_rule_set", "floating_ip")

#: Change sets planned on the small scenario (tests/data/small-brownfield.yaml, seed 3).
CHANGE_SETS: list[list[dict[str, Any]]] = [
    [_op("create", "tenant_site", None, tenant="t3", pe="r2", pe_interface="eth5", prefix6="auto", prefix4="auto")],
    [_op("modify", "tenant_site", "t3s2", pe="r6", pe_interface="eth4")],
    [_op("modify", "tenant_site", "t2s2", prefix4=None)],
    [_op("delete", "tenant_site", "t1s2")],
    [_op("delete", "tenant_site", "t2s2")],
    [_op("delete", "tenant_site", "t2s1")],
    [_op("create", "tenant", "t4", name="vandelay"),
     _op("create", "tenant_site", None, tenant="t4", pe="r2", pe_interface="eth5", prefix6="auto"),
     _op("create", "tenant_site", None, tenant="t4", pe="r6", pe_interface="eth4", prefix6="fd10:0:0:1::/64", prefix4="auto")],
    [_op("create", "steering_policy", None, tenant="t2", ingress_pe="r1", dst_site="t2s1", waypoint="r5")],
    [_op("modify", "steering_policy", "sp1", waypoint="r4")],
    [_op("delete", "steering_policy", "sp1")],
    [_op("modify", "firewall_rule_set", "fw-t2", rules=[{"src_site": "t2s1", "dst_site": "t2s2", "port": 22, "action": "accept"},
                                                       {"src_site": None, "dst_site": "t2s2", "port": 22, "action": "drop"}])],
    [_op("delete", "firewall_rule_set", "fw-t3"),
     _op("create", "firewall_rule_set", None, tenant="t3", rules=[{"src_site": None, "dst_site": "t3s2", "port": 443, "action": "drop"}])],
    [_op("create", "floating_ip", None, site="t3s1", address="auto")],
    [_op("modify", "floating_ip", "fip1", address="auto")],
    [_op("delete", "floating_ip", "fip1")],
    [_op("delete", "floating_ip", "fip1"), _op("create", "floating_ip", "fip1", site="t2s1")],
    [_op("delete", "tenant_site", "t3s1"), _op("create", "tenant_site", "t3s1", tenant="t3", pe="r2", pe_interface="eth4")],
    [_op("modify", "tenant", "t1", name="acme2"), _op("delete", "tenant", "t1")],
    # refused ones
    [_op("create", "tenant_site", None, tenant="t9", pe="r5", pe_interface="eth9")],
    [_op("create", "tenant_site", None, tenant="t1", pe="r2", pe_interface="eth4")],
    [_op("create", "tenant_site", None, tenant="t1", pe="r2", pe_interface="eth5", prefix6="fd10:0:0:1::/64"),
     _op("create", "tenant_site", None, tenant="t2", pe="r6", pe_interface="eth4", prefix6="fd10:9::/64")],
    [_op("create", "steering_policy", None, tenant="t3", ingress_pe="r2", dst_site="t3s2", waypoint="r2")],
    [_op("create", "steering_policy", None, tenant="t1", ingress_pe="r1", dst_site="t1s2", waypoint="r5")],
    [_op("modify", "firewall_rule_set", "fw-t1", rules=[{"src_site": "t2s1", "dst_site": "t1s1", "port": 8443, "action": "accept"}])],
    [_op("create", "firewall_rule_set", None, tenant="t1", rules=[{"src_site": None, "dst_site": "t1s1", "port": 22, "action": "drop"}])],
    [_op("create", "floating_ip", None, site="t1s1", address="198.51.100.10")],
    [_op("create", "floating_ip", None, site="t3s1", address="198.51.99.1")],
    [_op("delete", "tenant", "t2")],
    [_op("modify", "tenant", "t2", name="acme")],
    [_op("delete", "tenant_site", "t9s9"), _op("modify", "steering_policy", "t1s1", waypoint="r5")],
]


def _plan_digest(sc: Any, ops: list[dict[str, Any]]) -> dict[str, Any]:
    from servers.a3_intent.catalog import ChangeSetRejected, parse_ops
    from servers.a3_intent.inventory import expected_found
    from servers.a3_intent.planner import plan, records_of

    try:
        p = plan(sc, parse_ops(ops), expected_found(sc))
    except ChangeSetRejected as e:
        return {"rejected": [str(x) for x in e.problems]}
    return {
        "ops": [r.as_dict() for r in p.ops],
        # (a device change of the reference had no qdiscs, no ingress-side qdiscs: fields added with
        # the rate limits and with A3-R's repairs, issue 35)
        "deltas": {n: {k: v for k, v in asdict(d).items() if not (k in ("qdiscs", "ingress") and not v)} for n, d in p.deltas.items()},
        "changed": p.changed_services,
        "scope": [i.model_dump(mode="json") for i in p.invariants],
        "warnings": p.warnings,
        "records": records_of(p.new),
        "spares": [x.model_dump(mode="json") for x in p.new.spares],
        "render": {n: c.model_dump(mode="json") for n, c in p.new.node_config.items()},
    }


def _server_digests(sc: Any) -> dict[str, str]:
    """What A3-T's list_services and get_service say of each instance, without a lab: its summary,
    its spec and the device state it owns."""
    from servers.a3_intent.server import _instances, _owned, _spec_of, _summary, _without
    from substrate.scenario.generator import render_scenario

    out = {}
    for iid, (cls, x) in _instances(sc).items():
        owned = _owned(sc.node_config, render_scenario(_without(sc, cls, iid)))
        out[f"server/{iid}"] = _h({"class": cls, "summary": _summary(cls, x), "spec": _spec_of(cls, x),
                                   "owned": {n: c.model_dump(mode="json") for n, c in owned.items()}})
    return out


def digests() -> dict[str, str]:
    """Name -> SHA-256 of one piece of behaviour (see module docstring)."""
    from harness.tasks import SITE_TASK_CLASSES, make_variant
    from servers.a3_intent import catalog as cat
    from substrate.scenario import build, load_manifest

    out: dict[str, str] = {}
    six, small = load_manifest(SIX), load_manifest(SMALL)
    for seed in (7, 11, 23):
        for density in (1, 2, 3):
            out[f"scenario/six/{seed}/{density}"] = _h(build(six, seed=seed, density=density).to_json())
    for seed in (3, 5):
        out[f"scenario/small/{seed}"] = _h(build(small, seed=seed).to_json())
    ops, defs = cat.ops_json_schema(build(six).layers)  # the operations of the classes the reference knows
    out["catalog/ops_schema"] = _h({"ops": ops, "$defs": defs})
    for name in SIX_CLASSES:
        out[f"catalog/{name}"] = _h({"spec": cat.spec_schema(name), "patch": cat.spec_schema(name, patch=True),
                                     "info": cat.CLASS_INFO[name], "examples": cat.EXAMPLES.get(name, [])})
    sc = build(small)
    for k, ops in enumerate(CHANGE_SETS):
        out[f"plan/{k}"] = _h(_plan_digest(sc, ops))
    out.update(_server_digests(sc))
    big = build(six, seed=7, density=2)
    for task in SITE_TASK_CLASSES:
        for v in range(3):
            out[f"task/{task}/{v}"] = _h(make_variant(task, big, v).model_dump(mode="json"))
    return out


if __name__ == "__main__":
    json.dump(digests(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
