"""eBPF H.Encaps / H.Encaps.Red / End (+NEXT-C-SID) on real namespaces (substrate.dataplane.ebpf).

Lab: h1 - r1 - r2 - r3 - h3 (namespaces, veths, static routes, no FRR). r1 encapsulates towards
h3's prefixes, r2 runs End (NEXT-C-SID on its uSID locator fcbb:bbbb:200::/48, classic End on
fc00:2::e), r3 only receives (decapsulation is tested in test_ebpf_decap.py): frames are captured
with AF_PACKET sockets opened inside r2 and r3 and the outer headers compared byte for byte with
what the kernel's seg6 emits (net/ipv6/seg6_iptunnel.c, seg6_local.c).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import select
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.dataplane,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, BPF)"),
]

TUNSRC = "fcbb:bbbb:100::1"
USID = "fcbb:bbbb:200:300:fe00::"
USID_SHIFTED = "fcbb:bbbb:300:fe00::"
END_SID = "fc00:2::e"
H3_6 = "2001:db8:3::1"
H3_4 = "10.0.3.1"


def sh(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(args), capture_output=True, text=True, input=input, check=False)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed: {res.stderr.strip()}")
    return res


@dataclass
class Lab:
    prefix: str
    nodes: tuple[str, ...] = ("h1", "r1", "r2", "r3", "h3")

    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def ip(self, node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "-n", self.ns(node), *args, check=check)

    def batch(self, node: str, lines: list[str]) -> None:
        sh("ip", "-n", self.ns(node), "-batch", "-", input="\n".join(lines) + "\n")

    def path(self, node: str) -> str:
        return f"/run/netns/{self.ns(node)}"


def _sysctl(lab: Lab, node: str, **kv: str) -> None:
    for k, v in kv.items():
        sh("ip", "netns", "exec", lab.ns(node), "sysctl", "-qw", f"{k.replace('__', '.')}={v}")


@contextlib.contextmanager
def build_lab(core_mtu: int = 1500) -> Iterator[Lab]:
    """The h1 - r1 - r2 - r3 - h3 lab, every namespace removed on exit whatever happened."""
    lab = Lab(f"ebpft{uuid.uuid4().hex[:5]}")  # not anibench-*: harness lab cleanup (other tests) removes those
    try:
        for n in lab.nodes:
            sh("ip", "netns", "add", lab.ns(n))
            _sysctl(lab, n, net__ipv6__conf__all__accept_dad="0", net__ipv6__conf__default__accept_dad="0",
                    net__ipv6__conf__all__forwarding="1", net__ipv4__ip_forward="1",
                    net__ipv6__conf__default__accept_ra="0")
            lab.ip(n, "link", "set", "lo", "up")
        links = [("h1", "r1"), ("r1", "r2"), ("r2", "r3"), ("r3", "h3")]
        for a, b in links:
            sh("ip", "link", "add", f"t{a}{b}", "netns", lab.ns(a), "type", "veth", "peer", f"t{b}{a}",
               "netns", lab.ns(b))
            for x, y in ((a, b), (b, a)):
                lab.ip(x, "link", "set", f"t{x}{y}", "name", f"{x}-{y}")
                lab.ip(x, "link", "set", f"{x}-{y}", "up")
                if x[0] == "r" and y[0] == "r":
                    lab.ip(x, "link", "set", f"{x}-{y}", "mtu", str(core_mtu))
        lab.batch("h1", ["addr add 2001:db8:1::1/64 dev h1-r1", "addr add 10.0.1.1/24 dev h1-r1",
                         "route add default via 2001:db8:1::2", "route add default via 10.0.1.2"])
        lab.batch("r1", ["addr add 2001:db8:1::2/64 dev r1-h1", "addr add 10.0.1.2/24 dev r1-h1",
                         "addr add 2001:db8:12::1/64 dev r1-r2", f"addr add {TUNSRC}/128 dev lo",
                         "route add fcbb:bbbb:200::/48 via 2001:db8:12::2",
                         "route add fcbb:bbbb:300::/48 via 2001:db8:12::2",
                         "route add fc00:2::/32 via 2001:db8:12::2"])
        lab.batch("r2", ["addr add 2001:db8:12::2/64 dev r2-r1", "addr add 2001:db8:23::2/64 dev r2-r3",
                         "link add sr0 type bridge", "link set sr0 mtu 65535 up",
                         "route add fcbb:bbbb:300::/48 via 2001:db8:23::3",
                         "route add fcbb:bbbb:100::/48 via 2001:db8:12::1",
                         "route add fc00:3::/32 via 2001:db8:23::3",
                         "route add 2001:db8:1::/64 via 2001:db8:12::1",
                         "route add 10.0.1.0/24 via inet6 2001:db8:12::1",
                         "route add 2001:db8:3::/64 via 2001:db8:23::3",
                         "route add 10.0.3.0/24 via inet6 2001:db8:23::3"])
        lab.batch("r3", ["addr add 2001:db8:23::3/64 dev r3-r2", "addr add 2001:db8:3::3/64 dev r3-h3",
                         "addr add 10.0.3.3/24 dev r3-h3",
                         "route add blackhole fcbb:bbbb:300::/48", "route add blackhole fc00:3::/32",
                         "route add 2001:db8:1::/64 via 2001:db8:23::2", "route add 10.0.1.0/24 via inet6 2001:db8:23::2"])
        lab.batch("h3", ["addr add 2001:db8:3::1/64 dev h3-r3", "addr add 10.0.3.1/24 dev h3-r3",
                         "route add default via 2001:db8:3::3", "route add default via 10.0.3.3"])
        # r2's SIDs: uSID locator with NEXT-C-SID, classic End
        from substrate.dataplane.ebpf import loader

        loader.install_routes(lab.ns("r2"), [
            loader.RouteSpec("route add fcbb:bbbb:200::/48 {encap} dev sr0 metric 1",
                             loader.end_program(next_csid=True, lblen=32, nflen=16, basename="end-usid")),
            loader.RouteSpec(f"route add {END_SID}/128 {{encap}} dev sr0",
                             loader.end_program(basename="end-classic")),
        ])
        yield lab
    finally:
        for n in lab.nodes:
            sh("ip", "netns", "del", lab.ns(n), check=False)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with build_lab() as lab:
        yield lab


# -- packets -------------------------------------------------------------------------------------


def _in_ns(lab: Lab, node: str, fn: Callable[[], socket.socket]) -> socket.socket:
    from substrate.nsread import entered

    with entered(lab.path(node)):
        return fn()


class Capture:
    """An AF_PACKET socket inside a node, on one interface, opened before traffic is sent."""

    def __init__(self, lab: Lab, node: str, ifname: str):
        def mk() -> socket.socket:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            s.bind((ifname, 0))
            s.setblocking(False)
            return s

        self.sock = _in_ns(lab, node, mk)

    def wait(self, pred: Callable[[bytes], bool], timeout: float = 5.0) -> bytes | None:
        """The first L3 packet (after the Ethernet header) matching ``pred``, polling."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            r, _, _ = select.select([self.sock], [], [], max(0.0, end - time.monotonic()))
            if not r:
                continue
            while True:
                try:
                    frame, addr = self.sock.recvfrom(65535)
                except BlockingIOError:
                    break
                if addr[2] == socket.PACKET_OUTGOING:
                    continue
                if frame[12:14] == b"\x86\xdd" and pred(frame[14:]):
                    return frame[14:]
        return None

    def close(self) -> None:
        self.sock.close()


def send_udp(lab: Lab, node: str, dst: str, payload: bytes, *, hops: int = 50, tclass: int | None = 0x28,
             gso_segment: int | None = None) -> None:
    """One UDP datagram from ``node`` (hop limit/TTL ``hops``, traffic class ``tclass`` unless
    None; ``gso_segment``: sent as one GSO skb of segments of that size, UDP_SEGMENT)."""
    fam = socket.AF_INET6 if ":" in dst else socket.AF_INET

    def mk() -> socket.socket:
        s = socket.socket(fam, socket.SOCK_DGRAM)
        if gso_segment:
            s.setsockopt(socket.IPPROTO_UDP, UDP_SEGMENT, gso_segment)
        if fam == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, hops)
            if tclass is not None:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tclass)
        else:
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, hops)
            if tclass is not None:
                s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tclass)
        return s

    s = _in_ns(lab, node, mk)
    try:
        s.sendto(payload, (dst, 9999))
    finally:
        s.close()


def a6(b: bytes) -> str:
    return str(ipaddress.IPv6Address(b))


def outer_is(da: str, payload: bytes) -> Callable[[bytes], bool]:
    want = ipaddress.IPv6Address(da).packed
    return lambda p: p[24:40] == want and payload in p


def expected_outer(inner: bytes, *, family: int, segs: list[str], mode: str, hlim: int, da: str, src: str,
                   sl: int | None = None) -> bytes:
    """The outer IPv6 header + SRH the kernel's seg6 would put on the wire (after ``hlim``
    and ``da``/``sl`` changed along the path)."""
    from substrate.dataplane.ebpf.loader import srh_bytes

    srh = bytearray(srh_bytes(segs, reduced=(mode == "encap.red")))
    proto = 41 if family == 6 else 4
    if srh:
        srh[0] = proto
        if sl is not None:
            srh[3] = sl
    if family == 6:
        word = (0x60000000 | (struct.unpack("!I", inner[:4])[0] & 0x0FFFFFFF))
    else:
        word = 0x60000000
    hdr = struct.pack("!IHBB16s16s", word, len(srh) + len(inner), 43 if srh else proto, hlim,
                      ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(da).packed)
    return hdr + bytes(srh)


# -- tests ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_maps() -> Iterator:
    from substrate.dataplane.ebpf import loader

    with loader.NodeMaps() as m:
        m.set_tunsrc(TUNSRC)
        yield m


def _encap_route(lab: Lab, node_maps, prefix: str, segs: list[str], mode: str, *, basename: str = "enc") -> dict:
    from substrate.dataplane.ebpf import loader

    fam = 4 if "." in prefix else 6
    lab.ip("r1", "-6" if fam == 6 else "-4", "route", "del", prefix, check=False)
    spec = loader.encap_program(segs, mode=mode, family=fam, src="2001:db8:12::1", tunsrc_fd=node_maps.tunsrc_fd,
                                basename=basename)
    [r] = loader.install_routes(lab.ns("r1"), [loader.RouteSpec(f"route add {prefix} {{encap}} dev r1-r2", spec)])
    return dict(r.prog_ids)


CASES = [
    # (family, mode, segments, da at r2 ingress, da at r3 ingress, SL at r3 or None)
    (6, "encap.red", [USID], USID, USID_SHIFTED, None),
    (4, "encap.red", [USID], USID, USID_SHIFTED, None),
    (6, "encap", [USID], USID, USID_SHIFTED, 0),
    (4, "encap", [USID], USID, USID_SHIFTED, 0),
    (6, "encap", [USID, "fc00:3::1", "fc00:3::2"], USID, USID_SHIFTED, 2),
    (6, "encap.red", [USID, "fc00:3::1", "fc00:3::2"], USID, USID_SHIFTED, 2),
    (4, "encap.red", [USID, "fc00:3::1", "fc00:3::2"], USID, USID_SHIFTED, 2),
    # classic End with an SRH: SL 2 -> 1, DA = S2
    (6, "encap", [END_SID, USID_SHIFTED, "fc00:3::2"], END_SID, USID_SHIFTED, 1),
    (6, "encap.red", [END_SID, USID_SHIFTED, "fc00:3::2"], END_SID, USID_SHIFTED, 1),
    (4, "encap", [END_SID, USID_SHIFTED, "fc00:3::2"], END_SID, USID_SHIFTED, 1),
    # NEXT-C-SID with an empty argument falls back to the SRH
    (6, "encap", ["fcbb:bbbb:200::", USID_SHIFTED], "fcbb:bbbb:200::", USID_SHIFTED, 0),
]


@pytest.mark.parametrize("family,mode,segs,da2,da3,sl3", CASES,
                         ids=[f"v{c[0]}-{c[1]}-{len(c[2])}seg-{'end' if c[3] == END_SID else 'usid'}" for c in CASES])
def test_forwarded_outer_header_is_the_kernels(lab, node_maps, family, mode, segs, da2, da3, sl3):
    prefix = "2001:db8:3::/64" if family == 6 else "10.0.3.0/24"
    _encap_route(lab, node_maps, prefix, segs, mode)
    cap2, cap3 = Capture(lab, "r2", "r2-r1"), Capture(lab, "r3", "r3-r2")
    try:
        payload = b"anibench-" + uuid.uuid4().hex.encode()
        send_udp(lab, "h1", H3_6 if family == 6 else H3_4, payload, hops=50, tclass=0x28)
        at2 = cap2.wait(outer_is(da2, payload))
        at3 = cap3.wait(outer_is(da3, payload))
    finally:
        cap2.close()
        cap3.close()
    assert at2 is not None, "no encapsulated packet reached r2"
    assert at3 is not None, "r2 did not forward the packet to r3 with the shifted DA"
    n_srh = 0 if (mode == "encap.red" and len(segs) == 1) else 8 + 16 * (len(segs) - (mode == "encap.red"))
    inner2 = at2[40 + n_srh:]
    # inner untouched: hop limit / TTL as sent (50), nothing else changed
    if family == 6:
        assert inner2[7] == 50 and inner2[0] >> 4 == 6
    else:
        assert inner2[8] == 50 and inner2[0] >> 4 == 4
    # outer: IPv6 inner -> hlim = inner's, minus r1's ip6_forward; IPv4 -> 64 (ip6_dst_hoplimit) - 1
    h_r1 = (50 if family == 6 else 64) - 1
    exp2 = expected_outer(inner2, family=family, segs=segs, mode=mode, hlim=h_r1, da=da2, src=TUNSRC)
    assert at2[:40 + n_srh].hex() == exp2.hex()
    exp3 = expected_outer(inner2, family=family, segs=segs, mode=mode, hlim=h_r1 - 1, da=da3, src=TUNSRC, sl=sl3)
    assert at3[:40 + n_srh].hex() == exp3.hex()
    assert at3[40 + n_srh:] == inner2


def test_locally_originated_ipv4_uses_xmit_hook(lab, node_maps):
    """r1's own IPv4 packet: outer hop limit = ip6_dst_hoplimit (64), not decremented."""
    _encap_route(lab, node_maps, "10.0.3.0/24", [USID, "fc00:3::1"], "encap")
    cap2 = Capture(lab, "r2", "r2-r1")
    try:
        payload = b"local4-" + uuid.uuid4().hex.encode()
        send_udp(lab, "r1", H3_4, payload, hops=33, tclass=0)
        at2 = cap2.wait(outer_is(USID, payload))
    finally:
        cap2.close()
    assert at2 is not None
    inner = at2[80:]
    assert inner[8] == 33 and _ipv4_csum_ok(inner[:20])
    assert at2[:80] == expected_outer(inner, family=4, segs=[USID, "fc00:3::1"], mode="encap", hlim=64, da=USID,
                                      src=TUNSRC)


def test_locally_originated_uses_xmit_hook(lab, node_maps):
    """r1's own packets: encapsulated by the xmit program, outer hop limit = inner (no forward)."""
    _encap_route(lab, node_maps, "2001:db8:3::/64", [USID], "encap.red")
    cap2 = Capture(lab, "r2", "r2-r1")
    try:
        payload = b"local-" + uuid.uuid4().hex.encode()
        send_udp(lab, "r1", H3_6, payload, hops=33, tclass=0)
        at2 = cap2.wait(outer_is(USID, payload))
    finally:
        cap2.close()
    assert at2 is not None
    # the route's MTU is the device's minus the kernel's seg6 headroom (40 + 8 + 16 * segments)
    def mk() -> socket.socket:
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.connect((H3_6, 9))
        return s

    s = _in_ns(lab, "r1", mk)
    try:
        assert s.getsockopt(socket.IPPROTO_IPV6, 24)  # IPV6_MTU == 1500 - 56
    finally:
        s.close()
    inner = at2[40:]
    assert inner[7] == 33 and at2[7] == 33 and at2[6] == 41
    assert at2[:40] == expected_outer(inner, family=6, segs=[USID], mode="encap.red", hlim=33, da=USID, src=TUNSRC)


def test_tunsrc_changes_without_reload(lab, node_maps):
    """`ip sr tunsrc` semantics: the per-node map is read per packet; unset -> the route's
    source; neither -> the node's default source."""
    from substrate.dataplane.ebpf import loader

    _encap_route(lab, node_maps, "2001:db8:3::/64", [USID], "encap.red")
    try:
        for want, set_to in (("fcbb:bbbb:100::99", "fcbb:bbbb:100::99"), ("2001:db8:12::1", None),
                             ("fcbb:bbbb:100::d", "no-route-src")):
            if set_to == "no-route-src":
                node_maps.set_default_source("fcbb:bbbb:100::d")
                lab.ip("r1", "-6", "route", "del", "2001:db8:3::/64")
                loader.install_routes(lab.ns("r1"), [loader.RouteSpec(
                    "route add 2001:db8:3::/64 {encap} dev r1-r2",
                    loader.encap_program([USID], mode="encap.red", tunsrc_fd=node_maps.tunsrc_fd))])
                set_to = None
            node_maps.set_tunsrc(set_to)
            cap2 = Capture(lab, "r2", "r2-r1")
            try:
                payload = b"tunsrc-" + uuid.uuid4().hex.encode()
                send_udp(lab, "h1", H3_6, payload)
                at2 = cap2.wait(outer_is(USID, payload))
            finally:
                cap2.close()
            assert at2 is not None and a6(at2[8:24]) == want
    finally:
        node_maps.set_tunsrc(TUNSRC)
        node_maps.set_default_source(None)


def test_end_counters_and_drop(lab, node_maps):
    """End drops what the kernel's End drops (no SRH, nothing left in the DA) and counts."""
    from substrate.dataplane.ebpf import loader

    # a fresh End route on r2 for fcbb:bbbb:2ff::/48 so the counters start at zero
    [r] = loader.install_routes(lab.ns("r2"), [loader.RouteSpec(
        "route add fcbb:bbbb:2ff::/48 {encap} dev sr0", loader.end_program(next_csid=True, basename="end-count"))])
    pid = r.prog_ids["xmit"]
    assert loader.read_counters(pid) == loader.Counters(0, 0, 0)
    lab.ip("r1", "-6", "route", "replace", "fcbb:bbbb:2ff::/48", "via", "2001:db8:12::2")
    try:
        # 1) uSID with a next C-SID: processed
        _encap_route(lab, node_maps, "2001:db8:3::/64", ["fcbb:bbbb:2ff:300::"], "encap.red")
        cap3 = Capture(lab, "r3", "r3-r2")
        try:
            payload = b"count-" + uuid.uuid4().hex.encode()
            send_udp(lab, "h1", H3_6, payload)
            at3 = cap3.wait(outer_is("fcbb:bbbb:300::", payload))
        finally:
            cap3.close()
        assert at3 is not None
        c = loader.read_counters(pid)
        assert c.packets == 1 and c.errors == 0 and c.bytes == len(at3)
        # 2) last uSID, no SRH: the kernel's End drops it (get_and_validate_srh fails)
        _encap_route(lab, node_maps, "2001:db8:3::/64", ["fcbb:bbbb:2ff::"], "encap.red")
        send_udp(lab, "h1", H3_6, b"drop-me")
        deadline = time.monotonic() + 5
        while loader.read_counters(pid).errors < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert loader.read_counters(pid) == loader.Counters(1, c.bytes, 1)
        # 3) an SRH with Segments Left 0 and nothing left in the DA: dropped too
        _encap_route(lab, node_maps, "2001:db8:3::/64", ["fcbb:bbbb:2ff::"], "encap")
        send_udp(lab, "h1", H3_6, b"drop-me-too")
        deadline = time.monotonic() + 5
        while loader.read_counters(pid).errors < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert loader.read_counters(pid) == loader.Counters(1, c.bytes, 2)
    finally:
        lab.ip("r2", "-6", "route", "del", "fcbb:bbbb:2ff::/48", check=False)
        lab.ip("r1", "-6", "route", "del", "fcbb:bbbb:2ff::/48", check=False)
    deadline = time.monotonic() + 10  # the route is gone, so is its program (after RCU)
    while time.monotonic() < deadline:
        try:
            loader.read_counters(pid)
        except loader.BpfError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"program {pid} outlived its route")


def test_route_name_round_trip(lab):
    """iproute2 names the program `<pin basename>:[*fsobj]`; the kernel dumps it back, up to
    MAX_BASENAME bytes."""
    from substrate.dataplane.ebpf import loader

    name = "sr6-v1-" + "x" * (loader.MAX_BASENAME - 7)
    [r] = loader.install_routes(lab.ns("r1"), [loader.RouteSpec(
        "route add fc00:99::/64 {encap} dev r1-r2", loader.encap_program([USID], basename=name))])
    try:
        out = lab.ip("r1", "-6", "route", "show", "fc00:99::/64").stdout
        assert f"encap bpf in {name}:[*fsobj] xmit {name}:[*fsobj] dev r1-r2" in out, out
    finally:
        lab.ip("r1", "-6", "route", "del", "fc00:99::/64")
    for bad in (name + "y", "a.b", "a b"):
        with pytest.raises(ValueError):
            loader.install_routes(lab.ns("r1"), [loader.RouteSpec(
                "route add fc00:99::/64 {encap} dev r1-r2", loader.encap_program([USID], basename=bad))])


def test_iproute2_errors_are_iproute2s(lab):
    from substrate.dataplane.ebpf import loader

    with pytest.raises(loader.RouteInstallError) as ei:
        loader.install_routes(lab.ns("r1"), [
            loader.RouteSpec("route add fc00:98::/64 {encap} dev r1-r2", loader.encap_program([USID])),
            loader.RouteSpec("route add fc00:97::/64 {encap} dev nosuchdev", loader.encap_program([USID])),
        ])
    assert ei.value.line == 2 and "Command failed" in ei.value.stderr
    assert len(ei.value.installed) == 1 and len(ei.value.dropped_prog_ids) == 2
    mine = _ids_of([i for r in ei.value.installed for i in r.prog_ids.values()] + ei.value.dropped_prog_ids)
    lab.ip("r1", "-6", "route", "del", "fc00:98::/64")
    assert _wait_gone(mine), "programs or maps outlived their routes"
    assert not _own_pins()


def _own_pins() -> list[Path]:
    from substrate.dataplane.ebpf import loader

    return [p for p in loader.pins_dir().iterdir() if p.name.startswith(f"{os.getpid()}-")]


def _ids_of(prog_ids: list[int]) -> tuple[set[int], set[int]]:
    """The programs and their private maps (all but the node's shared tunsrc map)."""
    import json

    maps: set[int] = set()
    for pid in prog_ids:
        res = sh("bpftool", "-j", "prog", "show", "id", str(pid), check=False)
        if res.returncode == 0:
            maps |= set(json.loads(res.stdout).get("map_ids", []))
    shared = set()
    for mid in maps:
        info = json.loads(sh("bpftool", "-j", "map", "show", "id", str(mid)).stdout)
        if info.get("name") == "tunsrc":
            shared.add(mid)
    return set(prog_ids), maps - shared


def _live_ids() -> tuple[set[int], set[int]]:
    import json

    progs = json.loads(sh("bpftool", "-j", "prog", "show").stdout)
    maps = json.loads(sh("bpftool", "-j", "map", "show").stdout)
    return {p["id"] for p in progs}, {m["id"] for m in maps}


def _wait_gone(ids: tuple[set[int], set[int]], timeout: float = 30.0) -> bool:
    """Programs and maps are freed after an RCU grace period: poll until none of ``ids`` lives.
    (Ids are never reused while the counter has not wrapped, so other users of BPF on the
    machine cannot disturb this check.)"""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        p, m = _live_ids()
        if not (p & ids[0]) and not (m & ids[1]):
            return True
        time.sleep(0.05)
    return False


def test_no_pins_or_programs_left(lab, node_maps):
    from substrate.dataplane.ebpf import loader

    routes = [loader.RouteSpec(f"route add fc00:{i:x}::/64 {{encap}} dev r1-r2",
                               loader.encap_program([USID, f"fc00:3::{i:x}"], mode="encap",
                                                    tunsrc_fd=node_maps.tunsrc_fd)) for i in range(1, 21)]
    done = loader.install_routes(lab.ns("r1"), routes)
    assert len(done) == 20
    mine = _ids_of([i for r in done for i in r.prog_ids.values()])
    assert len(mine[0]) == 40 and len(mine[1]) == 40  # in + xmit; .rodata + counters per route
    live = _live_ids()
    assert mine[0] <= live[0] and mine[1] <= live[1]
    assert not _own_pins()
    for i in range(1, 21):
        lab.ip("r1", "-6", "route", "del", f"fc00:{i:x}::/64")
    assert _wait_gone(mine), "programs or maps outlived their routes"


def test_install_1000_routes_timing(lab, node_maps):
    """Measure (print, not assert) load+pin+install per route for 1,000 routes in one batch."""
    from substrate.dataplane.ebpf import loader

    routes = [loader.RouteSpec(f"route add fc01:{i:x}::/64 {{encap}} dev r1-r2",
                               loader.encap_program([USID], mode="encap.red", tunsrc_fd=node_maps.tunsrc_fd,
                                                    basename=f"r{i}")) for i in range(1000)]
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    done = loader.install_routes(lab.ns("r1"), routes, timings=t)
    total = time.perf_counter() - t0
    progs = {i for r in done for i in r.prog_ids.values()}
    print(f"\n1000 encap routes: total {total:.2f} s = {total:.2f} ms/route "
          f"(load+pin {t['load']:.2f} s, ip -batch {t['ip']:.2f} s)")
    t0 = time.perf_counter()
    lab.batch("r1", [f"route del fc01:{i:x}::/64" for i in range(1000)])
    print(f"delete 1000 routes: {time.perf_counter() - t0:.2f} s")
    assert _wait_gone((progs, set()), timeout=60)


# -- GSO -----------------------------------------------------------------------------------------

UDP_SEGMENT = 103  # SOL_UDP option: the socket hands GSO skbs (gso_type SKB_GSO_UDP_L4) down


def send_udp_gso(lab: Lab, node: str, dst: str, payload: bytes, *, seg: int = 1000, hops: int = 50) -> None:
    """One sendto() of ``payload`` that leaves the host as ONE GSO skb of len(payload)/seg
    segments (veth keeps it whole across namespaces)."""
    send_udp(lab, node, dst, payload, hops=hops, tclass=None, gso_segment=seg)


def _ipv4_csum_ok(h: bytes) -> bool:
    total = sum(struct.unpack(f"!{len(h) // 2}H", h))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


@pytest.fixture()
def gso_helper(lab, node_maps) -> Iterator[int]:
    from substrate.dataplane.ebpf import loader

    ifindex = loader.gso_helper_up(lab.ns("r1"), node_maps)
    try:
        yield ifindex
    finally:
        loader.gso_helper_down(lab.ns("r1"), node_maps)


GSO_CASES = [
    (6, "encap", [USID]), (6, "encap.red", [USID]), (4, "encap.red", [USID]),
    (6, "encap", [USID, "fc00:3::1", "fc00:3::2"]), (4, "encap", [USID, "fc00:3::1", "fc00:3::2"]),
]


@pytest.mark.parametrize("family,mode,segs", GSO_CASES, ids=[f"v{c[0]}-{c[1]}-{len(c[2])}seg" for c in GSO_CASES])
def test_gso_forwarded_through_helper(lab, node_maps, gso_helper, family, mode, segs):
    """A GSO skb (UDP_SEGMENT, 12 segments) forwarded through the encap route reaches r2 and
    r3 whole, with the outer header the kernel's seg6 would give the GSO skb (payload length
    of the whole, inner hop limit/TTL as received, IPv4 header checksum still valid)."""
    from substrate.dataplane.ebpf import loader

    prefix = "2001:db8:3::/64" if family == 6 else "10.0.3.0/24"
    ids = _encap_route(lab, node_maps, prefix, segs, mode)
    before = loader.read_counters(ids["in"])
    cap2, cap3 = Capture(lab, "r2", "r2-r1"), Capture(lab, "r3", "r3-r2")
    try:
        payload = (b"gso-" + uuid.uuid4().hex.encode()) * 300  # 10800 bytes
        send_udp_gso(lab, "h1", H3_6 if family == 6 else H3_4, payload, seg=900)
        at2 = cap2.wait(outer_is(USID, payload[:200]))
        at3 = cap3.wait(outer_is(USID_SHIFTED, payload[:200]))
    finally:
        cap2.close()
        cap3.close()
    assert at2 is not None and at3 is not None, f"GSO skb lost, counters {loader.read_counters(ids['in'])}"
    n_srh = 0 if (mode == "encap.red" and len(segs) == 1) else 8 + 16 * (len(segs) - (mode == "encap.red"))
    inner = at2[40 + n_srh:]
    assert payload in inner  # one frame carries the whole GSO skb
    if family == 6:
        assert inner[7] == 50
    else:
        assert inner[8] == 50 and _ipv4_csum_ok(inner[:20])
    h_r1 = (50 if family == 6 else 64) - 1
    assert at2[:40 + n_srh].hex() == expected_outer(inner, family=family, segs=segs, mode=mode, hlim=h_r1,
                                                    da=USID, src=TUNSRC).hex()
    sl3 = None if n_srh == 0 else len(segs) - 1
    assert at3[:40 + n_srh].hex() == expected_outer(inner, family=family, segs=segs, mode=mode, hlim=h_r1 - 1,
                                                    da=USID_SHIFTED, src=TUNSRC, sl=sl3).hex()
    after = loader.read_counters(ids["in"])
    assert after.packets == before.packets + 1 and after.errors == before.errors


def test_gso_local_through_helper(lab, node_maps, gso_helper):
    """r1's own GSO skb: outer hop limit = inner (seg6_output does not decrement)."""
    _encap_route(lab, node_maps, "2001:db8:3::/64", [USID, "fc00:3::1"], "encap")
    cap2 = Capture(lab, "r2", "r2-r1")
    try:
        payload = (b"lgso-" + uuid.uuid4().hex.encode()) * 200
        send_udp_gso(lab, "r1", H3_6, payload, seg=900, hops=40)
        at2 = cap2.wait(outer_is(USID, payload[:200]))
    finally:
        cap2.close()
    assert at2 is not None
    inner = at2[40 + 40:]
    assert inner[7] == 40
    assert at2[:80] == expected_outer(inner, family=6, segs=[USID, "fc00:3::1"], mode="encap", hlim=40, da=USID,
                                      src=TUNSRC)


def test_gso_without_helper_is_the_lwt_limit(lab, node_maps):
    """Kernel fact (net/core/lwt_bpf.c handle_gso_encap): bpf_lwt_push_encap refuses a GSO
    skb whose outer next header is not GRE/UDP/IPv6-in-IPv6 (here: an SRH) -- dropped, counted."""
    from substrate.dataplane.ebpf import loader

    ids = _encap_route(lab, node_maps, "2001:db8:3::/64", [USID, "fc00:3::1"], "encap")
    before = loader.read_counters(ids["in"])
    send_udp_gso(lab, "h1", H3_6, b"x" * 9000, seg=900)
    deadline = time.monotonic() + 5
    while loader.read_counters(ids["in"]).errors == before.errors and time.monotonic() < deadline:
        time.sleep(0.02)
    assert loader.read_counters(ids["in"]).errors == before.errors + 1


def _set_feature(lab: Lab, node: str, ifname: str, feature: str, on: bool) -> None:
    """``ethtool -K IFNAME FEATURE on|off`` through the SIOCETHTOOL ioctl (no ethtool binary here)."""
    import array
    import fcntl

    s = _in_ns(lab, node, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    try:
        def ioctl(buf: bytearray) -> bytearray:
            data = array.array("B", buf)
            addr, _ = data.buffer_info()
            ifr = struct.pack("16sQ", ifname.encode(), addr) + bytes(16)
            fcntl.ioctl(s.fileno(), 0x8946, ifr)
            return bytearray(data.tobytes())

        info = ioctl(bytearray(struct.pack("IIQI", 0x37, 0, 1 << 4, 0)))  # GSSET_INFO, ETH_SS_FEATURES
        count = struct.unpack_from("I", info, 16)[0]
        strings = ioctl(bytearray(struct.pack("III", 0x1B, 4, count) + bytes(32 * count)))
        names = [strings[12 + 32 * i: 12 + 32 * (i + 1)].split(b"\0", 1)[0].decode() for i in range(count)]
        bit = names.index(feature)
        blocks = (count + 31) // 32
        req = bytearray(struct.pack("II", 0x3B, blocks) + bytes(8 * blocks))  # SFEATURES
        struct.pack_into("II", req, 8 + 8 * (bit // 32), 1 << (bit % 32), (1 << (bit % 32)) if on else 0)
        ioctl(req)
    finally:
        s.close()


def _fold(data: bytes) -> int:
    data += b"\0" if len(data) % 2 else b""
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def _udp6_csum_ok(ip6: bytes) -> bool:
    """The UDP checksum of an IPv6/UDP segment is right: complete, or still CHECKSUM_PARTIAL
    (veth hands the skb over without computing it: the field then holds the folded
    pseudo-header sum for this segment's length, as the kernel's UDP GSO leaves it)."""
    plen = struct.unpack("!H", ip6[4:6])[0]
    udp = ip6[40:40 + plen]
    pseudo = ip6[8:40] + struct.pack("!I3xB", plen, 17)
    if _fold(pseudo + udp) == 0xFFFF:
        return True
    return struct.unpack("!H", udp[6:8])[0] == _fold(pseudo)


def test_gso_kernel_segments_the_srv6_packet(lab, node_maps, gso_helper):
    """With IPv6-in-IPv6 GSO off on r1's egress, the kernel segments the helper-encapsulated
    GSO skb itself (ipv6_gso_segment skips the SRH, then ip6ip6 + UDP GSO): every segment on
    the wire has the outer header the kernel's seg6 would give it and a valid inner checksum."""
    segs = [USID, "fc00:3::1", "fc00:3::2"]
    _encap_route(lab, node_maps, "2001:db8:3::/64", segs, "encap.red")
    _set_feature(lab, "r1", "r1-r2", "tx-ipxip6-segmentation", False)
    cap2 = Capture(lab, "r2", "r2-r1")
    try:
        tag = uuid.uuid4().hex.encode()
        payload = b"".join(tag + b"%04d" % i + b"." * (900 - len(tag) - 4) for i in range(12))
        send_udp_gso(lab, "h1", H3_6, payload, seg=900)
        frames = []
        for _ in range(12):
            f = cap2.wait(lambda p: tag in p)
            assert f is not None, f"only {len(frames)} of 12 segments reached r2"
            frames.append(f)
    finally:
        cap2.close()
        _set_feature(lab, "r1", "r1-r2", "tx-ipxip6-segmentation", True)
    n_srh = 8 + 16 * 2
    for f in frames:
        inner = f[40 + n_srh:]
        assert len(inner) == 40 + 8 + 900 and struct.unpack("!H", inner[4:6])[0] == 908
        assert _udp6_csum_ok(inner)
        assert f[:40 + n_srh] == expected_outer(inner, family=6, segs=segs, mode="encap.red", hlim=49, da=USID,
                                                src=TUNSRC)


# -- throughput (printed, not asserted) -----------------------------------------------------------


def _tcp_bulk(lab: Lab, dst: str, dur: float = 2.0) -> float:
    """Gbit/s of one TCP stream h1 -> h3 (Python sockets in the namespaces) for ``dur`` s."""
    import threading

    fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
    got = [0]

    def mk_srv() -> socket.socket:
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::" if fam == socket.AF_INET6 else "0.0.0.0", 5001))
        s.listen(1)
        s.settimeout(5)
        return s

    srv = _in_ns(lab, "h3", mk_srv)

    def rx() -> None:
        try:
            c, _ = srv.accept()
        except OSError:
            return
        c.settimeout(3)
        try:
            while b := c.recv(1 << 20):
                got[0] += len(b)
        except OSError:
            pass
        c.close()

    t = threading.Thread(target=rx)
    t.start()
    cli = _in_ns(lab, "h1", lambda: socket.socket(fam, socket.SOCK_STREAM))
    cli.settimeout(3)
    buf = b"x" * (1 << 20)
    t0 = time.monotonic()
    try:
        cli.connect((dst, 5001))
        while time.monotonic() - t0 < dur:
            cli.send(buf)
    except OSError:
        pass
    elapsed = time.monotonic() - t0
    cli.close()
    t.join(10)
    srv.close()
    return got[0] * 8 / elapsed / 1e9


@pytest.mark.slow
def test_tcp_throughput_encap_vs_plain():
    """TCP bulk h1 -> h3 over r1 (encap) - r2 (End next-csid) - r3 (End.DT46 from the decap
    module) vs plain IPv6 forwarding on the same veths; core MTU 9000 (the encapsulated
    packet must fit, as with the kernel's seg6)."""
    from substrate.dataplane.ebpf import loader

    decap = pytest.importorskip("substrate.dataplane.ebpf.decap")
    with build_lab(core_mtu=9000) as lab, loader.NodeMaps() as nm:
        nm.set_tunsrc(TUNSRC)
        lab.batch("r3", ["link add sr0 type bridge", "link set sr0 mtu 65535 up"])
        dn = decap.DecapNode(lab.ns("r3"))
        try:
            try:
                dn.install([decap.DecapSid(f"{USID_SHIFTED}/128", "End.DT46", table=254)])
            except Exception as e:  # the decap module is another engineer's work in progress
                pytest.skip(f"decap module not usable: {e}")
            results = {}
            lab.ip("r1", "route", "replace", "2001:db8:3::/64", "via", "2001:db8:12::2")
            results["plain IPv6"] = _tcp_bulk(lab, H3_6)
            lab.ip("r1", "route", "replace", "10.0.3.0/24", "via", "inet6", "2001:db8:12::2")
            results["plain IPv4"] = _tcp_bulk(lab, H3_4)
            for helper in (False, True):
                if helper:
                    loader.gso_helper_up(lab.ns("r1"), nm)
                for fam, mode, segs in ((6, "encap.red", [USID]), (6, "encap", [USID]),
                                        (6, "encap.red", [END_SID, "fcbb:bbbb:200::", USID_SHIFTED]),
                                        (4, "encap.red", [USID])):
                    _encap_route(lab, nm, "2001:db8:3::/64" if fam == 6 else "10.0.3.0/24", segs, mode)
                    g = _tcp_bulk(lab, H3_6 if fam == 6 else H3_4)
                    results[f"v{fam} {mode} {len(segs)} seg, GSO helper {'on' if helper else 'off'}"] = g
                    lab.ip("r1", "route", "del", "2001:db8:3::/64" if fam == 6 else "10.0.3.0/24", check=False)
            print()
            for k, v in results.items():
                print(f"  TCP {k}: {v:.2f} Gbit/s")
        finally:
            dn.teardown()


# -- pure (no namespaces) -------------------------------------------------------------------------


def test_srh_and_rodata_layouts():
    """The SRH iproute2 builds (segments reversed, SL = LE = n-1) and the reduced one
    (seg6_do_srh_encap_red: S1 dropped, LE n-2, SL n-1, none for one segment); rodata sizes
    match the compiled objects."""
    from substrate.dataplane.ebpf import loader

    a, b, c = "fc00::a", "fc00::b", "fc00::c"
    full = loader.srh_bytes([a, b, c])
    assert full[:8] == bytes([0, 6, 4, 2, 2, 0, 0, 0])
    assert [a6(full[8 + 16 * i: 24 + 16 * i]) for i in range(3)] == [c, b, a]
    red = loader.srh_bytes([a, b, c], reduced=True)
    assert red[:8] == bytes([0, 4, 4, 2, 1, 0, 0, 0])
    assert [a6(red[8 + 16 * i: 24 + 16 * i]) for i in range(2)] == [c, b]
    assert loader.srh_bytes([a], reduced=True) == b""
    assert loader.encap_headroom([a, b, c]) == 40 + 8 + 48
    assert len(loader.encap_rodata([a])) == loader.rodata_size("encap")
    assert len(loader.end_rodata(next_csid=True)) == loader.rodata_size("end")
    with pytest.raises(ValueError):
        loader.end_rodata(next_csid=True, lblen=30)
    with pytest.raises(ValueError):
        loader.encap_rodata([a] * (loader.MAX_SEGMENTS + 1))
    with pytest.raises(ValueError):
        loader.encap_rodata([a], mode="inline")
