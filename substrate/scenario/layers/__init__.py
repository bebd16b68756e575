"""The service-class registry: one module per class, registered in this order (one line each).

Importing a module registers its class (``@register``); the order here is the registry order
generic code iterates in (A3-T allocation and integrity checks, the catalog, reports). A module
that breaks the interface (:class:`~substrate.scenario.layers.base.ServiceClass`) fails here, at
import, naming the member it lacks.
"""

from substrate.scenario.layers import underlay  # noqa: F401, I001 - registry order
from substrate.scenario.layers import addressing  # noqa: F401
from substrate.scenario.layers import l3vpn  # noqa: F401
from substrate.scenario.layers import steering  # noqa: F401
from substrate.scenario.layers import firewall  # noqa: F401
from substrate.scenario.layers import floating_ip  # noqa: F401
from substrate.scenario.layers import shared_services  # noqa: F401
from substrate.scenario.layers import rate_limits  # noqa: F401
from substrate.scenario.layers import ebgp_peering  # noqa: F401
from substrate.scenario.layers.base import (
    LAYERS,
    GenerationError,
    Intent,
    Layer,
    LayerParams,
    ServiceClass,
    ServiceClassError,
    get_layer,
    intents,
    register,
    registry,
)

__all__ = ["LAYERS", "GenerationError", "Intent", "Layer", "LayerParams", "ServiceClass", "ServiceClassError", "get_layer",
           "intents", "register", "registry"]
