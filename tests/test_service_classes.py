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
