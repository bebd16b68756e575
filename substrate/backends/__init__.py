"""Substrate backends, registered by name.

A backend deploys a :class:`~substrate.topology.Topology` and knows how to run a command in one of
its nodes; everything above (the :class:`~substrate.lab.Lab` handle, the observer, the servers)
is backend-agnostic. ``netns`` (Linux namespaces + FRR from the distribution) is the default and
the only one that deploys today; ``containerlab`` is planned for machines with a Docker engine
(the topology already exports to a Containerlab file: ``harness lab export``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from substrate.errors import EnvironmentProblem

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable
    from pathlib import Path

    from substrate.lab import Lab, NodeState
    from substrate.process import ExecResult


class Backend(Protocol):
    """What a substrate backend provides."""

    name: str

    def check_environment(self) -> None:
        """Raise EnvironmentProblem (one line) if this machine cannot host a lab of this backend."""

    def deploy(self, lab: Lab, frr_extra: dict[str, list[str]], say: Callable[[str], None]) -> None:
        """Create every node and link, start FRR, fill ``lab.record.nodes``. Does not wait for
        convergence. On failure raise; the caller destroys what exists."""

    def destroy(self, lab: Lab) -> None:
        """Remove every process, namespace and link of the lab. Idempotent."""

    def exec(
        self, lab: Lab, node: NodeState, argv: list[str], *, confined: bool, timeout_s: float,
        input: str | bytes | None, max_output: int, cancel: threading.Event | None = None,
    ) -> ExecResult:  # fmt: skip
        """Run ``argv`` inside ``node`` (see Lab.exec); ``confined``: an agent's command, with the
        capabilities that reach beyond the node dropped and nothing it started left running;
        ``cancel``: when set, the command's process group is killed at once."""

    def vty_path(self, lab: Lab, node: NodeState, daemon: str) -> Path:
        """Path, on the host, of an FRR daemon's vty socket in ``node``."""


_REGISTRY: dict[str, type] = {}


def register(name: str):  # noqa: ANN201 - decorator
    """Class decorator registering a backend under ``name``."""

    def deco(cls: type) -> type:
        _REGISTRY[name] = cls
        cls.name = name
        return cls

    return deco


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``.

    Raises:
        EnvironmentProblem: unknown name (listing the known ones), or a planned backend that
        cannot deploy yet.
    """
    from substrate.backends import netns  # noqa: F401 - registers itself

    if name == "containerlab":
        raise EnvironmentProblem(
            "the containerlab backend is not available yet: export the topology with "
            "`harness lab export --format containerlab` and deploy it with containerlab on a Docker host"
        )
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise EnvironmentProblem(f"unknown backend {name!r}; available: {', '.join(sorted(_REGISTRY))}") from None
