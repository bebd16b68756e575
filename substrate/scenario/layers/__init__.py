"""Built-in service-class layers (importing this package registers them)."""

from substrate.scenario.layers import addressing, firewall, floating_ip, l3vpn, steering, underlay  # noqa: F401
from substrate.scenario.layers.base import LAYERS, GenerationError, Layer, LayerParams, get_layer, register

__all__ = ["LAYERS", "GenerationError", "Layer", "LayerParams", "get_layer", "register"]
