"""Deploying a scenario on a lab, and resetting a lab to its scenario baseline.

Deploy: the topology (routers, CE and external hosts) comes up as a lab, every node's rendered
service state is applied in parallel, and every baseline invariant is checked by the observer.
A scenario whose invariants do not all pass is refused: the lab is destroyed and the error lists
what failed (draft section 6: "every pre-existing service passes its invariants before the run").
The scenario and the baseline device state of every node are kept in the lab's directory.

Reset: back to that baseline without redeploying, and verified. Faults are cleared, processes an
agent left running in a node are killed, stopped processes resumed, dead FRR daemons restarted
(all of a router's FRR when zebra died), deleted links re-created (with their baseline MAC
addresses, so that link-local addresses and the routes through them come back the same), then every node's full state
(:class:`~substrate.devstate.DeviceState`) is compared with its baseline and whatever differs is
restored and verified; /etc/frr files are put back; where the kernel lost routes zebra believes
installed (``ip nexthop flush`` does that), FRR is restarted; once the underlay has converged, the
routes FRR installed are compared with the baseline's too. What still differs is the report's
``residual``: a reset that leaves a difference is not exact, and a run on it fails as a harness
error (never silently). Transactions an ANI server left unfinished in the journal are closed
(:func:`substrate.journal.close_unfinished`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from substrate.devstate import (
    SCHEMA_VERSION,
    ZEBRA_SETTLE_S,
    DeviceState,
    FibDesync,
    RestoreReport,
    capture,
    capture_frr_routes,
    capture_many,
    capture_with_prelude,
    fib_desync,
    repair_nexthop_groups,
    restart_frr,
    restore,
)
from substrate.errors import SubstrateError
from substrate.journal import close_unfinished, remove_unreadable
from substrate.lab import Lab
from substrate.locks import ConfigLockHeld, baseline_lock
from substrate.routes import route_key
from substrate.scenario.apply import apply_config
from substrate.scenario.model import Scenario
from substrate.scenario.observer import Verdict, observe
from substrate.topology import Role

SCENARIO_FILE = "scenario.json"
BASELINE_FILE = "baseline.json"
#: Shell that kills every process of a node but its init (PID 1), its FRR daemons and itself --
#: whatever an agent left running (a loop that keeps changing state would otherwise reach into
#: the observation or the next run) -- printing ``K pid:comm``. A daemon is kept only if its PID
#: file names a process of that name that runs only installed code, so neither a PID written into
#: /run/frr by an agent nor a library injected into a daemon's program protects anything.
#: ``{daemons}``: the lab's daemons. Builtins but for one awk (:data:`_MAPS_OUTSIDE_USR`), which
#: has exited before the kill loop reads /proc, so nothing it starts is killed by it.
_KILL_STRAYS = """keep=" 1 $$ "; cand=(); maps=()
for d in {daemons}; do
  p=; c=; read -r p < "/run/frr/$d.pid" 2>/dev/null
  [ -n "$p" ] && read -r c < "/proc/$p/comm" 2>/dev/null
  [ "$c" = "$d" ] || continue
  # only the installed program (frr.runs_only_installed_code): no LD_* variable, no executable
  # mapping but files of /usr and the vdso (the maps of every daemon read by one awk, below)
  ok=1
  while IFS= read -r -d '' v; do case "$v" in LD_*) ok=;; esac; done < "/proc/$p/environ" 2>/dev/null
  [ -n "$ok" ] && cand+=("$p") && maps+=("/proc/$p/maps")
done
bad=
[ ${{#maps[@]}} -gt 0 ] && bad=$(awk '{awk}' "${{maps[@]}}" 2>/dev/null)
bad=" ${{bad//$'\\n'/ }} "
for p in "${{cand[@]}}"; do case "$bad" in *" $p "*) ;; *) keep="$keep$p ";; esac; done
for d in /proc/[0-9]*; do
  p=${{d#/proc/}}
  case "$keep" in *" $p "*) continue;; esac
  c=?; read -r c < "$d/comm" 2>/dev/null
  kill -9 "$p" 2>/dev/null && echo "K $p:$c"
done
"""
#: awk over ``/proc/PID/maps`` files printing each PID with an executable mapping (``x`` in the
#: permissions, the second field) whose path (what follows the fifth field) is not under /usr/ nor
#: the kernel's [vdso]/[vsyscall] page -- anonymous code included: the rule of
#: :func:`substrate.frr.runs_only_installed_code`, one process for all daemons of a node (a bash
#: loop over their few hundred lines cost about 15 ms of CPU per router and reset).
_MAPS_OUTSIDE_USR = ('$2 ~ /x/ && !(FILENAME in bad) { p = $0; sub(/^[^ \\t]+[ \\t]+[^ \\t]+[ \\t]+[^ \\t]+[ \\t]+[^ \\t]+[ \\t]+[^ \\t]+[ \\t]*/, "", p); '
                     'sub(/[ \\t]+$/, "", p); if (p !~ /^\\/usr\\// && p != "[vdso]" && p != "[vsyscall]") { bad[FILENAME] = 1; split(FILENAME, f, "/"); print f[3] } }')
_KILL_STRAYS = _KILL_STRAYS.replace("{awk}", _MAPS_OUTSIDE_USR.replace("{", "{{").replace("}", "}}"))
#: At the start of a reset, per node: kill strays (above), resume stopped processes (the
#: frozen-node fault), print ``D daemon`` for each FRR daemon that is not running, and empty every
#: writable directory of the node (:data:`_EMPTY_WRITABLE`).
_REVIVE = _KILL_STRAYS + """kill -CONT -1 2>/dev/null
for d in {daemons}; do {{ read -r p < /run/frr/$d.pid && kill -0 "$p"; }} 2>/dev/null || echo "D $d"; done
"""
#: What one run's agent left in a node's writable directories (notes, scripts, a shell or vtysh
#: history, FRR's log of its changes) must not be read by the next run's agent, nor change what
#: the node does: /tmp, /root, /dev/shm, /var and /run are emptied but for FRR's own files (its
#: daemons' PID files, vty and zserv sockets, crash log buffers; its log file is truncated) and
#: their directories get their owners and modes back. Bash globs (``extglob``): one ``rm`` for all;
#: the host process tells whether any directory lacks its mode or owner (:func:`writable_dirs_ok`:
#: no process in the node), and only then do ``mkdir``/``chmod``/``chown`` run (:data:`_FIX_WRITABLE`).
_EMPTY_WRITABLE = """shopt -s nullglob dotglob extglob
junk=(/tmp/* /root/* /dev/shm/* /run/!(frr) /run/frr/!(@({keep})) /var/!(lib|log|tmp|run) /var/lib/!(frr) /var/lib/frr/*
      /var/log/!(frr) /var/log/frr/!(frr.log) /var/tmp/!(frr) /var/tmp/frr/!(*.+([0-9])) /var/tmp/frr/*/!(logbuf.+([0-9])))
[ -L /var/run ] || junk+=(/var/run)
[ -L /var/log/frr/frr.log ] && junk+=(/var/log/frr/frr.log)
[ ${{#junk[@]}} -gt 0 ] && rm -rf -- "${{junk[@]}}"
[ -e /var/run ] || ln -s /run /var/run
[ -f /var/log/frr/frr.log ] && : > /var/log/frr/frr.log
true
"""
#: Gives the writable directories their modes and owners back (run by reset only when
#: :func:`writable_dirs_ok` says one lacks them).
_FIX_WRITABLE = """mkdir -p /run/frr /var/lib/frr /var/log/frr /var/tmp/frr 2>/dev/null
chmod 1777 /tmp /var/tmp /dev/shm && chmod 700 /root /var/tmp/frr && chmod 755 /run /var /var/lib /var/log /run/frr /var/lib/frr /var/log/frr \
  && chown frr:frr /run/frr /var/lib/frr /var/log/frr /var/tmp/frr && chown root:root /tmp /var/tmp /dev/shm /root /run /var /var/lib /var/log
"""
#: The directories :data:`_EMPTY_WRITABLE` gives back their mode and owner, with them (what its
#: ``chmod`` and ``chown`` lines set: keep the two in step).
_WRITABLE_DIRS = {"/tmp": "1777 root:root", "/var/tmp": "1777 root:root", "/dev/shm": "1777 root:root", "/root": "700 root:root",
                  "/var/tmp/frr": "700 frr:frr", "/run": "755 root:root", "/var": "755 root:root", "/var/lib": "755 root:root",
                  "/var/log": "755 root:root", "/run/frr": "755 frr:frr", "/var/lib/frr": "755 frr:frr", "/var/log/frr": "755 frr:frr"}


def writable_dirs_ok(lab: Lab, node: str) -> bool:
    """Whether every directory of :data:`_WRITABLE_DIRS` has its mode and owner in ``node``, read
    from the host through the node's root (``/proc/INIT/root``: its mount namespace) with
    ``lstat`` (what ``stat -c '%a %U:%G'`` in the node prints: a symbolic link is not a
    directory, and as every parent in the list is checked too, no path is followed through one).
    Owners are named by the host's user database, which the nodes share."""
    import grp
    import pwd

    root = f"/proc/{lab.state(node).init_pid}/root"
    for d, want in _WRITABLE_DIRS.items():
        try:
            st = os.lstat(root + d)
            owner = f"{pwd.getpwuid(st.st_uid).pw_name}:{grp.getgrgid(st.st_gid).gr_name}"
        except (OSError, KeyError):
            return False
        if not stat.S_ISDIR(st.st_mode) or f"{stat.S_IMODE(st.st_mode):o} {owner}" != want:
            return False
    return True


def revive_script(daemons: list[str]) -> str:
    """The reset's prelude for a node running ``daemons`` (:data:`_REVIVE`, :data:`_EMPTY_WRITABLE`)."""
    keep = "|".join([*(f"{d}.pid|{d}.vty" for d in daemons), "zserv.api"])
    return _REVIVE.format(daemons=" ".join(daemons)) + _EMPTY_WRITABLE.format(keep=keep)


def kill_strays(lab: Lab, nodes: list[str] | None = None, also_keep: dict[str, list[str]] | None = None) -> list[str]:
    """Kill, in ``nodes`` (default: every node), every process but init and the FRR daemons
    (the node's own, plus ``also_keep[node]``: daemons a task's customer-side setup started for
    the run; kept on the same proof as the node's own, a PID file naming a process of that name
    that runs only installed code).

    Returns:
        The processes killed, as ``node:pid:command``.
    """
    extra = also_keep or {}

    def one(node: str) -> list[str]:
        daemons = [*lab.state(node).daemons, *(d for d in extra.get(node, []) if re.fullmatch(r"[a-z0-9]+", d))]
        r = lab.sh(node, _KILL_STRAYS.format(daemons=" ".join(daemons)) + "true", timeout_s=5)
        return [f"{node}:{ln[2:]}" for ln in r.stdout.splitlines() if ln.startswith("K ")]

    return [k for found in lab.map(one, nodes or lab.node_names()) for k in found]


#: A token rewritten whenever the lab is put at its baseline (deploy, reset); see baseline_epoch.
EPOCH_FILE = "baseline_epoch"
#: Beside each node's etc-frr directory: its baseline copy (routers).
FRR_FILES_BASELINE = "etc-frr.baseline"


class ScenarioInvalid(SubstrateError):
    """Baseline invariants failed on a freshly deployed scenario (the lab was destroyed)."""

    def __init__(self, failed: list[Verdict]):
        self.failed = failed
        lines = "; ".join(f"{v.id}: {v.detail}" for v in failed[:8])
        more = f" (and {len(failed) - 8} more)" if len(failed) > 8 else ""
        super().__init__(f"{len(failed)} baseline invariant(s) failed: {lines}{more}")


def load_scenario(lab: Lab) -> Scenario:
    """The scenario deployed on ``lab``.

    Raises:
        SubstrateError: the lab was not deployed from a scenario.
    """
    path = lab.dir / SCENARIO_FILE
    if not path.exists():
        raise SubstrateError(f"lab {lab.name} was not deployed from a scenario (harness lab up --scenario FILE)")
    return Scenario.model_validate_json(path.read_text())


def _no_baseline(lab: Lab) -> str:
    """Why ``lab`` cannot be reset, and what to do instead: only a scenario deployment records a
    baseline; a lab imported from a Containerlab file or made from a bare topology has none."""
    imported = lab.record.meta.get("clab_file") or next(
        (n.source.file for n in lab.topology.nodes if n.source is not None and n.source.file), None)
    if imported:
        return (f"lab {lab.name} cannot be reset: it was imported from the Containerlab file {imported}, not deployed "
                "from a scenario, so no baseline was recorded to go back to; nothing was changed. To start it afresh: "
                f"harness lab down {lab.name} && harness lab up --topology {imported} --name {lab.name}")
    return (f"lab {lab.name} cannot be reset: it was deployed from a bare topology ({lab.topology.name}), not from a "
            "scenario, so no baseline was recorded to go back to; nothing was changed. Redeploy it (harness lab down "
            f"{lab.name}, then harness lab up --topology ...) or deploy a scenario (harness lab up --scenario FILE)")


def load_baseline(lab: Lab) -> dict[str, DeviceState]:
    """Baseline device state of every node of a scenario lab (read once per process while the
    file is unchanged: the states are shared, never modify them).

    Raises:
        SubstrateError: the lab was not deployed from a scenario (it has no baseline).
    """
    path = lab.dir / BASELINE_FILE
    try:
        stamp = path.stat().st_mtime_ns
        cached = _BASELINES.get(str(path))
        if cached and cached[0] == stamp:  # a campaign resets the same lab again and again
            return dict(cached[1])
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SubstrateError(_no_baseline(lab)) from None
    old = sorted({v.get("schema_version", 1) for v in data.values()} - {SCHEMA_VERSION})
    if old:
        raise SubstrateError(f"lab {lab.name}'s baseline was recorded by another anibench version (device-state schema "
                             f"{old[0]}, this one reads {SCHEMA_VERSION}): redeploy it (harness lab down, lab up --scenario)")
    states = {k: DeviceState.model_validate(v) for k, v in data.items()}
    _BASELINES[str(path)] = (stamp, states)
    return dict(states)


#: Baselines read in this process: path -> (modification time, states).
_BASELINES: dict[str, tuple[int, dict[str, DeviceState]]] = {}


def baseline_epoch(lab: Lab) -> str:
    """A token that changes every time the lab is put at its scenario baseline (deploy, reset).

    Upper layers that keep records of changes made since the baseline (A3-T's committed change
    sets) tag them with it and drop them when it changes. Empty for a lab without a baseline.
    """
    try:
        return (lab.dir / EPOCH_FILE).read_text().strip()
    except OSError:
        return ""


def _new_epoch(lab: Lab) -> None:
    import uuid

    (lab.dir / EPOCH_FILE).write_text(uuid.uuid4().hex + "\n")


def deploy_scenario(
    scenario: Scenario | str | Path,
    name: str,
    *,
    detached: bool = False,
    verify: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Lab:
    """Deploy ``scenario`` (object or file) as lab ``name``; see module docstring.

    Raises:
        ScenarioInvalid: some baseline invariant failed (lab destroyed).
        SubstrateError and subclasses: as :meth:`Lab.create`.
    """
    sc = scenario if isinstance(scenario, Scenario) else Scenario.model_validate_json(Path(scenario).read_text())
    say = progress or (lambda _m: None)
    frr_extra = {n: cfg.frr for n, cfg in sc.node_config.items() if cfg.frr}
    # detached only once the baseline is recorded: a deploy killed half-way is a leftover
    lab = Lab.create(sc.topology, name, frr_extra=frr_extra, progress=say)
    try:
        t0 = time.monotonic()
        say(f"applying service state to {len(sc.node_config)} nodes")
        lab.map(lambda n: apply_config(lab, n, sc.node_config[n].model_copy(update={"frr": []})), sorted(sc.node_config))
        (lab.dir / SCENARIO_FILE).write_text(sc.to_json())
        lab.save_meta(scenario=sc.name, seed=sc.seed, density=sc.density, services_s=time.monotonic() - t0)
        if verify:
            say(f"checking {len(sc.invariants)} baseline invariants")
            verdicts = observe(lab, sc.invariants)
            failed = [v for v in verdicts if not v.ok]
            if failed:
                raise ScenarioInvalid(failed)
        say("recording the baseline")
        save_baseline(lab)
        if detached:
            lab.detach()
        return lab
    except BaseException:
        lab.destroy()
        raise


def save_baseline(lab: Lab) -> dict[str, DeviceState]:
    """Capture every node and store it as the lab's baseline (with a copy of each router's
    /etc/frr files, which reset puts back: see :func:`restore_frr_files`)."""
    states = capture_many(lab)
    (lab.dir / BASELINE_FILE).write_text(json.dumps({k: v.model_dump(mode="json") for k, v in states.items()}))
    for node in lab.node_names():
        live = _etc_frr(lab, node)
        if live.is_dir():
            shutil.rmtree(live.with_name(FRR_FILES_BASELINE), ignore_errors=True)
            shutil.copytree(live, live.with_name(FRR_FILES_BASELINE))
    _new_epoch(lab)
    return states


def _etc_frr(lab: Lab, node: str) -> Path:
    return lab.dir / "nodes" / node / "etc-frr"  # the node's /etc/frr (netns backend)


def restore_frr_files(lab: Lab) -> list[str]:
    """Put every router's /etc/frr files back to the baseline copy: a ``write memory`` by an agent
    changes no running state that capture sees, but the next daemon restart (a fault, or
    ``vtysh -b``) would load it. Files the agent added there are removed.

    The directory is the node's, written by its agent: it is read from the host without following
    a symlink (which would lead into the host's files) or opening anything but a regular file (a
    FIFO would block the reset forever); an entry of another kind is replaced.

    Returns:
        The files rewritten or removed, as ``node:/etc/frr/NAME``.
    """
    fixed: list[str] = []
    for node in lab.node_names():
        live = _etc_frr(lab, node)
        base = live.with_name(FRR_FILES_BASELINE)
        if not base.is_dir():
            continue
        want = {f.name: (f.read_bytes(), stat.S_IMODE(f.stat().st_mode)) for f in base.iterdir() if f.is_file()}
        have = {f.name for f in live.iterdir()} if live.is_dir() else set()
        for name in sorted(have - set(want)):
            _remove_entry(live / name)
            fixed.append(f"{node}:/etc/frr/{name}")
        for name, (data, mode) in sorted(want.items()):
            path = live / name
            if _regular_file_bytes(path, mode) == data:
                continue
            _remove_entry(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            try:
                os.write(fd, data)
                os.fchmod(fd, mode)
                shutil.chown(path, "frr", "frr")
            finally:
                os.close(fd)
            fixed.append(f"{node}:/etc/frr/{name}")
    return fixed


def _remove_entry(path: Path) -> None:
    """Remove whatever ``path`` is (a directory with its content; a symlink itself, never its target)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    shutil.rmtree(path) if stat.S_ISDIR(st.st_mode) else path.unlink()


def _regular_file_bytes(path: Path, mode: int) -> bytes | None:
    """The content of ``path`` if it is a regular file of ``mode`` (not followed if a symlink,
    never blocking), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != mode:
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class ResetReport(BaseModel):
    """What :func:`reset` did and what it verified."""

    seconds: float
    restored: list[RestoreReport] = Field(default_factory=list, description="Nodes that needed changes (none: the lab was at its baseline).")
    repaired_links: list[str] = Field(default_factory=list)
    restarted_daemons: list[str] = Field(default_factory=list)
    frr_restarted: list[str] = Field(
        default_factory=list, description="Routers whose FRR was restarted because the kernel lost routes zebra "
        "believed installed (`node: why`).")
    frr_files_restored: list[str] = Field(
        default_factory=list, description="/etc/frr files put back to the baseline copy (e.g. after `write memory`).")
    killed_processes: list[str] = Field(
        default_factory=list, description="Processes left running in a node (by an agent), killed: `node:pid:command`.")
    notes: list[str] = Field(default_factory=list, description="Other things the reset did (faults a crashed run left cleared, unfinished journal "
        "transactions closed).")
    verified: int = Field(default=0, description="Nodes whose full state was compared with the baseline and found equal.")
    residual: dict[str, list[str]] = Field(default_factory=dict, description="Differences left (empty = exact).")
    stages: dict[str, float] = Field(default_factory=dict, description="Seconds per stage (capture+restore, repair, converge, verify).")

    @property
    def exact(self) -> bool:
        return not self.residual

    def summary(self) -> str:
        """One line: what was restored and whether every node now equals its baseline."""
        what = (f"{len(self.restored)} node(s) restored ({', '.join(r.node for r in self.restored)})" if self.restored
                else "nothing to restore")
        extra = [f"links re-created: {', '.join(self.repaired_links)}" if self.repaired_links else "",
                 f"daemons restarted: {', '.join(self.restarted_daemons)}" if self.restarted_daemons else "",
                 f"FRR restarted: {', '.join(self.frr_restarted)}" if self.frr_restarted else "",
                 f"/etc/frr files put back: {', '.join(self.frr_files_restored)}" if self.frr_files_restored else "",
                 f"processes killed: {', '.join(self.killed_processes)}" if self.killed_processes else ""]
        verdict = (f"verified: all {self.verified} nodes equal their baseline" if self.exact
                   else f"NOT at the baseline: {len(self.residual)} node(s) still differ ({', '.join(sorted(self.residual))})")
        return "; ".join([what, *[e for e in extra if e], verdict])


def repair_links(lab: Lab, states: dict[str, DeviceState], baseline: dict[str, DeviceState] | None = None) -> list[str]:
    """Re-create veth pairs of the topology whose end is missing in some node (deleted by an
    agent or a fault), with the MAC addresses of the ``baseline`` (hence the same link-local
    addresses and routes through them). Returns the links re-created, as ``a:if--b:if``."""
    from substrate.backends.netns import ip_batch

    repaired = []
    for lk in lab.topology.links:
        a, b = lk.a, lk.b
        if a.interface in states[a.node].links and b.interface in states[b.node].links:
            continue
        for ep in (a, b):  # delete the surviving end, then re-create the pair
            if ep.interface in states[ep.node].links:
                lab.exec(ep.node, ["ip", "link", "del", ep.interface])

        def mac(ep) -> str:  # noqa: ANN001
            link = (baseline or {}).get(ep.node, DeviceState(node=ep.node)).links.get(ep.interface)
            return f" address {link.address}" if link and link.address else ""

        r = ip_batch([f"link add name {a.interface} netns {lab.state(a.node).netns}{mac(a)} type veth "
                      f"peer name {b.interface} netns {lab.state(b.node).netns}{mac(b)}"])
        if r.ok:
            repaired.append(f"{a}--{b}")
    return repaired


def _revive_lines(head: str, node: str) -> tuple[list[str], list[str]]:
    """(dead daemons, killed processes as node:pid:comm) from the revive prelude's output."""
    lines = head.splitlines()
    return [ln[2:] for ln in lines if ln.startswith("D ")], [f"{node}:{ln[2:]}" for ln in lines if ln.startswith("K ")]


def reset(lab: Lab, *, converge_timeout_s: float = 60.0, verify_timeout_s: float = 30.0,
          lock_timeout_s: float = 120.0) -> ResetReport:
    """Put ``lab`` back to its scenario baseline and verify it (see module docstring).

    Args:
        converge_timeout_s: bound on the wait for the IS-IS underlay.
        verify_timeout_s: bound on the wait for FRR's routes to equal the baseline's once the
            underlay has converged (ECMP sets and metrics settle a little after the prefixes).
        lock_timeout_s: bound on the wait for the devices' configuration locks (:mod:`substrate.locks`):
            a transaction in progress (an ANI server's) ends before the reset starts.

    Returns:
        The report; ``exact`` is false when some node still differs from its baseline
        (``residual`` says how): callers must treat that as a failure.

    Raises:
        SubstrateError: the lab has no baseline (or one of another schema), a node is dead
            (redeploy), or a configuration lock stayed held (naming its holder);
            ConvergenceTimeout: the underlay did not converge.
    """
    from substrate.faults import clear_all
    from substrate.netconf import stop_server as stop_netconf

    t0 = time.monotonic()
    stages: dict[str, float] = {}

    def lap(name: str, since: list[float] = [t0]) -> None:  # noqa: B006 - closure state
        now = time.monotonic()
        stages[name] = now - since[0]
        since[0] = now

    baseline = load_baseline(lab)
    faults_cleared = clear_all(lab)
    # the routers' NETCONF server keeps session state (candidates, locks, pending confirmed
    # commits whose timers would roll a device back in a later run): a reset ends it; the next
    # use starts a fresh one
    stop_netconf(lab)
    # the ANI servers change devices under their configuration locks: a reset takes every one, so
    # that it neither runs in the middle of a transaction nor lets one go on over the new
    # baseline (a transaction checks, under its locks, that the baseline epoch did not change)
    stack = contextlib.ExitStack()
    try:
        # first the baseline lock: a commit to a source of truth of this epoch (A3-R) is not
        # acknowledged in the middle of the reset, then lost with the epoch
        stack.enter_context(baseline_lock(lab.dir, shared=False, holder=f"lab reset (pid {os.getpid()})", timeout_s=lock_timeout_s))
        stack.enter_context(lab.config_lock(lab.node_names(), holder=f"lab reset (pid {os.getpid()})", timeout_s=lock_timeout_s))
    except ConfigLockHeld as e:
        stack.close()
        raise SubstrateError(f"lab reset waited for a configuration change in progress to end, in vain: {e}") from None
    with stack:
        restarted: list[str] = []
        killed: list[str] = []

        def check_and_restore(node: str, revive: bool = True) -> tuple[DeviceState, RestoreReport]:
            # one command per node: revive it (strays killed, processes resumed, /tmp emptied, dead
            # daemons named), then capture; restored at once if it differs, while the other nodes
            # are still being captured
            prelude = revive_script(lab.state(node).daemons) if revive else ""
            cur, head = capture_with_prelude(lab, node, frr="fast", sysctls="fast", prelude=prelude)
            if revive and not writable_dirs_ok(lab, node):  # checked once its strays are dead
                lab.sh(node, _FIX_WRITABLE, timeout_s=10)
            dead, strays = _revive_lines(head, node)
            killed.extend(strays)
            if "zebra" in dead:
                # every daemon depends on zebra, and they do not all re-send their routes to a new
                # one: restart the node's FRR as a whole, as watchfrr does
                errors = restart_frr(lab, node, baseline[node].frr_config or "")
                if errors:
                    raise SubstrateError(f"{node}: FRR could not be restarted after zebra died: {'; '.join(errors)}")
                restarted.extend(f"{node}:{d}" for d in lab.state(node).daemons)
                cur = capture(lab, node, frr="fast", sysctls="fast")
            elif dead:
                for d in dead:  # with its part of the baseline (vtysh sends it the lines it has commands for)
                    lab.start_daemon(node, d, config=baseline[node].frr_config or "")
                restarted.extend(f"{node}:{d}" for d in dead)
                cur = capture(lab, node, frr="fast", sysctls="fast")
            rep = restore(lab, baseline[node], cur)
            return rep.final or cur, rep

        # routers first (PEs, then P routers), hosts last: the nodes an agent acts on are the ones
        # a restore is likely to follow, so their restores overlap the hosts' captures instead of
        # starting when every node has been captured (the order changes no result)
        nodes = lab.node_names()
        order = sorted(nodes, key=lambda n: (_CAPTURE_ORDER.get(lab.state(n).role, 3), nodes.index(n)))
        got = dict(zip(order, lab.map(check_and_restore, order), strict=True))
        results = {n: got[n] for n in nodes}
        lap("capture+restore")
        repaired = repair_links(lab, {n: cur for n, (cur, _) in results.items()}, baseline)
        if repaired:
            again = sorted({ep.split(":")[0] for lk in repaired for ep in lk.split("--")})
            first = {n: results[n][1] for n in again}
            redo = dict(zip(again, lab.map(lambda n: check_and_restore(n, revive=False), again), strict=True))
            for n, (cur, rep) in redo.items():  # the first pass's actions count too
                rep.actions = first[n].actions + rep.actions
                rep.changed = rep.changed or first[n].changed
                results[n] = (cur, rep)
            lap("repair")
        changed = bool(repaired or restarted or any(rep.changed for _, rep in results.values()))
        # FRR's routes: where the kernel and zebra disagree, zebra will not fix it by itself
        routers = lab.routers()
        suspects = [n for n in routers if not results[n][0].same_as(baseline[n], dynamic=True) and results[n][0].same_as(baseline[n])]
        frr_restarted = _resync_frr(lab, baseline, {n: results[n][0] for n in suspects}, results, strict=False)
        if frr_restarted:
            changed = True
            lap("resync")
        # the routers whose capture equals the converged baseline, FRR's routes included, hold every
        # underlay prefix: only their adjacencies are asked for
        complete = [n for n in routers if n not in suspects and results[n][0].same_as(baseline[n], dynamic=True)]
        lab.wait_converged(timeout_s=converge_timeout_s, prefixes_read=complete)
        lap("converge")
        dyn: dict[str, list[str]] = {}
        if changed or suspects:
            # the routes FRR installed must come back too (see _verify_frr_routes)
            dyn, more = _verify_frr_routes(lab, baseline, routers, results, verify_timeout_s, converge_timeout_s)
            frr_restarted += more
            lap("verify")
        residual = {n: rep.residual for n, (_, rep) in results.items() if rep.residual}
        for n, routes in dyn.items():
            have, want = set(routes), set(baseline[n].frr_routes)
            residual.setdefault(n, []).extend([f"+ frr_routes: {x}" for x in sorted(want - have)] +
                                              [f"- frr_routes: {x}" for x in sorted(have - want)])
        # transactions an ANI server left unfinished (it died): every device is at the baseline now
        # and the processes it left in the nodes were killed above, so they are closed, not replayed
        notes = [f"fault a crashed run left cleared: {x}" for x in faults_cleared]
        notes += [f"unfinished transaction {x} closed (abandoned)"
                 for x in close_unfinished(lab, "lab reset: every device put back to its baseline")]
        notes += [f"unreadable journal entry {name} removed ({why}; every device was put back to its baseline)"
                  for name, why in remove_unreadable(lab).items()]  # fmt: skip
        frr_files = restore_frr_files(lab)  # last: restoring FRR (frr-reload, restarts) may write frr.conf
        reports = [rep for _, rep in results.values() if rep.changed]
        _new_epoch(lab)
        return ResetReport(seconds=time.monotonic() - t0, restored=reports, repaired_links=repaired,
                           restarted_daemons=restarted, frr_restarted=frr_restarted, killed_processes=killed,
                           frr_files_restored=frr_files, notes=notes, verified=len([n for n in nodes if n not in residual]),
                           residual=residual, stages=stages)


#: The order in which a reset takes the nodes' roles (see reset).
_CAPTURE_ORDER = {Role.PE: 0, Role.P: 1}


def isis_unsettled(lab: Lab, routers: list[str]) -> list[str]:
    """Why IS-IS may still move the routes of ``routers`` (empty when it is settled): an SPF run
    is scheduled on a router, or two routers' link-state databases differ (flooding in flight).
    Routes that equal the baseline's while either holds can change a moment later."""
    from substrate.frr import (
        ISIS_DATABASE,
        ISIS_SUMMARY_JSON,
        isis_spf_pending,
        parse_isis_database,
    )
    from substrate.vty import VtyError

    def read(node: str) -> tuple[bool, dict[str, tuple[str, str]]] | str:
        try:
            (summary, _), (db, _) = lab.vty(node, "isisd", ISIS_SUMMARY_JSON, ISIS_DATABASE, timeout_s=5)
            return isis_spf_pending(summary), parse_isis_database(db)
        except (VtyError, ValueError) as e:
            return f"{node}: isisd did not answer ({e})"

    out: list[str] = []
    dbs: dict[str, dict[str, tuple[str, str]]] = {}
    routers = [r for r in routers if "isisd" in lab.state(r).daemons]  # an external AS's router runs no IS-IS
    for node, got in zip(routers, lab.map(read, routers), strict=True):
        if isinstance(got, str):
            out.append(got)
            continue
        if got[0]:
            out.append(f"{node}: an SPF run is pending")
        dbs[node] = got[1]
    if len({tuple(sorted(d.items())) for d in dbs.values()}) > 1:
        out.append("the routers' IS-IS databases differ (flooding in flight)")
    return out


def _verify_frr_routes(lab: Lab, baseline: dict[str, DeviceState], routers: list[str],
                       results: dict[str, tuple[DeviceState, RestoreReport]], timeout_s: float,
                       converge_timeout_s: float) -> tuple[dict[str, list[str]], list[str]]:
    """Poll until every router's FRR routes equal its baseline's and IS-IS is settled (so that
    they stay so: :func:`isis_unsettled`). Where IS-IS has settled and a router's routes still
    differ, its kernel and zebra disagree: that is repaired once (:func:`_resync_frr`).

    Returns:
        The routes of the routers that still differ after ``timeout_s`` (every router, with a
        note, when only IS-IS never settled), and the FRR restarts made.
    """
    deadline = time.monotonic() + timeout_s
    attempts: dict[str, int] = {}
    seen: dict[str, list[str]] = {}
    restarts: list[str] = []
    routes: dict[str, list[str]] = {}
    stuck: dict[str, float] = {}  # router: when its routes were first seen differing with IS-IS settled
    hammered: set[str] = set()
    while True:
        # IS-IS first (a few vty reads): the routing tables are read once it has settled
        unsettled = isis_unsettled(lab, routers)
        if unsettled and time.monotonic() < deadline:
            time.sleep(0.1)  # poll interval, not a settle delay: the loop exits as soon as state holds
            continue
        routes = dict(zip(routers, lab.map(lambda n: capture_frr_routes(lab, n), routers), strict=True))
        differ = {n: r for n, r in routes.items() if sorted(r) != sorted(baseline[n].frr_routes)}
        if not differ and not unsettled:
            return {}, restarts
        # a router is repaired again only when its routes moved since (zebra may have moved too)
        todo = [n for n in sorted(differ) if attempts.get(n, 0) < 3 and seen.get(n) != differ[n]] if not unsettled else []
        if todo:
            states = {n: results[n][0].model_copy(update={"frr_routes": differ[n]}) for n in todo}
            more = _resync_frr(lab, baseline, states, results, strict=True)
            for n in todo:
                attempts[n] = attempts.get(n, 0) + 1
                seen[n] = differ[n]
                stuck[n] = time.monotonic()  # they moved: the wait for IS-IS starts again
            restarts += more
            if more:
                lab.wait_converged(timeout_s=converge_timeout_s)
            continue
        # IS-IS settled, the kernel agrees with zebra, and zebra's routes still are not the
        # baseline's: the router's IS-IS itself is stuck (seen once in CI: an adjacency Up on both
        # ends that r4's SPF never used again). FRR is restarted from the baseline, once a router.
        now = time.monotonic()
        wedged = [n for n in sorted(differ) if not unsettled and n not in hammered and now - stuck.get(n, now) >= STUCK_IGP_S]
        if wedged:
            restarts += _restart_wedged(lab, baseline, results, wedged)
            hammered.update(wedged)
            lab.wait_converged(timeout_s=converge_timeout_s)
            continue
        for n in differ:
            stuck.setdefault(n, now)
        if time.monotonic() >= deadline:
            return differ or {n: [*routes[n], f"?IS-IS not settled: {'; '.join(unsettled)[:300]}"] for n in routers}, restarts
        time.sleep(0.1)  # poll interval, not a settle delay: the loop exits as soon as state holds


#: Seconds a router's FRR routes may differ from the baseline's, with IS-IS settled and its kernel
#: agreeing with zebra, before a reset restarts its FRR (:func:`_verify_frr_routes`). IS-IS re-runs
#: SPF within its spf-interval (FRR's default 1 s, with back-off up to a few seconds: FRR isisd
#: docs, ``spf-delay-ietf``), so routes still wrong after this long will not move by themselves.
STUCK_IGP_S = 8.0


def _restart_wedged(lab: Lab, baseline: dict[str, DeviceState],
                    results: dict[str, tuple[DeviceState, RestoreReport]], nodes: list[str]) -> list[str]:
    """Restart FRR from its baseline configuration on ``nodes`` (routers whose routes stayed off
    the baseline with IS-IS settled) and restore their kernel state again; the actions go to
    their restore reports. Returns ``node: why`` per restart."""

    def one(node: str) -> str:
        results[node][1].changed = True
        _restart_from_baseline(lab, baseline, results, node, f"its routes stayed off the baseline {STUCK_IGP_S:.0f} s after IS-IS settled")
        return f"{node}: routes off the baseline with IS-IS settled"

    return list(lab.map(one, nodes))


def _restart_from_baseline(lab: Lab, baseline: dict[str, DeviceState],
                           results: dict[str, tuple[DeviceState, RestoreReport]], node: str, why: str) -> None:
    """Restart ``node``'s FRR from its baseline configuration and restore its kernel state again;
    the restart (with ``why``) and the restore's actions are added to its restore report in
    ``results``, whose residual and final state become the restore's."""
    prev = results[node][1]
    errors = restart_frr(lab, node, baseline[node].frr_config or "")
    rep = restore(lab, baseline[node])
    prev.actions += [f"FRR restarted: {why}", *rep.actions]
    prev.residual = errors + rep.residual
    results[node] = (rep.final or results[node][0], prev)


def _resync_frr(lab: Lab, baseline: dict[str, DeviceState], states: dict[str, DeviceState],
                results: dict[str, tuple[DeviceState, RestoreReport]], *, strict: bool) -> list[str]:
    """Where the kernel's FRR routes of a router of ``states`` disagree with zebra
    (:func:`substrate.devstate.fib_desync`): nexthop groups missing members are given zebra's
    nexthops back (:func:`substrate.devstate.repair_nexthop_groups`); routes with an FRR protocol
    zebra does not know (seen on two reads 0.2 s apart: zebra may be mid-update) are deleted;
    where zebra cannot or will not re-install (:meth:`FibDesync.restart_needed`), FRR is
    restarted from its baseline configuration and the node's kernel state restored again.
    Returns ``node: why`` of the restarts."""
    restarts: list[str] = []

    def fix(node: str) -> None:
        d = fib_desync(lab, node, states[node])
        if not strict:  # the underlay is moving: only what zebra will never fix counts yet
            d = FibDesync(failed=d.failed, unknown=d.unknown)
        if not d:
            return
        prev = results[node][1]
        prev.changed = True
        if d.regroup:
            unfixable = repair_nexthop_groups(lab, node, d)
            prev.actions.append(f"nexthop groups {sorted(d.regroup)} given back zebra's nexthops")
            d = fib_desync(lab, node, capture(lab, node, frr="fast", sysctls="fast"))
            d.nexthops += unfixable
        if d.unknown:
            time.sleep(ZEBRA_SETTLE_S)  # a second, later read: not a wait for an outcome
            again = fib_desync(lab, node, capture(lab, node, frr="fast", sysctls="fast"))
            d.unknown = [x for x in again.unknown if x in d.unknown]
        for x in d.unknown:
            fam, args = x.split(" ", 1)
            prev.actions.append(f"{fam} route del {route_key(args)} (an FRR protocol, unknown to zebra)")
            lab.exec(node, ["ip", fam, "route", "del", *route_key(args).split()])
        why = d.restart_needed(strict=strict)
        if why:
            _restart_from_baseline(lab, baseline, results, node, "the kernel lost routes zebra had installed")
            restarts.append(f"{node}: {why[0]}" + (f" (and {len(why) - 1} more)" if len(why) > 1 else ""))

    lab.map(fix, sorted(states))
    return sorted(restarts)
