"""ANI level A0: raw device shell (see :mod:`servers.a0_shell.server`)."""
