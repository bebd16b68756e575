"""Real-lab tests of the netns substrate: isolation, exec, SRv6 uSID forwarding, lifecycle, errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from substrate import Lab, Topology, cleanup, confine
from substrate import addressing as a
from substrate.errors import (
    BringUpError,
    EnvironmentProblem,
    LabExistsError,
    LabNotFoundError,
    NodeNotFoundError,
    SubstrateError,
)
from substrate.paths import LABS_DIR, NETNS_PREFIX
from tests.conftest import REPO, reachable, unique_name

pytestmark = pytest.mark.lab
HARNESS = [sys.executable, "-m", "harness.cli.__main__"]


def lab_netns(name: str) -> list[str]:
    """Network namespaces of lab ``name`` that exist right now."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{NETNS_PREFIX}{name}-")]


def lab_processes(name: str) -> list[int]:
    pids: list[int] = []
    for ns in lab_netns(name):
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        pids += [int(p) for p in out.split()]
    return pids


def assert_gone(name: str) -> None:
    assert lab_netns(name) == []
    assert not (LABS_DIR / name).exists()
    assert name not in confine.lab_cgroups()  # the nodes' cgroups
    assert f"{LABS_DIR / name}/" not in Path("/proc/self/mountinfo").read_text()  # the nodes' etc-frr tmpfs


# -- isolation -------------------------------------------------------------------------------


def test_node_has_own_hostname_pid1_and_frr_dirs(line3: Lab) -> None:
    for node in ("r1", "r2"):
        r = line3.sh(node, "hostname; cat /etc/hostname; cat /proc/1/comm; grep ^hostname /etc/frr/frr.conf; ls /run/frr")
        lines = r.stdout.split()
        assert lines[:3] == [node, node, "sleep"], r.stdout
        assert f"hostname {node}" in r.stdout and "zebra.pid" in r.stdout
    # two routers see different /etc/frr: each has its own
    assert line3.exec("r1", ["cat", "/etc/frr/frr.conf"]).stdout != line3.exec("r2", ["cat", "/etc/frr/frr.conf"]).stdout


def test_node_cannot_see_host_processes_or_directories(line3: Lab, tmp_path: Path) -> None:
    marker = Path("/tmp") / f"anibench-marker-{os.getpid()}"
    marker.write_text("secret")
    try:
        r = line3.sh("r1", f"ps -eo comm; ls -A /root; ls /work /run/anibench {marker} {tmp_path} 2>&1; cat /etc/shadow | wc -c")
    finally:
        marker.unlink()
    comms = set(r.stdout.split())
    assert "python" not in comms and "pytest" not in comms and "sleep" in comms
    assert "No such file" in r.stdout
    assert "secret" not in r.stdout
    assert r.stdout.strip().endswith("0")  # /etc/shadow masked
    # host PIDs are not visible: the node's /proc holds only its own few processes
    n = line3.sh("r1", "ls -d /proc/[0-9]* | wc -l").stdout.strip()
    assert int(n) < 15
    # the lab's runtime directory (where run files live) is not reachable by any path
    assert (line3.dir / "lab.json").exists()
    assert line3.exec("r1", ["test", "-e", str(line3.dir / "lab.json")]).returncode == 1


def test_confined_exec_cannot_mount_or_load_modules(line3: Lab) -> None:
    r = line3.sh("r1", "mount -t tmpfs x /tmp", confined=True)
    assert r.returncode != 0 and "permission denied" in r.stderr.lower()
    r = line3.sh("r1", "grep ^CapBnd /proc/self/status", confined=True)
    bnd = int(r.stdout.split()[1], 16)
    assert not bnd & (1 << 21)  # CAP_SYS_ADMIN
    assert not bnd & (1 << 16)  # CAP_SYS_MODULE
    assert bnd & (1 << 12)  # CAP_NET_ADMIN kept: the node's network stays configurable
    r = line3.sh("r1", "ip link add sr9 type bridge && ip link del sr9", confined=True)
    assert r.ok, r.stderr
    # /proc/sys outside net is read-only even for root
    assert not line3.sh("r1", "echo 1 > /proc/sys/kernel/sysrq").ok


def test_node_sees_only_its_own_interfaces(line3: Lab) -> None:
    r = line3.exec("r2", ["ip", "-j", "link"])
    names = sorted(link["ifname"] for link in json.loads(r.stdout))
    assert names == ["eth1", "eth2", "lo", "sr0"]
    assert line3.exec("h1", ["ip", "-6", "route", "show", "default"]).stdout.startswith("default via fd00:1:1::1")


# -- exec ------------------------------------------------------------------------------------


def test_exec_captures_exit_code_and_streams(line3: Lab) -> None:
    r = line3.sh("r1", "echo out; echo err >&2; exit 3")
    assert (r.returncode, r.stdout, r.stderr, r.ok) == (3, "out\n", "err\n", False)
    r = line3.exec("r1", ["cat"], input="piped")
    assert r.stdout == "piped"


def test_exec_timeout_kills_the_command(line3: Lab) -> None:
    t0 = time.monotonic()
    r = line3.exec("r1", ["sleep", "30"], timeout_s=0.5)
    assert r.timed_out and r.returncode == 124
    assert time.monotonic() - t0 < 5
    assert "sleep 30" not in line3.exec("r1", ["ps", "-eo", "args"]).stdout


def test_exec_output_is_bounded(line3: Lab) -> None:
    r = line3.exec("r1", ["head", "-c", "5000000", "/dev/zero"], max_output=1000)
    assert r.truncated and len(r.stdout) < 1200 and "truncated" in r.stdout


def test_exec_unknown_node_lists_nodes(line3: Lab) -> None:
    with pytest.raises(NodeNotFoundError, match=r"no node 'r9'; nodes: r1, r2, r3, h1, h3"):
        line3.exec("r9", ["true"])


def test_vtysh_and_attach_from_another_process(line3: Lab) -> None:
    r = line3.vtysh("r2", "show isis neighbor")
    assert r.ok and r.stdout.count(" Up ") == 2
    code = (
        "from substrate import Lab; lab = Lab.attach(%r); "
        "print(lab.vtysh('r1', 'show running-config').stdout)" % line3.name
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "router isis CORE" in out.stdout and "hostname r1" in out.stdout
    with pytest.raises(LabNotFoundError, match="no lab named 'nope'"):
        Lab.attach("nope")


# -- underlay and SRv6 -------------------------------------------------------------------------


def test_underlay_isis_and_locators(grid3: Lab) -> None:
    for rt in grid3.routers():
        assert grid3.missing_underlay_prefixes(rt) == set()
    r = grid3.vtysh("r5", "show isis neighbor json")
    assert r.ok
    assert grid3.vtysh("r5", "show isis neighbor").stdout.count(" Up ") == 4
    # each router's locator is installed as End with the NEXT-C-SID flavor (RFC 9800)
    route = json.loads(grid3.exec("r5", ["ip", "-6", "-j", "route", "show", str(a.locator(5))]).stdout)
    end = [x for x in route if x.get("encap") == "seg6local"]
    assert end and end[0]["action"] == "End" and end[0]["flavors"] == ["next-csid"]
    assert (end[0]["lblen"], end[0]["nflen"]) == (32, 16)


#: FRR 8.4's `show isis neighbor json` for two adjacencies on 15-character interfaces (the text
#: table runs `ethernetlong001` and the level column together) and one passive circuit.
ISIS_NEIGHBOR_JSON_SAMPLE = """{"areas":[{"area":"CORE","circuits":[
 {"circuit":0,"adj":"globalconne2","interface":"ethernetlong001","level":2,"state":"Up","expires-in":"3s","snpa":"2020.2020.2020"},
 {"circuit":0,"adj":"globalconne3","interface":"ethernetlong002","level":2,"state":"Initializing","expires-in":"2s"},
 {"circuit":0}]}]}"""


@pytest.mark.parametrize("text", [ISIS_NEIGHBOR_JSON_SAMPLE])
def test_isis_neighbors_are_read_from_structured_output(text: str) -> None:
    from substrate.frr import IsisAdjacency, parse_isis_neighbors

    assert parse_isis_neighbors(text) == [IsisAdjacency("globalconne2", "ethernetlong001", 2, "Up"),
                                          IsisAdjacency("globalconne3", "ethernetlong002", 2, "Initializing")]
    assert parse_isis_neighbors("") == []
    with pytest.raises(ValueError):
        parse_isis_neighbors("% Unknown command: show isis neighbor json")


def test_longest_names_the_validator_accepts_deploy_and_converge(tmp_path: Path) -> None:
    """Issue 17 (6): nodes of 12 characters (the node-name limit) and interfaces of 15 (Linux's
    limit) passed validation, then `lab up` failed: the adjacency columns of FRR's text table ran
    together. The lab must converge and the observer must see each adjacency Up."""
    from substrate.scenario.model import Invariant
    from substrate.scenario.observer import observe

    node, ifa, ifb = "globalconne", "ethernetlong001", "ethernetlong002"
    assert len(f"{node}1") == 12 and len(ifa) == 15
    spec = tmp_path / "long.yaml"
    spec.write_text(f"""name: longnames
nodes:
  {node}1: {{role: PE}}
  {node}2: {{role: P}}
  {node}3: {{role: PE}}
  customerhst1: {{role: host}}
links:
  - [{node}1:{ifa}, {node}2:{ifa}]
  - [{node}2:{ifb}, {node}3:{ifa}]
  - [customerhst1:{ifa}, {node}1:{ifb}]
""")
    topo = Topology.from_yaml(spec)
    with Lab.create(topo, unique_name("t-long"), converge_timeout_s=60) as lab:
        assert all(lab.missing_adjacencies(rt) == set() for rt in lab.routers())
        invs = [Invariant(id=f"isis/{n}/{i}", kind="isis_adjacency", service="underlay",
                          params={"node": n, "interface": i, "neighbor": peer})
                for n, i, peer in [(f"{node}1", ifa, f"{node}2"), (f"{node}2", ifa, f"{node}1"), (f"{node}2", ifb, f"{node}3"),
                                   (f"{node}3", ifa, f"{node}2")]]
        verdicts = observe(lab, invs)
        assert [v.detail for v in verdicts if not v.ok] == []
        assert "Up" in verdicts[0].evidence[0].output
        # and a broken adjacency is seen as such (the check can fail)
        lab.check([lab.exec(f"{node}3", ["ip", "link", "set", ifa, "down"])])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and lab.missing_adjacencies(f"{node}2") != {ifb}:
            time.sleep(0.2)
        assert lab.missing_adjacencies(f"{node}2") == {ifb}
        assert [v.ok for v in observe(lab, invs)] == [True, True, False, False]


def _packets(lab: Lab, node: str, prefix: str) -> int:
    out = json.loads(lab.exec(node, ["ip", "-6", "-s", "-j", "route", "show", prefix]).stdout)
    return sum(x["stats64"]["packets"] for x in out if x.get("encap") == "seg6local")


def test_usid_segment_list_steers_packets_through_chosen_router(grid3: Lab) -> None:
    """h1 -> h3 along r1 => r5 => r3: r5 is not on a shortest path (r1-r2-r3 is), so only the
    segment list can take packets there. r5's End counter proves the path; r7's stays put."""
    dt6 = a.function_sid(3, 0xE000)
    h3 = "fd00:1:3::2"
    h3_net = str(a.base_host_prefix(3, 0))
    segs = a.usid_segment_list([5], 3, 0xE000)
    assert [str(s) for s in segs] == ["fcbb:bb00:5:3:e000::"]
    grid3.check([grid3.exec("r3", ["ip", "-6", "route", "add", str(dt6), "encap", "seg6local", "action", "End.DT6",
                                   "table", "main", "count", "dev", "sr0"])])
    try:
        # control: plain IS-IS forwarding reaches h3 without touching r5's SID
        before = _packets(grid3, "r5", str(a.locator(5)))
        assert grid3.exec("h1", ["ping", "-6", "-c", "3", "-i", "0.2", "-W", "1", h3]).ok
        assert _packets(grid3, "r5", str(a.locator(5))) == before
        grid3.check([grid3.exec("r1", ["ip", "-6", "route", "add", h3_net, "encap", "seg6", "mode", "encap.red",
                                       "segs", ",".join(map(str, segs)), "dev", "eth1", "metric", "1"])])
        r5_0, r7_0, dt_0 = (_packets(grid3, "r5", str(a.locator(5))), _packets(grid3, "r7", str(a.locator(7))),
                            _packets(grid3, "r3", str(dt6)))
        ping = grid3.exec("h1", ["ping", "-6", "-c", "10", "-i", "0.05", "-W", "1", h3])
        assert ping.ok, ping.stdout
        assert _packets(grid3, "r5", str(a.locator(5))) - r5_0 == 10
        assert _packets(grid3, "r3", str(dt6)) - dt_0 == 10
        assert _packets(grid3, "r7", str(a.locator(7))) == r7_0
    finally:
        grid3.exec("r1", ["ip", "-6", "route", "del", h3_net, "metric", "1"])
        grid3.exec("r3", ["ip", "-6", "route", "del", str(dt6)])


def test_two_labs_side_by_side(line3: Lab, grid3: Lab) -> None:
    assert line3.alive() and grid3.alive()
    # same interface and node names in both, no clash; each lab's r1 has its own neighbours
    assert "eth1" in line3.exec("r1", ["ip", "link"]).stdout and "eth1" in grid3.exec("r1", ["ip", "link"]).stdout
    assert line3.vtysh("r1", "show isis neighbor").stdout.count(" Up ") == 1
    assert grid3.vtysh("r1", "show isis neighbor").stdout.count(" Up ") == 2


# -- lifecycle and bad input -------------------------------------------------------------------


def test_duplicate_name_is_refused_and_existing_lab_untouched(line3: Lab) -> None:
    with pytest.raises(LabExistsError, match="already exists"):
        Lab.create(Topology.from_spec("line:2"), line3.name)
    assert line3.alive() and line3.exec("r1", ["true"]).ok
    assert not list(LABS_DIR.glob(f"{line3.name}.staging-*"))  # the refused creator's staging directory


def test_bad_lab_name_is_refused() -> None:
    with pytest.raises(SubstrateError, match="invalid lab name"):
        Lab.create(Topology.from_spec("line:2"), "Bad Name!")


def test_failed_bringup_leaves_nothing(monkeypatch) -> None:
    name = unique_name("t-fail")
    with pytest.raises(BringUpError, match=r"r1: FRR 8.4 refused 1 line\(s\) of its frr.conf: line \d+: % Unknown command: +bogus-command"):
        Lab.create(Topology.from_spec("line:2:nohosts"), name, frr_extra={"r1": ["router isis CORE\n bogus-command"]})
    assert_gone(name)


def test_not_root_and_missing_frr_are_reported_before_anything_is_made(monkeypatch, tmp_path) -> None:
    import substrate.features as f

    name = unique_name("t-env")
    monkeypatch.setattr(f.os, "geteuid", lambda: 1000)
    with pytest.raises(EnvironmentProblem, match="need root"):
        Lab.create(Topology.from_spec("line:2"), name)
    monkeypatch.undo()
    monkeypatch.setattr(f, "FRR_DAEMON_DIR", tmp_path)
    with pytest.raises(EnvironmentProblem, match=r"apt install frr"):
        Lab.create(Topology.from_spec("line:2"), name)
    assert_gone(name)


def test_sigterm_during_bringup_destroys_the_lab() -> None:
    name = unique_name("t-term")
    p = subprocess.Popen([*HARNESS, "lab", "up", "-t", "grid:3x3", "-n", name], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not lab_netns(name) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lab_netns(name), "bring-up never started"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode != 0, err
    assert_gone(name)
    assert lab_processes(name) == []


def test_cleanup_removes_a_lab_up_killed_during_bringup() -> None:
    """SIGKILL leaves no chance to clean up: the half-made lab is not yet detached, so it is a
    leftover of a dead owner, and cleanup removes it (it used to be kept as the user's)."""
    name = unique_name("t-kill")
    p = subprocess.Popen([*HARNESS, "lab", "up", "-t", "grid:3x3", "-n", name], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not lab_netns(name) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lab_netns(name), "bring-up never started"
    p.kill()
    p.wait(timeout=10)
    assert lab_netns(name)  # SIGKILL: the leftover is there
    rep = cleanup()
    assert name in rep.labs and name not in rep.kept
    assert_gone(name)
    assert lab_processes(name) == []


def test_a_lab_directory_being_staged_is_its_live_creators_and_a_dead_ones_is_removed(line3: Lab) -> None:
    """A Ray host runs a cleanup as each lab slot starts, beside the other slots' bring-ups; the lab
    directory used to exist empty for a moment (mkdir, then the record), and a cleanup in that
    moment took it for a leftover. It is now staged with its record and renamed: a cleanup keeps
    the staging directory of a live creator, removes a dead creator's, and never touches the lab
    of the same name that the dead one failed to create."""
    from substrate.lab import STAGING_SUFFIX

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    record = json.loads((LABS_DIR / line3.name / "lab.json").read_text())
    staged = {}
    for owner in (os.getpid(), int(dead)):
        d = LABS_DIR / f"{line3.name}{STAGING_SUFFIX}{owner}"
        d.mkdir()
        (d / "lab.json").write_text(json.dumps({**record, "owner_pid": owner, "owner_start": 0, "status": "creating"}))
        staged[owner] = d
    try:
        rep = cleanup(prefix=line3.name)
        assert staged[int(dead)].name in rep.labs and not staged[int(dead)].exists()
        assert staged[os.getpid()].is_dir() and staged[os.getpid()].name not in rep.labs
        assert line3.name not in rep.labs and line3.alive() and line3.exec("r1", ["true"]).ok
        assert [r.name for r in Lab.list()].count(line3.name) == 1  # a staging directory is not listed
    finally:
        for d in staged.values():
            shutil.rmtree(d, ignore_errors=True)
    assert not list(LABS_DIR.glob(f"*{STAGING_SUFFIX}*{os.getpid()}"))


def test_cleanup_removes_crashed_labs_only() -> None:
    keep = Lab.create(Topology.from_spec("line:2:nohosts"), unique_name("t-keep"), detached=True)
    crashed = unique_name("t-crash")
    code = (
        "import os; from substrate import Lab, Topology; "
        f"Lab.create(Topology.from_spec('line:2'), {crashed!r}); os._exit(0)"  # owner dies without cleanup
    )
    try:
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)
        assert lab_netns(crashed)
        pids = lab_processes(crashed)
        assert pids
        rep = cleanup()
        assert crashed in rep.labs and keep.name in rep.kept
        assert_gone(crashed)
        assert all(not Path(f"/proc/{p}").exists() or "Z" in Path(f"/proc/{p}/stat").read_text().split(")")[1][:3]
                   for p in pids)
        assert keep.alive() and keep.exec("r1", ["true"]).ok
    finally:
        keep.destroy()
    assert_gone(keep.name)


def test_ls_and_cleanup_tell_the_truth_about_a_lab_whose_owner_was_killed() -> None:
    """Issue 17 (Also): after `kill -9` of a campaign's harness during a run, `lab ls` still showed
    its lab `up` although its owner was dead, and `lab cleanup` said "0 process(es) killed" while
    it stopped every process of that lab."""
    name = unique_name("t-orph")
    code = (f"import time; from substrate import Lab, Topology; Lab.create(Topology.from_spec('line:2'), {name!r}); "
            "print('up', flush=True); time.sleep(600)")  # a campaign's lab: owned by its process, not detached
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)

    def listed() -> str:
        out = subprocess.run([*HARNESS, "lab", "ls"], capture_output=True, text=True, cwd=REPO, timeout=60,
                             env={**os.environ, "COLUMNS": "200"}).stdout
        return next((ln for ln in out.splitlines() if name in ln), "")

    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
        assert " up " in listed() and "orphaned" not in listed()
        p.kill()
        p.wait(timeout=10)
        assert "orphaned" in listed() and f"owner PID {p.pid}" in listed()
        namespaces, pids = lab_netns(name), lab_processes(name)
        assert namespaces and pids
        rep = cleanup()
        assert name in rep.labs and name not in rep.kept
        assert rep.processes >= len(pids) and rep.lab_namespaces >= len(namespaces)
        assert f"{rep.processes} process(es) killed" in rep.summary() and rep.processes > 0
        assert_gone(name)
        assert lab_processes(name) == []
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        if p.stdout is not None:
            p.stdout.close()
        if (LABS_DIR / name).exists():
            Lab.attach(name).destroy()


CYCLES = int(os.environ.get("ANIBENCH_LAB_CYCLES", "6"))  # set higher to hunt slower leaks


@pytest.mark.slow
def test_up_down_cycles_leak_nothing() -> None:
    """Every cycle (a lab up, a probe, down) leaves no namespace, process or directory behind;
    a leak would show after any single cycle, so a few cycles in CI and ANIBENCH_LAB_CYCLES=20
    (the original bound) to look for one that needs repetition."""
    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    before_ns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    for i in range(CYCLES):
        name = f"t-cycle{i}-{os.getpid() % 10000}"
        with Lab.create(Topology.from_spec("line:2"), name) as lab:
            assert reachable(lab, "h1", "fd00:1:2::2")
            pids = lab_processes(name)
            assert len(pids) == 4 * len(lab.routers()) + len(lab.node_names()) - len(lab.routers())  # inits, daemons
        assert_gone(name)
        assert not [p for p in pids if alive(p)]
    after_ns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    # only this test's own namespaces: other labs come and go on a shared machine meanwhile
    assert {n for n in after_ns - before_ns if n.startswith(f"{NETNS_PREFIX}t-cycle")} == set()


def test_cli_errors_are_one_line_and_nonzero() -> None:
    r = subprocess.run([*HARNESS, "lab", "up", "-t", "mesh:3", "-n", unique_name("t-cli")], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert re.fullmatch(r"error: unknown topology spec 'mesh:3'.*\n", r.stderr), r.stderr
    r = subprocess.run([*HARNESS, "lab", "exec", "nope", "r1", "--", "true"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: no lab named 'nope'")


def test_lab_up_says_which_default_topology_it_deploys() -> None:
    """Without --topology the 25-router default is shown in --help and said on stderr (a bad name
    stops it before anything is deployed)."""
    r = subprocess.run([*HARNESS, "lab", "up", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "default without --scenario: grid:5x5 (25 routers)" in " ".join(r.stdout.replace("│", " ").split())
    r = subprocess.run([*HARNESS, "lab", "up", "-n", "Bad Name!"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("note: no --topology or --scenario given: deploying the default "
                                                     "grid:5x5 (25 routers)\nerror: invalid lab name"), r.stderr
    r = subprocess.run([*HARNESS, "lab", "up", "-t", "line:2", "-n", "Bad Name!"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "note:" not in r.stderr and "default" not in r.stderr, r.stderr


def test_cleanup_keeps_a_running_lab_whose_record_it_cannot_read() -> None:
    """A record of another version (a field this model does not know) is not a leftover while its
    owner runs: another checkout's cleanup used to destroy such a live lab."""
    lab = Lab.create(Topology.from_spec("line:2:nohosts"), unique_name("t-skew"))
    try:
        rec = json.loads((lab.dir / "lab.json").read_text())
        rec["topology"]["nodes"][0]["field_of_a_newer_model"] = 1
        (lab.dir / "lab.json").write_text(json.dumps(rec))
        rep = cleanup()
        assert lab.name in rep.kept and lab.name not in rep.labs
        assert lab.exec("r1", ["true"]).ok and lab_netns(lab.name)
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        rec["owner_pid"] = int(dead.stdout)  # its owner gone: now a leftover
        (lab.dir / "lab.json").write_text(json.dumps(rec))
        rep = cleanup()
        assert lab.name in rep.labs
        assert not lab_netns(lab.name)
    finally:
        lab.destroy()


def test_cleanup_does_not_call_a_dead_kept_lab_running() -> None:
    """A detached lab with a dead node is kept (the user's until `lab down`), and the report says
    it is dead, not running."""
    lab = Lab.create(Topology.from_spec("line:2:nohosts"), unique_name("t-deadkeep"), detached=True)
    try:
        os.kill(lab.state("r2").init_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while lab.condition() == "up" and time.monotonic() < deadline:
            time.sleep(0.05)  # poll: the init is reaped within milliseconds
        rep = cleanup()
        assert lab.name in rep.kept and lab.name in rep.kept_dead
        running = rep.summary().split("kept running: ")[1].split(";")[0] if "kept running: " in rep.summary() else ""
        assert lab.name not in running.split(", ") and f"dead (detached: harness lab down NAME): " in rep.summary()
    finally:
        lab.destroy()
