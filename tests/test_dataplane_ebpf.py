"""The eBPF SRv6 data plane in a real lab (FRR, namespaces), chosen with ``--dataplane ebpf``.

These run wherever the eBPF programs build (the CI kernel has no seg6): marked ``dataplane``, not
``lab``, so the interim deselection of lab tests (issue 34) does not take them away. They check
the contract of issue 34: inside a node, ``ip`` with the SRv6 forms answers as iproute2 6.1 does
on a seg6 kernel (its own printing, errors and exit status), confined commands cannot reach
bpf(2), each node's service socket serves that node only, the service's death is said clearly
and repaired, and nothing is left after the lab.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.conftest import unique_name

pytestmark = [pytest.mark.dataplane, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def _bpf_prog_ids() -> set[int]:
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    import json

    return {p["id"] for p in json.loads(out or "[]")}


def _lab_prog_ids(lab) -> set[int]:  # noqa: ANN001
    """Program ids of the lab's SRv6 routes, read raw (the host's ip, no shim: ``encap bpf``
    routes named ``anibench:<id>:...``)."""
    import re

    ids: set[int] = set()
    for st in lab.record.nodes.values():
        for fam in ("-4", "-6"):
            out = subprocess.run(["ip", "-n", st.netns, fam, "route", "show", "table", "all"], capture_output=True, text=True).stdout
            ids |= {int(x) for x in re.findall(r"anibench:(\d+):", out)}
    return ids


@pytest.fixture(scope="module")
def ebpf_lab() -> Iterator:
    from substrate import Lab
    from substrate.dataplane import ENV, select
    from substrate.topology import Topology

    old = os.environ.get(ENV)
    os.environ[ENV] = "ebpf"
    try:
        if select().dataplane != "ebpf":
            pytest.skip(select().line())
        from substrate.dataplane.ebpf.service import running

        with Lab.create(Topology.from_spec("line:3"), unique_name("t-ebpf")) as lab:
            yield lab
            ours = _lab_prog_ids(lab)
            assert ours, "no program found on the lab's SRv6 routes"
            service = running(lab.dir)
        from substrate.record import pid_alive

        assert service is not None and not pid_alive(service), "the data-plane service outlived its lab"
        # the kernel frees a namespace's routes, and so their programs, in its cleanup work
        # after the last reference goes: poll, bounded
        deadline = time.monotonic() + 30
        while ours & _bpf_prog_ids() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not ours & _bpf_prog_ids(), f"programs left after the lab: {sorted(ours & _bpf_prog_ids())}"
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def _ip(lab, node: str, *args: str, confined: bool = True, input: str | None = None):  # noqa: ANN001, ANN202
    return lab.exec(node, ["ip", *args], confined=confined, input=input, timeout_s=20)


def test_the_lab_records_its_data_plane_and_locators_carry_end(ebpf_lab) -> None:
    assert ebpf_lab.record.dataplane == "ebpf"
    r = _ip(ebpf_lab, "r2", "-6", "route", "show", "fcbb:bb00:2::/48", "metric", "1")
    assert r.ok, r.stderr
    assert r.stdout.strip() == ("fcbb:bb00:2::/48  encap seg6local action End flavors next-csid lblen 32 nflen 16 "
                                "dev sr0 pref medium")  # fmt: skip (a metric filter hides the metric)


def test_srv6_routes_print_as_iproute2_prints_seg6_in_text_and_json(ebpf_lab) -> None:
    lab = ebpf_lab
    assert _ip(lab, "r1", "-6", "r", "a", "fd77::/64", "table", "100", "encap", "seg6", "mode", "encap.red", "segs",
               "fcbb:bb00:2:300:fe00::,fcbb:bb00:3::", "dev", "sr0").ok  # fmt: skip
    r = _ip(lab, "r1", "-6", "route", "show", "table", "100")
    assert r.stdout.strip() == ("fd77::/64  encap seg6 mode encap.red segs 2 [ fcbb:bb00:2:300:fe00:: fcbb:bb00:3:: ] "
                                "dev sr0 metric 1024 pref medium")  # fmt: skip
    import json

    (route,) = json.loads(_ip(lab, "r1", "-6", "-j", "route", "show", "table", "100").stdout)
    assert {k: route[k] for k in ("dst", "encap", "mode", "segs", "dev")} == {
        "dst": "fd77::/64", "encap": "seg6", "mode": "encap.red", "segs": ["fcbb:bb00:2:300:fe00::", "fcbb:bb00:3::"], "dev": "sr0"}
    r = _ip(lab, "r1", "-4", "route", "add", "10.77.0.0/24", "table", "100", "encap", "seg6", "mode", "encap", "segs",
            "fcbb:bb00:3::", "dev", "sr0")  # fmt: skip
    assert r.ok, r.stderr
    assert "10.77.0.0/24  encap seg6 mode encap segs 1 [ fcbb:bb00:3:: ] dev sr0" in _ip(lab, "r1", "-4", "route", "show", "table", "100").stdout
    assert _ip(lab, "r1", "route", "flush", "table", "100").ok  # no family: IPv4 only, as iproute2 does
    assert _ip(lab, "r1", "-4", "route", "show", "table", "100").stdout == ""
    assert "fd77::/64" in _ip(lab, "r1", "-6", "route", "show", "table", "100").stdout
    assert _ip(lab, "r1", "-6", "route", "flush", "table", "100").ok
    assert _ip(lab, "r1", "-6", "route", "show", "table", "100").stdout == ""


def test_errors_and_exit_status_are_iproute2s(ebpf_lab) -> None:
    lab = ebpf_lab
    add = ["-6", "route", "add", "fd78::/64", "encap", "seg6local", "action", "End", "count", "dev", "sr0"]
    assert _ip(lab, "r3", *add).ok
    r = _ip(lab, "r3", *add)
    assert (r.returncode, r.stderr.strip()) == (2, "RTNETLINK answers: File exists")
    r = _ip(lab, "r3", "-6", "-batch", "-", input="route del fd78::/64\nroute del fd78::/64\n")
    assert r.returncode == 1 and "RTNETLINK answers: No such process" in r.stderr and "Command failed -:2" in r.stderr
    r = _ip(lab, "r3", "-6", "route", "add", "fd79::/64", "encap", "seg6local", "action", "End.BPF", "endpoint", "obj", "x", "dev", "sr0")
    assert r.returncode != 0  # iproute2's own refusal (no such object) or the data plane's one line
    r = _ip(lab, "r3", "-6", "route", "add", "fd79::/64", "encap", "seg6", "mode", "l2encap", "segs", "fc00::1", "dev", "sr0")
    assert r.returncode == 2 and "the eBPF SRv6 data plane does not forward seg6 mode l2encap" in r.stderr


def test_tunnel_source_is_kept_per_node_and_set_only_with_host_privileges(ebpf_lab) -> None:
    """``ip sr tunsrc set`` wants CAP_NET_ADMIN in the initial user namespace (GENL_ADMIN_PERM):
    an agent's confined shell is refused as on the kernel's seg6; the harness (host user
    namespace) sets it (adversarial finding F12)."""
    lab = ebpf_lab
    r = _ip(lab, "r1", "sr", "tunsrc", "set", "fd00::9")
    assert (r.returncode, r.stderr.strip()) == (1, "RTNETLINK answers: Operation not permitted"), r
    assert _ip(lab, "r1", "sr", "tunsrc", "set", "fd00::1", confined=False).ok
    assert _ip(lab, "r1", "sr", "tunsrc", "show").stdout.strip() == "tunsrc addr fd00::1"
    assert _ip(lab, "r2", "sr", "tunsrc", "show").stdout.strip() == "tunsrc addr ::"
    assert _ip(lab, "r1", "sr", "tunsrc", "set", "::", confined=False).ok


def test_a_confined_shell_gets_eperm_from_bpf_and_sees_only_its_own_socket(ebpf_lab) -> None:
    lab = ebpf_lab
    script = ("bpftool prog show >/dev/null 2>&1; echo bpftool=$?; "
              "python3 -c 'import ctypes,os; l=ctypes.CDLL(None,use_errno=True); "
              "print(\"bpf\", l.syscall(321,5,0,0), ctypes.get_errno())'; ls /run/anibench; ls /sys/fs/bpf 2>&1 | head -1")  # fmt: skip
    r = lab.exec("r2", ["sh", "-c", script], confined=True)
    assert "bpftool=255" in r.stdout or "bpftool=1" in r.stdout, r.stdout
    assert "bpf -1 1" in r.stdout  # EPERM
    assert "r1.sock" not in r.stdout and "dataplane.sock" in r.stdout
    # the node's socket reaches the service for that node only: a route added through r2's
    # socket is in r2's namespace and in no other
    assert _ip(lab, "r2", "-6", "route", "add", "fd7a::/64", "encap", "seg6local", "action", "End", "dev", "sr0").ok
    assert "fd7a::/64" in _ip(lab, "r2", "-6", "route", "show").stdout
    assert "fd7a::/64" not in _ip(lab, "r1", "-6", "route", "show").stdout
    assert _ip(lab, "r2", "-6", "route", "del", "fd7a::/64").ok


def test_the_service_dying_is_said_and_repaired_and_forwarding_state_stays(ebpf_lab) -> None:
    lab = ebpf_lab
    from substrate.dataplane.ebpf.service import running

    supervisor = running(lab.dir)
    assert supervisor is not None
    workers = subprocess.run(["pgrep", "-P", str(supervisor)], capture_output=True, text=True).stdout.split()
    assert workers
    os.kill(int(workers[0]), signal.SIGKILL)
    deadline = time.monotonic() + 20
    while True:  # the supervisor restarts the worker on the same sockets
        r = _ip(lab, "r1", "-6", "route", "add", "fd7b::/64", "encap", "seg6local", "action", "End", "dev", "sr0")
        if r.ok or time.monotonic() > deadline:
            break
        assert "SRv6 data-plane service" in r.stderr or "File exists" in r.stderr, r.stderr
        time.sleep(0.1)
    assert r.ok, r.stderr
    # the locator's End route, installed before the kill, is still there with its program
    assert "encap seg6local action End" in _ip(lab, "r1", "-6", "route", "show", "fcbb:bb00:1::/48", "metric", "1").stdout
    assert (lab.dir / "dataplane" / "supervisor.jsonl").read_text().count("worker died") >= 1
    assert _ip(lab, "r1", "-6", "route", "del", "fd7b::/64").ok


def test_the_data_planes_own_helper_devices_are_not_the_nodes(ebpf_lab) -> None:
    """An encapsulating route gives its node the GSO helper bridge: the node's ip neither shows it
    (links, addresses, routes) nor lets it be changed; the host sees it is there."""
    lab = ebpf_lab
    assert _ip(lab, "r3", "-6", "route", "add", "fd7c::/64", "encap", "seg6", "mode", "encap", "segs", "fcbb:bb00:1::",
               "dev", "sr0").ok  # fmt: skip
    raw = subprocess.run(["ip", "-n", lab.state("r3").netns, "-o", "link", "show"], capture_output=True, text=True).stdout
    assert "sr6gso" in raw
    for args in (("link", "show"), ("-d", "-j", "link", "show"), ("addr", "show"), ("-6", "route", "show", "table", "all"),
                 ("-4", "route", "show", "table", "all"), ("rule", "show"), ("neigh", "show")):  # fmt: skip
        r = _ip(lab, "r3", *args)
        assert r.ok and "sr6gso" not in r.stdout, (args, r.stdout[-500:])
    r = _ip(lab, "r3", "link", "set", "sr6gso", "down")
    assert r.returncode != 0 and "No such device" in r.stderr, r.stderr
    assert "state UP" in subprocess.run(["ip", "-n", lab.state("r3").netns, "link", "show", "sr6gso"], capture_output=True,
                                        text=True).stdout or "UNKNOWN" in raw  # fmt: skip
    assert _ip(lab, "r3", "-6", "route", "del", "fd7c::/64").ok


def test_an_end_dx6_next_hop_is_followed_when_the_main_table_changes(ebpf_lab) -> None:
    """End.DX6 resolves nh6 in the main table per packet in the kernel; here the helper's private
    table follows the main table (service.DX_REFRESH_S): a SID whose next hop had no route when it
    was added forwards once one exists."""
    lab = ebpf_lab
    ns = lab.state("r3").netns
    assert _ip(lab, "r3", "-6", "route", "add", "fd7d::/64", "encap", "seg6local", "action", "End.DX6", "nh6",
               "fd7e::2", "dev", "sr0").ok  # fmt: skip

    def private() -> str:
        rules = subprocess.run(["ip", "-n", ns, "-6", "rule", "show"], capture_output=True, text=True).stdout
        tables = {int(t) for t in __import__("re").findall(r"iif sr6dx\w+ lookup (\d+)", rules)}
        return "".join(subprocess.run(["ip", "-n", ns, "-6", "route", "show", "table", str(t)], capture_output=True,
                                      text=True).stdout for t in tables)  # fmt: skip

    assert "unreachable default" in private()
    assert _ip(lab, "r3", "-6", "route", "add", "fd7e::/64", "dev", "eth1").ok  # fd7e::2 now routed via eth1
    deadline = time.monotonic() + 10
    while "default via fd7e::2 dev eth1" not in private() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "default via fd7e::2 dev eth1" in private(), private()
    assert _ip(lab, "r3", "-6", "route", "del", "fd7d::/64").ok and _ip(lab, "r3", "-6", "route", "del", "fd7e::/64").ok


ESCAPE = r'''
import socket, struct, sys
idx = int(sys.argv[1])
ifi = struct.pack("=BxHiII", 0, 0, idx, 0, 0)
attr = struct.pack("=HHI", 8, 19, 1)  # IFLA_NET_NS_PID = the host's PID 1
msg = struct.pack("=IHHII", 16 + len(ifi) + len(attr), 16, 1 | 4, 7, 0) + ifi + attr  # RTM_NEWLINK, REQUEST|ACK
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect("/run/anibench/dataplane.sock")
s.send(b"S\0\0\0" + struct.pack("=I", 0) + msg)
print(struct.unpack_from("=I", s.recv(65536))[0])
'''


def test_a_node_cannot_have_the_service_write_what_it_may_not_write_itself(ebpf_lab) -> None:
    """Adversarial finding F1: a raw request on the node's socket asking to move one of its veths
    into the host's namespace is not the data plane's: the service answers "pass" (the node's
    own ip would send it, with the node's privileges) and nothing moves."""
    lab = ebpf_lab
    assert _ip(lab, "r1", "link", "add", "escA", "type", "veth", "peer", "name", "escB").ok
    try:
        idx = json.loads(_ip(lab, "r1", "-j", "link", "show", "escB").stdout)[0]["ifindex"]
        r = lab.exec("r1", ["python3", "-c", ESCAPE, str(idx)], confined=True)
        assert r.ok and r.stdout.strip() == str(0xFFFFFFFF), (r.stdout, r.stderr)
        assert "escB" in _ip(lab, "r1", "link", "show").stdout
        assert "escB" not in subprocess.run(["ip", "link", "show"], capture_output=True, text=True).stdout
    finally:
        _ip(lab, "r1", "link", "del", "escA")


def test_the_helpers_rules_and_devices_cannot_be_changed_from_the_node(ebpf_lab) -> None:
    """Adversarial findings F3, F4: ``ip rule del pref 1`` (the decapsulation helpers' rules) is
    answered as for a rule that is not there, and the helpers' devices take no address."""
    lab = ebpf_lab
    assert _ip(lab, "r2", "-6", "route", "add", "fd80::/64", "encap", "seg6local", "action", "End.DT6", "table", "120",
               "dev", "sr0").ok  # fmt: skip
    assert _ip(lab, "r2", "-6", "route", "add", "fd81::/64", "encap", "seg6", "mode", "encap", "segs", "fcbb:bb00:1::",
               "dev", "sr0").ok  # fmt: skip
    try:
        raw = lambda: subprocess.run(["ip", "-n", lab.state("r2").netns, "-6", "rule", "show"], capture_output=True,  # noqa: E731
                                     text=True).stdout  # fmt: skip
        assert "iif sr6dt120 lookup 120" in raw()
        for pref in ("1", "2"):
            r = _ip(lab, "r2", "-6", "rule", "del", "pref", pref)
            assert r.returncode == 2 and "No such file or directory" in r.stderr, r
        assert "iif sr6dt120 lookup 120" in raw() and "iif sr6dt120 unreachable" in raw()
        # a deletion the node's ip cannot tell apart (the helper's rule is the first of table 120)
        # is repaired by the service within its bound
        assert _ip(lab, "r2", "-6", "rule", "del", "table", "120").ok
        deadline = time.monotonic() + 10
        while "iif sr6dt120 lookup 120" not in raw() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "iif sr6dt120 lookup 120" in raw()
        for dev in ("sr6dt120", "sr6gso"):
            r = _ip(lab, "r2", "-6", "addr", "add", "fd82::1/64", "dev", dev)
            assert r.returncode != 0, r
    finally:
        _ip(lab, "r2", "-6", "route", "del", "fd80::/64")
        _ip(lab, "r2", "-6", "route", "del", "fd81::/64")


def test_identical_srv6_routes_compare_equal_as_the_kernels_do(ebpf_lab) -> None:
    """Adversarial finding F5: an encapsulating route is named by its parameters, so appending its
    twin is "File exists" as on the kernel's seg6, and an IPv4 delete naming other segments
    deletes nothing."""
    lab = ebpf_lab
    add = ["route", "append", "fd83::/64", "encap", "seg6", "mode", "encap", "segs", "fcbb:bb00:3::", "dev", "sr0"]
    assert _ip(lab, "r1", "-6", *add).ok
    r = _ip(lab, "r1", "-6", *add)
    assert (r.returncode, r.stderr.strip()) == (2, "RTNETLINK answers: File exists"), r
    assert _ip(lab, "r1", "-6", "route", "del", "fd83::/64").ok
    v4 = ["10.83.0.0/24", "encap", "seg6", "mode", "encap", "segs"]
    assert _ip(lab, "r1", "-4", "route", "add", *v4, "fcbb:bb00:3::", "dev", "sr0").ok
    r = _ip(lab, "r1", "-4", "route", "del", *v4, "fcbb:bb00:2::", "dev", "sr0")
    assert (r.returncode, r.stderr.strip()) == (2, "RTNETLINK answers: No such process"), r
    assert _ip(lab, "r1", "-4", "route", "del", *v4, "fcbb:bb00:3::", "dev", "sr0").ok


BAD_SRH = r'''
import socket, struct, sys
src, dst, seg = sys.argv[1], sys.argv[2], sys.argv[3]
a = lambda x: socket.inet_pton(socket.AF_INET6, x)
def srh(hdrlen, tail=b""):
    return bytes([59, hdrlen, 4, 1, 1, 0, 0, 0]) + a(seg) + a(dst) + tail
for body in (srh(254), srh(5, b"\xff" * 8)):   # runs past the packet; 8 bytes that are no TLV
    s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, 43)   # the kernel writes the IPv6 header
    s.sendto(body, (dst, 0))
print("sent")
'''


def test_end_drops_an_srh_the_kernel_drops(ebpf_lab) -> None:
    """Adversarial finding F7: an SRH longer than the packet, or whose bytes after the segment
    list are no TLVs, is dropped at End and counted as an error (seg6_get_srh's pull,
    seg6_validate_srh's TLV walk)."""
    lab = ebpf_lab
    sid = "fcbb:bb00:2:e0e0::"
    assert _ip(lab, "r2", "-6", "route", "add", f"{sid}/64", "encap", "seg6local", "action", "End", "count", "dev", "sr0").ok
    try:
        def errors() -> int:
            (route,) = json.loads(_ip(lab, "r2", "-6", "-s", "-j", "route", "show", f"{sid}/64").stdout)
            return route["stats64"]["errors"]

        before = errors()
        src = json.loads(_ip(lab, "r1", "-6", "-j", "addr", "show", "dev", "lo", "scope", "global").stdout)[0]["addr_info"][0]["local"]
        r = lab.exec("r1", ["python3", "-c", BAD_SRH, src, sid, "fd00::3"], confined=True)
        assert r.ok, r.stderr
        deadline = time.monotonic() + 10
        while errors() < before + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert errors() == before + 2
    finally:
        _ip(lab, "r2", "-6", "route", "del", f"{sid}/64")


def test_routes_of_one_behaviour_share_a_program_that_lives_as_long_as_they_do() -> None:
    """Identical SRv6 behaviours share one program instance (installing 1,000 routes to one
    segment list loads one program, not 1,000); a counting route keeps its own (its counters
    are per route); once nothing holds the shared instance the kernel frees it, and the next
    route of that behaviour loads a fresh one."""
    import types

    from substrate.dataplane.ebpf import loader, programs, seg6

    if select_ebpf_unavailable():
        pytest.skip("the eBPF programs do not build here")
    node = types.SimpleNamespace(shared_programs={}, netns="unused")
    end = seg6.Seg6Local(seg6.END)
    fds1, id1, _h, close1 = programs.install_programs(end, 10, node)
    fds2, id2, _h, close2 = programs.install_programs(end, 10, node)
    assert id1 == id2 and set(fds1.values()).isdisjoint(fds2.values())
    counting = seg6.Seg6Local(seg6.END, counters=True)
    _f3, id3, _h, close3 = programs.install_programs(counting, 10, node)
    _f4, id4, _h, close4 = programs.install_programs(counting, 10, node)
    assert len({id1, id3, id4}) == 3, "a counting route must not share its counters"
    for c in (close1, close2, close3, close4):
        c()
    assert loader.reopen({"xmit": id1}) is None, "the shared program outlived every holder"
    fds5, id5, _h, close5 = programs.install_programs(end, 10, node)
    close5()
    assert id5 != id1


def select_ebpf_unavailable() -> bool:
    from substrate.dataplane import ebpf_status

    return not ebpf_status()[0]


REAL_IP = "LD_PRELOAD= /run/anibench/ip"  # the node's iproute2 without its front: what any root shell can run


@pytest.mark.parametrize("breakage", [
    "tc qdisc del dev {dt} clsact",
    f"{REAL_IP} link del {{dt}}",
    f"{REAL_IP} link set {{dt}} down",
    f"{REAL_IP} link set {{dt}} mtu 1280",
    "sysctl -qw net.ipv6.conf.{dt}.disable_ipv6=1",
    f"{REAL_IP} link del sr6gso",
    "tc qdisc del dev sr6gso clsact",
    # the second reconciler attack (issue 35): a classic-BPF filter ahead of the strip program that
    # passes every packet undecapsulated, a route through the helper in the table DT6 looks up
    "tc filter add dev {dt} ingress protocol all pref 1 handle 2 bpf bytecode '1,6 0 0 4294967295,'",
    f"{REAL_IP} -6 route add fd00:1:3::2/128 dev {{dt}}",
    f"{REAL_IP} -6 rule add pref 0 iif {{dt}} blackhole",
    f"{REAL_IP} -6 addr add fd00:1:3::2/128 dev {{dt}}",
    # the third attack: a rule into a table the node's ip hides, a rule on the GSO helper's input,
    # the GSO helper's IPv6 turned off (TCP bulk through H.Encaps enters IPv6 there)
    f"{REAL_IP} -6 route add blackhole fd00:1:3::2/128 table 2130706433 && {REAL_IP} -6 rule add pref 5 lookup 2130706433",
    f"{REAL_IP} -6 rule add pref 5 iif sr6gso prohibit",
    "sysctl -qw net.ipv6.conf.sr6gso.disable_ipv6=1",
    "tc filter add dev sr6gso ingress protocol all pref 1 handle 2 bpf bytecode '1,6 0 0 4294967295,'",
])  # fmt: skip
def test_a_helper_a_node_breaks_behind_its_ip_is_put_back(ebpf_lab, breakage: str) -> None:
    """The data plane's helper devices live in the node's namespace, so its root can break them
    with a tool that bypasses the node's ``ip`` front (the kernel's seg6 has no such object).
    The service puts each back within its refresh bound (a confined agent's commands here), and
    SRv6 forwarding through them works again: h1 -> h3 over H.Encaps at r1, End with NEXT-C-SID
    at r2, End.DT6 at r3."""
    from substrate.dataplane.ebpf.decap import HELPER_PREFIX

    lab = ebpf_lab
    dst, sid = "fd00:1:3::2", "fcbb:bb00:3:e000::/64"
    dt = f"{HELPER_PREFIX}t254"
    assert _ip(lab, "r3", "-6", "route", "add", sid, "encap", "seg6local", "action", "End.DT6", "table", "254",
               "dev", "sr0").ok  # fmt: skip
    assert _ip(lab, "r1", "-6", "route", "add", f"{dst}/128", "encap", "seg6", "mode", "encap", "segs",
               "fcbb:bb00:2:3:e000::", "dev", "sr0").ok  # fmt: skip

    def pings() -> bool:
        return lab.exec("h1", ["ping", "-6", "-c1", "-W1", dst], timeout_s=5).returncode == 0

    def intact() -> bool:
        ns = {n: lab.state(n).netns for n in ("r1", "r3")}
        out = subprocess.run(["ip", "-n", ns["r3"], "-j", "link", "show", "dev", dt], capture_output=True, text=True).stdout
        link = (json.loads(out or "[]") or [{}])[0]
        gso = subprocess.run(["tc", "-n", ns["r1"], "filter", "show", "dev", "sr6gso", "ingress"], capture_output=True,
                             text=True).stdout  # fmt: skip
        dt_f = subprocess.run(["tc", "-n", ns["r3"], "filter", "show", "dev", dt, "ingress"], capture_output=True,
                              text=True).stdout  # fmt: skip
        dis = subprocess.run(["ip", "netns", "exec", ns["r3"], "sysctl", "-n", f"net.ipv6.conf.{dt}.disable_ipv6"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
        addrs = subprocess.run(["ip", "-n", ns["r3"], "-j", "addr", "show", "dev", dt], capture_output=True, text=True).stdout
        gso6 = subprocess.run(["ip", "netns", "exec", ns["r1"], "sysctl", "-n", "net.ipv6.conf.sr6gso.disable_ipv6"],
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        rules = "".join(subprocess.run(["ip", "-n", ns[n], "-6", "rule"], capture_output=True, text=True).stdout for n in ("r1", "r3"))
        own = [a for a in (json.loads(addrs or "[]") or [{}])[0].get("addr_info", []) if a.get("scope") == "global"]
        return ("UP" in link.get("flags", []) and link.get("mtu") == 65535 and "bpf" in gso and "bpf" in dt_f
                and dis == "0" and not own and gso.count("handle") == 1 and dt_f.count("handle") == 1 and gso6 == "0"
                and "2130706433" not in rules and "sr6gso" not in rules)

    try:
        _wait(pings, 20, "SRv6 forwarding before the breakage")
        before = _ifindex(lab, "r3", dt)
        node = "r1" if "sr6gso" in breakage else "r3"
        r = lab.exec(node, ["sh", "-c", breakage.format(dt=dt)], confined=True, timeout_s=10)
        assert r.returncode == 0, (breakage, r.stderr)
        _wait(lambda: intact() and pings(), 20, f"the helper put back after: {breakage}")
        assert _ifindex(lab, "r3", dt) == before, "the decap helper came back at another index"
    finally:
        _ip(lab, "r1", "-6", "route", "del", f"{dst}/128")
        _ip(lab, "r3", "-6", "route", "del", sid)


def _ifindex(lab, node: str, dev: str) -> int:  # noqa: ANN001
    out = subprocess.run(["ip", "-n", lab.state(node).netns, "-j", "link", "show", "dev", dev], capture_output=True,
                         text=True).stdout  # fmt: skip
    return json.loads(out)[0]["ifindex"]


def _wait(pred, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_appending_a_counting_routes_twin_is_refused_as_the_kernel_does(ebpf_lab) -> None:
    """A counting route has a program of its own, so its name differs from its twin's; the
    kernel's seg6local compares behaviours (counters by presence only): ``append`` of the same
    route is EEXIST, and a route differing in one parameter is appended. A seg6local route is
    IPv6 only (seg6_local_build_state: EINVAL for another family)."""
    lab = ebpf_lab
    route = ["-6", "route", "append", "fd7a::/64", "table", "100", "encap", "seg6local", "action", "End.DT6", "table",
             "7", "count", "dev", "sr0"]  # fmt: skip
    try:
        assert _ip(lab, "r3", *route).ok
        r = _ip(lab, "r3", *route)
        assert (r.returncode, r.stderr.strip()) == (2, "RTNETLINK answers: File exists"), r
        other = [*route]
        other[other.index("count") - 1] = "8"
        assert _ip(lab, "r3", *other).ok, "a route of another behaviour is appended"
        assert _ip(lab, "r3", "-6", "route", "show", "table", "100").stdout.count("End.DT6") == 2
        r = _ip(lab, "r3", "-4", "route", "add", "10.77.7.0/24", "encap", "seg6local", "action", "End.DX4", "nh4",
                "10.9.9.9", "dev", "sr0")  # fmt: skip
        assert (r.returncode, r.stderr.strip()) == (2, "RTNETLINK answers: Invalid argument"), r
    finally:
        _ip(lab, "r3", "-6", "route", "flush", "table", "100")


def test_what_the_adversarial_pass_found_is_answered_as_the_kernel_does(ebpf_lab) -> None:
    """Second adversarial pass (issue 34): ``hmac KEYID`` was accepted and never applied (the
    kernel signs each packet, or drops it for want of the key): now refused in one line; End.DT6
    with both ``table`` and ``vrftable`` was accepted (the kernel: "table or vrftable must be
    specified"); attributes an action does not take were refused (the kernel ignores them, and
    does not show them)."""
    lab = ebpf_lab
    r = _ip(lab, "r1", "-6", "route", "add", "fd7d::/64", "encap", "seg6", "mode", "encap", "segs", "fcbb:bb00:3::",
            "hmac", "5", "dev", "sr0")  # fmt: skip
    assert r.returncode == 2 and "does not do SRH HMAC" in r.stderr, r
    assert "fd7d::/64" not in _ip(lab, "r1", "-6", "route", "show").stdout
    r = _ip(lab, "r1", "-6", "route", "add", "fd7d::/64", "nhid", "1", "encap", "seg6", "mode", "encap", "segs",
            "fcbb:bb00:3::", "dev", "sr0")  # fmt: skip
    assert (r.returncode, r.stderr.strip()) == (2, "Error: Nexthop specification and nexthop id are mutually exclusive."), r
    r = _ip(lab, "r3", "-6", "route", "add", "fd7e::/64", "encap", "seg6local", "action", "End.DT6", "table", "254",
            "vrftable", "100", "dev", "sr0")  # fmt: skip
    assert (r.returncode, r.stderr.strip()) == (2, "Error: table or vrftable must be specified."), r
    try:
        assert _ip(lab, "r3", "-6", "route", "add", "fd7e::/64", "encap", "seg6local", "action", "End", "table", "100",
                   "dev", "sr0").ok  # fmt: skip
        assert _ip(lab, "r3", "-6", "route", "add", "fd7f::/64", "encap", "seg6local", "action", "End.DX6", "nh6",
                   "fd00:1:3::2", "oif", "eth1", "dev", "sr0").ok  # fmt: skip
        shown = _ip(lab, "r3", "-6", "route", "show").stdout
        assert "fd7e::/64  encap seg6local action End dev sr0" in shown, shown
        assert "fd7f::/64  encap seg6local action End.DX6 nh6 fd00:1:3::2 dev sr0" in shown, shown
    finally:
        _ip(lab, "r3", "-6", "route", "del", "fd7e::/64")
        _ip(lab, "r3", "-6", "route", "del", "fd7f::/64")


def test_a_device_named_like_a_helper_is_refused_and_an_impostor_is_replaced(ebpf_lab) -> None:
    """A node's device named like the data plane's helpers would be hidden from its own ip and,
    made before a helper of that name, taken for it (End.DT6 then dropped everything while its
    counters counted): the node's ip refuses the name; one made behind the front is replaced by
    a real helper when the SID needs it."""
    lab = ebpf_lab
    r = _ip(lab, "r3", "link", "add", "sr6dt253", "type", "veth", "peer", "name", "x1")
    assert r.returncode == 2 and "are the eBPF SRv6 data plane's" in r.stderr, r
    r = lab.exec("r3", ["sh", "-c", f"{REAL_IP} link add sr6dt253 type veth peer name x1"], confined=True)
    assert r.returncode == 0, r.stderr
    sid = "fcbb:bb00:3:e253::/64"
    try:
        assert _ip(lab, "r3", "-6", "route", "add", sid, "encap", "seg6local", "action", "End.DT6", "table", "253",
                   "dev", "sr0").ok  # fmt: skip
        out = subprocess.run(["ip", "-n", lab.state("r3").netns, "-d", "-j", "link", "show", "dev", "sr6dt253"],
                             capture_output=True, text=True).stdout  # fmt: skip
        assert json.loads(out)[0]["linkinfo"]["info_kind"] == "tun"
        assert "x1" not in subprocess.run(["ip", "-n", lab.state("r3").netns, "-br", "link"], capture_output=True,
                                          text=True).stdout  # fmt: skip
    finally:
        _ip(lab, "r3", "-6", "route", "del", sid)
