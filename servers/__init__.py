"""anibench ANI servers: one MCP server per agent-network interface (ANI) level.

``servers.common`` holds what every level shares (lab attachment, trajectory recorder, step
budget, ``submit``, error mapping, transports); ``servers.a0_shell`` and ``servers.a1_wrapper``
are the levels A0 and A1 of draft section 5.1; :mod:`servers.registry` maps a level name to its
builder. Servers use only the :mod:`substrate` lab API and know nothing of campaigns.
"""
