"""Exceptions of the substrate package.

One root (:class:`SubstrateError`) and a few specific subclasses, so callers can catch the
family or one case. Every message is a single line meant for a human: it says what was wrong
and, where there is one, what to do about it.
"""

from __future__ import annotations


class SubstrateError(Exception):
    """Root of every error raised by :mod:`substrate`."""


class TopologyError(SubstrateError):
    """A topology spec or file is malformed (unknown base, bad size, dangling link, ...)."""


class EnvironmentProblem(SubstrateError):
    """The machine cannot host a lab: not root, FRR missing, a required kernel feature missing."""


class LabExistsError(SubstrateError):
    """A lab with this name is already deployed on this machine."""


class LabNotFoundError(SubstrateError):
    """No deployed lab has this name."""


class NodeNotFoundError(SubstrateError):
    """The lab has no node with this name."""


class BringUpError(SubstrateError):
    """Deploying a lab failed; whatever had been created was destroyed before this was raised."""


class ConvergenceTimeout(SubstrateError):
    """An expected network state did not hold within the bounded wait."""


class ExecError(SubstrateError):
    """A command run inside a node could not be started, or failed where success was required."""
