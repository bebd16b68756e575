"""Packet probes of the conformance suite: hand-made packets through an h1 - r1 - r2 - r3 - h3
uSID path, captured on every link, on one data plane (issue 34).

The path is five network namespaces joined by veths ``<a>-<b>`` / ``<b>-<a>`` whose MAC addresses
are fixed (``02:00:00:00:<a>:<b>``, :func:`mac`), set up by the ``ip`` commands of
``corpus/probes.txt`` (one case per node; their outputs are compared like the command corpus).
Neighbours are static and router solicitations off, so that the only frames on the links are the
probes' own, and every node has ``net.ipv6.auto_flowlabels=0``, so that the packets h3's kernel
answers with carry flow label 0 and the encapsulations copy it.

Each probe (:data:`PROBES`) is one hand-made frame sent from h1 with an AF_PACKET socket (so its
every byte is chosen: flow label, traffic class, hop limit, IPv4 identification), while receive
rings (``PACKET_RX_RING``, :class:`Ring`) opened before it in each node record every frame
*received* on each of the eight veth ends, as it arrived (frames sent are seen once, at the
receiving end). A probe is done when its last expected frame
(its ``until``) has arrived, or after :data:`PROBE_WAIT_S`; a probe the data plane drops thus waits
the bound. Then ``ip -s`` shows the SIDs' counters on each router.

Recorded per probe: the frames per interface, in arrival order, as hex. What must differ between
two runs is normalised by :mod:`conformance.compare`, not here.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from conformance import runner

NODES = ("h1", "r1", "r2", "r3", "h3")
LINKS = (("h1", "r1"), ("r1", "r2"), ("r2", "r3"), ("r3", "h3"))
NODE_BYTE = {"r1": 0x01, "r2": 0x02, "r3": 0x03, "h1": 0x11, "h3": 0x13}
PROBE_SETUP = runner.HERE / "corpus" / "probes.txt"
#: Bound on how long one probe waits for its last frame (seconds; a dropped probe waits it whole);
#: ``$ANIBENCH_PROBE_WAIT_S`` (the TCG guest, slow on a loaded host, takes longer).
PROBE_WAIT_S = float(os.environ.get("ANIBENCH_PROBE_WAIT_S", "4"))
ROUTER_SYSCTLS = {
    "net.ipv6.conf.all.forwarding": "1", "net.ipv4.ip_forward": "1",
    "net.ipv6.conf.all.seg6_enabled": "1", "net.ipv6.conf.default.seg6_enabled": "1",
}  # fmt: skip
COMMON_SYSCTLS = {
    "net.ipv6.conf.all.accept_dad": "0", "net.ipv6.conf.default.accept_dad": "0",
    "net.ipv6.conf.all.accept_ra": "0", "net.ipv6.conf.default.accept_ra": "0",
    "net.ipv6.conf.all.router_solicitations": "0", "net.ipv6.conf.default.router_solicitations": "0",
    "net.ipv6.auto_flowlabels": "0",
}  # fmt: skip
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
H1_6, H1_4 = "2001:db8:1::1", "10.0.1.1"


def mac(a: str, b: str) -> bytes:
    """The MAC address of interface ``a-b`` (node ``a``'s end of its link to ``b``)."""
    return bytes([2, 0, 0, 0, NODE_BYTE[a], NODE_BYTE[b]])


def _mac_str(m: bytes) -> str:
    return ":".join(f"{x:02x}" for x in m)


# -- packets --------------------------------------------------------------------------------------


def checksum(data: bytes) -> int:
    """The Internet checksum of ``data`` (RFC 1071: ones' complement of the ones' complement sum
    of 16-bit words, an odd byte padded with zero), as IPv4, UDP and ICMPv6 headers carry it."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def _a6(x: str) -> bytes:
    return socket.inet_pton(socket.AF_INET6, x)


def ipv6(src: str, dst: str, nh: int, payload: bytes, *, hl: int = 64, tc: int = 0x28, fl: int = 0x12345) -> bytes:
    """An IPv6 header (version 6, ``tc``, flow label ``fl``, hop limit ``hl``) and ``payload``."""
    return struct.pack("!IHBB", 6 << 28 | tc << 20 | fl, len(payload), nh, hl) + _a6(src) + _a6(dst) + payload


def icmp6_echo(src: str, dst: str, ident: int, seq: int, *, size: int = 56, **kw: int) -> bytes:
    """An ICMPv6 echo request in IPv6 (checksum over the pseudo-header)."""
    data = bytes((i * 7) & 0xFF for i in range(size))
    body = struct.pack("!BBHHH", 128, 0, 0, ident, seq) + data
    pseudo = _a6(src) + _a6(dst) + struct.pack("!I3xB", len(body), 58)
    body = body[:2] + struct.pack("!H", checksum(pseudo + body)) + body[4:]
    return ipv6(src, dst, 58, body, **kw)


def ipv4(src: str, dst: str, proto: int, payload: bytes, *, ttl: int = 64, tos: int = 0x28, ident: int = 0x1234,
         df: bool = True) -> bytes:  # fmt: skip
    """An IPv4 header (checksummed) and ``payload``."""
    h = struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + len(payload), ident, 0x4000 if df else 0, ttl, proto, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))  # fmt: skip
    return h[:10] + struct.pack("!H", checksum(h)) + h[12:] + payload


def icmp4_echo(src: str, dst: str, echo_id: int, seq: int, *, size: int = 56, **kw: int) -> bytes:
    """An ICMP echo request in IPv4."""
    data = bytes((i * 5) & 0xFF for i in range(size))
    body = struct.pack("!BBHHH", 8, 0, 0, echo_id, seq) + data
    body = body[:2] + struct.pack("!H", checksum(body)) + body[4:]
    return ipv4(src, dst, 1, body, **kw)


def srh(segments: list[str], nh: int, *, sl: int | None = None, last: int | None = None) -> bytes:
    """An SRH (routing type 4) carrying ``segments`` in travel order (stored reversed), Segments
    Left ``sl`` (default: len - 1), Last Entry ``last`` (default: len - 1)."""
    n = len(segments)
    body = b"".join(_a6(s) for s in reversed(segments))
    return struct.pack("!BBBBBBH", nh, 2 * n, 4, n - 1 if sl is None else sl, n - 1 if last is None else last, 0, 0) + body


def srv6(src: str, segments: list[str], inner: bytes, *, sl: int | None = None, **kw: int) -> bytes:
    """An SRv6 packet as a source node sends it: the active segment in the destination, an SRH,
    ``inner`` (IPv6 or IPv4) as its payload."""
    nh = 41 if inner[0] >> 4 == 6 else 4
    k = len(segments) - 1 if sl is None else sl
    dst = segments[len(segments) - 1 - k] if 0 <= k < len(segments) else segments[0]
    return ipv6(src, dst, 43, srh(segments, nh, sl=sl) + inner, **kw)


@dataclass(frozen=True)
class Probe:
    """One hand-made packet sent from h1.

    Attributes:
        name: a short name (the report's key).
        what: what it checks, in a few words.
        packet: the L3 packet (IPv6 or IPv4).
        until: (interface, predicate on the L3 packet) of the last frame expected, received on
            that interface; None: wait the whole bound (a packet the kernel drops).
    """

    name: str
    what: str
    packet: bytes
    until: tuple[str, Callable[[bytes], bool]] | None


def _reply_to_h1(ident: int) -> tuple[str, Callable[[bytes], bool]]:
    """The echo reply (ICMPv6 129 / ICMP 0) with ``ident`` arriving at h1, or an ICMP error."""

    def pred(p: bytes) -> bool:
        if p[0] >> 4 == 6 and p[6] == 58 and len(p) >= 46:
            return (p[40] == 129 and struct.unpack_from("!H", p, 44)[0] == ident) or p[40] < 128
        if p[0] >> 4 == 4 and p[9] == 1:
            ihl = (p[0] & 15) * 4
            return (p[ihl] == 0 and struct.unpack_from("!H", p, ihl + 4)[0] == ident) or p[ihl] in (3, 11, 12)
        return False

    return ("h1-r1", pred)


def _probes() -> list[Probe]:
    out: list[Probe] = []
    six = [("61", "H.Encaps, one uSID container: uN at r2, uDT6 at r3"),
           ("62", "H.Encaps.Red, two segments: End (container ends) at r2, uDT6 at r3"),
           ("63", "H.Encaps, two segments"),
           ("64", "H.Encaps.Red, one segment: no SRH"),
           ("65", "H.Encaps, classic End at r2, uDT6 at r3"),
           ("66", "End.DX6 at r3"),
           ("46", "End.DT46 at r3, IPv6 payload")]  # fmt: skip
    for i, (host, what) in enumerate(six):
        ident = 0x6100 + i
        out.append(Probe(f"v6-{host}", what, icmp6_echo(H1_6, f"2001:db8:3::{host}", ident, 1), _reply_to_h1(ident)))
    four = [("41", "End.DT4 at r3 (IPv4 in H.Encaps)"), ("42", "End.DT4 at r3 (IPv4 in H.Encaps.Red, two segments)"),
            ("44", "End.DX4 at r3"), ("46", "End.DT46 at r3, IPv4 payload")]  # fmt: skip
    for i, (host, what) in enumerate(four):
        ident = 0x4100 + i
        out.append(Probe(f"v4-{host}", what, icmp4_echo(H1_4, f"10.0.3.{host}", ident, 1, ident=0x2200 + i),
                         _reply_to_h1(ident)))  # fmt: skip
    # hop limits and TTLs at their edges
    out.append(Probe("v6-hl2", "inner hop limit 2 through H.Encaps", icmp6_echo(H1_6, "2001:db8:3::61", 0x6200, 1, hl=2),
                     _reply_to_h1(0x6200)))  # fmt: skip
    out.append(Probe("v6-hl1", "inner hop limit 1 at the encapsulating router",
                     icmp6_echo(H1_6, "2001:db8:3::61", 0x6201, 1, hl=1), _reply_to_h1(0x6201)))  # fmt: skip
    out.append(Probe("v4-ttl2", "inner TTL 2 through H.Encaps (IPv4)",
                     icmp4_echo(H1_4, "10.0.3.41", 0x4200, 1, ttl=2, ident=0x2300), _reply_to_h1(0x4200)))  # fmt: skip
    # SRv6 packets made by h1 itself (h1 as the source node)
    inner = icmp6_echo(H1_6, "2001:db8:3::1", 0x6300, 1)
    out.append(Probe("srh-classic-end", "h1's own SRH: classic End at r2 (SL 1 -> 0), uDT6 at r3",
                     srv6(H1_6, ["fc00:2::e", "fcbb:bb00:3:e006::"], inner), _reply_to_h1(0x6300)))  # fmt: skip
    inner = icmp6_echo(H1_6, "2001:db8:3::1", 0x6301, 1)
    out.append(Probe("usid-three", "h1's own uSID container of three: uN r2, uN r3 (shift), uDT6 at r3",
                     ipv6(H1_6, "fcbb:bb00:2:3:e006::", 41, inner), _reply_to_h1(0x6301)))  # fmt: skip
    inner = icmp6_echo(H1_6, "2001:db8:3::1", 0x6302, 1)
    out.append(Probe("usid-unknown", "uN at r2, then an unconfigured uSID at r3 (after the shift: no route)",
                     ipv6(H1_6, "fcbb:bb00:2:3:e999::", 41, inner), _reply_to_h1(0x6302)))  # fmt: skip
    inner = icmp6_echo(H1_6, "2001:db8:3::1", 0x6303, 1)
    out.append(Probe("srh-sl-beyond", "SRH with Segments Left beyond Last Entry at r2's End (dropped, counted)",
                     srv6(H1_6, ["fc00:2::e", "fcbb:bb00:3:e006::"], inner, sl=3), None))  # fmt: skip
    inner = icmp6_echo(H1_6, "2001:db8:3::1", 0x6304, 1)
    pkt = srv6(H1_6, ["fc00:2::e", "fcbb:bb00:3:e006::"], inner, sl=0)
    pkt = pkt[:24] + _a6("fc00:2::e") + pkt[40:]  # addressed to r2's End with nothing left to do
    out.append(Probe("srh-sl0-end", "SRH with Segments Left 0 at r2's classic End (dropped, counted)", pkt, None))
    inner = icmp6_echo(H1_6, "2001:db8:3::1", 0x6305, 1)
    out.append(Probe("outer-hl1-end", "outer hop limit 1 arriving at r2's uN",
                     ipv6(H1_6, "fcbb:bb00:2:3:e006::", 41, inner, hl=1), _reply_to_h1(0x6305)))  # fmt: skip
    return out


PROBES: list[Probe] = _probes()


# -- namespaces and sockets -----------------------------------------------------------------------

in_netns = runner.in_netns


def _packet_socket(netns: str, ifname: str) -> socket.socket:
    def mk() -> socket.socket:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        s.bind((ifname, 0))
        s.setblocking(False)
        return s

    return in_netns(f"/run/netns/{netns}", mk)


#: linux/if_packet.h: the socket option level and options of a packet ring, TPACKET_V2's number and
#: header (struct tpacket2_hdr: status, len, snaplen, mac, net, sec, nsec, vlan tci/tpid, padding;
#: 32 bytes, then the struct sockaddr_ll whose sll_pkttype is at byte 10).
SOL_PACKET, PACKET_RX_RING, PACKET_VERSION, TPACKET_V2 = 263, 5, 10, 1
TP_STATUS_KERNEL, TP_STATUS_USER = 0, 1
TPACKET2_HDRLEN = 32
#: The ring's geometry: 256 slots of 4 KiB (a probe's frames are a few hundred bytes).
RING_FRAME, RING_FRAMES = 4096, 256


class Ring:
    """A receive ring on one veth end (``PACKET_RX_RING``, TPACKET_V2; packet(7)): the kernel
    copies each frame into the ring when the frame passes the tap, so the copy is the frame as it
    arrived. A plain AF_PACKET socket queues a clone that shares the frame's data, and what the
    receiving node does to the packet in place before the socket is read (seg6local End shifting
    the destination address, decrementing Segments Left) showed in the capture: seen on the
    kernel's seg6 in the conformance guest, not on the eBPF data plane (which rewrites a copy).
    """

    def __init__(self, netns: str, ifname: str):
        import mmap

        def mk() -> socket.socket:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
            s.setsockopt(SOL_PACKET, PACKET_RX_RING, struct.pack("IIII", RING_FRAME * 16, RING_FRAMES // 16, RING_FRAME, RING_FRAMES))
            s.bind((ifname, 0))
            s.setblocking(False)
            return s

        self.sock = in_netns(f"/run/netns/{netns}", mk)
        self.map = mmap.mmap(self.sock.fileno(), RING_FRAME * RING_FRAMES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.slot = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def frames(self) -> list[tuple[bytes, int]]:
        """The frames filled since the last call, in order, as (frame, sll_pkttype); their slots
        are handed back to the kernel."""
        out = []
        while True:
            off = self.slot * RING_FRAME
            status, _len, snaplen, mac_off = struct.unpack_from("IIIH", self.map, off)
            if not status & TP_STATUS_USER:
                return out
            pkttype = self.map[off + TPACKET2_HDRLEN + 10]
            out.append((bytes(self.map[off + mac_off:off + mac_off + snaplen]), pkttype))
            struct.pack_into("I", self.map, off, TP_STATUS_KERNEL)
            self.slot = (self.slot + 1) % RING_FRAMES

    def close(self) -> None:
        self.map.close()
        self.sock.close()


def noise(frame: bytes) -> bool:
    """Frames that are no probe's: ARP, IPv6 neighbour discovery and MLD, anything to a multicast
    destination."""
    et = frame[12:14]
    if et == b"\x08\x06":
        return True
    if et == b"\x86\xdd":
        p = frame[14:]
        if p[24] == 0xFF:
            return True
        if p[6] == 58 and p[40] in (130, 131, 132, 133, 134, 135, 136, 137, 143):
            return True
        if p[6] == 0 and len(p) > 48 and p[48] in (130, 131, 132, 143):  # hop-by-hop (MLD)
            return True
    return False


class Captures:
    """One receive ring (:class:`Ring`) per veth end, recording received frames."""

    def __init__(self, names: dict[str, str]):
        self.socks: dict[str, Ring] = {}
        for a, b in LINKS:
            for x, y in ((a, b), (b, a)):
                self.socks[f"{x}-{y}"] = Ring(names[x], f"{x}-{y}")

    def drain(self, into: dict[str, list[bytes]] | None = None) -> None:
        """Read every frame filled in (into ``into``, per interface, noise left out)."""
        for ifname, ring in self.socks.items():
            for frame, pkttype in ring.frames():
                if into is not None and pkttype != PACKET_OUTGOING and not noise(frame):
                    into.setdefault(ifname, []).append(frame)

    def until(self, ifname: str, pred: Callable[[bytes], bool], into: dict[str, list[bytes]], deadline: float) -> bool:
        """Record frames until one received on ``ifname`` matches ``pred`` (then drain the rest),
        or ``deadline``; whether it came."""
        while True:
            self.drain(into)
            if any(f[12:14] in (b"\x86\xdd", b"\x08\x00") and pred(f[14:]) for f in into.get(ifname, [])):
                self.drain(into)
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select(list(self.socks.values()), [], [], min(left, 0.5))

    def close(self) -> None:
        """Close every socket."""
        for s in self.socks.values():
            s.close()


def send_from_h1(netns: str, packet: bytes) -> None:
    """Send ``packet`` from h1 on h1-r1 as one Ethernet frame to r1."""
    et = b"\x86\xdd" if packet[0] >> 4 == 6 else b"\x08\x00"
    s = _packet_socket(netns, "h1-r1")
    try:
        s.send(mac("r1", "h1") + mac("h1", "r1") + et + packet)
    finally:
        s.close()


# -- the run --------------------------------------------------------------------------------------


def build_path(names: dict[str, str]) -> None:
    """The veths of :data:`LINKS` between the (existing) namespaces, fixed MACs, up."""
    for a, b in LINKS:
        runner.check(["ip", "link", "add", f"cf{a}{b}", "netns", names[a], "type", "veth", "peer", "name", f"cf{b}{a}",
                      "netns", names[b]])  # fmt: skip
        for x, y in ((a, b), (b, a)):
            runner.check(["ip", "-n", names[x], "link", "set", f"cf{x}{y}", "name", f"{x}-{y}", "address",
                          _mac_str(mac(x, y))])  # fmt: skip
            runner.check(["ip", "-n", names[x], "link", "set", f"{x}-{y}", "up"])
    for n in NODES:
        runner.check(["ip", "-n", names[n], "link", "set", "lo", "up"])


def run_probes(plane: runner.Plane, tag: str) -> dict:
    """Set the path up on ``plane`` (``corpus/probes.txt``), send every probe and record the
    frames, then the routers' counters. Returns ``{"setup": [...], "probes": [...], "counters": [...]}``
    (set-up and counters in the command records' shape of :func:`runner.run_cases`)."""
    names = {n: f"acp{tag}-{n}" for n in NODES}
    cases = {c.name: c for c in runner.load_corpus(PROBE_SETUP)}
    doc: dict = {"setup": [], "probes": [], "counters": []}
    try:
        for n in NODES:
            runner.add_netns(names[n], {**COMMON_SYSCTLS, **(ROUTER_SYSCTLS if n[0] == "r" else {})})
        build_path(names)
        plane.start(names)
        try:
            for n in NODES:
                doc["setup"].append({"name": n, "commands": _run_steps(plane, n, names[n], cases[n])})
            caps = Captures(names)
            try:
                caps.drain()
                for probe in PROBES:
                    print(f"probe {probe.name}", file=sys.stderr, flush=True)
                    frames: dict[str, list[bytes]] = {}
                    t = time.monotonic()
                    send_from_h1(names["h1"], probe.packet)
                    done = False
                    if probe.until is not None:
                        done = caps.until(*probe.until, frames, time.monotonic() + PROBE_WAIT_S)
                    else:
                        caps.until("h1-r1", lambda p: False, frames, time.monotonic() + PROBE_WAIT_S)
                    doc["probes"].append({"name": probe.name, "what": probe.what, "sent": probe.packet.hex(), "completed": done,
                                          "seconds": round(time.monotonic() - t, 3),
                                          "frames": {k: [f.hex() for f in v] for k, v in sorted(frames.items())}})  # fmt: skip
            finally:
                caps.close()
            for n in ("r1", "r2", "r3"):
                show = runner.Case(n, [runner.Step("ip -6 -s route show dev sr0"), runner.Step("ip -6 -s -j route show dev sr0")])
                doc["counters"].append({"name": n, "commands": _run_steps(plane, n, names[n], show)})
        finally:
            plane.stop()
    finally:
        for n in NODES:
            runner.del_netns(names[n])
    return doc


def _run_steps(plane: runner.Plane, node: str, netns: str, case: runner.Case) -> list[dict]:
    records = []
    for step in case.steps:
        if step.plane is not None and step.plane != plane.name:
            continue
        argv = runner._argv(step.line, netns, runner.WORK_DIR)
        r = runner.run(argv, env=plane.env(node) if argv[1] == "-n" else None, stdin=step.stdin)
        records.append({"cmd": step.line, "stdin": step.stdin, "plane": step.plane, "rc": r.returncode,
                        "stdout": r.stdout, "stderr": r.stderr})  # fmt: skip
    return records
