"""ANI level registry: level name -> builder ``build_server(config) -> AniServer``.

Builders are named as import paths and imported only when used, so starting one level's server
does not import the others. Adding a level is one entry here plus its module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servers.common import AniServer, ServerConfig

#: Level name (draft section 5.1) -> "module:function".
LEVELS: dict[str, str] = {
    "A0": "servers.a0_shell.server:build_server",
    "A1": "servers.a1_wrapper.server:build_server",
    "A2": "servers.a2_netconf.server:build_server",
    "A3-T": "servers.a3_intent.server:build_server",
    "A3-R": "servers.a3_reconciled.server:build_server",
    "A4": "servers.a4_reconciled_intent.server:build_server",
}

#: Levels with a source of truth and its reconciler (their runs count reconciles and drift events).
RECONCILED_LEVELS: frozenset[str] = frozenset({"A3-R", "A4"})

#: Levels that have a blocklist of destructive commands (ServerConfig.blocklist); the others refuse it.
BLOCKLIST_LEVELS: frozenset[str] = frozenset({"A1"})


def levels() -> list[str]:
    """Registered level names."""
    return list(LEVELS)


def normalize_level(level: str) -> str:
    """Canonical level name (case-insensitive match).

    Raises:
        KeyError: unknown level (the message lists the registered ones).
    """
    for name in LEVELS:
        if name.lower() == level.strip().lower():
            return name
    raise KeyError(f"unknown ANI level {level!r}; registered: {', '.join(LEVELS)}")


def build_server(level: str, config: ServerConfig) -> AniServer:
    """Build the MCP server of ``level`` for ``config``.

    Raises:
        KeyError: unknown level. servers.common.ServerSetupError: the server cannot start
            (lab missing, bad options, ...).
    """
    module, _, fn = LEVELS[normalize_level(level)].partition(":")
    return getattr(importlib.import_module(module), fn)(config)


def get_builder(level: str):  # noqa: ANN201 - Callable[[ServerConfig], AniServer]
    """The builder function of ``level`` (imports its module).

    Raises:
        KeyError: unknown level.
    """
    module, _, fn = LEVELS[normalize_level(level)].partition(":")
    return getattr(importlib.import_module(module), fn)
