"""What a node does once it, its links and its FRR are up: the start-up steps a lab's topology
asks for (an imported Containerlab lab's ``hostname``, renamed interfaces, ``sysctls`` and
``exec`` commands). Backend-agnostic: everything runs through :meth:`substrate.lab.Lab.exec`.

Order per node (nodes in parallel), as Containerlab's post-deploy does it: the hostname, the
interfaces' original names as Linux alternative names (so the lab's own commands can still say
``ip link set <long name> up``), the sysctls, then each exec command in order. Containerlab runs
an exec command without a shell after splitting it into words (``shlex``); so does this. Exec
commands come from a file that may not be the operator's own (a lab found on the web): they run
confined like an agent's shell (capabilities that could leave the node dropped, network
administration kept; whatever one leaves running is killed when it returns, and said), as a
container would not be privileged either. A
command that fails stops the bring-up (the caller destroys the lab) with a one-line error naming
the node, the command, its line in the source file and what it printed.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from substrate.errors import BringUpError

if TYPE_CHECKING:
    from collections.abc import Callable

    from substrate.lab import Lab
    from substrate.topology import Node

#: Bound on one exec command (seconds).
EXEC_TIMEOUT_S = 60.0
#: Longest Linux alternative interface name (ALTIFNAMSIZ - 1).
ALTNAME_MAX = 127


def needs_startup(node: Node) -> bool:
    """True when :func:`run_startup` has something to do on ``node``."""
    return bool(node.exec or node.sysctls or node.hostname != node.name or (node.source and node.source.interfaces))


def valid_altname(name: str) -> bool:
    """Linux accepts ``name`` as an alternative interface name (``dev_valid_name``: 1-127 bytes,
    not ``.``/``..``, no ``/``, ``:`` or whitespace)."""
    return 0 < len(name.encode()) <= ALTNAME_MAX and name not in (".", "..") and not any(
        c in "/:" or c.isspace() for c in name)


def where(node: Node, k: int) -> str:
    """``file:line`` of the node's k-th exec command (0-based), when it came from a file."""
    src = node.source
    if src is None or k >= len(src.exec_lines):
        return ""
    return f" ({src.file}:{src.exec_lines[k]})"


def run_node(lab: Lab, node: Node, say: Callable[[str], None] | None = None) -> None:
    """Run ``node``'s start-up steps. Raises BringUpError (one line) at the first failure.

    An exec command's leftovers (a process it started in the background: confined commands keep
    nothing running once they return) are killed and, with ``say``, named in one line."""
    name = node.name
    if node.hostname != name:
        r = lab.exec(name, ["hostname", node.hostname], timeout_s=10)
        if not r.ok:
            raise BringUpError(f"{name}: cannot set hostname {node.hostname!r}: {r.stderr.strip()[:200]}")
    for ifname, original in sorted((node.source.interfaces if node.source else {}).items()):
        if valid_altname(original):
            r = lab.exec(name, ["ip", "link", "property", "add", "dev", ifname, "altname", original], timeout_s=10)
            if not r.ok:
                raise BringUpError(f"{name}: cannot give {ifname} its name {original!r}: {r.stderr.strip()[:200]}")
    if node.sysctls:
        argv = ["sysctl", "-q", "-w", *(f"{k}={v}" for k, v in sorted(node.sysctls.items()))]
        r = lab.exec(name, argv, timeout_s=10)
        if not r.ok:
            raise BringUpError(f"{name}: sysctls refused: {r.stderr.strip().splitlines()[0][:200] if r.stderr.strip() else r.summary()}")
    for k, line in enumerate(node.exec):
        try:
            argv = shlex.split(line)
        except ValueError as e:
            raise BringUpError(f"{name}: exec command {k + 1} `{line}`{where(node, k)} cannot be split into words: {e}") from None
        r = lab.exec(name, argv, timeout_s=EXEC_TIMEOUT_S, confined=True)
        if not r.ok:
            said = (r.stderr.strip() or r.stdout.strip()).replace("\n", " | ")[:300]
            status = "timed out" if r.timed_out else f"failed (exit {r.returncode})"
            raise BringUpError(f"{name}: exec command {k + 1} `{line}`{where(node, k)} {status}: {said or 'no output'}")
        killed = r.extra.get("leftovers_killed") or []
        if killed and say is not None:
            say(f"{name}: exec command {k + 1} `{line}`{where(node, k)} left {', '.join(killed)} running: killed "
                "(a node keeps nothing an exec command starts in the background, as for an agent's shell)")


def run_startup(lab: Lab, say: Callable[[str], None] | None = None) -> None:
    """Run every node's start-up steps, nodes in parallel (``say``: see :func:`run_node`).

    Raises:
        BringUpError: the first failure (in topology order), naming node, command and line.
    """
    nodes = [n for n in lab.topology.nodes if needs_startup(n)]
    errors: list[BringUpError] = []

    def one(n: Node) -> None:
        try:
            run_node(lab, n, say)
        except BringUpError as e:
            errors.append(e)

    lab.map(one, nodes)
    if errors:
        order = {n.name: i for i, n in enumerate(lab.topology.nodes)}
        raise min(errors, key=lambda e: order.get(str(e).split(":", 1)[0], 0))
