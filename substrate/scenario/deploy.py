"""Deploying a scenario on a lab, and resetting a lab to its scenario baseline.

Deploy: the topology (routers, CE and external hosts) comes up as a lab, every node's rendered
service state is applied in parallel, and every baseline invariant is checked by the observer.
A scenario whose invariants do not all pass is refused: the lab is destroyed and the error lists
what failed (draft section 6: "every pre-existing service passes its invariants before the run").
The scenario and the baseline device state of every node are kept in the lab's directory.

Reset: back to that baseline without redeploying. Faults are cleared, processes an agent left
running in a node are killed, stopped processes resumed, dead FRR daemons restarted (all of a
router's daemons when zebra died: :func:`substrate.faults.restart_daemons`), deleted links
re-created, then every node whose state differs from the baseline is restored (only what
differs), the underlay is left converged, and transactions an ANI server left unfinished in the
journal are closed (:func:`substrate.journal.close_unfinished`).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from substrate.devstate import DeviceState, RestoreReport, capture, capture_many, restore
from substrate.errors import SubstrateError
from substrate.journal import close_unfinished
from substrate.lab import Lab
from substrate.scenario.apply import apply_config
from substrate.scenario.model import Scenario
from substrate.scenario.observer import Verdict, observe

SCENARIO_FILE = "scenario.json"
BASELINE_FILE = "baseline.json"
#: Shell (builtins only: no fork, so nothing it starts is killed by it) that kills every process
#: of a node but its init (PID 1), its FRR daemons and itself -- whatever an agent left running (a
#: loop that keeps changing state would otherwise reach into the observation or the next run) --
#: printing ``K pid:comm``. A daemon is kept only if its PID file names a process of that name, so
#: a PID written into /run/frr by an agent protects nothing. ``{daemons}``: the lab's daemons.
_KILL_STRAYS = """keep=" 1 $$ "
for d in {daemons}; do
  p=; c=; read -r p < "/run/frr/$d.pid" 2>/dev/null
  [ -n "$p" ] && read -r c < "/proc/$p/comm" 2>/dev/null
  [ "$c" = "$d" ] && keep="$keep$p "
done
for d in /proc/[0-9]*; do
  p=${{d#/proc/}}
  case "$keep" in *" $p "*) continue;; esac
  c=?; read -r c < "$d/comm" 2>/dev/null
  kill -9 "$p" 2>/dev/null && echo "K $p:$c"
done
"""
#: At the start of a reset, per node: kill strays (above), resume stopped processes (the
#: frozen-node fault), print ``D daemon`` for each FRR daemon that is not running, empty /tmp
#: (what one run's agent left there must not be read by the next).
_REVIVE = _KILL_STRAYS + """kill -CONT -1 2>/dev/null
for d in {daemons}; do {{ read -r p < /run/frr/$d.pid && kill -0 "$p"; }} 2>/dev/null || echo "D $d"; done
rm -rf /tmp/* /tmp/.[!.]* 2>/dev/null
true
"""


def kill_strays(lab: Lab, nodes: list[str] | None = None) -> list[str]:
    """Kill, in ``nodes`` (default: every node), every process but init and the FRR daemons.

    Returns:
        The processes killed, as ``node:pid:command``.
    """

    def one(node: str) -> list[str]:
        r = lab.sh(node, _KILL_STRAYS.format(daemons=" ".join(lab.state(node).daemons)) + "true", timeout_s=5)
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


def load_baseline(lab: Lab) -> dict[str, DeviceState]:
    """Baseline device state of every node of a scenario lab.

    Raises:
        SubstrateError: the lab was not deployed from a scenario (it has no baseline).
    """
    try:
        data = json.loads((lab.dir / BASELINE_FILE).read_text())
    except FileNotFoundError:
        raise SubstrateError(
            f"lab {lab.name} has no baseline: it was not deployed from a scenario (harness lab up --scenario FILE)"
        ) from None
    return {k: DeviceState.model_validate(v) for k, v in data.items()}


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

    Returns:
        The files rewritten or removed, as ``node:/etc/frr/NAME``.
    """
    fixed: list[str] = []
    for node in lab.node_names():
        live = _etc_frr(lab, node)
        base = live.with_name(FRR_FILES_BASELINE)
        if not base.is_dir():
            continue
        want = {f.name: f.read_bytes() for f in base.iterdir() if f.is_file()}
        have = {f.name for f in live.iterdir()} if live.is_dir() else set()
        for name in sorted(have - set(want)):
            path = live / name
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            fixed.append(f"{node}:/etc/frr/{name}")
        for name, data in sorted(want.items()):
            path = live / name
            if not path.is_file() or path.is_symlink() or path.read_bytes() != data:
                if path.is_symlink() or path.is_dir():
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                path.write_bytes(data)
                shutil.chown(path, "frr", "frr")
                fixed.append(f"{node}:/etc/frr/{name}")
    return fixed


class ResetReport(BaseModel):
    """What :func:`reset` did."""

    seconds: float
    restored: list[RestoreReport] = Field(default_factory=list, description="Nodes that needed changes.")
    repaired_links: list[str] = Field(default_factory=list)
    restarted_daemons: list[str] = Field(default_factory=list)
    frr_files_restored: list[str] = Field(
        default_factory=list, description="/etc/frr files put back to the baseline copy (e.g. after `write memory`).")
    killed_processes: list[str] = Field(
        default_factory=list, description="Processes left running in a node (by an agent), killed: `node:pid:command`.")
    residual: dict[str, list[str]] = Field(default_factory=dict, description="Differences left (empty = exact).")
    stages: dict[str, float] = Field(default_factory=dict, description="Seconds per stage (revive, capture+restore, repair, converge).")

    @property
    def exact(self) -> bool:
        return not self.residual


def repair_links(lab: Lab, states: dict[str, DeviceState]) -> list[str]:
    """Re-create veth pairs of the topology whose end is missing in some node (deleted by an
    agent or a fault). Returns the links re-created, as ``a:if--b:if``."""
    from substrate.backends.netns import ip_batch

    repaired = []
    for lk in lab.topology.links:
        a, b = lk.a, lk.b
        if a.interface in states[a.node].links and b.interface in states[b.node].links:
            continue
        for ep in (a, b):  # delete the surviving end, then re-create the pair
            if ep.interface in states[ep.node].links:
                lab.exec(ep.node, ["ip", "link", "del", ep.interface])
        r = ip_batch([f"link add name {a.interface} netns {lab.state(a.node).netns} type veth "
                      f"peer name {b.interface} netns {lab.state(b.node).netns}"])
        if r.ok:
            repaired.append(f"{a}--{b}")
    return repaired


def reset(lab: Lab, *, converge_timeout_s: float = 60.0) -> ResetReport:
    """Put ``lab`` back to its scenario baseline (see module docstring).

    Raises:
        SubstrateError: the lab has no baseline, or a node is dead (redeploy).
    """
    from substrate.faults import clear_all, restart_daemons
    from substrate.netconf import stop_server as stop_netconf

    t0 = time.monotonic()
    stages: dict[str, float] = {}

    def lap(name: str, since: list[float] = [t0]) -> None:  # noqa: B006 - closure state
        now = time.monotonic()
        stages[name] = now - since[0]
        since[0] = now

    baseline = load_baseline(lab)
    clear_all(lab)
    # the routers' NETCONF server keeps session state (candidates, locks, pending confirmed
    # commits whose timers would roll a device back in a later run): a reset ends it; the next
    # use starts a fresh one
    stop_netconf(lab)
    restarted = []

    killed: list[str] = []

    def revive(node: str) -> tuple[list[str], list[str]]:
        lines = lab.sh(node, _REVIVE.format(daemons=" ".join(lab.state(node).daemons)), timeout_s=5).stdout.splitlines()
        dead = [ln[2:] for ln in lines if ln.startswith("D ")]
        strays = [f"{node}:{ln[2:]}" for ln in lines if ln.startswith("K ")]
        started = restart_daemons(lab, node, dead, load_config=False) if dead else []  # after zebra: all of them
        return [f"{node}:{d}" for d in started], strays

    for found, strays in lab.map(revive, lab.node_names()):
        restarted += found
        killed += strays
    lap("revive")

    def check_and_restore(node: str) -> tuple[DeviceState, RestoreReport]:
        # pipelined: a node is restored as soon as its own capture shows a difference, while
        # the other nodes are still being captured
        cur = capture(lab, node, frr="fast")
        return cur, restore(lab, baseline[node], cur)

    results = dict(zip(lab.node_names(), lab.map(check_and_restore, lab.node_names()), strict=True))
    lap("capture+restore")
    repaired = repair_links(lab, {n: cur for n, (cur, _) in results.items()})
    if repaired:
        again = sorted({ep.split(":")[0] for lk in repaired for ep in lk.split("--")})
        results.update(zip(again, lab.map(check_and_restore, again), strict=True))
        lap("repair")
    reports = [rep for _, rep in results.values() if rep.changed]
    frr_files = restore_frr_files(lab)  # last: restoring FRR may write frr.conf (frr-reload, restart)
    lab.wait_converged(timeout_s=converge_timeout_s)
    lap("converge")
    residual = {r.node: r.residual for r in reports if r.residual}
    # transactions an ANI server left unfinished (it died): every device is at the baseline now
    # and the processes it left in the nodes were killed above, so they are closed, not replayed
    close_unfinished(lab, "lab reset: every device put back to its baseline")
    _new_epoch(lab)
    return ResetReport(seconds=time.monotonic() - t0, restored=reports, repaired_links=repaired,
                       restarted_daemons=restarted, killed_processes=killed, frr_files_restored=frr_files,
                       residual=residual, stages=stages)
