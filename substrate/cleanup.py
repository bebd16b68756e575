"""``harness lab cleanup``: remove what crashed processes left behind, and only that.

Above :mod:`substrate.lab`, :mod:`substrate.faults` and the netns backend (it uses all three), so
that none of them needs to import another back.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from substrate import confine
from substrate.backends.netns import delete_netns, kill_netns_processes, unmount_under
from substrate.errors import SubstrateError
from substrate.faults import clear_all
from substrate.lab import STAGING_SUFFIX, Lab
from substrate.paths import LABS_DIR, NETNS_PREFIX, lab_dir
from substrate.process import run_bounded
from substrate.controllers import stop_all as stop_all_controllers
from substrate.record import LabRecord, pid_alive


@dataclass
class CleanupReport:
    """What :func:`cleanup` removed."""

    labs: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list, metadata={"doc": "Stray namespaces (of no lab record)."})
    lab_namespaces: int = 0  # namespaces removed with the labs in ``labs``
    processes: int = 0  # every process stopped: those of the removed labs and of stray namespaces
    kept: list[str] = field(default_factory=list)
    kept_dead: list[str] = field(default_factory=list, metadata={"doc": "Of ``kept``: detached labs with a dead node."})
    faults_cleared: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line saying what was removed and kept."""
        return (f"removed {len(self.labs)} lab(s){': ' + ', '.join(self.labs) if self.labs else ''}"
                + (f" ({self.lab_namespaces} namespace(s))" if self.labs else "")
                + f"; {len(self.namespaces)} stray namespace(s); {self.processes} process(es) killed"
                + (f"; kept running: {', '.join(running)}" if (running := [k for k in self.kept if k not in self.kept_dead]) else "")
                + (f"; kept, dead (detached: harness lab down NAME): {', '.join(self.kept_dead)}" if self.kept_dead else "")
                + (f"; faults cleared: {'; '.join(self.faults_cleared)}" if self.faults_cleared else ""))


def _netns_pids(namespaces: Iterable[str]) -> set[int]:
    """Live processes inside the given network namespaces (``ip netns pids``)."""
    pids: set[int] = set()
    for ns in namespaces:
        r = run_bounded(["ip", "netns", "pids", ns], timeout_s=5)
        pids.update(int(p) for p in r.stdout.split() if p.isdigit() and pid_alive(int(p)))
    return pids


def _list_netns() -> list[str]:
    try:
        return sorted(p.name for p in Path("/run/netns").iterdir())
    except OSError:
        return []


def _owner_alive(d: Path) -> bool:
    """The record in ``d`` names a running owner process (read as plain JSON, whatever its model;
    its start time, when recorded, guards against PID reuse)."""
    try:
        data = json.loads((d / "lab.json").read_text())
        owner, start = data.get("owner_pid"), data.get("owner_start", 0)
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(owner, int) and pid_alive(owner, start if isinstance(start, int) else 0)


def cleanup(all_labs: bool = False, prefix: str = "") -> CleanupReport:
    """Remove leftovers of crashed labs; only anibench's.

    A lab is a leftover when it was not detached (``harness lab up`` detaches once the bring-up
    is complete, so a bring-up killed half-way is a leftover too) and its owner process is gone or
    one of its nodes died (:meth:`substrate.lab.Lab.condition`), or when its record is unreadable
    and names no running owner (a record of another version whose owner runs is kept). Detached
    labs are kept, faults a crashed run left on them cleared. Namespaces named ``anibench-*`` that
    belong to no kept lab are removed with every process inside them, and cgroups of labs whose
    directory is gone are emptied. With ``all_labs`` every anibench lab goes, running or not.
    With ``prefix`` only labs whose name starts with it (and their namespaces and cgroups) are
    looked at: what one kind of owner leaves (``ray-``: the lab slots of :mod:`harness.cluster`).

    Returns:
        What was removed and which labs were kept.
    """
    report = CleanupReport()
    keep_ns: set[str] = set()
    keep_prefixes: list[str] = []
    # the namespaces as they are before the labs are read: a lab's directory exists before its
    # namespaces, so each of these belongs to a lab read below; one a bring-up makes while this
    # runs (destroying a leftover takes seconds) is not taken for a stray (a lab test's bring-up
    # lost its namespaces to another worker's cleanup: "Invalid netns value")
    namespaces = _list_netns()
    if LABS_DIR.is_dir():
        for d in sorted(LABS_DIR.iterdir()):
            if not d.is_dir() or not d.name.startswith(prefix):
                continue
            if STAGING_SUFFIX in d.name:  # a lab directory being staged (Lab.create): its creator's until renamed
                if all_labs or not _owner_alive(d):
                    shutil.rmtree(d, ignore_errors=True)
                    report.labs.append(d.name)
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
                lab = Lab(record)
                owner_alive = lab.owner_alive()
                condition = lab.condition()
                # a detached lab (harness lab up) is the user's until harness lab down, even with a
                # dead node; a lab owned by a process is a leftover once that process is gone
                if condition == "creating" or record.detached or condition == "up":
                    # controllers (A3-R's reconciler) whose owner died must not outlive it
                    report.processes += stop_all_controllers(d, orphans_only=True)
                    if not owner_alive and condition != "creating":
                        # a kept lab may still carry faults of a run whose process crashed
                        report.faults_cleared += clear_all(lab)
                    report.kept.append(record.name)
                    if condition not in ("up", "creating"):
                        report.kept_dead.append(record.name)
                    keep_ns.update(s.netns for s in record.nodes.values())
                    keep_ns.update(f"{NETNS_PREFIX}{record.name}-{n.name}" for n in record.topology.nodes)
                    continue
            if record is not None:
                names = {s.netns for s in record.nodes.values()} | {f"{NETNS_PREFIX}{record.name}-{n.name}" for n in record.topology.nodes}
                present = [ns for ns in names if ns in set(_list_netns())]
                report.processes += len(_netns_pids(present))  # what destroying it stops
                report.lab_namespaces += len(present)
                try:
                    Lab(record).destroy()
                except SubstrateError:
                    pass
            report.processes += stop_all_controllers(d, recover=False)  # the lab is gone: nothing to recover
            from substrate.dataplane.ebpf.service import stop as stop_dataplane

            report.processes += stop_dataplane(d)  # a lab whose record could not be read: its data-plane service
            unmount_under(d)
            shutil.rmtree(d, ignore_errors=True)
            report.labs.append(d.name)
    still = set(_list_netns())
    for ns in namespaces:
        if ns not in still or not ns.startswith(NETNS_PREFIX + prefix) or ns in keep_ns or ns.startswith(tuple(keep_prefixes)):
            continue
        m = re.fullmatch(rf"{NETNS_PREFIX}probe-(\d+)", ns)
        if m and pid_alive(int(m.group(1))) and not all_labs:
            continue  # a feature probe running right now
        report.processes += kill_netns_processes([ns])
        delete_netns([ns])
        report.namespaces.append(ns)
    # cgroups of labs whose directory is gone (a lab's directory exists before its cgroups do)
    for name, dirs in confine.lab_cgroups().items():
        if name.startswith(prefix) and not lab_dir(name).exists():
            report.processes += confine.kill_cgroups(dirs)
    return report
