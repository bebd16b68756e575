"""ANI level A1: the bounded per-device command wrapper (NetConfArena's compact interface); see
:mod:`servers.a1_wrapper.server` and, for the command grammar, :mod:`servers.a1_wrapper.grammar`."""
