"""eBPF SRv6 decapsulating endpoints (End.DT6/DT4/DT46/DX4/DX6) on a real namespace lab.

Lab (no FRR, static routes)::

    h1 (sends hand-made SRv6 packets over a raw socket)
     | 2001:db8:1::1/64 -- 2001:db8:1::2/64
    r1 (decapsulating PE: SIDs in fc00:0:1::/48 on sr0, tenant table 100)
     | 2001:db8:3::1/64, 10.0.3.1/24 -- 2001:db8:3::2/64, 10.0.3.2/24
    h3 (CE: an AF_PACKET capture on h3-eth0 sees what r1 forwards)

Table 100 on r1 routes the tenant prefixes 2001:db8:33::/64 and 10.33.0.0/24 to h3; main has
no route for them (so delivery proves the lookup in table 100). DX SIDs use inner destinations
that no table routes (2001:db8:99::/64, 10.99.0.0/24): delivery to h3's MAC proves forwarding
to nh4/nh6. All traffic is between lab namespaces; the host only runs ip/tc/nft and reads maps.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

pytestmark = [pytest.mark.dataplane]

if os.geteuid() != 0 or shutil.which("clang") is None:  # pragma: no cover
    pytest.skip("needs root and clang", allow_module_level=True)

from conformance.probes import checksum as _csum  # noqa: E402
from substrate.dataplane.ebpf import decap, loader  # noqa: E402

PORT = 7777
MARK = b"ANIBENCH-DECAP-"
H1, R1_A, R1_B, H3 = "2001:db8:1::1", "2001:db8:1::2", "2001:db8:3::1", "2001:db8:3::2"
SIDS = {
    "End.DT6": "fc00:0:1:d6::",
    "End.DT4": "fc00:0:1:d4::",
    "End.DT46": "fc00:0:1:d46::",
    "End.DX4": "fc00:0:1:dd4::",
    "End.DX6": "fc00:0:1:dd6::",
}


# ------------------------------------------------------------------------------------ packets


def udp6(src: str, dst: str, payload: bytes, hl: int = 64) -> bytes:
    s, d = ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed
    ln = 8 + len(payload)
    pseudo = s + d + struct.pack("!I3xB", ln, 17)
    udp = struct.pack("!HHHH", 40000, PORT, ln, 0) + payload
    c = _csum(pseudo + udp) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", c) + udp[8:]
    return struct.pack("!IHBB", 6 << 28, ln, 17, hl) + s + d + udp


def udp4(src: str, dst: str, payload: bytes, ttl: int = 64) -> bytes:
    s, d = ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed
    ln = 8 + len(payload)
    udp = struct.pack("!HHHH", 40000, PORT, ln, 0) + payload
    c = _csum(s + d + struct.pack("!BBH", 0, 17, ln) + udp) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", c) + udp[8:]
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + ln, 1, 0, ttl, 17, 0, s, d)
    hdr = hdr[:10] + struct.pack("!H", _csum(hdr)) + hdr[12:]
    return hdr + udp


def srv6(sid: str, inner: bytes, *, sl: int = 0, srh: bool = True, hl: int = 64,
         extra_segs: tuple[str, ...] = ()) -> bytes:
    """Outer IPv6 (h1 -> sid) + optional SRH whose active segment is ``sid``."""
    nh = 41 if inner[0] >> 4 == 6 else 4
    body = inner
    if srh:
        # segments[0] is the last segment; the active one is segments[sl] == sid
        segs = [ipaddress.IPv6Address(a).packed for a in extra_segs]
        segs.insert(sl, ipaddress.IPv6Address(sid).packed)
        n = len(segs)
        body = struct.pack("!BBBBBBH", nh, 2 * n, 4, sl, n - 1, 0, 0) + b"".join(segs) + inner
        nh = 43
    return (struct.pack("!IHBB", 6 << 28, len(body), nh, hl) + ipaddress.IPv6Address(H1).packed
            + ipaddress.IPv6Address(sid).packed + body)


def expect_forwarded(inner: bytes) -> bytes:
    """``inner`` as ip_forward/ip6_forward sends it: TTL / hop limit minus one."""
    if inner[0] >> 4 == 6:
        return inner[:7] + bytes([inner[7] - 1]) + inner[8:]
    hdr = bytearray(inner[:20])
    hdr[8] -= 1
    hdr[10:12] = b"\0\0"
    hdr[10:12] = struct.pack("!H", _csum(bytes(hdr)))
    return bytes(hdr) + inner[20:]


# ------------------------------------------------------------------------------------ lab


def sh(*argv: str, input: str | None = None) -> str:
    res = subprocess.run(list(argv), capture_output=True, text=True, input=input, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")
    return res.stdout


def wait_for(pred: Callable[[], object], what: str, timeout: float = 10.0) -> object:
    """Poll ``pred`` until truthy (bounded)."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


SENDER = r"""
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
for h in sys.argv[2:]:
    s.sendto(bytes.fromhex(h), (sys.argv[1], 0))
"""

CAPTURE = r"""
import json, select, socket, sys, time
ifname, mark, deadline = sys.argv[1], bytes.fromhex(sys.argv[2]), time.monotonic() + float(sys.argv[3])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((ifname, 0))
print("ready", flush=True)
while time.monotonic() < deadline:
    r, _, _ = select.select([s, sys.stdin], [], [], 0.2)
    if sys.stdin in r:
        line = sys.stdin.readline()
        if not line or line.strip() == "stop":
            break
    if s in r:
        frame, addr = s.recvfrom(65535)
        if mark in frame and addr[2] != socket.PACKET_OUTGOING:
            print(json.dumps({"dst_mac": frame[:6].hex(), "l3": frame[14:].hex()}), flush=True)
"""


class Capture:
    """AF_PACKET capture in a namespace; frames whose payload holds the test's marker."""

    def __init__(self, ns: str, ifname: str, mark: bytes):
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", CAPTURE, ifname, mark.hex(), "60"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.frames: list[dict] = []

    def until(self, n: int, timeout: float = 10.0) -> list[dict]:
        """Read frames until ``n`` were seen (bounded by the capture's own deadline)."""
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while len(self.frames) < n and time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                line = self.proc.stdout.readline()
                if not line:
                    break
                self.frames.append(json.loads(line))
        return self.frames

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except BrokenPipeError:
                pass


class Lab:
    def __init__(self) -> None:
        tag = f"dcap{os.getpid() % 100000}"
        self.ns = {n: f"ebpfd-{tag}-{n}" for n in ("h1", "r1", "h3")}  # not anibench-*: lab cleanup removes those
        self.node: decap.DecapNode | None = None
        self.sids: dict[str, decap.InstalledSid] = {}

    def ip(self, node: str, *args: str) -> str:
        return sh("ip", "-n", self.ns[node], *args)

    def nsexec(self, node: str, *args: str, input: str | None = None) -> str:
        return sh("ip", "netns", "exec", self.ns[node], *args, input=input)

    def up(self) -> None:
        for n, ns in self.ns.items():
            sh("ip", "netns", "add", ns)
            self.nsexec(n, "sysctl", "-q", "-w", "net.ipv6.conf.all.accept_dad=0",
                        "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.forwarding=1",
                        "net.ipv4.ip_forward=1")
            self.ip(n, "link", "set", "lo", "up")
        sh("ip", "link", "add", "h1-eth0", "netns", self.ns["h1"], "type", "veth", "peer", "name", "r1-eth0",
           "netns", self.ns["r1"])
        sh("ip", "link", "add", "r1-eth1", "netns", self.ns["r1"], "type", "veth", "peer", "name", "h3-eth0",
           "netns", self.ns["h3"])
        sh("ip", "-n", self.ns["h1"], "-batch", "-", input="\n".join([
            "link set h1-eth0 up", f"addr add {H1}/64 dev h1-eth0",
            f"route add fc00:0:1::/48 via {R1_A}"]) + "\n")
        sh("ip", "-n", self.ns["r1"], "-batch", "-", input="\n".join([
            "link set r1-eth0 up", "link set r1-eth1 up", f"addr add {R1_A}/64 dev r1-eth0",
            f"addr add {R1_B}/64 dev r1-eth1", "addr add 10.0.3.1/24 dev r1-eth1",
            "link add sr0 type bridge", "link set sr0 up",
            f"route add 2001:db8:33::/64 via {H3} dev r1-eth1 table 100",
            "route add 10.33.0.0/24 via 10.0.3.2 dev r1-eth1 table 100"]) + "\n")
        sh("ip", "-n", self.ns["h3"], "-batch", "-", input="\n".join([
            "link set h3-eth0 up", f"addr add {H3}/64 dev h3-eth0", "addr add 10.0.3.2/24 dev h3-eth0"]) + "\n")
        self.nsexec("r1", "nft", "-f", "-", input=NFT_FW)
        self.node = decap.DecapNode(self.ns["r1"])
        specs = [
            decap.DecapSid(SIDS["End.DT6"] + "/128", "End.DT6", table=100),
            decap.DecapSid(SIDS["End.DT4"] + "/128", "End.DT4", table=100),
            decap.DecapSid(SIDS["End.DT46"] + "/128", "End.DT46", table=100),
            decap.DecapSid(SIDS["End.DX4"] + "/128", "End.DX4", nh="10.0.3.2"),
            decap.DecapSid(SIDS["End.DX6"] + "/128", "End.DX6", nh=H3),
        ]
        for spec, inst in zip(specs, self.node.install(specs)):
            self.sids[spec.behaviour] = inst

    def down(self) -> None:
        if self.node is not None:
            self.node.teardown()
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)

    def send(self, *packets: bytes) -> None:
        dst = str(ipaddress.IPv6Address(packets[0][24:40]))
        self.nsexec("h1", sys.executable, "-c", SENDER, dst, *(p.hex() for p in packets))

    def counters(self, behaviour: str) -> loader.Counters:
        return self.node.counters(self.sids[behaviour])

    def nft_counter(self, name: str, family: str = "inet", table: str = "fw") -> int:
        out = json.loads(self.nsexec("r1", "nft", "-j", "list", "counter", family, table, name))
        return next(o["counter"]["packets"] for o in out["nftables"] if "counter" in o)

    def mac(self, node: str, dev: str) -> str:
        return json.loads(self.ip(node, "-j", "link", "show", "dev", dev))[0]["address"].replace(":", "")


NFT_FW = f"""
table inet fw {{
    counter inner {{ }}
    counter outer {{ }}
    counter pre {{ }}
    counter post {{ }}
    chain c_pre {{
        type filter hook prerouting priority -150; policy accept;
        meta l4proto udp udp dport {PORT} iifname "sr6d*" counter name pre
    }}
    chain c_fwd {{
        type filter hook forward priority 0; policy accept;
        meta l4proto udp udp dport {PORT} counter name inner
        meta l4proto {{ 4, 41 }} counter name outer
    }}
    chain c_post {{
        type filter hook postrouting priority 100; policy accept;
        meta l4proto udp udp dport {PORT} oifname "r1-eth1" counter name post
    }}
}}
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lb = Lab()
    try:
        lb.up()
        yield lb
    finally:
        lb.down()
        leftovers = list(loader.bpffs_root().rglob(f"decap-{os.getpid()}-*"))
        assert not leftovers, f"pins left: {leftovers}"


def mark() -> bytes:
    return MARK + uuid.uuid4().hex.encode()


def _deliver(lab: Lab, behaviour: str, inner: bytes, m: bytes, **kw) -> dict:
    before = lab.counters(behaviour)
    nft_before = {c: lab.nft_counter(c) for c in ("inner", "pre", "post", "outer")}
    cap = Capture(lab.ns["h3"], "h3-eth0", m)
    try:
        pkt = srv6(SIDS[behaviour], inner, **kw)
        lab.send(pkt)
        frames = cap.until(1)
    finally:
        cap.close()
    assert len(frames) == 1, f"{behaviour}: inner packet not delivered to the CE"
    after = lab.counters(behaviour)
    assert after.packets == before.packets + 1
    assert after.bytes == before.bytes + len(pkt)
    assert after.errors == before.errors
    nft_after = {c: lab.nft_counter(c) for c in ("inner", "pre", "post", "outer")}
    assert nft_after["inner"] == nft_before["inner"] + 1, "FORWARD did not see the inner packet"
    assert nft_after["pre"] == nft_before["pre"] + 1, "PREROUTING did not see the inner packet"
    assert nft_after["post"] == nft_before["post"] + 1, "POSTROUTING did not see the inner packet"
    frames[0]["outer_fwd_delta"] = nft_after["outer"] - nft_before["outer"]
    return frames[0]


# ------------------------------------------------------------------------------------ tests


def test_end_dt6_delivers_inner_via_table(lab: Lab) -> None:
    m = mark()
    inner = udp6("2001:db8:11::1", "2001:db8:33::1", m, hl=17)
    f = _deliver(lab, "End.DT6", inner, m)
    assert bytes.fromhex(f["l3"]) == expect_forwarded(inner)
    assert f["dst_mac"] == lab.mac("h3", "h3-eth0")
    # known difference: the OUTER packet went through ip6_forward (FORWARD hook) before the LWT
    # xmit program ran; the kernel's seg6local consumes it in the input path instead
    assert f["outer_fwd_delta"] == 1


def test_end_dt6_without_srh(lab: Lab) -> None:
    """The kernel accepts plain IPv6-in-IPv6 (no SRH) on a decap SID."""
    m = mark()
    inner = udp6("2001:db8:11::1", "2001:db8:33::2", m)
    f = _deliver(lab, "End.DT6", inner, m, srh=False)
    assert bytes.fromhex(f["l3"]) == expect_forwarded(inner)


def test_end_dt4_delivers_inner_via_table(lab: Lab) -> None:
    m = mark()
    inner = udp4("10.11.0.1", "10.33.0.1", m, ttl=9)
    f = _deliver(lab, "End.DT4", inner, m)
    assert bytes.fromhex(f["l3"]) == expect_forwarded(inner)


@pytest.mark.parametrize("family", [4, 6])
def test_end_dt46_both_families(lab: Lab, family: int) -> None:
    m = mark()
    inner = udp4("10.11.0.1", "10.33.0.7", m) if family == 4 else udp6("2001:db8:11::1", "2001:db8:33::7", m)
    f = _deliver(lab, "End.DT46", inner, m)
    assert bytes.fromhex(f["l3"]) == expect_forwarded(inner)


def test_end_dx4_forwards_to_nh4(lab: Lab) -> None:
    m = mark()
    inner = udp4("10.11.0.1", "10.99.0.1", m, ttl=2)
    f = _deliver(lab, "End.DX4", inner, m)
    assert bytes.fromhex(f["l3"]) == expect_forwarded(inner)
    assert f["dst_mac"] == lab.mac("h3", "h3-eth0")


def test_end_dx6_forwards_to_nh6(lab: Lab) -> None:
    m = mark()
    inner = udp6("2001:db8:11::1", "2001:db8:99::1", m, hl=5)
    f = _deliver(lab, "End.DX6", inner, m)
    assert bytes.fromhex(f["l3"]) == expect_forwarded(inner)
    assert f["dst_mac"] == lab.mac("h3", "h3-eth0")


def test_end_dx4_nat(lab: Lab) -> None:
    """DNAT (prerouting) and SNAT (postrouting) on the decapsulating router apply to the inner
    IPv4 packet after End.DX4, with conntrack."""
    lab.nsexec("r1", "nft", "-f", "-", input=f"""
table ip nat {{
    chain pre {{ type nat hook prerouting priority dstnat; ip daddr 10.99.0.9 udp dport {PORT} dnat to 10.0.3.2; }}
    chain post {{ type nat hook postrouting priority srcnat; ip saddr 10.11.0.9 oifname "r1-eth1" snat to 10.0.3.1; }}
}}
""")
    try:
        m = mark()
        inner = udp4("10.11.0.9", "10.99.0.9", m)
        f = _deliver(lab, "End.DX4", inner, m)
        got = bytes.fromhex(f["l3"])
        assert got[12:16] == socket.inet_aton("10.0.3.1")
        assert got[16:20] == socket.inet_aton("10.0.3.2")
        assert got[8] == 63
        assert _csum(got[:20]) == 0
        udp = got[20:]
        assert _csum(got[12:20] + struct.pack("!BBH", 0, 17, len(udp)) + udp) == 0, "UDP checksum not fixed"
        ct = lab.nsexec("r1", "conntrack", "-L", "-p", "udp", "--dport", str(PORT)) if shutil.which("conntrack") else ""
        if ct:
            assert "10.99.0.9" in ct
    finally:
        lab.nsexec("r1", "nft", "delete", "table", "ip", "nat")


def _dropped(lab: Lab, behaviour: str, bad: bytes, good_inner: Callable[[bytes], bytes]) -> None:
    """``bad`` is dropped with the SID's error counter; a valid packet sent after it arrives
    alone (so the bad one was not delivered)."""
    before = lab.counters(behaviour)
    m_bad = mark()
    cap = Capture(lab.ns["h3"], "h3-eth0", MARK)
    try:
        lab.send(bad.replace(MARK + b"X" * 32, m_bad))
        wait_for(lambda: lab.counters(behaviour).errors == before.errors + 1, f"{behaviour} error counter")
        m = mark()
        lab.send(srv6(SIDS[behaviour], good_inner(m)))
        frames = cap.until(1)
    finally:
        cap.close()
    # the bad packet was counted as an error, i.e. dropped before the redirect; the first frame
    # at the CE is the good packet sent after it
    assert m in bytes.fromhex(frames[0]["l3"])
    after = lab.counters(behaviour)
    assert (after.packets, after.errors) == (before.packets + 1, before.errors + 1)


PLACEHOLDER = MARK + b"X" * 32


def test_wrong_family_dropped(lab: Lab) -> None:
    # IPv4 inner on End.DT6 / End.DX6, IPv6 inner on End.DT4 / End.DX4: kernel decap_and_validate
    # (ipv6_find_hdr for the behaviour's protocol fails) -> kfree_skb, -EINVAL -> errors++.
    v4 = udp4("10.11.0.1", "10.33.0.1", PLACEHOLDER)
    v6 = udp6("2001:db8:11::1", "2001:db8:33::1", PLACEHOLDER)
    _dropped(lab, "End.DT6", srv6(SIDS["End.DT6"], v4), lambda m: udp6("2001:db8:11::1", "2001:db8:33::1", m))
    _dropped(lab, "End.DX6", srv6(SIDS["End.DX6"], v4), lambda m: udp6("2001:db8:11::1", "2001:db8:99::1", m))
    _dropped(lab, "End.DT4", srv6(SIDS["End.DT4"], v6), lambda m: udp4("10.11.0.1", "10.33.0.1", m))
    _dropped(lab, "End.DX4", srv6(SIDS["End.DX4"], v6), lambda m: udp4("10.11.0.1", "10.99.0.1", m))


def test_segments_left_nonzero_dropped(lab: Lab) -> None:
    # SRH with SL=1 whose active segment is the SID: kernel decap_and_validate returns false.
    for b in ("End.DT6", "End.DT46", "End.DX6"):
        bad = srv6(SIDS[b], udp6("2001:db8:11::1", "2001:db8:33::1", PLACEHOLDER), sl=1,
                   extra_segs=("fc00:0:9::1",))
        _dropped(lab, b, bad, lambda m: udp6("2001:db8:11::1", "2001:db8:33::1", m) if b != "End.DX6"
                 else udp6("2001:db8:11::1", "2001:db8:99::1", m))
    bad = srv6(SIDS["End.DX4"], udp4("10.11.0.1", "10.99.0.1", PLACEHOLDER), sl=1, extra_segs=("fc00:0:9::1",))
    _dropped(lab, "End.DX4", bad, lambda m: udp4("10.11.0.1", "10.99.0.1", m))


def test_dt46_non_ip_inner_dropped(lab: Lab) -> None:
    """End.DT46 with an upper layer that is neither IPv4 nor IPv6 (here UDP) is dropped."""
    inner = udp6("2001:db8:11::1", "2001:db8:33::1", PLACEHOLDER)[40:]  # a bare UDP datagram
    body = struct.pack("!BBBBBBH", 17, 2, 4, 0, 0, 0, 0) + ipaddress.IPv6Address(SIDS["End.DT46"]).packed + inner
    bad = (struct.pack("!IHBB", 6 << 28, len(body), 43, 64) + ipaddress.IPv6Address(H1).packed
           + ipaddress.IPv6Address(SIDS["End.DT46"]).packed + body)
    _dropped(lab, "End.DT46", bad, lambda m: udp6("2001:db8:11::1", "2001:db8:33::1", m))


def test_dt_table_miss_does_not_fall_through(lab: Lab) -> None:
    """A destination absent from table 100 (but routed in main: 2001:db8:3::/64) is not
    forwarded via main: the helper's `unreachable` rule ends the lookup."""
    before = lab.counters("End.DT6")
    cap = Capture(lab.ns["h3"], "h3-eth0", MARK)
    try:
        m_bad = mark()
        lab.send(srv6(SIDS["End.DT6"], udp6("2001:db8:11::1", H3, m_bad)))
        wait_for(lambda: lab.counters("End.DT6").packets == before.packets + 1, "DT6 packet counter")
        m = mark()
        lab.send(srv6(SIDS["End.DT6"], udp6("2001:db8:11::1", "2001:db8:33::1", m)))
        frames = cap.until(1)
    finally:
        cap.close()
    assert m in bytes.fromhex(frames[0]["l3"]), "the table-100 miss was forwarded"


def test_route_is_real_and_unpinned(lab: Lab) -> None:
    out = lab.ip("r1", "-6", "route", "show", "dev", "sr0")
    for b, sid in SIDS.items():
        assert sid in out and "encap bpf xmit" in out, out
    assert "End-DT6_table_100_count" in out
    assert not list(loader.bpffs_root().rglob(f"decap-{os.getpid()}-*"))
    # deleting the route frees its program instance (the route held the only reference)
    pid = lab.sids["End.DT46"].prog_id
    spec = decap.DecapSid("fc00:0:1:eee::/128", "End.DT46", table=100)
    (tmp,) = lab.node.install([spec])
    assert loader.read_counters(tmp.prog_id).packets == 0
    lab.ip("r1", "-6", "route", "del", "fc00:0:1:eee::/128")
    wait_for(lambda: _gone(tmp.prog_id), "program freed with its route")
    assert loader.read_counters(pid) is not None


def _gone(prog_id: int) -> bool:
    try:
        loader.read_counters(prog_id)
    except loader.BpfError:
        return True
    return False


def test_helper_devices(lab: Lab) -> None:
    """One tun helper per DT table and per DX next hop; no carrier (no fd attached), no
    addresses; their strip programs stripped everything they got and dropped nothing."""
    links = {ln["ifname"]: ln for ln in json.loads(lab.ip("r1", "-j", "link", "show"))}
    helpers = sorted(n for n in links if n.startswith(decap.HELPER_PREFIX))
    dx = [lab.node.helper_name(decap.DecapSid("::/128", b, nh=nh))[0]
          for b, nh in (("End.DX4", "10.0.3.2"), ("End.DX6", H3))]
    assert helpers == sorted(["sr6dt100", *dx])
    for n in helpers:
        assert links[n]["link_type"] == "none" and "NO-CARRIER" in links[n]["flags"]
        assert not json.loads(lab.ip("r1", "-j", "addr", "show", "dev", n))[0]["addr_info"]
    n0 = lab.node.strip_stats()["sr6dt100"][0]
    lab.send(srv6(SIDS["End.DT6"], udp6("2001:db8:11::1", "2001:db8:33::1", mark())))
    wait_for(lambda: lab.node.strip_stats()["sr6dt100"][0] == n0 + 1, "strip program ran")
    stats = lab.node.strip_stats()
    assert all(v[1] == 0 for v in stats.values()), stats


def test_fact_lwt_xmit_redirect_needs_l3_device(lab: Lab, tmp_path) -> None:
    """Kernel fact behind the design: from LWT xmit, bpf_redirect to an Ethernet device (veth)
    loses the packet, egress or ingress (run_lwt_bpf resets the MAC header, so
    __bpf_redirect_common answers -ERANGE); the tun helper (no MAC) takes it (other tests)."""
    src = tmp_path / "r.c"
    src.write_text('#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n'
                   'SEC("lwt_xmit") int r(struct __sk_buff *skb) { return bpf_redirect(IFX, FLAGS); }\n'
                   'char LICENSE[] SEC("license") = "GPL";\n')
    ifx = json.loads(lab.ip("r1", "-j", "link", "show", "r1-eth1"))[0]["ifindex"]
    for flags in (0, 1):  # egress, BPF_F_INGRESS
        obj = tmp_path / f"r{flags}.o"
        sh("clang", "-O2", "-target", "bpf", f"-I/usr/include/{os.uname().machine}-linux-gnu", f"-DIFX={ifx}",
           f"-DFLAGS={flags}", "-c", str(src), "-o", str(obj))
        sid = f"fc00:0:1:ee{flags}::"
        lab.ip("r1", "-6", "route", "add", f"{sid}/128", "encap", "bpf", "xmit", "obj", str(obj), "section",
               "lwt_xmit", "dev", "sr0")
        try:
            st = json.loads(lab.ip("r1", "-s", "-j", "link", "show", "r1-eth1"))[0]["stats64"]
            cap = Capture(lab.ns["h3"], "h3-eth0", MARK)
            try:
                lab.send(*[srv6(sid, udp6("2001:db8:11::1", "2001:db8:33::1", mark())) for _ in range(5)])
                # a valid packet after them arrives first: the five were lost
                m = mark()
                lab.send(srv6(SIDS["End.DT6"], udp6("2001:db8:11::1", "2001:db8:33::1", m)))
                frames = cap.until(1)
            finally:
                cap.close()
            assert m in bytes.fromhex(frames[0]["l3"])
            st2 = json.loads(lab.ip("r1", "-s", "-j", "link", "show", "r1-eth1"))[0]["stats64"]
            assert st2["rx"]["packets"] - st["rx"]["packets"] < 5
        finally:
            lab.ip("r1", "-6", "route", "del", f"{sid}/128")


def test_known_difference_outer_hop_limit_one(lab: Lab) -> None:
    """Known difference: an outer hop limit of 1 gets ICMPv6 Time Exceeded from ip6_forward
    before the SID's program runs (the kernel's seg6local would decapsulate it)."""
    before = lab.counters("End.DT6")
    icmp0 = _nstat(lab, "Icmp6OutTimeExcds")
    lab.send(srv6(SIDS["End.DT6"], udp6("2001:db8:11::1", "2001:db8:33::1", mark()), hl=1))
    wait_for(lambda: _nstat(lab, "Icmp6OutTimeExcds") == icmp0 + 1, "ICMPv6 time exceeded from r1")
    assert lab.counters("End.DT6") == before


def _nstat(lab: Lab, name: str) -> int:
    snmp = lab.nsexec("r1", "cat", "/proc/net/snmp6")
    return next(int(ln.split()[1]) for ln in snmp.splitlines() if ln.split()[0] == name)


TCP_SERVER = r"""
import hashlib, socket, sys
s = socket.socket(socket.AF_INET6)
s.bind((sys.argv[1], 9000)); s.listen(1); s.settimeout(30); print("ready", flush=True)
c, _ = s.accept(); c.settimeout(30); h = hashlib.sha256(); n = 0
while True:
    b = c.recv(65536)
    if not b:
        break
    h.update(b); n += len(b)
c.sendall(h.hexdigest().encode()); c.close(); print(n, flush=True)
"""

TCP_CLIENT = r"""
import hashlib, os, socket, sys
data = os.urandom(int(sys.argv[2]))
c = socket.create_connection((sys.argv[1], 9000), timeout=30)
c.sendall(data); c.shutdown(socket.SHUT_WR)
print(c.recv(100).decode() == hashlib.sha256(data).hexdigest())
"""


def test_tcp_bulk_through_encap_and_dt6(lab: Lab) -> None:
    """4 MB of TCP from h1 to a tenant address behind h3: h1 encapsulates with the H.Encaps
    program (loader.encap_program, segs = the End.DT6 SID), r1 decapsulates into table 100,
    the return path is plain IPv6. gso_max_segs 1 on h1-eth0: the encap program cannot carry
    GSO packets yet (bpf_lwt_push_encap refuses GSO with a routing header), which is the
    encap's limit, not the decap's."""
    dst = "2001:db8:33::100"
    lab.ip("h3", "addr", "add", f"{dst}/128", "dev", "lo")
    lab.ip("h3", "route", "add", "2001:db8:1::/64", "via", R1_B)
    lab.ip("h1", "link", "set", "h1-eth0", "gso_max_segs", "1")
    spec = loader.encap_program([SIDS["End.DT6"]], src=H1)
    loader.install_routes(lab.ns["h1"], [loader.RouteSpec("route add 2001:db8:33::100/128 {encap} dev h1-eth0", spec)])
    before = lab.counters("End.DT6")
    srv = subprocess.Popen(["ip", "netns", "exec", lab.ns["h3"], sys.executable, "-c", TCP_SERVER, dst],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready"
        out = lab.nsexec("h1", sys.executable, "-c", TCP_CLIENT, dst, str(4_000_000))
        assert out.strip() == "True"
        assert srv.wait(timeout=30) == 0
        assert srv.stdout.read().strip() == "4000000"
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
        srv.stdout.close()
        srv.stderr.close()
        lab.ip("h1", "route", "del", "2001:db8:33::100/128")
    after = lab.counters("End.DT6")
    assert after.packets - before.packets > 2500 and after.errors == before.errors


def _snmp6(lab: Lab, node: str, name: str) -> int:
    snmp = lab.nsexec(node, "cat", "/proc/net/snmp6")
    return next(int(ln.split()[1]) for ln in snmp.splitlines() if ln.split()[0] == name)


def _rules(lab: Lab, fam: str) -> list[dict]:
    return json.loads(lab.ip("r1", fam, "-j", "rule", "show"))


def test_dt_inner_to_local_address(lab: Lab) -> None:
    """Inner packet addressed to the PE itself (2001:db8:1::2, only in the local table).
    Default set-up: rule 0 ``lookup local`` comes first, so it is delivered locally (UDP: port
    unreachable). ``tables_before_local=True``: only table N is consulted, as the kernel's
    End.DT6 does, so it is not delivered; teardown puts ``lookup local`` back at 0."""
    m = mark()
    n0 = _snmp6(lab, "r1", "Udp6NoPorts")
    lab.send(srv6(SIDS["End.DT6"], udp6("2001:db8:11::1", R1_A, m)))
    wait_for(lambda: _snmp6(lab, "r1", "Udp6NoPorts") == n0 + 1, "local delivery on r1")

    strict = decap.DecapNode(lab.ns["r1"], tables_before_local=True)
    try:
        lab.ip("r1", "route", "add", "2001:db8:33::/64", "via", H3, "dev", "r1-eth1", "table", "200")
        (inst,) = strict.install([decap.DecapSid("fc00:0:1:d200::/128", "End.DT6", table=200)])
        for fam in ("-4", "-6"):
            prios = [(r["priority"], r.get("iif"), r.get("table", r.get("action"))) for r in _rules(lab, fam)]
            assert prios[:3] == [(0, "sr6dt200", "200"), (0, "sr6dt200", "unreachable"), (1, None, "local")], prios
        n1 = _snmp6(lab, "r1", "Udp6NoPorts")
        cap = Capture(lab.ns["h3"], "h3-eth0", MARK)
        try:
            lab.send(srv6("fc00:0:1:d200::", udp6("2001:db8:11::1", R1_A, mark())))
            m2 = mark()
            lab.send(srv6("fc00:0:1:d200::", udp6("2001:db8:11::1", "2001:db8:33::1", m2)))
            frames = cap.until(1)
        finally:
            cap.close()
        assert m2 in bytes.fromhex(frames[0]["l3"])
        assert _snmp6(lab, "r1", "Udp6NoPorts") == n1
        assert strict.counters(inst).packets == 2
        lab.ip("r1", "-6", "route", "del", "fc00:0:1:d200::/128")
    finally:
        strict.teardown()
        subprocess.run(["ip", "-n", lab.ns["r1"], "-6", "route", "flush", "table", "200"], capture_output=True)
    for fam in ("-4", "-6"):
        assert _rules(lab, fam)[0] == {"priority": 0, "src": "all", "table": "local"}
        assert not [r for r in _rules(lab, fam) if r.get("iif") == "sr6dt200"]


def test_new_process_adopts_helpers(lab: Lab) -> None:
    """A DecapNode that lost its state (new host process) finds the helper device again by its
    deterministic name, and its rules are not duplicated."""
    other = decap.DecapNode(lab.ns["r1"])
    (inst,) = other.install([decap.DecapSid("fc00:0:1:eef::/128", "End.DX4", nh="10.0.3.2")])
    try:
        assert len(other.helpers) == 1
        (h,) = other.helpers.values()
        assert h.ifindex == lab.node.helpers["x10.0.3.2"].ifindex
        rules = [r for r in _rules(lab, "-4") if r.get("iif") == h.name]
        assert len(rules) == 2, rules
        m = mark()
        cap = Capture(lab.ns["h3"], "h3-eth0", m)
        try:
            lab.send(srv6("fc00:0:1:eef::", udp4("10.11.0.1", "10.99.0.3", m)))
            assert len(cap.until(1)) == 1
        finally:
            cap.close()
        assert other.counters(inst).packets == 1
    finally:
        lab.ip("r1", "-6", "route", "del", "fc00:0:1:eef::/128")


def test_dx_next_hop_resolved_later(lab: Lab) -> None:
    """A DX6 SID whose nh6 has no route yet installs (the kernel's seg6local accepts it too and
    drops per packet); after the next hop becomes routable in main (here recursively, behind
    a gateway), ``resync`` picks it up."""
    nh = "2001:db8:77::1"
    node = decap.DecapNode(lab.ns["r1"])
    (inst,) = node.install([decap.DecapSid("fc00:0:1:d77::/128", "End.DX6", nh=nh)])
    (h,) = node.helpers.values()
    try:
        assert "unreachable default" in lab.ip("r1", "-6", "route", "show", "table", str(h.table))
        lab.ip("r1", "-6", "route", "add", f"{nh}/128", "via", H3, "dev", "r1-eth1")
        node.resync()
        # nh6 sits behind the gateway h3: the kernel's DX6 sends to h3 as well
        assert f"default via {H3} dev r1-eth1" in lab.ip("r1", "-6", "route", "show", "table", str(h.table))
        m = mark()
        cap = Capture(lab.ns["h3"], "h3-eth0", m)
        try:
            lab.send(srv6("fc00:0:1:d77::", udp6("2001:db8:11::1", "2001:db8:99::5", m)))
            (f,) = cap.until(1)
        finally:
            cap.close()
        assert f["dst_mac"] == lab.mac("h3", "h3-eth0")
        assert node.counters(inst).packets == 1
    finally:
        subprocess.run(["ip", "-n", lab.ns["r1"], "-6", "route", "del", "fc00:0:1:d77::/128"], capture_output=True)
        subprocess.run(["ip", "-n", lab.ns["r1"], "-6", "route", "del", f"{nh}/128"], capture_output=True)
        node.teardown()


@pytest.mark.parametrize("family", [4, 6])
def test_dx_next_hop_losing_its_route_drops_at_once(lab: Lab, family: int) -> None:
    """The kernel resolves nh4/nh6 for every packet: once the next hop's route is gone, the very
    next packet is dropped. The private table still points at the old next hop (no ``resync``
    here, and the service's refresh runs only every DX_REFRESH_S), so the strip program's own
    per-packet lookup must drop it (the reset suite's flushed-routes case on the eBPF plane)."""
    nh, via, sid = (("10.77.0.1", "10.0.3.2", "fc00:0:1:d78::") if family == 4
                    else ("2001:db8:77::2", H3, "fc00:0:1:d79::"))
    fam = f"-{family}"
    lab.ip("r1", fam, "route", "add", f"{nh}/{32 if family == 4 else 128}", "via", via, "dev", "r1-eth1")
    node = decap.DecapNode(lab.ns["r1"])
    (inst,) = node.install([decap.DecapSid(sid + "/128", f"End.DX{family}", nh=nh)])
    (h,) = node.helpers.values()

    def inner(m: bytes) -> bytes:
        return udp4("10.11.0.1", "10.99.0.9", m) if family == 4 else udp6("2001:db8:11::1", "2001:db8:99::9", m)

    try:
        m = mark()
        cap = Capture(lab.ns["h3"], "h3-eth0", m)
        try:
            lab.send(srv6(sid, inner(m)))
            assert len(cap.until(1)) == 1, "not delivered while the next hop is routed"
        finally:
            cap.close()
        lab.ip("r1", fam, "route", "del", f"{nh}/{32 if family == 4 else 128}")
        assert f"default via {via}" in lab.ip("r1", fam, "route", "show", "table", str(h.table)), \
            "the private table was re-pointed: this test would not show the per-packet check"
        dropped = node.strip_stats()[h.name][1]
        m = mark()
        cap = Capture(lab.ns["h3"], "h3-eth0", m)
        try:
            lab.send(srv6(sid, inner(m)))
            wait_for(lambda: node.strip_stats()[h.name][1] == dropped + 1, "the strip program dropped it")
            assert cap.until(1, timeout=0.3) == [], "forwarded to a next hop that has no route"
        finally:
            cap.close()
    finally:
        subprocess.run(["ip", "-n", lab.ns["r1"], "-6", "route", "del", sid + "/128"], capture_output=True)
        subprocess.run(["ip", "-n", lab.ns["r1"], fam, "route", "del", f"{nh}/{32 if family == 4 else 128}"],
                       capture_output=True)
        node.teardown()


def test_dx_table_flushed_and_resolving_as_before_is_put_back(lab: Lab) -> None:
    """The PE's address on the next hop's subnet taken away and put back between two refreshes
    (issue 35, the reconciler attack): the kernel flushed the private table's ``default via NH``
    with the address, and the next hop then resolves as it did before, so a refresh that only
    compared resolutions left the table empty for good (the DX4 site lost, while reset and
    reconciler saw nothing: the table is the data plane's own). The refresh checks the table
    with the service's strict, table-filtered netlink dump and puts the route back."""
    from substrate.dataplane.ebpf.service import Node

    nh, sid = "10.0.3.2", "fc00:0:1:d7a::"
    node = decap.DecapNode(lab.ns["r1"])
    (inst,) = node.install([decap.DecapSid(sid + "/128", "End.DX4", nh=nh)])
    (h,) = node.helpers.values()
    nl = Node(name="r1", netns=f"/run/netns/{lab.ns['r1']}", listener=None, maps=None)  # type: ignore[arg-type]

    def table() -> str:
        return lab.ip("r1", "-4", "route", "show", "table", str(h.table))

    try:
        assert node.refresh(nl.route_get, nl.table_routes) in (0, 1)
        assert f"default via {nh}" in table() and len(nl.table_routes(socket.AF_INET, h.table)) == 1
        assert not nl.table_routes(socket.AF_INET, 4242)  # the dump is the table's, not every route
        lab.ip("r1", "addr", "del", "10.0.3.1/24", "dev", "r1-eth1")
        lab.ip("r1", "addr", "add", "10.0.3.1/24", "dev", "r1-eth1")
        assert table().strip() == "", "the kernel kept the route: this test would not show the repair"
        assert node.refresh(nl.route_get, nl.table_routes) == 1
        assert f"default via {nh}" in table()
        assert node.refresh(nl.route_get, nl.table_routes) == 0, "a table as written is rewritten"
        # rewritten behind the front: another next hop, and a more specific route beside it
        lab.ip("r1", "-4", "route", "replace", "default", "via", "10.0.3.9", "dev", "r1-eth1", "table", str(h.table))
        lab.ip("r1", "-4", "route", "add", "10.99.0.0/24", "via", "10.0.3.9", "dev", "r1-eth1", "table", str(h.table))
        assert node.refresh(nl.route_get, nl.table_routes) == 1
        assert table().split("\n")[0].startswith(f"default via {nh}") and "10.99.0.0" not in table(), table()
        m = mark()
        cap = Capture(lab.ns["h3"], "h3-eth0", m)
        try:
            lab.send(srv6(sid, udp4("10.11.0.1", "10.99.0.7", m)))
            assert len(cap.until(1)) == 1, "the DX4 SID does not forward after the repair"
        finally:
            cap.close()
    finally:
        subprocess.run(["ip", "-n", lab.ns["r1"], "-6", "route", "del", sid + "/128"], capture_output=True)
        subprocess.run(["ip", "-n", lab.ns["r1"], "addr", "replace", "10.0.3.1/24", "dev", "r1-eth1"], capture_output=True)
        node.teardown()
        for s in (nl.nl, nl.nl_strict):
            if s is not None:
                s.close()


def test_an_unreachable_dx_table_is_left_as_written(lab: Lab) -> None:
    """A DX next hop with no route gets ``unreachable default`` in its private table; the refresh
    reads that back as written (the kernel shows an IPv6 unreachable route on lo) and leaves it,
    rather than rewriting it every period."""
    from substrate.dataplane.ebpf.service import Node

    node = decap.DecapNode(lab.ns["r1"])
    node.install([decap.DecapSid("fc00:0:1:d7b::/128", "End.DX6", nh="2001:db8:7b::1")])
    (h,) = node.helpers.values()
    nl = Node(name="r1", netns=f"/run/netns/{lab.ns['r1']}", listener=None, maps=None)  # type: ignore[arg-type]
    try:
        node.refresh(nl.route_get, nl.table_routes)
        assert "unreachable default" in lab.ip("r1", "-6", "route", "show", "table", str(h.table))
        assert [node.refresh(nl.route_get, nl.table_routes) for _ in range(3)] == [0, 0, 0]
    finally:
        subprocess.run(["ip", "-n", lab.ns["r1"], "-6", "route", "del", "fc00:0:1:d7b::/128"], capture_output=True)
        node.teardown()
        for s in (nl.nl, nl.nl_strict):
            if s is not None:
                s.close()
