"""FRR's files in a Containerlab lab: the ``daemons`` file, and the daemon set of the ``frr`` kind.

``/etc/frr/daemons`` (FRR's ``tools/etc/frr/daemons``): one ``<daemon>=yes|no`` line per daemon
FRR may start, plus shell variables (``*_options``, ``vtysh_enable``, ``frr_profile``, ...).
zebra and staticd always run. Daemon options are not used: every daemon here starts with
``-d -A 127.0.0.1``, as the substrate's own routers do.

The ``frr`` kind (Containerlab PR #3382, merged after the schema pinned in shared/data) writes
that file from ``extras.frr.daemons``: a list enables exactly those daemons (the always-on ones
may be listed, to no effect); an empty or missing list enables every daemon the kind knows
(``nodes/frr/daemons.go``: bgpd ospfd ospf6d ripd ripngd isisd pimd pim6d ldpd nhrpd eigrpd
babeld sharpd pbrd bfdd fabricd vrrpd pathd).
"""

from __future__ import annotations

import re

from substrate import frr_daemons

#: What the frr kind enables when ``extras.frr.daemons`` is empty (nodes/frr/daemons.go).
CLAB_FRR_CONFIGURABLE = (
    "bgpd", "ospfd", "ospf6d", "ripd", "ripngd", "isisd", "pimd", "pim6d", "ldpd", "nhrpd", "eigrpd",
    "babeld", "sharpd", "pbrd", "bfdd", "fabricd", "vrrpd", "pathd",
)  # fmt: skip
#: Listed in extras.frr.daemons to no effect (always started by FRR).
CLAB_FRR_ALWAYS_ON = ("zebra", "staticd", "mgmtd", "watchfrr")
#: The frr kind's frr.conf when the node has no startup-config (nodes/frr/frr.cfg).
CLAB_FRR_DEFAULT_CONF = "frr defaults traditional\n!\nlog stdout\n!\n"
#: Every daemon name a daemons file may switch (FRR 8.4 to 10.x).
DAEMON_NAMES = frozenset(frr_daemons.KNOWN_DAEMONS) | set(frr_daemons.UNAVAILABLE) | set(CLAB_FRR_CONFIGURABLE)

_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


class DaemonsFileError(ValueError):
    """A line of a daemons file that cannot be used: ``(line number, message)``."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


def parse_daemons_file(text: str) -> tuple[tuple[str, ...], list[str]]:
    """The daemons a daemons file runs, and the settings it has that are not used.

    Returns:
        ``(daemons in start order with the always-on ones, ignored variable names)``.

    Raises:
        DaemonsFileError: a daemon line whose value is not yes/no, or a daemon switched on that
            cannot run here (the message says why and what to do).
    """
    on: list[str] = []
    ignored: list[str] = []
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0]
        if not line.strip():
            continue
        m = _LINE.match(line)
        if not m:
            raise DaemonsFileError(no, f"cannot read {raw.strip()!r}: expected NAME=VALUE")
        key, value = m.group(1), m.group(2).strip("\"'")
        if key in DAEMON_NAMES:
            if value not in ("yes", "no"):
                raise DaemonsFileError(no, f"{key}={value}: a daemon line says yes or no")
            if value == "yes" and key not in frr_daemons.ALWAYS_ON:
                if key not in frr_daemons.KNOWN_DAEMONS:
                    raise DaemonsFileError(no, f"{key}=yes: {frr_daemons.UNAVAILABLE.get(key, 'not in this FRR')}; set {key}=no")
                on.append(key)
        else:
            ignored.append(key)
    return frr_daemons.ordered(on), ignored


def clab_frr_daemons(listed: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """The daemon set of an ``frr`` kind node from its ``extras.frr.daemons``.

    Returns:
        ``(daemons in start order, daemons the kind would enable that this FRR lacks)``; the
        second is non-empty only for an empty list (every daemon).

    Raises:
        ValueError: a name the kind does not know, or one this FRR cannot run (with the reason).
    """
    if not listed:
        here = [d for d in CLAB_FRR_CONFIGURABLE if d in frr_daemons.KNOWN_DAEMONS]
        return frr_daemons.ordered(here), [d for d in CLAB_FRR_CONFIGURABLE if d not in frr_daemons.KNOWN_DAEMONS]
    on = []
    for d in listed:
        if d in CLAB_FRR_ALWAYS_ON:
            continue
        if d not in CLAB_FRR_CONFIGURABLE:
            raise ValueError(f"unknown FRR daemon {d!r}; the frr kind knows {', '.join(CLAB_FRR_CONFIGURABLE + CLAB_FRR_ALWAYS_ON)}")
        if d not in frr_daemons.KNOWN_DAEMONS:
            raise ValueError(f"FRR daemon {d!r} cannot run here: {frr_daemons.UNAVAILABLE.get(d, 'not in this FRR')}; remove it")
        on.append(d)
    return frr_daemons.ordered(on), []
