"""The Ray executor (harness/cluster.py) on a real Ray cluster on this machine.

The cluster (one node with two lab slots: two worker processes, each deploying its own variant's
lab; a second raylet on the same host would add start-up time and test nothing more) lives in a network
namespace of its own that has only a loopback interface, so every Ray port is on 127.0.0.1 of that
namespace and no other Ray cluster (nor anything outside) is reachable from it or can reach it; the
fixture ends every process of that namespace, then removes it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.campaign import make_spec, run_campaign
from harness.cluster import LAB_PREFIX, SLOT_DIR_PREFIX, LoopbackCluster, loopback_cluster
from harness.store import CampaignStore, RunStatus
from substrate.cleanup import cleanup
from substrate.paths import LABS_DIR
from tests.conftest import REPO

pytest.importorskip("ray")
MANIFEST = REPO / "tests" / "data" / "small-campaign.yaml"
VENV_BIN = Path(sys.executable).parent


def _wait(cond, bound_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _ns_pids(ns: str) -> list[int]:
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory) -> Iterator[LoopbackCluster]:
    with loopback_cluster(1, cpus=2, temp_dir=tmp_path_factory.mktemp("ray")) as cluster:
        listening = subprocess.run(cluster.command(["ss", "-ltnH"]), capture_output=True, text=True).stdout.split("\n")
        local = [line.split()[3] for line in listening if line.strip()]
        assert local and all(a.rsplit(":", 1)[0] in ("127.0.0.1", "[::ffff:127.0.0.1]") for a in local), local
        yield cluster
    assert not _ns_pids(cluster.netns), "a Ray process outlived the cluster"
    cleanup(prefix=LAB_PREFIX)  # what a failed test left (labs of dead slots only)


def _status(db: Path) -> list[tuple[str, str]]:
    try:
        with sqlite3.connect(db) as c:
            return list(c.execute("select run_key, status from runs"))
    except sqlite3.OperationalError:
        return []


def _attempts(db: Path) -> dict[str, tuple[int, str]]:
    try:
        with sqlite3.connect(db) as c:
            return {k: (a, s) for k, a, s in c.execute("select run_key, attempts, status from runs")}
    except sqlite3.OperationalError:
        return {}


def _kill_a_worker_mid_variant(db: Path, cluster: LoopbackCluster) -> tuple[int, int]:
    """When a variant has one run stored and the next running, SIGKILL the worker process that owns
    its lab; returns (variant, killed pid)."""
    found: list[tuple[int, int]] = []

    def mid_variant() -> bool:
        rows = _status(db)
        by_v: dict[int, set[str]] = {}
        for key, status in rows:
            by_v.setdefault(int(key.rsplit("/", 1)[1]), set()).add(status)
        for v, statuses in by_v.items():
            if {"done", "running"} <= statuses:
                for d in LABS_DIR.glob(f"ray-*-v{v}"):
                    try:
                        owner = json.loads((d / "lab.json").read_text())["owner_pid"]
                    except (OSError, ValueError, KeyError):
                        continue
                    if owner in _ns_pids(cluster.netns):
                        found.append((v, owner))
                        return True
        return False

    _wait(mid_variant, 300, "a variant with one run stored and the next running")
    v, pid = found[0]
    os.kill(pid, signal.SIGKILL)
    return v, pid


@pytest.mark.lab
def test_ray_campaign_matches_local_and_survives_a_killed_worker(ray_cluster, tmp_path) -> None:
    """Two variants of A0 vs A1 on two lab slots at once; one worker killed mid-variant, then
    Ctrl-C on the driver while the killed run is redone, then --resume: the campaign ends with
    exactly the four planned runs, each stored once, with the same outcomes as the local
    executor's runs of the same seeds, and its run files in the driver's directory."""
    spec = make_spec(ani=["A0", "A1"], agent=["scripted"], model=[None], task="onboarding", variants=2,
                     manifest=str(MANIFEST), seed=7, density=1, fault_rate=0.0, budget_steps=40, wall_cap_s=120,
                     agent_options={}, campaign_id="local")
    with CampaignStore(tmp_path / "local.sqlite") as store:
        local = {(r.setting, r.variant): r for r in run_campaign(spec, store, results_dir=tmp_path / "local-runs")}

    db = tmp_path / "ray.sqlite"
    argv = [str(VENV_BIN / "harness"), "campaign", "--ani", "A0,A1", "--task", "onboarding", "--variants", "2",
            "--manifest", str(MANIFEST), "--density", "1", "--seed", "7", "--wall-cap", "120", "--db", str(db),
            "--results", str(tmp_path / "runs"), "--id", "onray", "--no-report", "--executor", "ray",
            "--ray-address", ray_cluster.address, "--labs-per-node", "2"]
    p = subprocess.Popen(ray_cluster.command(argv), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        v, pid = _kill_a_worker_mid_variant(db, ray_cluster)
        redone = f"onray/A1/{v}" if dict(_status(db)).get(f"onray/A0/{v}") == "done" else f"onray/A0/{v}"
        # the killed worker's unfinished run is taken again (a second attempt); then Ctrl-C on the driver
        _wait(lambda: _attempts(db).get(redone) == (2, "running"), 300, f"{redone} to run again")
        # the killed worker's lab was removed by its host before the variant was taken again
        assert not (LABS_DIR / f"{LAB_PREFIX}{pid % 100000}-v{v}").exists()
        assert not list(Path(tempfile.gettempdir()).glob(f"{SLOT_DIR_PREFIX}{pid}-*")), "the killed slot's run files"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130 and "resume with the same options and --resume" in " ".join(err.split()), err[-3000:]
    # stopped by the hosts themselves, each saying what it removed (or that it did not answer)
    assert not list(LABS_DIR.glob("ray-*")), ("Ctrl-C left a lab of the cluster", err[-3000:])
    assert "removed " in err and "did not clean up" not in err, err[-3000:]
    print(next(line for line in err.splitlines() if "removed " in line))  # how long the hosts took (pytest -s)
    assert all(status in ("done", "pending") for _, status in _status(db))
    p = subprocess.Popen(ray_cluster.command([*argv, "--resume"]), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    # a campaign that ends leaves nothing on its hosts: each slot destroyed its last lab before it was stopped
    assert not list(LABS_DIR.glob("ray-*")) and not list(Path(tempfile.gettempdir()).glob(f"{SLOT_DIR_PREFIX}*")), \
        list(LABS_DIR.glob("ray-*"))
    assert "anibench-ray-" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    with CampaignStore(db) as store:
        rows = store.rows("onray")
        assert len(rows) == 4 and all(row.status == "done" for row in rows), rows
        # killed, interrupted, done: the run of the killed worker took three attempts; none stored twice
        assert {row.run_key: row.attempts for row in rows}[redone] == 3, rows
        recs = store.runs("onray")
    assert sorted(r.run_key for r in recs) == sorted({r.run_key for r in recs})
    for r in recs:
        ref = local[(r.setting, r.variant)]
        assert r.status is RunStatus.done
        assert (r.scenario_seed, r.fault_seed) == (ref.scenario_seed, ref.fault_seed)
        assert (r.outcome_label, r.test_cases_passed, r.test_cases_total, r.violated_invariants, r.steps) == \
               (ref.outcome_label, ref.test_cases_passed, ref.test_cases_total, ref.violated_invariants, ref.steps)
        run_dir = tmp_path / "runs" / "onray" / r.setting / f"v{r.variant}"
        assert r.trajectory_path == str((run_dir / "trajectory.jsonl").resolve())
        assert json.loads((run_dir / "verdicts.json").read_text()) and (run_dir / "agent.json").is_file()
    assert f"anibench-{LAB_PREFIX}{pid % 100000}-v{v}-" not in subprocess.run(["ip", "netns", "list"],
                                                                             capture_output=True, text=True).stdout
    r = subprocess.run([str(VENV_BIN / "harness"), "report", "onray", "--db", str(db)], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "A1" in r.stdout, r.stderr[-2000:]


def test_an_unreachable_cluster_is_one_line_before_anything(tmp_path) -> None:
    argv = [str(VENV_BIN / "harness"), "campaign", "--task", "onboarding", "--manifest", str(MANIFEST), "--variants",
            "1", "--db", str(tmp_path / "d.sqlite"), "--executor", "ray", "--ray-address", "127.0.0.1:1"]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("error:") == 1 and "Ray cluster at 127.0.0.1:1 unreachable" in r.stderr, r.stderr
    with CampaignStore(tmp_path / "d.sqlite") as store:
        assert store.campaigns() == []  # nothing planned, no lab deployed


def test_a_host_without_frr_or_with_other_code_is_named_in_one_line() -> None:
    from harness.cluster import NodeReport, host_problems, source_digest

    driver = NodeReport("driver", "", "drv", 2, source_digest(), "2.60.0", "3.11.2", None)
    ok = dataclasses.replace(driver, node_id="a" * 40, address="10.0.0.1", host="w1")
    no_frr = dataclasses.replace(ok, node_id="b" * 40, host="w2", problem="missing programs: vtysh (apt install frr)")
    other = dataclasses.replace(ok, node_id="c" * 40, host="w3", anibench="0123456789ab", ray="2.59.0")
    assert host_problems([ok], driver) == []
    lines = host_problems([ok, no_frr, other], driver)
    assert lines == [
        "host w2 (10.0.0.1, node bbbbbb): missing programs: vtysh (apt install frr)",
        f"host w3 (10.0.0.1, node cccccc): anibench source 0123456789ab differs from the driver's {driver.anibench}; "
        "Ray 2.59.0 differs from the driver's 2.60.0",
    ]


def test_a_port_where_no_ray_head_listens_is_one_line_at_once(tmp_path) -> None:
    """Something listens at the address but it is not a Ray head (a silent server, an HTTP/1
    server): one line at once, instead of Ray waiting minutes for a GCS there."""
    import socket
    import threading

    servers, accepted = [], []
    for reply in (b"", b"HTTP/1.0 400 Bad request\r\n\r\n"):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        servers.append(s)

        def serve(s=s, reply=reply) -> None:  # noqa: ANN001
            while True:
                try:
                    c, _ = s.accept()
                except OSError:
                    return
                accepted.append(c)
                if reply:
                    c.recv(100)
                    c.sendall(reply)

        threading.Thread(target=serve, daemon=True).start()
    try:
        for s in servers:
            address = f"127.0.0.1:{s.getsockname()[1]}"
            argv = [str(VENV_BIN / "harness"), "campaign", "--task", "onboarding", "--manifest", str(MANIFEST),
                    "--variants", "1", "--db", str(tmp_path / "d.sqlite"), "--executor", "ray", "--ray-address", address]
            r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
            assert r.returncode == 1, r.stderr
            assert r.stderr.count("error:") == 1 and f"{address}: something listens there, but not a Ray head" in \
                   " ".join(r.stderr.split()), r.stderr
    finally:
        for s in [*servers, *accepted]:
            s.close()
    r = subprocess.run([*argv[:-1], "127.0.0.1:99999"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Ray cluster at 127.0.0.1:99999 unreachable" in r.stderr, r.stderr


def test_lab_slots_never_outnumber_the_variants() -> None:
    """--labs-per-node 500 for a campaign of 2 variants on 2 nodes starts 2 worker processes in all,
    one per node (it started 2 per node: 4 workers, '2 lab(s)' shown per node, for 2 labs)."""
    from harness.cluster import NodeReport, lab_slots

    a = NodeReport("a" * 40, "10.0.0.1", "w1", 8, "x", "2", "3", None)
    b = dataclasses.replace(a, node_id="b" * 40, cpus=1)
    name = lambda slots: [(r.host if r is a else "b", i) for r, i in slots]  # noqa: E731
    assert name(lab_slots([a, b], 500, 2)) == [("w1", 0), ("b", 0)]
    assert name(lab_slots([a, b], 500, 3)) == [("w1", 0), ("b", 0), ("w1", 1)]
    assert name(lab_slots([a, b], None, 9)) == [("w1", 0), ("b", 0), ("w1", 1), ("w1", 2), ("w1", 3)]
    assert lab_slots([a, b], 3, 0) == [] and lab_slots([], 3, 5) == []


def test_a_dead_slots_run_files_are_removed_by_its_host(tmp_path) -> None:
    """A slot killed mid-run leaves its temporary run directory; the host's next clean-up removes it
    (and leaves a live slot's alone)."""
    import tempfile

    from harness.cluster import SLOT_DIR_PREFIX, _clean_host

    p = subprocess.Popen(["true"])
    p.wait()
    dead = Path(tempfile.mkdtemp(prefix=f"{SLOT_DIR_PREFIX}{p.pid}-"))
    (dead / "onray" / "A0" / "v0").mkdir(parents=True)
    (dead / "onray" / "A0" / "v0" / "trajectory.jsonl").write_text("{}\n")
    live = Path(tempfile.mkdtemp(prefix=f"{SLOT_DIR_PREFIX}{os.getpid()}-"))
    try:
        _clean_host()
        assert not dead.exists() and live.is_dir()
    finally:
        import shutil

        shutil.rmtree(dead, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)


def test_why_a_variant_was_lost_names_the_remote_error_not_rays_wrapper() -> None:
    """A variant that raised on its worker is reported by the error it raised (its type and first
    line), not by Ray's wrapper line (``ray::LabSlot.run_variant() (pid=..., actor_id=...)``, with
    terminal colour codes), which said nothing of the cause."""
    from ray.exceptions import ActorDiedError, RayTaskError

    from harness.cluster import why_lost
    from substrate.errors import EnvironmentProblem

    cause = EnvironmentProblem("no cgroup with the pids and memory controllers\nsecond line")
    e = RayTaskError("LabSlot.run_variant", "Traceback ...", cause, proctitle="\x1b[36mray::LabSlot.run_variant()\x1b[39m",
                     pid=4242, ip="10.0.0.1").as_instanceof_cause()
    assert "ray::LabSlot" in str(e).splitlines()[0]  # what was stored before
    assert why_lost(e) == "EnvironmentProblem: no cgroup with the pids and memory controllers"
    assert why_lost(ActorDiedError()).startswith("ActorDiedError: The actor died")
    assert why_lost(TimeoutError()) == "TimeoutError"


def _host_problem(prefix: list[str], env: dict[str, str] | None = None) -> str | None:
    code = "from harness.cluster import _host_report; print(_host_report('n' * 40, '10.0.0.1').problem)"
    r = subprocess.run([*prefix, sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return None if r.stdout.strip() == "None" else r.stdout.strip()


def test_a_host_check_finds_what_a_lab_deploy_would_refuse(monkeypatch) -> None:
    """The pre-flight check of a node runs what a lab's deploy checks first, in that node's own
    environment: not root, FRR missing from its PATH, its cgroup controllers not mounted (as under
    ``ip netns exec``, which remounts /sys) each give the node's problem, where a deploy would have
    failed -- every variant three times -- after the check had passed."""
    from harness.cluster import _host_report

    from substrate.dataplane import select

    problem = _host_report("n" * 40, "10.0.0.1").problem
    if select().dataplane:
        assert problem is None
    else:  # a kernel no SRv6 data plane can serve (issue 34): the check says so, as a deploy would
        assert "data plane: NONE usable" in (problem or ""), problem
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    assert "labs need root" in (_host_problem(nobody) or "")
    no_cgroups = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                  "umount -R /sys/fs/cgroup 2>/dev/null || umount -l /sys/fs/cgroup; exec \"$0\" \"$@\""]
    assert "no cgroup with the pids and memory controllers" in (_host_problem(no_cgroups) or "")
    bin_dir = Path(tempfile.mkdtemp(prefix="anibench-test-path-"))
    try:
        for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
            for p in Path(d).iterdir():
                if p.name != "vtysh" and not (bin_dir / p.name).exists():
                    (bin_dir / p.name).symlink_to(p)
        monkeypatch.setenv("PATH", str(bin_dir))
        assert "vtysh (apt install frr)" in (_host_report("n" * 40, "10.0.0.1").problem or "")
    finally:
        import shutil

        shutil.rmtree(bin_dir)


def test_runs_of_a_variant_lost_too_often_are_stored_failed_and_reported(tmp_path) -> None:
    """After MAX_VARIANT_ATTEMPTS losses a variant's remaining runs are stored as failed, and each
    goes through on_run like any other finished run (the progress bar and the run's summary line):
    before, they were stored silently and the campaign ended showing 0/N runs, exit 0."""
    import queue

    from harness.cluster import MAX_VARIANT_ATTEMPTS, NodeReport, _requeue, _Slot, _State
    from harness.campaign import plan_campaign

    spec = make_spec(ani=["A0", "A1"], agent=["scripted"], model=[None], task="onboarding", variants=1,
                     manifest=str(MANIFEST), seed=7, density=1, fault_rate=0.0, budget_steps=40, wall_cap_s=120,
                     agent_options={}, campaign_id="lost")
    slot = _Slot(NodeReport("a" * 40, "10.0.0.1", "w1", 2, "x", "2", "3", None), 0)
    seen: list[tuple[str, str | None, str]] = []
    with CampaignStore(tmp_path / "s.sqlite") as store:
        keys, _ = plan_campaign(spec, store, resume=False)
        st, work = _State(todo={0: {keys[("A0", 0)]: "A0", keys[("A1", 0)]: "A1"}}), queue.Queue()
        for attempt in range(1, MAX_VARIANT_ATTEMPTS + 1):
            _requeue(store, spec, st, work, slot, 0, "ActorDiedError: the worker died",
                     lambda k, rec, node: seen.append((k, rec and rec.error, node)))
            assert work.qsize() == min(attempt, MAX_VARIANT_ATTEMPTS - 1)
        assert not st.todo and sorted(k for k, _, _ in seen) == sorted(keys.values())
        assert all(f"variant lost {MAX_VARIANT_ATTEMPTS} times (last on w1 (10.0.0.1, node aaaaaa)): ActorDiedError: "
                   "the worker died" == why and node == slot.node.label for _, why, node in seen), seen
        assert [r.status for r in store.rows("lost")] == ["failed", "failed"]


_METADATA = """
import json, sys
import ray._common.usage.usage_constants as uc
from ray._private import ray_constants
from ray._raylet import GcsClient
g = GcsClient(address=sys.argv[1])
m = json.loads(g.internal_kv_get(uc.CLUSTER_METADATA_KEY, namespace=ray_constants.KV_NAMESPACE_CLUSTER))
print(m["python_version"])
if len(sys.argv) > 2:
    m["python_version"] = sys.argv[2]
    g.internal_kv_put(uc.CLUSTER_METADATA_KEY, json.dumps(m).encode(), overwrite=True,
                      namespace=ray_constants.KV_NAMESPACE_CLUSTER)
"""


@pytest.mark.lab
def test_a_cluster_of_another_python_is_one_line_with_both_versions(ray_cluster, tmp_path) -> None:
    """The head records the Ray and Python versions it was started with (its GCS cluster metadata);
    a driver of other versions is refused by Ray in a message whose versions are on its 2nd-6th
    lines: the one line says them all (it said 'Version mismatch: The cluster was started with:')."""
    meta = [sys.executable, "-c", _METADATA, ray_cluster.address]
    ours = subprocess.run(ray_cluster.command(meta), capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    subprocess.run(ray_cluster.command([*meta, "3.0.1"]), capture_output=True, text=True, timeout=60, check=True)
    try:
        argv = [str(VENV_BIN / "harness"), "campaign", "--task", "onboarding", "--manifest", str(MANIFEST), "--variants",
                "1", "--db", str(tmp_path / "d.sqlite"), "--executor", "ray", "--ray-address", ray_cluster.address]
        r = subprocess.run(ray_cluster.command(argv), cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(ray_cluster.command([*meta, ours]), capture_output=True, text=True, timeout=60, check=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("error:"))
    assert f"cannot join the Ray cluster at {ray_cluster.address}: Version mismatch" in line, r.stderr
    assert "Python: 3.0.1" in line and f"Python: {ours}" in line, r.stderr
    with CampaignStore(tmp_path / "d.sqlite") as store:
        assert store.campaigns() == []
