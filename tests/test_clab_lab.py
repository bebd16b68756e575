"""Containerlab labs on the netns substrate, for real: the upstream frr01 example deployed with
``harness lab up --topology frr01.clab.yml`` (OSPF converges, the PCs reach each other), the ANI
servers and the observer on it, renamed nodes and interfaces, and failed imports that leave
nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrate import Lab, confine
from substrate.clab import load
from substrate.clab.names import map_interface, map_nodes
from substrate.errors import BringUpError
from substrate.paths import lab_dir, netns_name
from substrate.scenario.model import Invariant
from substrate.scenario.observer import observe
from tests.conftest import REPO, shared_data, unique_name
from tests.servers_support import connect, data

pytestmark = [pytest.mark.lab]
HARNESS = [sys.executable, "-m", "harness.cli"]
#: Bound on polls for what follows OSPF's adjacencies (route installation, first pings); generous:
#: the machine may be shared and loaded (a bound, not a threshold).
SETTLE_S = 90.0


def poll(fn, within_s: float = SETTLE_S):  # noqa: ANN001, ANN201
    """Call ``fn`` until it returns something truthy or ``within_s`` passes; return its last value."""
    deadline = time.monotonic() + within_s
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)  # poll interval: returns as soon as the state holds


def gone(name: str) -> bool:
    """Nothing of lab ``name`` is left: no record, no namespace."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return not lab_dir(name).exists() and f"anibench-{name}-" not in ns


@pytest.fixture(scope="module")
def frr01() -> Iterator[Lab]:
    """The upstream example, deployed as a user would: harness lab up --topology FILE --name N."""
    name = unique_name("t-frr01")
    path = shared_data("containerlab", "frr01", "frr01.clab.yml")
    r = subprocess.run([*HARNESS, "lab", "up", "--topology", str(path), "--name", name], cwd=REPO,
                       capture_output=True, text=True, timeout=400)  # fmt: skip
    try:
        assert r.returncode == 0, r.stderr
        assert "IGP adjacencies up" in r.stdout and "PC1 -> pc1" in r.stderr
        yield Lab.attach(name)
    finally:
        subprocess.run([*HARNESS, "lab", "down", name], cwd=REPO, capture_output=True, timeout=120)
        assert gone(name)


def test_a_lab_of_hosts_only_does_not_claim_an_igp(tmp_path: Path) -> None:
    """Two linux hosts and no router: lab up says there was no IGP to wait for (it said 'IS-IS
    converged', which an imported lab never runs)."""
    p = tmp_path / "h.clab.yml"
    p.write_text("name: h\ntopology:\n  nodes:\n    a: {kind: linux}\n    b: {kind: linux}\n"
                 "  links:\n    - endpoints: [\"a:eth1\", \"b:eth1\"]\n")
    name = unique_name("t-hosts")
    try:
        r = subprocess.run([*HARNESS, "lab", "up", "--topology", str(p), "--name", name], cwd=REPO,
                           capture_output=True, text=True, timeout=400)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "0 routers, 2 hosts, no IGP to wait for" in r.stdout and "IS-IS" not in r.stdout, r.stdout
    finally:
        subprocess.run([*HARNESS, "lab", "down", name], cwd=REPO, capture_output=True, timeout=120)
        assert gone(name)


def ospf_full(lab: Lab, router: str) -> set[str]:
    out = json.loads(lab.vtysh(router, "show ip ospf neighbor json").stdout or "{}")
    return {nb["ifaceName"].split(":")[0] for nbs in out.get("neighbors", {}).values() for nb in nbs
            if str(nb.get("converged", nb.get("nbrState", ""))).startswith("Full")}  # fmt: skip


def test_frr01_ospf_converges(frr01: Lab) -> None:
    for r in ("router1", "router2", "router3"):
        # both ring neighbours Full: lab up waited for it; polled, as a loaded machine can delay hellos
        assert poll(lambda r=r: ospf_full(frr01, r) == {"eth1", "eth2"}), (r, frr01.vtysh(r, "show ip ospf neighbor").stdout)
        assert frr01.state(r).daemons == ["zebra", "staticd", "ospfd", "ldpd"]
    # every router learns every other PC's subnet through OSPF
    want = {"router1": ["192.168.12.0/24", "192.168.13.0/24"], "router2": ["192.168.11.0/24", "192.168.13.0/24"],
            "router3": ["192.168.11.0/24", "192.168.12.0/24"]}  # fmt: skip

    seen: dict[str, set[str]] = {}

    def learnt() -> bool:
        for r, prefixes in want.items():
            out = frr01.exec(r, ["ip", "-4", "-j", "route", "show", "proto", "ospf"], timeout_s=30)
            seen[r] = {x.get("dst", "") for x in json.loads(out.stdout or "[]")} if out.ok else {f"<{out.summary()}>"}
            if not set(prefixes) <= seen[r]:
                return False
        return True

    assert poll(learnt), seen


def test_frr01_hosts_reach_each_other(frr01: Lab) -> None:
    pcs = {"pc1": "192.168.11.2", "pc2": "192.168.12.2", "pc3": "192.168.13.2"}
    for src in pcs:
        for dst, address in pcs.items():
            if src != dst:
                ok = poll(lambda s=src, a=address: frr01.exec(s, ["ping", "-4", "-n", "-c", "1", "-W", "1", a], timeout_s=5).ok)
                assert ok, f"{src} cannot reach {dst} ({address})"
    # the nodes look like the file's: hostname PC1, addresses from its exec commands, no substrate underlay
    assert frr01.exec("pc1", ["hostname"]).stdout.strip() == "PC1"
    assert "sr0" not in frr01.exec("router1", ["ip", "-br", "link"]).stdout
    assert "router isis" not in frr01.vtysh("router1", "show running-config").stdout


def assert_confined_as_generated(lab: Lab) -> None:
    """Every node of ``lab`` is confined as a generated node is (issue 17): a user namespace of its
    own, its init and exactly its FRR daemons in its cgroup, the allowlisted /etc with its own
    /etc/frr, and an agent's (confined) command without namespace administration."""
    host_userns = Path("/proc/self/ns/user").stat().st_ino
    allowed = {p.split("/")[0] for p in confine.ETC_ALLOWLIST} | {"hosts", "hostname", "frr"}
    for node in lab.node_names():
        st = lab.state(node)
        assert Path(f"/proc/{st.init_pid}/ns/user").stat().st_ino != host_userns, node
        assert st.cgroups, node
        want = {"sleep", *st.daemons}  # init is `sleep infinity`
        seen: dict[str, set[str]] = {}

        def members(st=st) -> set[str]:  # noqa: ANN001
            comms = set()
            for p in confine.members(st.cgroups[0]):
                try:
                    comms.add(Path(f"/proc/{p}/comm").read_text().strip())
                except OSError:
                    pass  # gone meanwhile
            seen[node] = comms
            return comms

        # polled: on a loaded machine a start-up command's cgroup may still be emptying
        assert poll(lambda: members() == want, 30), (node, seen.get(node), want)
        names = set(lab.sh(node, "ls /etc", confined=True).stdout.split())
        assert names <= allowed and "passwd" in names and not names & {"shadow", "sudoers"}, (node, names)
        for cmd in ("unshare -n true", "mount -t tmpfs x /tmp", "hostname other"):
            assert not lab.sh(node, cmd, confined=True).ok, (node, cmd)
        assert lab.sh(node, "ip link add t0 type bridge && ip link del t0", confined=True).ok, node


def test_imported_nodes_are_confined_as_generated_ones(frr01: Lab) -> None:
    """kind linux routers (own frr.conf and daemons file: ospfd, ldpd) and hosts with exec commands."""
    assert set(frr01.state("router1").daemons) == {"zebra", "staticd", "ospfd", "ldpd"}
    assert_confined_as_generated(frr01)
    # the router's /etc/frr is its own, from the file, in the node's size-limited tmpfs
    assert "router ospf" in frr01.sh("router1", "cat /etc/frr/frr.conf", confined=True).stdout
    assert frr01.sh("router1", "df -m --output=size /etc/frr | tail -1").stdout.strip() == str(frr01.record.node_limits["etc_frr"])


def test_exec_leftovers_are_killed_and_said(tmp_path: Path) -> None:
    """An exec command's background process does not outlive it (as for an agent's shell), and the
    bring-up says so, naming node, command and line; kind frr routers are confined too."""
    p = tmp_path / "bg.clab.yml"
    p.write_text("name: bg\ntopology:\n  nodes:\n    r1: {kind: frr, extras: {frr: {daemons: [bgpd]}}}\n"
                 "    h1:\n      kind: linux\n      exec:\n        - sh -c 'sleep 777 >/dev/null 2>&1 &'\n"
                 "  links:\n    - endpoints: [r1:eth1, h1:eth1]\n")
    said: list[str] = []
    with Lab.create(load(p).topology, unique_name("t-bg"), progress=said.append) as lab:
        assert any(m.startswith("h1: exec command 1 `sh -c 'sleep 777 >/dev/null 2>&1 &'`") and "bg.clab.yml:8" in m
                   and "sleep" in m and "killed" in m for m in said), said  # fmt: skip
        assert "sleep 777" not in lab.sh("h1", "ps -eo args").stdout
        assert lab.state("r1").daemons == ["zebra", "staticd", "bgpd"]
        assert_confined_as_generated(lab)


def test_lab_show_lists_the_names_of_the_file(frr01: Lab) -> None:
    r = subprocess.run([*HARNESS, "lab", "show", frr01.name], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.replace("│", " ").splitlines() if line.split()}
    assert "PC1" in rows["pc1"] and "host" in rows["pc1"]
    assert "own config: ospfd ldpd" in " ".join(rows["router1"].split())
    assert "imported from" in r.stdout and "frr01.clab.yml" in r.stdout


def test_lab_reset_refuses_an_imported_lab_and_says_what_to_do(frr01: Lab) -> None:
    """No scenario, no baseline: reset refuses in one line, changes nothing, and says how to start afresh."""
    before = frr01.exec("pc1", ["ip", "-4", "route"]).stdout
    r = subprocess.run([*HARNESS, "lab", "reset", frr01.name], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    flat = " ".join(r.stderr.split())
    assert f"lab {frr01.name} cannot be reset: it was imported from the Containerlab file" in flat and "nothing was changed" in flat
    assert f"harness lab down {frr01.name} && harness lab up --topology " in flat and "frr01.clab.yml" in flat, flat
    assert frr01.alive() and frr01.exec("pc1", ["ip", "-4", "route"]).stdout == before


def test_observer_on_the_imported_lab(frr01: Lab) -> None:
    invs = [
        Invariant(id="reach", kind="reach", service="frr01", params={"src": "pc1", "dst": "192.168.13.2", "family": 4}),
        # router3's loopback is in no OSPF network statement: the PCs' route to 10.10.10.0/24 leads nowhere
        Invariant(id="lo3", kind="isolated", service="frr01", params={"src": "pc1", "dst": "10.10.10.3", "family": 4}),
        Invariant(id="none", kind="reach", service="frr01", params={"src": "pc1", "dst": "192.168.99.1", "family": 4}),
    ]
    assert poll(lambda: observe(frr01, invs[:1])[0].ok)
    v = {x.id: x for x in observe(frr01, invs)}
    assert v["reach"].ok and v["lo3"].ok, (v["reach"].detail, v["lo3"].detail)
    assert not v["none"].ok and v["none"].evidence  # the observer is not vacuous here


@pytest.mark.anyio
async def test_a0_and_a1_on_the_imported_lab(frr01: Lab, tmp_path: Path) -> None:
    from servers.a0_shell.server import build_server as a0
    from servers.a1_wrapper.server import build_server as a1
    from servers.common import ServerConfig

    async with connect(a0(ServerConfig(lab=frr01.name, trajectory=tmp_path / "a0.jsonl"), lab=frr01)) as c:
        # the instructions describe the lab served: its routers' own OSPF/LDP configuration, no IS-IS underlay
        said = c.instructions or ""
        assert "router1, router2, router3 run ospfd, ldpd" in said and "isisd" not in said and "SRv6 provider" not in said, said
        devices = {d["name"]: d for d in data(await c.call_tool("list_devices", {}))["devices"]}
        assert set(devices) == {"router1", "router2", "router3"}  # the routers, by default
        assert set(devices["router1"]["interfaces"].values()) == {"router2:eth1", "router3:eth1", "pc1:eth1"}
        out = data(await c.call_tool("run_shell", {"device": "router2", "command": "vtysh -c 'show ip ospf neighbor'"}))
        assert out["exit_status"] == 0 and out["stdout"].count("Full") == 2
    async with connect(a1(ServerConfig(lab=frr01.name, trajectory=tmp_path / "a1.jsonl"), lab=frr01)) as c:
        said = c.instructions or ""
        assert "run ospfd, ldpd" in said and "running IS-IS" not in said and "get_running_config" in said, said
        topo = data(await c.call_tool("get_topology", {}))
        r1 = next(n for n in topo["nodes"] if n["name"] == "router1")
        assert r1["loopback"] is None and r1["locator"] is None and "own FRR configuration" in topo["underlay"]
        conf = data(await c.call_tool("get_running_config", {"devices": ["router1"]}))["router1"]
        assert "router ospf" in conf and "network 192.168.11.0/24 area 0.0.0.0" in conf
        reply = data(await c.call_tool("apply_config", {"commands": {"router1": ["ip route 10.99.0.0/24 192.168.1.2"]}}))
        assert reply["devices"]["router1"]["applied"] == ["ip route 10.99.0.0/24 192.168.1.2"], reply
        shown = data(await c.call_tool("execute_validation", {"commands": {"router1": ["show ip route 10.99.0.0/24"]}}))
        assert "192.168.1.2" in json.dumps(shown)
        # out of band: really applied (staticd -> zebra -> kernel takes its time on a loaded machine)
        assert poll(lambda: "10.99.0.0/24" in frr01.exec("router1", ["ip", "-4", "route"]).stdout)
        rb = data(await c.call_tool("rollback", {"device": "router1", "snapshot_id": reply["devices"]["router1"]["snapshot_id"]}))
        assert rb["complete"], rb
    assert poll(lambda: "10.99.0.0/24" not in frr01.exec("router1", ["ip", "-4", "route"]).stdout)
    assert ospf_full(frr01, "router1") == {"eth1", "eth2"} or poll(lambda: ospf_full(frr01, "router1") == {"eth1", "eth2"}, 60)


# -- names, and failures that leave nothing behind ---------------------------------------------

LONG = """\
name: long-names
topology:
  nodes:
    core-router-number-one:
      kind: frr
      extras: {frr: {daemons: [staticd]}}
      startup-config: |
        interface ethernet-1-1-to-edge-router
         ip address 10.0.0.1/31
        ip route 10.9.0.0/16 10.0.0.0
    Edge:
      kind: frr
      startup-config: |
        interface eth1
         ip address 10.0.0.0/31
      extras: {frr: {daemons: [staticd]}}
    customer-host-one:
      kind: linux
      image: alpine
      exec:
        - ip link set ethernet-1-1-to-core mtu 1400
        - ip addr add 192.0.2.2/24 dev ethernet-1-1-to-core
  links:
    - endpoints: ["core-router-number-one:ethernet-1-1-to-edge-router", "Edge:eth1"]
    - endpoints: ["customer-host-one:ethernet-1-1-to-core", "Edge:eth2"]
"""


def test_long_names_are_mapped_and_shown(tmp_path: Path) -> None:
    p = tmp_path / "long.clab.yml"
    p.write_text(LONG)
    names = map_nodes(["core-router-number-one", "Edge", "customer-host-one"])
    core, host = names["core-router-number-one"], names["customer-host-one"]
    core_if, host_if = map_interface("ethernet-1-1-to-edge-router"), map_interface("ethernet-1-1-to-core")
    with Lab.create(load(p).topology, unique_name("t-long")) as lab:
        # the router's configuration names the interface it really has
        assert "10.0.0.1/31" in lab.exec(core, ["ip", "-br", "addr", "show", "dev", core_if]).stdout
        assert "10.9.0.0/16" in lab.exec(core, ["ip", "-4", "route"]).stdout
        # the exec commands used the file's long name (an alternative name of the interface)
        link = lab.exec(host, ["ip", "link", "show", "ethernet-1-1-to-core"]).stdout
        assert f" {host_if}@" in link and "mtu 1400" in link and "altname ethernet-1-1-to-core" in link
        assert lab.exec(host, ["hostname"]).stdout.strip() == "customer-host-one"
        r = subprocess.run([*HARNESS, "lab", "show", lab.name], cwd=REPO, capture_output=True, text=True, timeout=60)
        flat = " ".join(r.stdout.replace("│", " ").split())
        assert f"{core} core-router-number-one" in flat and f"{core_if} (ethernet-1-1-to-edge-router)" in flat, r.stdout


FAILING = """\
name: failing
topology:
  nodes:
    r1:
      kind: frr
      extras: {{frr: {{daemons: [ospfd]}}}}
      startup-config: |
        interface eth1
         ip address 10.0.0.1/24
        {frr_line}
    h1:
      kind: linux
      exec:
        - ip addr add 10.0.0.2/24 dev eth1
        - {exec_line}
  links:
    - endpoints: ["r1:eth1", "h1:eth1"]
"""


@pytest.mark.parametrize(
    ("frr_line", "exec_line", "expect"),
    [
        ("!", "ip route add 10.9.0.0/16 via 10.99.0.1",
         r"h1: exec command 2 `ip route add 10.9.0.0/16 via 10.99.0.1` \(.*failing.clab.yml:15\) failed \(exit 2\): .*gateway"),
        ("router ospf\n         no-such-command 1", "echo ok",
         r"r1: FRR 8.4 refused 1 line\(s\) of its frr.conf \(topology.nodes.r1.startup-config at .*failing.clab.yml:7\): "
         r"line 4: % Unknown command: +no-such-command 1; fix the configuration"),
    ],
    ids=["exec", "frr.conf"],
)
def test_a_failed_import_destroys_what_it_created(tmp_path: Path, frr_line: str, exec_line: str, expect: str) -> None:
    p = tmp_path / "failing.clab.yml"
    p.write_text(FAILING.format(frr_line=frr_line, exec_line=exec_line))
    name = unique_name("t-fail")
    r = subprocess.run([*HARNESS, "lab", "up", "--topology", str(p), "--name", name], cwd=REPO, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert __import__("re").search(expect, r.stderr), r.stderr
    assert gone(name)
    with pytest.raises(BringUpError):
        Lab.create(load(p).topology, name)
    assert gone(name) and not Path(f"/run/netns/{netns_name(name, 'h1')}").exists()


def test_exec_commands_cannot_leave_the_node(tmp_path: Path) -> None:
    """A lab file's exec commands run confined: network administration yes, mounting over the
    host's read-only /usr no (the command fails and the bring-up with it, naming the line)."""
    p = tmp_path / "escape.clab.yml"
    p.write_text("name: escape\ntopology:\n  nodes:\n    h1:\n      kind: linux\n      exec:\n"
                 "        - ip link add d0 type bridge\n        - mount -o remount,rw /usr\n")
    with pytest.raises(BringUpError, match=r"h1: exec command 2 `mount -o remount,rw /usr` \(.*escape.clab.yml:8\) failed"):
        Lab.create(load(p).topology, unique_name("t-esc"))
