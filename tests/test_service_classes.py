"""Service classes behind one registry (issue 18): identical behaviour after the move, the
registry's contract, and bad input."""

from __future__ import annotations

import json

from tests.behaviour_digests import digests
from tests.conftest import REPO

REFERENCE = REPO / "tests" / "data" / "behaviour-digests.json"


def test_behaviour_is_identical_to_the_reference() -> None:
    """Scenario files, the A3-T catalog, plans of accepted and refused change sets, what A3-T says
    of each instance and the task variants are byte-identical to the reference computed on
    branch integ before the classes moved behind the registry."""
    want = json.loads(REFERENCE.read_text())
    got = digests()
    differ = sorted(k for k in want if got.get(k) != want[k])
    assert not differ, f"behaviour changed: {differ}"


def test_every_generic_part_reaches_every_class_through_the_registry() -> None:
    """The catalog, the manifest schema and the registry list the same classes, in registry order."""
    from servers.a3_intent import catalog as cat
    from substrate.scenario.layers import intents, registry
    from substrate.scenario.manifest import manifest_json_schema

    names = [c.name for c in registry()]
    assert names[:6] == ["underlay", "addressing", "l3vpn", "steering", "firewall", "floating_ip"]
    assert list(cat.SERVICE_CLASSES) == [i.name for i in intents() if not i.read_only]
    layer_enum = manifest_json_schema()["properties"]["layers"]["items"]["anyOf"][0]["enum"]
    assert sorted(layer_enum) == sorted(names)


def test_a_manifest_naming_an_unknown_class_lists_the_registered_ones() -> None:
    import pytest

    from substrate.scenario.layers import registry
    from substrate.scenario.manifest import ManifestError, parse_manifest

    with pytest.raises(ManifestError) as e:
        parse_manifest("name: m\ntopology: line:3\nlayers:\n  - underlay\n  - route_leaks\n")
    msg = str(e.value)
    assert "line 5" in msg and "unknown layer 'route_leaks'" in msg
    assert msg.endswith("registered service classes: " + ", ".join(c.name for c in registry()))


def test_a_class_module_that_breaks_the_interface_fails_at_import(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A module whose class lacks a member fails when imported, naming the member; nothing is registered."""
    import importlib
    import sys

    import pytest

    from substrate.scenario.layers.base import LAYERS, ServiceClassError

    (tmp_path / "broken_class.py").write_text(
        "from substrate.scenario.layers.base import ServiceClass, register\n\n"
        "@register\n"
        "class Broken(ServiceClass):\n"
        "    name = 'broken'\n"
        "    requires = ('l3vpn',)\n"
        "    records = ()\n"
        "    intents = ()\n"
        "    def generate(self, sc, params, rng, density):\n"
        "        return sc\n"
        "    def invariants(self, sc):\n"
        "        return []\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ServiceClassError) as e:
        importlib.import_module("broken_class")
    sys.modules.pop("broken_class", None)
    assert "Broken in broken_class does not define Params, render" in str(e.value)
    assert "broken" not in LAYERS
