"""The FRR daemons a node can run here, as data (no imports: the topology model and the FRR
helpers both use it).

The FRR of the substrate is Debian 12's 8.4 (``/usr/lib/frr``). Its ``frrinit.sh`` always starts
zebra and staticd, whatever ``/etc/frr/daemons`` says (the file's own comment: "The watchfrr,
zebra and staticd daemons are always started"); every other daemon runs when its line says
``yes``. FRR 8.4 has no ``mgmtd`` (9.0+), and Debian's build ships neither ``pim6d`` nor
``sharpd`` although its daemons file lists them.
"""

from __future__ import annotations

#: Every daemon anibench may run, in start order: zebra first (the others connect to it), then
#: staticd, then the routing daemons.
KNOWN_DAEMONS = (
    "zebra", "staticd", "isisd", "bgpd", "ospfd", "ospf6d", "ripd", "ripngd", "babeld", "pimd",
    "ldpd", "nhrpd", "eigrpd", "pbrd", "bfdd", "fabricd", "vrrpd", "pathd",
)  # fmt: skip
#: Started whatever the daemons file says (FRR's frrinit.sh).
ALWAYS_ON = ("zebra", "staticd")
#: Daemons of a router of the anibench underlay; bgpd is added on demand (Lab.start_daemon).
BASE_DAEMONS = ("zebra", "staticd", "isisd")
#: Daemon names FRR knows (daemons files, Containerlab's ``extras.frr.daemons``) that this FRR
#: cannot run, with the reason.
UNAVAILABLE = {
    "mgmtd": "FRR 8.4 has no mgmtd (it came with FRR 9.0)",
    "pim6d": "Debian's FRR 8.4 is built without pim6d",
    "sharpd": "Debian's FRR 8.4 is built without sharpd (a test daemon)",
    "watchfrr": "anibench starts and watches the daemons itself",
}


def ordered(daemons: list[str] | tuple[str, ...] | set[str]) -> tuple[str, ...]:
    """``daemons`` plus the always-on ones, in start order.

    Raises:
        ValueError: a name that is not in :data:`KNOWN_DAEMONS` (the message says why, for the
            names in :data:`UNAVAILABLE`).
    """
    for d in daemons:
        if d not in KNOWN_DAEMONS:
            why = UNAVAILABLE.get(d)
            raise ValueError(
                f"FRR daemon {d!r} cannot run here: {why}" if why
                else f"unknown FRR daemon {d!r}; known: {', '.join(KNOWN_DAEMONS)}"
            )
    want = set(daemons) | set(ALWAYS_ON)
    return tuple(d for d in KNOWN_DAEMONS if d in want)
