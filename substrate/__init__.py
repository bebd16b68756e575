"""anibench substrate: the emulated SRv6 network and everything the test environment owns.

Public entry points: :class:`~substrate.topology.Topology` (what to deploy),
:class:`~substrate.lab.Lab` (a deployed lab, attachable by name), :func:`~substrate.cleanup.cleanup`.
This package knows nothing of MCP, agents or campaigns (DESIGN.md: dependencies point down).
"""

from substrate.errors import SubstrateError
from substrate.cleanup import cleanup
from substrate.lab import Lab
from substrate.process import ExecResult
from substrate.topology import Role, Topology

__all__ = ["ExecResult", "Lab", "Role", "SubstrateError", "Topology", "cleanup"]
