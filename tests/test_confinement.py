"""Node confinement (issue 17, items 1-3): an agent's shell in one node cannot act on other nodes'
namespaces, sees no host file but the allowlisted ones (whatever the host does later), and
cannot exhaust the host: per-node cgroup limits, size-limited tmpfs, nothing outlives its call.

The attacks run the way the issue's adversarial agent ran them: through the A0 server (its
confined shell) with an MCP client."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from servers.a0_shell.server import build_server
from servers.common import ServerConfig
from substrate import Lab, Topology, confine, frr
from substrate.errors import EnvironmentProblem
from substrate.scenario import Scenario, build, load_manifest
from substrate.scenario.deploy import deploy_scenario
from substrate.scenario.observer import observe
from tests.conftest import REPO, reachable, unique_name
from tests.servers_support import connect, data

SMALL = REPO / "tests" / "data" / "small-brownfield.yaml"
ATTACK = REPO / "tests" / "data" / "netlink_escape.py"


def a0(lab: Lab, devices: list[str] | str = "all"):  # noqa: ANN201
    return build_server(ServerConfig(lab=lab.name, devices=devices), lab=lab)  # type: ignore[arg-type]


def links(lab: Lab) -> dict[str, str]:
    """Every node's interfaces as the host sees them (name, index, peer, state)."""
    return {n: lab.host_exec(["ip", "-n", lab.state(n).netns, "-br", "link"]).stdout for n in lab.node_names()}


@pytest.fixture(scope="module")
def line3() -> Iterator[Lab]:
    with Lab.create(Topology.from_spec("line:3"), unique_name("t-conf")) as lab:
        yield lab


# -- 1. no way into another node's namespaces ---------------------------------------------------


@pytest.mark.lab
@pytest.mark.anyio
async def test_raw_netlink_cannot_reach_neighbour_namespaces(line3: Lab) -> None:
    """By namespace id (list, create, delete, bind to) and by moving an interface: all refused."""
    before = links(line3)
    command = f"python3 - <<'ANIBENCH_EOF'\n{ATTACK.read_text()}\nANIBENCH_EOF"
    async with connect(a0(line3, devices=["r2"])) as c:
        out = data(await c.call_tool("run_shell", {"device": "r2", "command": command, "timeout_s": 60}))
        list_id = data(await c.call_tool("run_shell", {"device": "r2", "command": "ip netns list-id"}))
    assert out["exit_status"] == 0, out["stderr"]
    report = json.loads(out["stdout"])
    # not vacuous: r2's veths give it an id for r1's and for r3's namespace, and every kind was tried
    assert len(report["nsids"]) == 2 and len(list_id["stdout"].splitlines()) == 2
    kinds = {a["attempt"] for a in report["attempts"]}
    assert kinds == {"list", "create-veth-in", "create-veth-tunnel", "create-on-peer", "delete-peer",
                     "delete-peer-by-name", "move-own-veth-end"}  # fmt: skip
    accepted = [a for a in report["attempts"] if a["errno"] == 0 or a["detail"]]
    assert not accepted, accepted
    assert links(line3) == before  # no interface appeared, moved or vanished anywhere
    assert reachable(line3, "h1", "fd00:1:3::2")


@pytest.mark.lab
def test_confined_commands_hold_no_host_capability(line3: Lab) -> None:
    """Root of its own user namespace only: no namespace administration, no resource overrides."""
    r = line3.sh("r1", "grep -E '^Cap(Bnd|Eff)' /proc/self/status; cat /proc/self/uid_map", confined=True)
    caps = [int(line.split()[1], 16) for line in r.stdout.splitlines()[:2]]
    assert all(not c & (1 << 21) and not c & (1 << 24) for c in caps)  # CAP_SYS_ADMIN, CAP_SYS_RESOURCE
    assert all(c & (1 << 12) for c in caps)  # CAP_NET_ADMIN (over the node's own network)
    own = Path(f"/proc/{line3.state('r1').init_pid}/ns/user").stat().st_ino
    assert own != Path("/proc/self/ns/user").stat().st_ino  # a user namespace of its own
    for cmd in ("ulimit -n 1048576", "unshare -U true", "unshare -n true", "mount -t tmpfs x /tmp",
                "ip netns add x", "echo 1 > /proc/sys/kernel/panic", "hostname other"):  # fmt: skip
        assert not line3.sh("r1", cmd, confined=True).ok, cmd
    assert line3.sh("r1", "ip link add t0 type bridge && ip link del t0", confined=True).ok


@pytest.mark.lab
def test_harness_commands_in_a_node_do_not_run_an_agents_startup_files(line3: Lab) -> None:
    """The harness's own commands run in the host's user namespace among files an agent wrote:
    an agent's Python startup file (a .pth in the user site of HOME) is not run by them."""
    site = "/root/.local/lib/python3.11/site-packages"
    planted = line3.sh("r1", f"mkdir -p {site} && echo 'import os; os.system(\"touch /run/ran\")' > {site}/zz.pth",
                       confined=True)  # fmt: skip
    assert planted.ok, planted.summary()
    try:
        r = line3.sh("r1", "python3 -c 'pass'; test -e /run/ran && echo RAN; echo HOME=$HOME; ip sr tunsrc show")
        assert "RAN" not in r.stdout and "HOME=/\n" in r.stdout and "tunsrc" in r.stdout, r.stdout
    finally:
        line3.sh("r1", "rm -rf /root/.local /run/ran")


@pytest.mark.lab
@pytest.mark.anyio
async def test_host_side_reads_of_a_nodes_sockets_and_pid_files_stay_in_that_node(line3: Lab, tmp_path: Path) -> None:
    """The harness reaches a node's vty sockets and PID files through /proc/PID/root: a symlink
    the node's agent puts there -- to another node's socket, to a host socket -- must not lead
    the harness's reads (reset, observer) or writes (A2) there, and a FIFO must not block it."""
    import socket

    from substrate.vty import VtyError

    host_sock = socket.socket(socket.AF_UNIX)
    host_sock.bind(str(tmp_path / "host.sock"))
    host_sock.listen(1)
    host_sock.setblocking(False)
    r2_isisd = f"/proc/{line3.state('r2').init_pid}/root/run/frr/isisd.vty"
    cmd = (f"cd /run/frr && mv isisd.vty isisd.vty.real && ln -s {r2_isisd} isisd.vty && "
           f"mv zebra.vty zebra.vty.real && ln -s {tmp_path / 'host.sock'} zebra.vty")  # fmt: skip
    try:
        assert line3.sh("r1", cmd, confined=True).ok
        for daemon in ("isisd", "zebra"):
            with pytest.raises(VtyError):
                line3.vty("r1", daemon, "show running-config")
        with pytest.raises(BlockingIOError):
            host_sock.accept()  # nobody came
        async with connect(a0(line3, devices=["r1"])) as c:
            with anyio.fail_after(120):  # the keep check read a FIFO as the daemon's PID file: blocked for ever
                out = data(await c.call_tool("run_shell", {"device": "r1", "command":
                    "kill $(cat /run/frr/staticd.pid); /usr/lib/frr/staticd -d -A 127.0.0.1 && "
                    "rm /run/frr/staticd.pid && mkfifo /run/frr/staticd.pid && echo started"}))  # fmt: skip
        assert out["stdout"] == "started\n" and [k.split()[0] for k in out["killed_leftovers"]] == ["staticd"], out
    finally:
        line3.sh("r1", "cd /run/frr && rm -f isisd.vty zebra.vty staticd.pid && mv isisd.vty.real isisd.vty && "
                       "mv zebra.vty.real zebra.vty")  # fmt: skip
        line3.start_daemon("r1", "staticd")
        host_sock.close()
    assert "hostname r1" in line3.vty("r1", "isisd", "show running-config")[0][0]


# -- 2. host files: deny by default --------------------------------------------------------------


@pytest.mark.lab
def test_host_files_never_reach_a_running_node(line3: Lab) -> None:
    """A file the host adds to /etc, or replaces by rename (as apt, useradd and passwd do), is not
    in any node: a node's /etc is the lab's copy of the allowlisted files."""
    scratch = Path(f"/etc/anibench-t17-{uuid.uuid4().hex[:8]}")
    try:
        scratch.write_text("SECRET-1\n")
        tmp = scratch.with_name(scratch.name + ".tmp")
        tmp.write_text("SECRET-2\n")
        os.replace(tmp, scratch)  # rename-replace while the lab is up
        for node in ("r1", "h1"):
            r = line3.sh(node, f"cat {scratch}; grep -rl SECRET- /etc; ls /etc", confined=True)
            assert "SECRET" not in r.stdout and r.stdout.strip(), r.stdout
            names = set(r.stdout.split())
            assert names <= {p.split("/")[0] for p in confine.ETC_ALLOWLIST} | {"hosts", "hostname", "frr"}
            assert {"passwd", "iproute2", "frr"} <= names and not names & {"shadow", "gshadow", "ssh", "sudoers"}
    finally:
        scratch.unlink(missing_ok=True)


@pytest.mark.lab
def test_proc_and_sys_entries_are_masked_or_read_only(line3: Lab) -> None:
    present = [p for p in confine.PROC_MASKED if line3.sh("r1", f"test -e /proc/{p}").ok]
    assert present  # the kernel has at least some of them (interrupts, keys, timer_list, ...)
    for p in present:  # a directory: empty and read-only; a file: the null device (reads nothing, writes go nowhere)
        r = line3.sh("r1", f"if [ -d /proc/{p} ]; then ls -A /proc/{p}; touch /proc/{p}/x; else stat -c %t:%T /proc/{p}; fi",
                     confined=True)  # fmt: skip
        assert r.stdout.strip() in ("", "1:3") and not (r.ok and r.stdout.strip() == ""), (p, r)
    for cmd in ("echo 1 > /proc/sys/vm/drop_caches", "echo 1 > /proc/sys/kernel/sysrq", "echo 1 > /proc/irq/default_smp_affinity"):
        assert not line3.sh("r1", cmd).ok, cmd  # even unconfined root of the node
    assert line3.sh("r1", "ls -A /sys/firmware").stdout == ""
    assert line3.sh("r1", "echo 0 > /proc/sys/net/ipv4/icmp_echo_ignore_all", confined=True).ok  # its own network
    assert not line3.sh("r1", "touch /x || touch /usr/x || touch /etc/x").ok  # the root is read-only


# -- 3. resource limits ---------------------------------------------------------------------------


@pytest.mark.lab
@pytest.mark.anyio
async def test_background_processes_do_not_outlive_the_call(line3: Lab) -> None:
    old = line3.daemon_pid("r3", "staticd")
    async with connect(a0(line3)) as c:
        out = data(await c.call_tool("run_shell", {"device": "r3", "command":
            "(setsid sleep 777 &); nohup sleep 778 >/dev/null 2>&1 & sleep 779 & disown; echo started"}))  # fmt: skip
        assert out["stdout"] == "started\n" and sorted(k.split()[0] for k in out["killed_leftovers"]) == ["sleep"] * 3
        left = data(await c.call_tool("run_shell", {"device": "r3", "command": "ps -eo comm | grep -c sleep"}))
        assert left["stdout"].strip() == "1"  # the node's init only ('sleep infinity')
        # a daemon of the node it restarts is the node's again, not a leftover
        out = data(await c.call_tool("run_shell", {"device": "r3", "command":
            "kill $(cat /run/frr/staticd.pid); /usr/lib/frr/staticd -d -A 127.0.0.1"}))  # fmt: skip
        assert out["exit_status"] == 0 and out["killed_leftovers"] == [], out
    new = line3.daemon_pid("r3", "staticd")
    assert new is not None and new != old


#: A library of /usr preloaded into a daemon: any code could be (gcc and /tmp are there).
PRELOAD = "LD_PRELOAD=$(ls /usr/lib/*-linux-gnu/libm.so.6 | head -1)"


@pytest.mark.lab
@pytest.mark.anyio
async def test_a_daemon_program_running_injected_code_does_not_outlive_the_call(line3: Lab) -> None:
    """An FRR daemon's program started with an agent's code in it (an LD_* variable, or an
    executable mapping outside /usr) is not the node's daemon: it is killed with the call, so no
    delayed change can ride on it into the observation or the next run."""
    async with connect(a0(line3, devices=["r3"])) as c:
        out = data(await c.call_tool("run_shell", {"device": "r3", "command":
            f"kill $(cat /run/frr/staticd.pid); {PRELOAD} /usr/lib/frr/staticd -d -A 127.0.0.1; echo started"}))  # fmt: skip
        assert out["stdout"] == "started\n" and [k.split()[0] for k in out["killed_leftovers"]] == ["staticd"], out
        left = data(await c.call_tool("run_shell", {"device": "r3", "command": "ps -eo comm | grep -c staticd"}))
        assert left["stdout"].strip() == "0"
    line3.start_daemon("r3", "staticd")  # put the node back for the other tests


def test_injected_code_is_told_from_a_daemons_own() -> None:
    own = ("55d0c0a00000-55d0c0a1b000 r-xp 00002000 fe:00 1 /usr/lib/frr/staticd\n"
           "7f00-7f01 r-xp 00000000 fe:00 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
           "7f02-7f03 rw-p 00000000 00:00 0 \n7f04-7f05 rw-s 00000000 00:2a 3 /var/tmp/frr/staticd.1/logbuf.2\n"
           "7ffc-7ffd r-xp 00000000 00:00 0 [vdso]\n")  # fmt: skip
    env = b"PATH=/usr/bin\0HOME=/root\0"
    assert frr.runs_only_installed_code(own, env)
    assert not frr.runs_only_installed_code(own, env + b"LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libm.so.6\0")
    assert not frr.runs_only_installed_code(own + "7f06-7f07 r-xp 00000000 00:2b 4 /tmp/evil.so\n", env)
    assert not frr.runs_only_installed_code(own + "7f08-7f09 rwxp 00000000 00:00 0 \n", env)  # anonymous code
    assert not frr.runs_only_installed_code(own + "7f0a-7f0b r-xp 00000000 00:01 5 /memfd:x (deleted)\n", env)


@pytest.fixture(scope="module")
def bf() -> Iterator[tuple[Lab, Scenario]]:
    sc = build(load_manifest(SMALL))
    lab = deploy_scenario(sc, unique_name("t-limits"))
    try:
        yield lab, sc
    finally:
        lab.destroy()


@pytest.mark.lab
@pytest.mark.anyio
async def test_fork_bomb_memory_hog_and_full_tmpfs_stay_in_their_node(bf: tuple[Lab, Scenario]) -> None:
    lab, sc = bf
    limits = confine.NodeLimits(**lab.record.node_limits)
    pe = sc.tenants[0].sites[0].pe
    count = "n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo $n"  # builtins only: no fork needed
    spin = "end=$((SECONDS+3)); while [ $SECONDS -lt $end ]; do :; done"
    async with connect(a0(lab, devices=[pe])) as c:

        async def sh(cmd: str, timeout_s: float = 60) -> dict:
            return data(await c.call_tool("run_shell", {"device": pe, "command": cmd, "timeout_s": timeout_s}))

        bomb = await sh(f"b(){{ b|b& }}; b; {spin}; {count}")
        assert limits.command_pids // 2 < int(bomb["stdout"]) <= limits.command_pids + 16  # up to its limit, not beyond
        assert len(bomb["killed_leftovers"]) > limits.command_pids // 2
        assert int((await sh(count))["stdout"]) < 16  # all gone with the call
        assert lab.vtysh(pe, "show isis neighbor").ok  # the node's daemons kept running meanwhile
        for mount, mib in (("/tmp", limits.tmp), ("/var/tmp", limits.var), ("/dev/shm", limits.shm),
                           ("/root", limits.home), ("/etc/frr", limits.etc_frr)):  # fmt: skip
            fill = await sh(f"head -c {mib + 50}M /dev/zero > {mount}/fill; echo rc=$?; du -m {mount}/fill; rm -f {mount}/fill")
            assert "rc=1" in fill["stdout"] and "No space left on device" in fill["stderr"], (mount, fill)
            assert int(fill["stdout"].split()[1]) <= mib, (mount, fill)
        hog = await sh("python3 -c 'b = bytearray(4 << 30)'; echo rc=$?")
        assert "rc=137" in hog["stdout"] or "MemoryError" in hog["stderr"], hog  # OOM-killed inside the node
    lab.wait_converged(timeout_s=60)
    failed = [v.id for v in observe(lab, sc.invariants) if not v.ok]
    assert failed == []


@pytest.mark.lab
def test_limits_are_configurable_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(confine.LIMITS_ENV, "pids=128,command_pids=64,memory=256m,tmp=8m")
    with Lab.create(Topology.from_spec("line:2"), unique_name("t-lim")) as lab:
        assert lab.record.node_limits["pids"] == 128 and lab.record.node_limits["tmp"] == 8
        dirs = [Path(d) for d in confine.lab_cgroups()[lab.name]]  # anibench/<lab> in each hierarchy
        values = {p.name: p.read_text().strip() for d in dirs for p in (d / "r1").iterdir()
                  if p.name in ("pids.max", "memory.limit_in_bytes", "memory.max")}  # fmt: skip
        assert values["pids.max"] == "128" and str(256 << 20) in values.values()
        assert lab.sh("r1", "df -m --output=size /tmp | tail -1").stdout.strip() == "8"
        # the node's init and FRR daemons count against its limits (a restarted daemon too)
        lab.kill_daemon("r1", "staticd")
        lab.start_daemon("r1", "staticd")
        inside = {Path(f"/proc/{p}/comm").read_text().strip() for p in confine.members(lab.state("r1").cgroups[0])}
        assert inside == {"sleep", *lab.state("r1").daemons}  # init is `sleep infinity`
    monkeypatch.setenv(confine.LIMITS_ENV, "pids=lots")
    with pytest.raises(EnvironmentProblem, match="ANIBENCH_NODE_LIMITS"):
        Lab.create(Topology.from_spec("line:2"), unique_name("t-lim"))


# -- pure parts -------------------------------------------------------------------------------------


def test_node_limits_spec() -> None:
    assert confine.node_limits("") == confine.NodeLimits()
    lim = confine.node_limits("pids=1024, memory=1g, tmp=128m, shm=2048k, etc-frr=4")
    assert (lim.pids, lim.memory, lim.tmp, lim.shm, lim.etc_frr) == (1024, 1024, 128, 2, 4)
    for bad, says in (("pids=lots", "not field=number"), ("disk=5", "disk"), ("pids=1", "greater than or equal"),
                      ("pids=100,command_pids=200", "must be below pids")):  # fmt: skip
        with pytest.raises(EnvironmentProblem, match=says):
            confine.node_limits(bad)


def test_cgroup_layout_from_mountinfo() -> None:
    v1 = ("30 25 0:26 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
          "31 25 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
          "32 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")  # fmt: skip
    lay = confine.cgroup_layout(v1)
    assert (lay.version, lay.pids, lay.memory) == (1, Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/memory"))
    with pytest.raises(EnvironmentProblem, match="pids and memory"):
        confine.cgroup_layout(v1.splitlines()[0] + "\n")
    # a bind of a sub-cgroup (a container's view) is not a hierarchy's root
    with pytest.raises(EnvironmentProblem):
        confine.cgroup_layout(v1.replace(" / /sys", " /docker/x /sys"))


def test_stage_etc_copies_only_the_allowlist(tmp_path: Path) -> None:
    src, dst = tmp_path / "etc", tmp_path / "out"
    (src / "iproute2").mkdir(parents=True)
    (src / "iproute2" / "rt_tables").write_text("254 main\n")
    (src / "passwd").write_text("root:x:0:0::/root:/bin/bash\n")
    (src / "shadow").write_text("root:$6$hash:::::::\n")
    (src / "group").write_text("secret\n")
    (src / "group").chmod(0o640)  # not readable by others: left out even though listed
    (src / "alternatives").mkdir()
    (src / "alternatives" / "awk").symlink_to("/usr/bin/mawk")
    (src / "mtab").symlink_to("../proc/self/mounts")
    copied = confine.stage_etc(dst, source=src)
    assert sorted(copied) == ["alternatives/awk", "iproute2/rt_tables", "mtab", "passwd"]
    assert sorted(p.name for p in dst.iterdir()) == ["alternatives", "frr", "hostname", "hosts", "iproute2", "mtab", "passwd"]
    assert os.readlink(dst / "alternatives" / "awk") == "/usr/bin/mawk" and (dst / "hosts").read_text() == confine.ETC_HOSTS
