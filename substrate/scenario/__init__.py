"""Brownfield scenarios: manifests, layered seeded generation, deployment, observation, reset.

Flow (DESIGN.md): manifest + seed --generator--> Scenario (device state + service inventory +
baseline invariants) --deploy--> lab whose every invariant passes --observer--> verdicts.
"""

from substrate.scenario.generator import build, render_scenario, scenario_invariants
from substrate.scenario.manifest import Manifest, ManifestError, load_manifest, parse_manifest
from substrate.scenario.model import Invariant, NodeConfig, Scenario

__all__ = [
    "Invariant", "Manifest", "ManifestError", "NodeConfig", "Scenario", "build", "load_manifest",
    "parse_manifest", "render_scenario", "scenario_invariants",
]
