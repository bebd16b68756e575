"""The Ray executor: a campaign's task variants spread over the nodes of a Ray cluster
(``harness campaign --executor ray``).

The unit of scheduling is one task variant (:func:`harness.campaign.run_variant`): its brownfield
is deployed on one worker node and every setting's paired run of that variant runs there, from
resets of that one lab. Each node runs at most ``labs_per_node`` variants at once, one per *lab
slot* (a Ray actor pinned to the node, ``num_cpus=0`` so that the slots, not Ray's CPU count,
bound the labs).

The driver (the process that runs ``harness campaign``) is the only writer of the SQLite store.
A slot streams each run back as it finishes (a Ray streaming generator): the driver copies the
run's files (trajectory, verdicts, agent output) into its own results directory, points the record
at them and stores it durably, then the next. A slot whose worker process or node dies mid-variant
loses only the runs it had not sent: they go back to *pending* (:meth:`CampaignStore.release`)
and the variant is queued again with just those runs; a stored run is never redone (the store
refuses to save a run key twice). Before each variant a slot removes the labs that dead owners
left on its host (:func:`substrate.cleanup.cleanup`, the safe ``harness lab cleanup``). Ctrl-C (or
SIGTERM) on the driver kills the slots, has every live node clean its leftovers, and puts the
unfinished runs back to pending: ``--resume`` continues the campaign, with either executor.

Before any lab is deployed every node is checked (what a lab's deploy checks first: root, FRR and
the other programs, the kernel features, the cgroup controllers -- the netns backend's
``check_environment`` --, and the same anibench source, Ray and Python versions as the driver); a
problem is one line naming the host and what is missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import queue
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.campaign import CampaignSpec, _failed, plan_campaign, run_spec, run_variant, settings_order
from harness.errors import AnibenchError
from harness.store import CampaignStore, RunRecord

__all__ = ["MAX_VARIANT_ATTEMPTS", "LoopbackCluster", "NodeReport", "host_problems", "lab_slots", "loopback_cluster",
           "run_campaign_ray", "source_digest", "why_lost"]

#: A variant whose slot is lost this many times (worker or node died, or the variant raised) has
#: its remaining runs stored as failed instead of being queued again.
MAX_VARIANT_ATTEMPTS = 3
#: Seconds a node may take to answer the pre-flight check, and a slot to start.
CHECK_TIMEOUT_S = 120.0
#: Seconds the driver waits, once the slots are killed, for every node to remove what they left
#: (a Ray worker to start on each node, the killed slots to be gone, their labs destroyed: on a
#: loaded host this exceeded CHECK_TIMEOUT_S once). A second Ctrl-C cuts the wait short.
STOP_TIMEOUT_S = 300.0
#: Names of the labs of lab slots start with this (then the worker's pid and the variant).
LAB_PREFIX = "ray-"
#: How often the driver, waiting for the slots' next event, looks whether a stop signal was
#: received whose exception Python could not raise (substrate.signals.raise_if_interrupted).
_EVENT_POLL_S = 0.5
#: A slot's temporary run directory is named this, then its worker's pid and a dash.
SLOT_DIR_PREFIX = "anibench-slot-"
#: The packages whose source must be identical on the driver and every worker.
_SOURCE_PACKAGES = ("harness", "servers", "substrate")


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise AnibenchError(f"--executor ray needs Ray on every host: pip install -e '.[ray]' ({e})") from None
    return ray


def source_digest() -> str:
    """A digest (12 hex digits) of anibench's source files (harness, servers, substrate: .py, .yaml,
    .yang, .sh, .json, .md), so that a worker running other code than the driver is refused."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for pkg in _SOURCE_PACKAGES:
        for p in sorted((root / pkg).rglob("*")):
            if p.is_file() and p.suffix in {".py", ".yaml", ".yang", ".sh", ".json", ".md"} and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class NodeReport:
    """What a node says about itself in the pre-flight check."""

    node_id: str
    address: str
    host: str
    cpus: int
    anibench: str
    ray: str
    python: str
    problem: str | None

    @property
    def label(self) -> str:
        """``HOST (ADDRESS, node ID6)``: names the host in errors and progress bars."""
        return f"{self.host} ({self.address}, node {self.node_id[:6]})"


def _host_report(node_id: str, address: str) -> NodeReport:
    import ray

    from substrate.backends import get_backend
    from substrate.errors import EnvironmentProblem

    try:  # what Lab.create checks before it deploys: root, programs, FRR, kernel features, cgroups
        get_backend("netns").check_environment()
        problem = None
    except EnvironmentProblem as e:
        problem = str(e)
    return NodeReport(node_id, address, socket.gethostname(), os.cpu_count() or 1, source_digest(), ray.__version__,
                      platform.python_version(), problem)


def host_problems(reports: list[NodeReport], driver: NodeReport) -> list[str]:
    """One line per host that cannot take part, naming the host and what is missing or differs.

    A node's own problem (not root, FRR missing) comes first; then the anibench source, Ray and
    Python versions, which must equal the driver's (``driver``) so that every run is the same
    experiment.
    """
    lines = []
    for r in reports:
        what = [r.problem] if r.problem else []
        for name, theirs, ours in (("anibench source", r.anibench, driver.anibench), ("Ray", r.ray, driver.ray),
                                   ("Python", r.python, driver.python)):
            if theirs != ours:
                what.append(f"{name} {theirs} differs from the driver's {ours}")
        if what:
            lines.append(f"host {r.label}: {'; '.join(what)}")
    return lines


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def why_lost(e: BaseException) -> str:
    """One line saying why a remote call failed: for an exception the remote code raised (a
    ``RayTaskError``), its own type and first line (``EnvironmentProblem: no cgroup ...``), not Ray's
    wrapper line (``ray::LabSlot.run_variant() (pid=..., actor_id=...)``); else the first line of
    Ray's error (``The actor died unexpectedly ...``). Terminal colour codes removed."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        e = cause
    first = next((ln.strip() for ln in _ANSI.sub("", str(e)).splitlines() if ln.strip()), "")
    name = type(e).__name__
    return f"{name}: {first}" if first and not first.startswith(name) else (first or name)


def _is_ray_worker(pid: int) -> bool:
    """``pid`` is a Ray worker process (its command line starts ``ray::``, as Ray names them)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::")
    except OSError:
        return False


def _clean_host(dead: tuple[int, ...] = (), bound_s: float = 60.0) -> str:
    """Remove what dead lab slots left on this host: the labs named ``ray-*`` whose owner is gone
    (:func:`substrate.cleanup.cleanup` with that prefix; no other lab of the host is looked at) and
    the temporary run directories (``anibench-slot-PID-*``) of slots whose process is gone.

    Args:
        dead: processes of this host just killed (``ray.kill`` returns before they are gone): waited
            for, up to ``bound_s`` seconds, so that their labs count as left by a dead owner; a Ray
            worker among them still running after half of that is sent SIGKILL.
    """

    from substrate.cleanup import cleanup
    from substrate.record import pid_alive

    start = time.monotonic()
    killed = False
    while (alive := [p for p in dead if pid_alive(p)]) and time.monotonic() < start + bound_s:
        if not killed and time.monotonic() > start + bound_s / 2:  # ray.kill did not end it: the host does
            killed = True
            for p in alive:
                if _is_ray_worker(p):
                    with contextlib.suppress(OSError):
                        os.kill(p, signal.SIGKILL)
        time.sleep(0.1)
    for d in Path(tempfile.gettempdir()).glob(f"{SLOT_DIR_PREFIX}*-*"):  # run files of a slot killed mid-run
        owner = d.name[len(SLOT_DIR_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            shutil.rmtree(d, ignore_errors=True)
    return cleanup(prefix=LAB_PREFIX).summary()


class LabSlot:
    """One lab slot on one node (a Ray actor): runs one variant at a time, streaming its runs."""

    def ready(self) -> int:
        """The worker process id (the slot is up)."""
        return os.getpid()

    def run_variant(self, spec_json: str, v: int, todo: list[tuple[str, str]]) -> Iterator[dict[str, Any]]:
        """Yield ``{"key"}`` before each run and ``{"key", "record", "run_dir", "files"}`` after it
        (``files``: path relative to the run directory -> bytes); the run directory is removed once read."""
        _clean_host()
        spec = CampaignSpec.model_validate_json(spec_json)
        lab_name = f"{LAB_PREFIX}{os.getpid() % 100000}-v{v}"[:24]
        settings = dict((k, s) for s, k in todo)
        with tempfile.TemporaryDirectory(prefix=f"{SLOT_DIR_PREFIX}{os.getpid()}-") as tmp_dir:
            yield from self._runs(spec, v, todo, settings, Path(tmp_dir).resolve(), lab_name)

    @staticmethod
    def _runs(spec: CampaignSpec, v: int, todo: list[tuple[str, str]], settings: dict[str, str], tmp: Path,
              lab_name: str) -> Iterator[dict[str, Any]]:
        for k, rec in run_variant(spec, v, todo, tmp, lab_name):
            if rec is None:
                yield {"key": k}
                continue
            run_dir = run_spec(spec, k, settings[k], v, tmp).run_dir.resolve()
            files = {str(p.relative_to(run_dir)): p.read_bytes()
                     for p in sorted(run_dir.rglob("*")) if p.is_file() and not p.is_symlink()} if run_dir.is_dir() else {}
            shutil.rmtree(run_dir, ignore_errors=True)
            yield {"key": k, "record": rec.model_dump_json(), "run_dir": str(run_dir), "files": files}


def _store_files(rec: RunRecord, worker_dir: str, files: dict[str, bytes], target: Path) -> RunRecord:
    """Write a run's files under ``target`` and return the record with its paths pointing there."""
    target = target.resolve()
    for rel, data in files.items():
        p = (target / rel).resolve()
        if target not in p.parents:  # a worker sends paths relative to its run directory only
            raise AnibenchError(f"run {rec.run_key}: a worker sent a file outside its run directory: {rel!r}")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    target.mkdir(parents=True, exist_ok=True)
    moved = {name: str(target) + value[len(worker_dir):] for name, value in rec.model_dump().items()
             if isinstance(value, str) and (value == worker_dir or value.startswith(worker_dir + "/"))}
    return rec.model_copy(update=moved)


@dataclass
class _Slot:
    node: NodeReport
    index: int
    actor: Any = None
    pid: int | None = None  # of the slot's worker process, on its node


@dataclass
class _State:
    todo: dict[int, dict[str, str]] = field(default_factory=dict)  # variant -> {run key: setting} not yet stored
    attempts: dict[int, int] = field(default_factory=dict)
    done: list[RunRecord] = field(default_factory=list)


#: The HTTP/2 client connection preface and an empty SETTINGS frame (RFC 9113 sections 3.4, 6.5).
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _speaks_http2(host: str, port: int, timeout_s: float = 5.0) -> bool:
    """Whether ``host:port`` answers the HTTP/2 client preface with a SETTINGS frame (RFC 9113
    section 3.4), as every gRPC server -- a Ray head's GCS -- does; a closed port raises OSError.
    Something else listening (or nothing answering within ``timeout_s``) is False."""
    with socket.create_connection((host, port), timeout=timeout_s) as c:
        c.sendall(_HTTP2_PREFACE)
        head = b""
        try:
            while len(head) < 9 and (chunk := c.recv(9 - len(head))):
                head += chunk
        except OSError:  # timeout, reset: not a gRPC server
            return False
    return len(head) == 9 and head[3] == 0x04


def check_address(address: str) -> None:
    """Refuse a ``--ray-address`` nobody can join, before Ray is imported or anything is built.

    ``address`` is ``auto`` (not checked here: Ray finds the local head) or ``HOST:PORT`` of the
    head's GCS. The check is one TCP connection that sends the HTTP/2 preface (RFC 9113 section
    3.4), bounded by ``_speaks_http2``'s timeout, so a wrong address costs seconds, not the
    import of Ray and a scenario build first.

    Raises:
        AnibenchError: not ``auto`` nor ``HOST:PORT``; nothing listens there (connection refused,
            unresolvable name, port out of range); something listens that is not a gRPC server.
    """
    if address == "auto":
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise AnibenchError(f"--ray-address {address!r}: give auto or HOST:PORT (the head's GCS port, 6379 by default)")
    try:
        speaks_grpc = _speaks_http2(host.strip("[]"), int(port))
    except (OSError, OverflowError, ValueError) as e:
        raise AnibenchError(f"Ray cluster at {address} unreachable ({getattr(e, 'strerror', None) or e}): "
                            "start it with ray start --head on that host, or give its address") from None
    if not speaks_grpc:  # Ray would wait minutes for a GCS there
        raise AnibenchError(f"--ray-address {address}: something listens there, but not a Ray head (its GCS "
                            "speaks gRPC; the port is 6379 unless ray start --head was given --port)")


def _connect(address: str) -> Any:
    check_address(address)
    ray = _ray()
    try:
        ray.init(address=address, namespace="anibench", logging_level=logging.ERROR, log_to_driver=False,
                 configure_logging=False)
    except Exception as e:  # noqa: BLE001 -- Ray raises ConnectionError, RuntimeError (version mismatch), ...
        # the whole message on one line: Ray's version mismatch puts the versions on the lines after
        # its first ("Version mismatch: The cluster was started with:")
        said = " ".join(_ANSI.sub("", str(e)).split()) or type(e).__name__
        raise AnibenchError(f"this host ({socket.gethostname()}) cannot join the Ray cluster at {address}: "
                            f"{said[:600]}") from None
    return ray


def _check_nodes(ray: Any) -> list[NodeReport]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    report = ray.remote(num_cpus=0, max_retries=0)(_host_report)
    refs = {n["NodeID"]: report.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(n["NodeID"], n["NodeManagerAddress"]) for n in nodes}
    reports, lines = [], []
    for n in nodes:
        try:
            reports.append(ray.get(refs[n["NodeID"]], timeout=CHECK_TIMEOUT_S))
        except Exception as e:  # noqa: BLE001 -- a node that cannot run the check is a problem of that host
            lines.append(f"host {n['NodeManagerAddress']} (node {n['NodeID'][:6]}): the check did not run ({why_lost(e)})")
    driver = NodeReport("driver", "", socket.gethostname(), 0, source_digest(), ray.__version__, platform.python_version(), None)
    lines += host_problems(reports, driver)
    if lines:
        raise AnibenchError("; ".join(lines))
    if not reports:
        raise AnibenchError("the Ray cluster has no live node")
    return reports


def run_campaign_ray(
    spec: CampaignSpec,
    store: CampaignStore,
    *,
    results_dir: Path,
    address: str = "auto",
    labs_per_node: int | None = None,
    resume: bool = False,
    on_run: Callable[[str, RunRecord | None, str], None] | None = None,
    on_nodes: Callable[[list[tuple[str, int]]], None] | None = None,
    on_cleanup: Callable[[str, str], None] | None = None,
) -> list[RunRecord]:
    """Run every pending run of ``spec`` on the nodes of a Ray cluster; returns the records stored now.

    Args:
        address: the cluster (``auto``: the one started on this host; or the head's ``HOST:PORT``).
        labs_per_node: variants (labs) a node runs at once; None: its CPU count // 2, at least 1
            (on 2 cores, 1: see README "Many machines" for what was measured).
        on_run: called with (run key, None, node label) when a run starts and (run key, record,
            node label) once it is stored.
        on_nodes: called once, before any lab is deployed, with (node label, lab slots) of every node.
        on_cleanup: called once per node after a stop signal, with (node label, what its host
            removed, or that it did not answer and ``harness lab cleanup`` there removes the rest).

    Raises:
        AnibenchError: before any lab is deployed, for an unreachable cluster, a node without root
            or FRR, or another anibench source, Ray or Python version (one line naming each host);
            after, if every node was lost (the unfinished runs are left pending for ``--resume``).
        KeyboardInterrupt / substrate.signals.Terminated: after killing the slots and cleaning up
            every live node; the unfinished runs are pending again, ``--resume`` continues.
    """
    from substrate.signals import terminate_gracefully

    ray = _connect(address)
    try:
        reports = _check_nodes(ray)
        with terminate_gracefully():
            return _drive(ray, spec, store, results_dir, reports, labs_per_node, resume, on_run, on_nodes, on_cleanup)
    finally:
        ray.shutdown()


def lab_slots(reports: list[NodeReport], labs_per_node: int | None, variants: int) -> list[tuple[NodeReport, int]]:
    """The lab slots to start: (node, slot index), up to ``labs_per_node`` per node (None: its CPU
    count // 2, at least 1), but never more slots in all than there are ``variants`` to run (each
    slot is a Ray worker process: an idle one only costs memory, and the progress bar would count
    labs that never run). Taken across the nodes first (every node's slot 0, then slot 1, ...), so
    that two variants on two nodes run one per node."""
    per_node = [labs_per_node or max(1, r.cpus // 2) for r in reports]
    every = [(r, i) for i in range(max(per_node, default=0)) for r, n in zip(reports, per_node, strict=True) if i < n]
    return every[:max(0, variants)]


def _drive(ray: Any, spec: CampaignSpec, store: CampaignStore, results_dir: Path, reports: list[NodeReport],
           labs_per_node: int | None, resume: bool, on_run: Callable[[str, RunRecord | None, str], None] | None,
           on_nodes: Callable[[list[tuple[str, int]]], None] | None,
           on_cleanup: Callable[[str, str], None] | None = None) -> list[RunRecord]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from substrate.signals import raise_if_interrupted

    keys, pending = plan_campaign(spec, store, resume=resume)
    st = _State()
    work: queue.Queue[tuple[int, list[tuple[str, str]]] | None] = queue.Queue()
    for v in range(spec.variants):
        todo = [(s, keys[(s, v)]) for s in settings_order(spec, v) if keys[(s, v)] in pending]
        if todo:
            st.todo[v] = {k: s for s, k in todo}
            work.put((v, todo))
    slots = [_Slot(r, i) for r, i in lab_slots(reports, labs_per_node, len(st.todo))]
    if on_nodes:
        on_nodes([(r.label, sum(1 for s in slots if s.node is r)) for r in reports])
    events: queue.Queue[tuple[Any, ...]] = queue.Queue()
    spec_json = spec.model_dump_json()
    stopping = threading.Event()
    actor_cls = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(LabSlot)

    def start(slot: _Slot) -> bool:
        try:
            slot.actor = actor_cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(slot.node.node_id, soft=False)).remote()
            slot.pid = ray.get(slot.actor.ready.remote(), timeout=CHECK_TIMEOUT_S)
            return True
        except Exception:  # noqa: BLE001 -- the node is gone (or cannot start a worker): this slot ends
            slot.actor = None
            return False

    def serve(slot: _Slot) -> None:
        while not stopping.is_set():
            if slot.actor is None and not start(slot):
                events.put(("gone", slot))
                return
            item = work.get()
            if item is None or stopping.is_set():
                return
            v, todo = item
            try:
                for ref in slot.actor.run_variant.remote(spec_json, v, todo):
                    events.put(("item", slot, v, ray.get(ref)))
                events.put(("end", slot, v, None))
            except Exception as e:  # noqa: BLE001 -- worker or node died, or the variant raised: re-queued
                events.put(("lost", slot, v, why_lost(e)))
                try:
                    ray.kill(slot.actor)
                except Exception:  # noqa: BLE001,S110 -- already dead
                    pass
                slot.actor = None

    threads = [threading.Thread(target=serve, args=(s,), daemon=True, name=f"slot-{s.node.node_id[:6]}-{s.index}")
               for s in slots]
    for t in threads:
        t.start()
    alive = len(slots)
    try:
        while st.todo:
            if alive == 0:
                left = sum(len(t) for t in st.todo.values())
                raise AnibenchError(f"every Ray node was lost; {left} run(s) left pending: resume with --resume")
            raise_if_interrupted()  # a Ctrl-C Python swallowed (raised in a callback) stops here
            try:
                kind, slot, *rest = events.get(timeout=_EVENT_POLL_S)
            except queue.Empty:
                continue
            if kind == "gone":
                alive -= 1
            elif kind == "item":
                _take(store, results_dir, spec, st, slot, *rest, on_run)
            elif kind == "end" and st.todo.get(rest[0]):  # cannot happen unless a run went unreported
                _requeue(store, spec, st, work, slot, rest[0], "the variant ended without reporting every run", on_run)
            elif kind == "lost":
                _requeue(store, spec, st, work, slot, *rest, on_run)
    except BaseException:
        stopping.set()
        store.release([k for t in st.todo.values() for k in t])  # first: a second Ctrl-C may cut _stop short
        _stop(ray, slots, on_cleanup)
        raise
    # every run is stored, but a slot may still be destroying its lab (after its last run): let each
    # variant end before the slots are killed, then have the hosts remove whatever is left
    stopping.set()
    for _ in threads:
        work.put(None)
    deadline = time.monotonic() + CHECK_TIMEOUT_S
    try:
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:  # Ctrl-C while the last labs are destroyed: every run is stored, the hosts still clean up
        _stop(ray, slots)
    return st.done


def _take(store: CampaignStore, results_dir: Path, spec: CampaignSpec, st: _State, slot: _Slot, v: int,
          item: dict[str, Any], on_run: Callable[[str, RunRecord | None, str], None] | None) -> None:
    k = item["key"]
    if "record" not in item:
        store.mark_running(k)
    else:
        rec = RunRecord.model_validate_json(item["record"])
        target = run_spec(spec, k, st.todo[v][k], v, results_dir).run_dir
        rec = _store_files(rec, item["run_dir"], item["files"], target)
        store.save_result(rec)
        st.done.append(rec)
        del st.todo[v][k]
        if not st.todo[v]:
            del st.todo[v]
    if on_run:
        on_run(k, rec if "record" in item else None, slot.node.label)


def _requeue(store: CampaignStore, spec: CampaignSpec, st: _State, work: queue.Queue, slot: _Slot, v: int,
             why: str, on_run: Callable[[str, RunRecord | None, str], None] | None = None) -> None:
    left = st.todo.get(v)
    if not left:
        return
    store.release(list(left))
    st.attempts[v] = st.attempts.get(v, 0) + 1
    if st.attempts[v] < MAX_VARIANT_ATTEMPTS:
        work.put((v, [(s, k) for k, s in left.items()]))
        return
    for k, s in list(left.items()):
        store.mark_running(k)
        rec = _failed(spec, k, s, v, f"variant lost {st.attempts[v]} times (last on {slot.node.label}): {why}")
        store.save_result(rec)
        st.done.append(rec)
        if on_run:  # counted and shown like any other finished run
            on_run(k, rec, slot.node.label)
    del st.todo[v]


def _stop(ray: Any, slots: list[_Slot], on_cleanup: Callable[[str, str], None] | None = None) -> None:
    """Kill every slot, then have every node that had one remove what they left (labs, namespaces),
    waiting up to ``STOP_TIMEOUT_S`` for them all.

    Args:
        on_cleanup: called once per node with (node label, what its host removed, or why it did
            not answer: then ``harness lab cleanup`` on that host removes the rest).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    for s in slots:
        if s.actor is not None:
            try:
                ray.kill(s.actor)
            except Exception:  # noqa: BLE001,S110 -- already dead
                pass
    clean = ray.remote(num_cpus=0, max_retries=0)(_clean_host)
    nodes = {s.node.node_id: s.node for s in slots}
    refs = {node_id: clean.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
            .remote(tuple(s.pid for s in slots if s.node.node_id == node_id and s.pid), STOP_TIMEOUT_S - 30.0)
            for node_id in nodes}
    t0 = time.monotonic()
    deadline = t0 + STOP_TIMEOUT_S
    for node_id, ref in refs.items():
        try:
            line = f"{ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))} in {time.monotonic() - t0:.1f} s"
        except Exception as e:  # noqa: BLE001 -- a node that is gone cleans up with harness lab cleanup
            line = (f"did not clean up in {time.monotonic() - t0:.1f} s ({why_lost(e)}): "
                    f"run harness lab cleanup on {nodes[node_id].host}")
        if on_cleanup:
            on_cleanup(nodes[node_id].label, line)


@dataclass
class LoopbackCluster:
    """A Ray cluster of this host only, in a network namespace of its own (see :func:`loopback_cluster`)."""

    netns: str
    address: str
    ray_bin: Path

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the cluster's namespace (where its 127.0.0.1 is): e.g. a driver."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", *argv]

    def add_node(self, cpus: int = 1, object_store_mb: int = 100) -> None:
        """Start one more Ray node (raylet and its workers) on this host, joined to the head.

        Raises:
            AnibenchError: ``ray start`` failed; Ray gives a raylet a fixed 30 s to register, which a
                very loaded host may not meet.
        """
        self._start(["start", f"--address={self.address}", *self._common(cpus, object_store_mb)])

    @staticmethod
    def _common(cpus: int, object_store_mb: int) -> list[str]:
        return ["--node-ip-address=127.0.0.1", f"--object-store-memory={object_store_mb * 1_000_000}",
                f"--num-cpus={cpus}", "--disable-usage-stats"]

    def _start(self, args: list[str], env: dict[str, str] | None = None) -> None:
        import subprocess

        r = subprocess.run(self.command([str(self.ray_bin), *args]), capture_output=True, text=True, timeout=300,
                           env=env or self._env)
        if r.returncode != 0:
            tail = " ".join((r.stderr or r.stdout).split())[-400:]
            raise AnibenchError(f"ray {args[0]} {args[1]} failed in namespace {self.netns}: {tail}")

    _env: dict[str, str] = field(default_factory=dict)


def _netns_pids(ns: str) -> list[int]:
    import subprocess

    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


@contextmanager
def loopback_cluster(nodes: int = 2, *, cpus: int = 1, object_store_mb: int = 100,
                     temp_dir: Path | None = None) -> Iterator[LoopbackCluster]:
    """A Ray cluster on this host for tests and benchmarks: ``nodes`` nodes (a head and ``nodes - 1``
    more), each its own raylet, in a new network namespace (``rayloop-XXXXXX``) that has only a
    loopback interface. Every Ray port is on 127.0.0.1 of that namespace, so nothing outside it can
    reach the cluster and it reaches no other Ray cluster; no dashboard; ``object_store_mb`` of
    shared memory per node. Labs deployed by its workers are ordinary labs of this host.

    On exit every process of the namespace is ended (SIGTERM, then SIGKILL, each with a bounded
    wait) and the namespace removed: no Ray process outlives the block (``ray stop`` is never used: it
    would stop every Ray process of the host).

    Raises:
        AnibenchError: ``ray start`` failed (its last words).
    """
    import signal
    import subprocess
    import sys
    import time
    import uuid

    ns = f"rayloop-{uuid.uuid4().hex[:6]}"  # not anibench-*: harness lab cleanup leaves it alone
    tmp = Path(temp_dir or tempfile.mkdtemp(prefix="anibench-ray-"))
    env = {**os.environ, "RAY_TMPDIR": str(tmp), "RAY_USAGE_STATS_ENABLED": "0"}
    cluster = LoopbackCluster(ns, "127.0.0.1:6379", Path(sys.executable).parent / "ray", env)
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, capture_output=True)
        cluster._start(["start", "--head", "--port=6379", "--include-dashboard=false", f"--temp-dir={tmp}",
                        *cluster._common(cpus, object_store_mb)])
        for _ in range(nodes - 1):
            cluster.add_node(cpus, object_store_mb)
        yield cluster
    finally:
        # the gcs_server outlives a SIGTERM by more than 30 s (measured on this 2-core host: the whole
        # bound, every time, so the tests' and the bench's teardown took 30 s): the cluster and its
        # temporary directory are thrown away, so a short grace for the others, then SIGKILL
        for sig, bound_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
            for pid in _netns_pids(ns):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + bound_s
            while _netns_pids(ns) and time.monotonic() < deadline:
                time.sleep(0.2)
            if not _netns_pids(ns):
                break
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        if temp_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
