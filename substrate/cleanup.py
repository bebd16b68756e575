"""``harness lab cleanup``: remove what crashed processes left behind, and only that.

Above :mod:`substrate.lab`, :mod:`substrate.faults` and the netns backend (it uses all three), so
that none of them needs to import another back.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from substrate.backends.netns import delete_netns, kill_netns_processes
from substrate.errors import SubstrateError
from substrate.faults import clear_all
from substrate.lab import Lab
from substrate.paths import LABS_DIR, NETNS_PREFIX
from substrate.record import LabRecord, pid_alive


@dataclass
class CleanupReport:
    """What :func:`cleanup` removed."""

    labs: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    processes: int = 0
    kept: list[str] = field(default_factory=list)
    faults_cleared: list[str] = field(default_factory=list)


def _list_netns() -> list[str]:
    try:
        return sorted(p.name for p in Path("/run/netns").iterdir())
    except OSError:
        return []


def _owner_alive(d: Path) -> bool:
    """The record in ``d`` names a running owner process (read as plain JSON, whatever its model)."""
    try:
        owner = json.loads((d / "lab.json").read_text()).get("owner_pid")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(owner, int) and pid_alive(owner)


def cleanup(all_labs: bool = False) -> CleanupReport:
    """Remove leftovers of crashed labs; only anibench's.

    A lab is a leftover when it was not detached (``harness lab up`` detaches once the bring-up
    is complete, so a bring-up killed half-way is a leftover too) and its owner process is gone or
    one of its nodes died, or when its record is unreadable and names no running owner (a record
    of another version whose owner runs is kept). Detached labs
    are kept, faults a crashed run left on them cleared. Namespaces named ``anibench-*`` that
    belong to no kept lab are removed with every process inside them. With ``all_labs`` every
    anibench lab goes, running or not.

    Returns:
        What was removed and which labs were kept.
    """
    report = CleanupReport()
    keep_ns: set[str] = set()
    keep_prefixes: list[str] = []
    if LABS_DIR.is_dir():
        for d in sorted(LABS_DIR.iterdir()):
            if not d.is_dir():
                continue
            try:
                record = LabRecord.model_validate_json((d / "lab.json").read_text())
            except (OSError, ValueError):
                record = None
                if not all_labs and _owner_alive(d):
                    # a record this version cannot read (another checkout's, a newer model) whose
                    # owner is running: a live lab, not a leftover; keep it and its namespaces
                    report.kept.append(d.name)
                    keep_prefixes.append(f"{NETNS_PREFIX}{d.name}-")
                    continue
            if record is not None and not all_labs:
                owner_alive = pid_alive(record.owner_pid)
                creating = record.status == "creating" and owner_alive
                lab = Lab(record)
                # a detached lab (harness lab up) is the user's until harness lab down, even with a
                # dead node; a lab owned by a process is a leftover once that process is gone
                if creating or record.detached or (lab.alive() and owner_alive):
                    if not owner_alive and not creating:
                        # a kept lab may still carry faults of a run whose process crashed
                        report.faults_cleared += clear_all(lab)
                    report.kept.append(record.name)
                    keep_ns.update(s.netns for s in record.nodes.values())
                    keep_ns.update(f"{NETNS_PREFIX}{record.name}-{n.name}" for n in record.topology.nodes)
                    continue
            if record is not None:
                try:
                    Lab(record).destroy()
                except SubstrateError:
                    pass
            shutil.rmtree(d, ignore_errors=True)
            report.labs.append(d.name)
    for ns in _list_netns():
        if not ns.startswith(NETNS_PREFIX) or ns in keep_ns or ns.startswith(tuple(keep_prefixes)):
            continue
        m = re.fullmatch(rf"{NETNS_PREFIX}probe-(\d+)", ns)
        if m and pid_alive(int(m.group(1))) and not all_labs:
            continue  # a feature probe running right now
        report.processes += kill_netns_processes([ns])
        delete_netns([ns])
        report.namespaces.append(ns)
    return report
