"""Service classes behind one registry (issue 18): identical behaviour after the move, the
registry's contract, and bad input."""

from __future__ import annotations

import json

import pytest

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


def _complete_class(**members: str) -> str:
    """Source of a service-class module complete but for ``members`` (class attribute lines)."""
    body = {"name": "name = 'extra'", "requires": "requires = ('underlay',)", "records": "records = ()", "intents": "intents = ()",
            "checks": "checks = {}", **members}  # fmt: skip
    return ("from substrate.scenario.layers.base import ServiceClass, LayerParams, register\n"
            "from substrate.scenario.layers.ebgp_peering import EbgpPeeringIntent\n\n"
            "@register\nclass Extra(ServiceClass):\n    Params = LayerParams\n"
            + "".join(f"    {v}\n" for v in body.values())
            + "    def generate(self, sc, params, rng, density):\n        return sc\n"
            "    def render(self, sc, out):\n        pass\n    def invariants(self, sc):\n        return []\n")  # fmt: skip



@pytest.mark.parametrize(("member", "words"), [
    ("requires = ('bgp_magic',)", "requires names 'bgp_magic', not registered before it"),
    ("records = ('peerings',)", "records/derived name 'peerings', not fields of Scenario"),
    ("intents = (EbgpPeeringIntent(),)", "catalog class 'ebgp_peering' is already substrate.scenario.layers.ebgp_peering's"),
    ("checks = {'reach': print}", "kind 'reach' is already the observer's"),
    ("checks = {'bgp_session': print}", "kind 'bgp_session' is already substrate.scenario.layers.ebgp_peering's"),
])
def test_a_class_naming_what_does_not_exist_or_taking_what_is_anothers_fails_at_import(tmp_path, monkeypatch, member: str, words: str) -> None:  # noqa: ANN001
    """Accepted before: a second class offering the catalog class 'ebgp_peering', a check kind
    'reach' that the observer's own shadowed (its invariants judged by another rule), requires
    or records naming nothing."""
    import importlib
    import sys

    from substrate.scenario.layers.base import LAYERS, ServiceClassError, registry

    registry()
    key = member.split(" =")[0]
    (tmp_path / "extra_class.py").write_text(_complete_class(**{key: member}))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ServiceClassError) as e:
            importlib.import_module("extra_class")
    finally:
        sys.modules.pop("extra_class", None)
        LAYERS.pop("extra", None)
    assert "Extra in extra_class" in str(e.value) and words in str(e.value), e.value


def test_the_readme_least_class_works_as_written(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """README "Adding a service class": its smallest class, imported as written, is registered last,
    named by a manifest (its parameters validated) and built into a scenario."""
    import importlib
    import re
    import sys

    from substrate.scenario import build
    from substrate.scenario.layers.base import LAYERS
    from substrate.scenario.manifest import ManifestError, parse_manifest

    section = (REPO / "README.md").read_text().split("### Adding a service class", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "readme_class.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("readme_class")
        assert list(LAYERS)[-1] == "motd"
        text = "name: m\ntopology: grid:2x2:nohosts\nlayers:\n  - underlay\n  - addressing\n  - motd: {text: hi}\n"
        assert build(parse_manifest(text)).layers == ["underlay", "addressing", "motd"]
        with pytest.raises(ManifestError, match="colour"):
            parse_manifest(text.replace("text: hi", "colour: red"))
    finally:
        LAYERS.pop("motd", None)
        sys.modules.pop("readme_class", None)
