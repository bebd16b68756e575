"""Service-class layers: the registry and what a layer is.

A layer (draft section 6, "layered, seeded scenario generator") declares its prerequisites
(``requires``), validates its parameters (``Params``), generates its service instances into the
scenario from a seeded random generator (``generate``), renders them to device state
(``render``) and emits each instance's baseline invariants (``invariants``). ``render`` and
``invariants`` are pure functions of the scenario's inventory: A3-T re-runs them after an intent
changes the inventory, and task classes use ``invariants`` to produce hidden test cases.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from substrate.scenario.model import Invariant, NodeConfig, Scenario


class LayerParams(BaseModel):
    """Base of every layer's parameters: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class GenerationError(ValueError):
    """A layer cannot generate what the manifest asks (e.g. density does not fit the pools).

    ``field`` names the manifest field at fault (e.g. ``layers.l3vpn.tenants_per_density``).
    """

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


@contextlib.contextmanager
def density_fits(density: int) -> Iterator[None]:
    """Within the block, a pool running dry is reported as the density not fitting the pools
    (the error keeps naming the pool's field)."""
    try:
        yield
    except GenerationError as e:
        raise GenerationError(e.field, f"density {density} does not fit the pools: {e}") from None


class Layer:
    """Base class of a service-class layer (subclasses register with :func:`register`)."""

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    Params: ClassVar[type[LayerParams]] = LayerParams

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        """Add this layer's instances (and any nodes they need) to ``sc``; return the scenario."""
        return sc

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        """Add this layer's device state for every instance to ``out`` (node -> config)."""

    def invariants(self, sc: Scenario) -> list[Invariant]:
        """Baseline invariants of this layer's instances."""
        return []


LAYERS: dict[str, Layer] = {}


def register(cls: type[Layer]) -> type[Layer]:
    """Class decorator: make a layer available to manifests under ``cls.name``."""
    LAYERS[cls.name] = cls()
    return cls


def get_layer(name: str) -> Layer:
    """The layer called ``name``. Raises KeyError listing the known ones."""
    from substrate.scenario import layers  # noqa: F401 - imports register the built-ins

    try:
        return LAYERS[name]
    except KeyError:
        raise KeyError(f"unknown layer {name!r}; known layers: {', '.join(sorted(LAYERS))}") from None


def node_cfg(out: dict[str, NodeConfig], node: str) -> NodeConfig:
    """The (created on demand) config of ``node`` in a rendering."""
    if node not in out:
        out[node] = NodeConfig()
    return out[node]


def zipf_weights(n: int, s: float) -> list[float]:
    """Weights 1/k^s for k = 1..n (a Zipf law, for skewed sizes and node load)."""
    return [1.0 / (k**s) for k in range(1, n + 1)]
