"""What every ANI level shares: configuration, lab attachment, the trajectory recorder, the step
budget and episode state (``submit``), error mapping and the transports.

Adding a level: a module with a ``build_server(config, *, lab=None) -> AniServer`` that
validates its ``config.options``, creates an :class:`AniServer`, registers its tools with
:meth:`AniServer.ani_tool` (kind + truthful annotations; the docstring is the description), and
one entry in :mod:`servers.registry`. Budget, ``submit``, recording and error mapping come for
free: tools raise ``ToolError`` (or let ``substrate`` errors propagate) with a message that says
what to fix, and call :func:`note_rejected` when the device refused part of a call. Also free:
every result is bounded to one JSON-RPC message with a paging handle and the ``read_output``
tool (:mod:`servers.common.paging`), and arguments follow one policy (:mod:`servers.common.args`).
A tool that runs commands passes :func:`cancel_event` to ``Lab.exec(cancel=...)`` so that a
cancelled call stops them, and may say what it stopped with :func:`note_cancelled`.

The SDK reads a tool's parameter annotations at registration: a module whose tools are closures
inside ``build_server`` and whose annotations use builder locals (e.g. a bound from the options)
must not use ``from __future__ import annotations``.

In-process use (the harness): ``srv = servers.registry.build_server("A1", config)``, then
``mcp.Client(srv)`` or ``await srv.run_stdio_async()``; ``srv.episode.ended`` (a
``threading.Event``) is set on submit or when the budget is spent, ``srv.episode.ended_reason``
says which; ``srv.close()`` closes the trajectory.
"""

from servers.common.config import ServerConfig
from servers.common.errors import argument_error, from_substrate, unknown_device
from servers.common.recorder import CallRecord, ClientInfo, Kind, TrajectoryRecorder, read_trajectory
from servers.common.server import (
    AniServer,
    Episode,
    ServerSetupError,
    attach_lab,
    cancel_event,
    level_options,
    note_cancelled,
    note_rejected,
    own_config_routers,
    pid_holder,
)
from servers.common.transport import run_server

__all__ = [
    "AniServer",
    "CallRecord",
    "ClientInfo",
    "Episode",
    "Kind",
    "ServerConfig",
    "ServerSetupError",
    "TrajectoryRecorder",
    "argument_error",
    "attach_lab",
    "cancel_event",
    "from_substrate",
    "level_options",
    "note_cancelled",
    "note_rejected",
    "own_config_routers",
    "pid_holder",
    "read_trajectory",
    "run_server",
    "unknown_device",
]
