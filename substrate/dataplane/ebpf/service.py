"""The eBPF data plane's per-lab service: the host side of every node's SRv6 netlink conversation.

One service per lab, started with the lab (``python -m substrate.dataplane.ebpf.service LAB``)
and part of it: the lab's destroy (and so ``harness lab cleanup``) stops it (:func:`stop`), and it
exits by itself when the lab directory goes. It listens on one Unix socket per node
(``<lab dir>/dataplane/<node>.sock``, SOCK_SEQPACKET, bind-mounted into that node only as
``/run/anibench/dataplane.sock``), so a request on a node's socket can only ever touch that node.

Nodes hold no CAP_BPF (BPF is not namespaced: a node that could call bpf(2) could open every
other node's maps by id). Their ``ip`` is the real iproute2 with ``nlshim.so`` preloaded, which
hands this service the SRv6 part of its netlink conversation (see nlshim.c for the wire format):

- ``S`` (sent): an RTM_NEWROUTE/RTM_DELROUTE with ``encap seg6|seg6local``: the request is checked
  as the kernel's seg6 would check it (:mod:`.seg6`), the route's programs are loaded (one instance
  per route, parameters in its .rodata, :mod:`.loader`), and the same route is sent to the kernel in
  the node's namespace with ``encap bpf`` in its place, named after its SRv6 parameters; the
  kernel's answer goes back to ``ip`` as its own (errno, extack). The kernel keeps the route: its
  longest-prefix, metric, replace, flush and device-deletion semantics are the kernel's own, and
  the programs go with the route. A generic-netlink request of the ``SEG6`` family (``ip sr
  tunsrc``, ``ip sr hmac``) is answered here: the family id, the tunnel source (kept in the node's
  ``tunsrc`` map, read by every encapsulating program of the node).
- ``R`` (received): a kernel datagram holding routes of ours is returned with those routes shown
  as the kernel's seg6/seg6local would show them (counters read from the route's program).

The listening sockets and the per-node maps are made by a supervisor process and inherited by the
worker that serves them; when the worker dies the supervisor starts another on the same sockets
(forwarding never stops: the programs stay attached to their routes), bounded in rate, and logs it
to ``<lab dir>/dataplane/supervisor.jsonl``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from substrate.dataplane import OWN_DEVICE_PREFIXES
from substrate.dataplane.ebpf import seg6
from substrate.dataplane.ebpf.decap import LinkState
from substrate.dataplane.ebpf.seg6 import Seg6Encap, Seg6Error, Seg6Local, attr, attrs

NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWROUTE, RTM_DELROUTE = 24, 25
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 1, 2, 4
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200  # in an NLMSG_ERROR
NLM_F_REPLACE, NLM_F_EXCL, RTM_GETROUTE = 0x100, 0x200, 26  # in an RTM_NEWROUTE request
NLMSGERR_ATTR_MSG = 1
RTA_ENCAP_TYPE, RTA_ENCAP = 21, 22
SOL_NETLINK, NETLINK_EXT_ACK, NETLINK_GET_STRICT_CHK = 270, 11, 12
NETLINK_GENERIC = 16
GENL_ID_CTRL, CTRL_CMD_NEWFAMILY, CTRL_CMD_GETFAMILY = 16, 1, 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME, CTRL_ATTR_VERSION, CTRL_ATTR_HDRSIZE, CTRL_ATTR_MAXATTR = 1, 2, 3, 4, 5
SEG6_CMD_SETHMAC, SEG6_CMD_DUMPHMAC, SEG6_CMD_SET_TUNSRC, SEG6_CMD_GET_TUNSRC = 1, 2, 3, 4
SEG6_ATTR_DST = 1
#: The generic netlink family id handed out for "SEG6" (the kernel allocates ids from 0x13 up;
#: this one is far above what a node's kernel hands out, and only ever used on the asking socket).
SEG6_FAMILY_ID = 0x3F0
HDR = struct.Struct("=IHHII")
RTMSG = struct.Struct("=BBBBBBBBI")
#: The answer that tells the shim to send the request itself (count field of the answer).
PASS_COUNT = 0xFFFFFFFF
PASS = b"PASS"
AF_INET = 2
RTA_MULTIPATH, RTA_CACHEINFO, RTA_NH_ID = 9, 12, 30
#: Attributes an SRv6 route request may carry besides its encapsulation (linux/rtnetlink.h: RTA_DST,
#: RTA_SRC, RTA_IIF, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_METRICS, RTA_FLOW,
#: RTA_TABLE, RTA_MARK, RTA_VIA, RTA_PREF, RTA_EXPIRES): all about the route in the node's own
#: namespace. The service rebuilds the route from these only.
ROUTE_ATTRS = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 11, 15, 16, 18, 20, 23})
#: Concurrent connections one node may hold on its socket (its ip processes); more are closed at once.
MAX_CONNECTIONS_PER_NODE = 32
#: Directory of the per-node sockets, in the lab directory.
SOCKET_DIR = "dataplane"
#: Where a node sees its socket.
NODE_SOCKET = "/run/anibench/dataplane.sock"
#: Bound on how late an End.DX4/DX6 next-hop table follows a change of the main table (seconds).
DX_REFRESH_S = 0.5
#: Restarts of a dead worker allowed per minute before the supervisor gives up.
MAX_RESTARTS_PER_MIN = 10


def socket_path(lab_dir: Path, node: str) -> Path:
    """The host path of ``node``'s socket."""
    return lab_dir / SOCKET_DIR / f"{node}.sock"


def _msgs(buf: bytes) -> list[tuple[int, int, int, int, int, bytes]]:
    """Netlink messages of a datagram: (len, type, flags, seq, pid, whole message bytes)."""
    out, off = [], 0
    while off + 16 <= len(buf):
        ln, typ, flags, seq, pid = HDR.unpack_from(buf, off)
        if ln < 16 or off + ln > len(buf):
            break
        out.append((ln, typ, flags, seq, pid, buf[off:off + ln]))
        off += (ln + 3) & ~3
    return out


def _ours(parts: list[tuple[int, bytes]]) -> tuple[Seg6Encap | Seg6Local, int] | None:
    """The SRv6 behaviour and program id a route's ``encap bpf`` carries in its program name
    (``parts``: the route's attributes), or None for a route that is not one of ours."""
    encap = next((p for t, p in parts if t & 0x3FFF == RTA_ENCAP), b"")
    for _hook, prog in attrs(encap):
        name = dict(attrs(prog)).get(seg6.LWT_BPF_PROG_NAME) if len(prog) >= 4 else None
        if name:
            decoded = seg6.decode_name(name.rstrip(b"\0").decode(errors="replace"))
            if decoded:
                return decoded
    return None


def _message(typ: int, flags: int, seq: int, pid: int, payload: bytes) -> bytes:
    raw = HDR.pack(16 + len(payload), typ, flags, seq, pid) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _error_reply(request: bytes, port: int, err: int, extack: str = "") -> bytes:
    """An NLMSG_ERROR answering ``request`` as the kernel's netlink_ack does for a socket with
    NETLINK_EXT_ACK and without NETLINK_CAP_ACK: the request's header (its whole message on an
    error), then the extack message TLV."""
    _ln, _typ, _flags, seq, _pid = HDR.unpack_from(request)
    flags = NLM_F_ACK_TLVS if extack else 0
    body = struct.pack("=i", -err) + (request if err else request[:16])
    if extack:
        body += attr(NLMSGERR_ATTR_MSG, extack.encode() + b"\0")
    return _message(NLMSG_ERROR, flags, seq, port, body)


#: Names of the data plane's own devices in a node (the GSO helper bridge, the decapsulation
#: helpers): never shown to the node's ip, never changed through it.
HIDDEN_PREFIXES: tuple[bytes, ...] = tuple(p.encode() for p in OWN_DEVICE_PREFIXES)
#: Tables at or above this id are the data plane's own (the DX helpers' next-hop tables).
HIDDEN_TABLE_BASE = 0x7E000000
RTM_NEWLINK, RTM_DELLINK, RTM_SETLINK, RTM_NEWADDR, RTM_DELADDR = 16, 17, 19, 20, 21
RTM_NEWNEIGH, RTM_DELNEIGH, RTM_NEWRULE, RTM_DELRULE, RTM_NEWNETCONF = 28, 29, 32, 33, 80
RTA_OIF, RTA_TABLE, FRA_IIFNAME, FRA_TABLE, IFLA_IFNAME = 4, 15, 3, 15, 3
IFLA_MTU, IFLA_AF_SPEC, RTM_GETLINK, RTM_GETTFILTER = 4, 26, 18, 46


def hidden_message(typ: int, msg: bytes, hidden: set[int]) -> bool:
    """Whether a kernel message is about the data plane's own helpers: a link, address, neighbour
    or netconf entry of a hidden ifindex or name, a route through one or in a hidden table, a
    rule on one's input (``iif``)."""
    if typ in (RTM_NEWLINK, RTM_DELLINK, RTM_SETLINK) and len(msg) >= 32:
        if struct.unpack_from("=i", msg, 20)[0] in hidden:
            return True
        name = dict(attrs(msg[32:])).get(IFLA_IFNAME, b"")
        return name.startswith(HIDDEN_PREFIXES)
    if typ in (RTM_NEWADDR, RTM_DELADDR, RTM_NEWNEIGH, RTM_DELNEIGH) and len(msg) >= 24:
        return struct.unpack_from("=i", msg, 20)[0] in hidden
    if typ in (RTM_NEWROUTE, RTM_DELROUTE) and len(msg) >= 28:
        a = dict((t, p) for t, p in attrs(msg[28:]))
        oif = a.get(RTA_OIF)
        table = a.get(RTA_TABLE)
        return (oif is not None and struct.unpack_from("=i", oif)[0] in hidden) or (
            table is not None and struct.unpack_from("=I", table)[0] >= HIDDEN_TABLE_BASE)
    if typ in (RTM_NEWRULE, RTM_DELRULE) and len(msg) >= 28:
        a = dict(attrs(msg[28:]))
        table = a.get(FRA_TABLE)
        return a.get(FRA_IIFNAME, b"").startswith(HIDDEN_PREFIXES) or (
            table is not None and struct.unpack_from("=I", table)[0] >= HIDDEN_TABLE_BASE)
    if typ == RTM_NEWNETCONF and len(msg) >= 20:
        idx = dict(attrs(msg[20:])).get(1)
        return idx is not None and struct.unpack_from("=i", idx)[0] in hidden
    return False


def hidden_rule_delete(typ: int, msg: bytes) -> bool:
    """A rule deletion that would take a rule of the data plane's decapsulation helpers: one
    naming their preference (1 or 2, :data:`programs.DECAP_RULE_PREF`) without naming an input
    device of the node's own. (Others are left to the kernel; a helper rule lost anyway is put
    back by the service within its refresh bound.)"""
    if typ != RTM_DELRULE or len(msg) < 28:
        return False
    a = dict(attrs(msg[28:]))
    prio = a.get(6)  # FRA_PRIORITY
    iif = a.get(FRA_IIFNAME, b"").rstrip(b"\0")
    return (prio is not None and struct.unpack_from("=I", prio)[0] in (1, 2) and (not iif or iif.startswith(HIDDEN_PREFIXES))) or (
        bool(iif) and iif.startswith(HIDDEN_PREFIXES))


def _host_userns(pid: int) -> bool:
    """Whether process ``pid`` is in this process's user namespace (the host's): a node's
    confined commands run in the node's own."""
    try:
        return os.readlink(f"/proc/{pid}/ns/user") == os.readlink("/proc/self/ns/user")
    except OSError:
        return False


def _route_parts(msg: bytes) -> tuple[bytes, list[tuple[int, bytes]]]:
    """(nlmsghdr + rtmsg, [(attr type with flags, payload)]) of a route message."""
    head = msg[:16 + RTMSG.size]
    out, off = [], len(head)
    while off + 4 <= len(msg):
        ln, typ = struct.unpack_from("=HH", msg, off)
        if ln < 4 or off + ln > len(msg):
            break
        out.append((typ, msg[off + 4:off + ln]))
        off += (ln + 3) & ~3
    return head, out


def _route_message(head: bytes, parts: list[tuple[int, bytes]], *, flags: int | None = None, seq: int | None = None,
                   pid: int | None = None) -> bytes:  # fmt: skip
    body = head[16:] + b"".join(attr(t, p) for t, p in parts)
    _ln, typ, f, s, p = HDR.unpack_from(head)
    return _message(typ, f if flags is None else flags, s if seq is None else seq, p if pid is None else pid, body)


@dataclass
class Node:
    """One node the service serves.

    Attributes:
        name: the node's name. netns: path of its network namespace (``/run/netns/...``).
        listener: its listening socket. maps: its shared maps (the ``tunsrc`` map).
    """

    name: str
    netns: str
    listener: socket.socket
    maps: object
    nl: socket.socket | None = None
    #: a second socket with strict dump checking (the kernel filters a route dump by table)
    nl_strict: socket.socket | None = None
    seq: int = 0
    #: ifindexes of the data plane's own helper devices in the node (hidden from its ip).
    hidden: set[int] = field(default_factory=set)
    hidden_known: bool = False
    #: Program ids of the node's SRv6 routes (counters are read for these only).
    progs: set[int] = field(default_factory=set)
    #: Program instances routes share, by what configures them (programs.install_programs).
    shared_programs: dict[tuple, dict[str, int]] = field(default_factory=dict)
    progs_read: float = 0.0
    #: Held while one of the node's requests is answered or its helpers are refreshed.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def owns(self, prog_id: int) -> bool:
        """Whether ``prog_id`` runs on one of this node's routes (learnt from the node's own routes
        after a restart of the worker, at most once a second)."""
        if prog_id in self.progs:
            return True
        if time.monotonic() - self.progs_read > 1.0:
            import re
            import subprocess

            self.progs_read = time.monotonic()
            ns = os.path.basename(self.netns)
            out = subprocess.run(["ip", "-n", ns, "-6", "route", "show", "table", "all"], capture_output=True,
                                 text=True, check=False).stdout  # fmt: skip
            self.progs |= {int(x) for x in re.findall(r"anibench:(\d+):", out)}
        return prog_id in self.progs

    def find_hidden(self) -> None:
        """Learn the ifindexes of the data plane's helper devices already in the node (a worker
        started after another one died finds those its predecessor made)."""
        if self.hidden_known:
            return
        import subprocess

        r = subprocess.run(["ip", "-n", os.path.basename(self.netns), "-j", "link", "show"], capture_output=True, text=True,
                           check=False)  # fmt: skip
        with contextlib.suppress(ValueError):
            self.hidden.update(int(i["ifindex"]) for i in json.loads(r.stdout or "[]")
                               if i.get("ifname", "").encode().startswith(HIDDEN_PREFIXES))  # fmt: skip
        self.hidden_known = True

    def netlink(self, *, strict: bool = False) -> socket.socket:
        """A NETLINK_ROUTE socket in the node's namespace (made once); ``strict``: the one with
        NETLINK_GET_STRICT_CHK, whose dumps the kernel filters by the request's header."""
        if (self.nl_strict if strict else self.nl) is None:
            from substrate import nsread

            with nsread.entered(self.netns):
                s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            s.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
            if strict:
                s.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
            s.bind((0, 0))
            if strict:
                self.nl_strict = s
            else:
                self.nl = s
        return self.nl_strict if strict else self.nl  # type: ignore[return-value]

    def table_routes(self, family: int, table: int) -> list[tuple[int, int, str, str]]:
        """The routes of routing table ``table`` of ``family``, as ``(type, destination length,
        output ifindex, gateway)`` (``""`` for none), sorted (a dump the kernel filters by table:
        ``ip route show table N`` does the same; no process)."""
        import ipaddress

        body = RTMSG.pack(family, 0, 0, 0, table if table < 256 else 0, 0, 0, 0, 0) + attr(RTA_TABLE, struct.pack("=I", table))
        out = []
        for m in self.dump(RTM_GETROUTE, body, strict=True):
            a = dict(attrs(m[16 + RTMSG.size:]))
            oif, gw = a.get(RTA_OIF), a.get(5)  # RTA_GATEWAY
            if m[16 + 7] != 1:  # not RTN_UNICAST: no next hop (an IPv6 unreachable route shows dev lo)
                out.append((m[16 + 7], m[16 + 1], "", ""))
                continue
            out.append((m[16 + 7], m[16 + 1], str(struct.unpack_from("=i", oif)[0]) if oif else "",
                        str(ipaddress.ip_address(gw)) if gw else ""))  # fmt: skip
        return sorted(out)

    def routes_via(self, family: int, ifindex: int) -> list[bytes]:
        """The RTM_NEWROUTE messages of every route of ``family``, in any table, whose output
        device is ``ifindex`` (a dump the kernel filters by RTA_OIF)."""
        body = RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0) + attr(RTA_TABLE, struct.pack("=I", 0)) + attr(RTA_OIF, struct.pack("=i", ifindex))
        return self.dump(RTM_GETROUTE, body, strict=True)

    def route_get(self, addr: str) -> tuple[str, str] | None:
        """The main table's (output ifindex, gateway) for ``addr`` in the node (an RTM_GETROUTE
        answered by the kernel, as ``ip route get``), or None when nothing routes it."""
        import ipaddress

        ip = ipaddress.ip_address(addr)
        fam = socket.AF_INET if ip.version == 4 else socket.AF_INET6
        body = RTMSG.pack(fam, 32 if ip.version == 4 else 128, 0, 0, 0, 0, 0, 0, 0) + attr(1, ip.packed)  # RTA_DST
        s = self.netlink()
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        s.send(HDR.pack(16 + len(body), 26, NLM_F_REQUEST, self.seq, 0) + body)  # RTM_GETROUTE
        while True:
            for _l, t, _f, sq, _p, m in _msgs(s.recv(1 << 16)):
                if sq != self.seq:
                    continue
                if t != RTM_NEWROUTE or m[16 + 7] != 1:  # an error, or not RTN_UNICAST
                    return None
                a = dict(attrs(m[16 + RTMSG.size:]))
                oif, gw = a.get(RTA_OIF), a.get(5)  # RTA_GATEWAY
                if oif is None:
                    return None
                return str(struct.unpack("=i", oif)[0]), str(ipaddress.ip_address(gw)) if gw else ""

    def rules(self) -> set[tuple[int, int, str]]:
        """(family, preference, input device) of every policy rule of the node (an RTM_GETRULE
        dump, no process)."""
        out: set[tuple[int, int, str]] = set()
        for m in self.dump(34, bytes(12)):  # RTM_GETRULE
            a = dict(attrs(m[16 + 12:]))
            prio = struct.unpack_from("=I", a[6])[0] if 6 in a else 0
            out.add((m[16], prio, a.get(FRA_IIFNAME, b"").rstrip(b"\0").decode(errors="replace")))
        return out

    def dump(self, typ: int, body: bytes, *, strict: bool = False) -> list[bytes]:
        """The messages (whole, header included) of one netlink dump request ``typ`` with
        ``body`` in the node's namespace (``strict``: on the strict-checking socket); an error
        answer gives what came before it."""
        s = self.netlink(strict=strict)
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        s.send(HDR.pack(16 + len(body), typ, NLM_F_REQUEST | 0x300, self.seq, 0) + body)  # NLM_F_DUMP
        out: list[bytes] = []
        while True:
            for _l, t, _f, sq, _p, m in _msgs(s.recv(1 << 20)):
                if sq != self.seq:
                    continue
                if t in (NLMSG_DONE, NLMSG_ERROR):
                    return out
                out.append(m)

    def links(self) -> dict[int, LinkState]:
        """Every device of the node by ifindex: name, up, MTU and the sysctls the helpers need
        (one RTM_GETLINK dump; IFLA_AF_SPEC's devconf arrays: IFLA_INET_CONF indexed from
        IPV4_DEVCONF_FORWARDING = 1, IFLA_INET6_CONF from DEVCONF_FORWARDING = 0, linux/ip.h and
        linux/ipv6.h)."""
        out: dict[int, LinkState] = {}
        for m in self.dump(RTM_GETLINK, bytes(16)):
            _fam, _t, index, flags, _ch = struct.unpack_from("=BxHiII", m, 16)
            a = dict(attrs(m[32:]))
            conf = {fam: dict(attrs(p)) for fam, p in attrs(a.get(IFLA_AF_SPEC, b""))}
            v4 = conf.get(socket.AF_INET, {}).get(1, b"")  # IFLA_INET_CONF: u32 per IPV4_DEVCONF_*
            v6 = conf.get(socket.AF_INET6, {}).get(2, b"")  # IFLA_INET6_CONF: s32 per DEVCONF_*

            def at(arr: bytes, i: int) -> int:
                return struct.unpack_from("=i", arr, 4 * i)[0] if len(arr) >= 4 * i + 4 else -1

            out[index] = LinkState(
                name=a.get(IFLA_IFNAME, b"").rstrip(b"\0").decode(errors="replace"), up=bool(flags & 1),
                mtu=struct.unpack_from("=I", a[IFLA_MTU])[0] if IFLA_MTU in a else 0,
                v4_forwarding=at(v4, 0), v4_rp_filter=at(v4, 7), v6_forwarding=at(v6, 0), v6_disabled=at(v6, 26),
            )  # fmt: skip
        return out

    def ingress_progs(self, ifindex: int) -> list[int]:
        """One entry per filter on device ``ifindex``'s clsact ingress, in the kernel's order: the
        eBPF program id of a bpf filter, 0 for any other (a classic BPF bytecode, another
        classifier) -- one RTM_GETTFILTER dump; a message without TCA_OPTIONS or with handle 0
        heads a filter list and is not counted (TCA_BPF_ID, linux/pkt_cls.h)."""
        body = struct.pack("=BxxxiIII", socket.AF_UNSPEC, ifindex, 0, 0xFFFFFFF2, 0)  # TC_H_CLSACT:TC_H_MIN_INGRESS
        ids: list[int] = []
        for m in self.dump(RTM_GETTFILTER, body):
            handle = struct.unpack_from("=I", m, 16 + 8)[0]  # struct tcmsg: family, pad, ifindex, handle
            a = dict(attrs(m[16 + 20:]))
            if 2 not in a or not handle:  # TCA_OPTIONS
                continue
            opts = dict(attrs(a[2])) if a.get(1, b"").rstrip(b"\0") == b"bpf" else {}  # TCA_KIND
            ids.append(struct.unpack_from("=I", opts[11])[0] if 11 in opts else 0)  # TCA_BPF_ID
        return ids

    def talk(self, msg: bytes) -> tuple[int, list[tuple[int, bytes]]]:
        """Send one request to the node's kernel with NLM_F_ACK; (errno, extack TLVs) of its answer."""
        s = self.netlink()
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        _ln, typ, flags, _seq, _pid = HDR.unpack_from(msg)
        s.send(HDR.pack(len(msg), typ, flags | NLM_F_ACK, self.seq, 0) + msg[16:])
        while True:
            data = s.recv(1 << 16)
            for _l, t, f, sq, _p, m in _msgs(data):
                if t == NLMSG_ERROR and sq == self.seq:
                    (err,) = struct.unpack_from("=i", m, 16)
                    tlvs: list[tuple[int, bytes]] = []
                    if f & NLM_F_ACK_TLVS:
                        inner_len = HDR.unpack_from(m, 20)[0] if not f & NLM_F_CAPPED else 16
                        start = 20 + ((inner_len + 3) & ~3)
                        tlvs = [(tt, pp) for tt, pp in attrs(m[start:]) if tt == NLMSGERR_ATTR_MSG]
                    return -err, tlvs


class Service:
    """Answers the nodes' requests (one worker process, a thread per node: :meth:`serve`).

    Args:
        nodes: node name -> :class:`Node`.
        load: the program loader (``substrate.dataplane.ebpf.programs.install_programs``-shaped:
            (behaviour, route family, node) -> (prog fds by hook, prog id, headroom, closer)).
        counters: prog id -> (packets, bytes, errors) of a counting route.
    """

    def __init__(self, nodes: dict[str, Node], load: Callable, counters: Callable[[int], tuple[int, int, int]]):
        self.nodes = nodes
        self.load = load
        self.counters = counters
        self._refreshed = 0.0

    # -- requests ----------------------------------------------------------------------------

    def handle(self, node: Node, data: bytes, peer: int = 0) -> bytes:
        """One request datagram from ``node``'s shim -> the answer datagram (``peer``: the
        asking process's host pid, from SO_PEERCRED)."""
        if len(data) < 8:
            return struct.pack("=I", 0)
        op, proto, port = chr(data[0]), data[1], struct.unpack_from("=I", data, 4)[0]
        node.find_hidden()
        payload = data[8:]
        if op == "R":
            try:
                out = [self.rewrite(payload, node)]
            except Exception:  # noqa: BLE001 -- a bug here must not cost the node its ip: show it raw
                traceback.print_exc()
                out = [payload]
        else:
            out = []
            for m in _msgs(payload):
                try:
                    answer = self.genl(node, m, port, peer) if proto == NETLINK_GENERIC else self.route(node, m, port)
                    if answer is PASS:  # the shim sends one message a datagram
                        if len(_msgs(payload)) == 1:
                            return struct.pack("=I", PASS_COUNT)
                        answer = _error_reply(m[5], port, errno.EINVAL)
                    if answer is not None:
                        out.append(answer)
                except Exception as e:  # noqa: BLE001 -- answered as an error of the request, logged
                    traceback.print_exc()
                    out.append(_error_reply(m[5], port, errno.EIO, f"internal error of the eBPF SRv6 data plane: {e}"))
        return struct.pack("=I", len(out)) + b"".join(struct.pack("=I", len(d)) + d for d in out)

    def route(self, node: Node, m: tuple, port: int) -> bytes | None:
        """An RTM_NEWROUTE/RTM_DELROUTE carrying ``encap seg6|seg6local``: done with ``encap bpf``,
        the route rebuilt from the attributes a route may carry (:data:`ROUTE_ATTRS`; anything else
        is refused). A change of the data plane's own helpers is refused as the kernel refuses a
        device or rule that is not there. Every other message is :data:`PASS`: the node's ``ip``
        sends it itself, with the node's own privileges -- this host process never writes for a
        node what the node could not write itself (a veth moved to another namespace, say).
        Answered as the kernel answers: an error always, a success only when the request asked for
        an ack (iproute2's flush sends its deletes without, and takes any answer for a failure)."""
        _ln, typ, flags, _seq, _pid, msg = m
        if typ in (RTM_NEWLINK, RTM_SETLINK) and len(msg) >= 32 and struct.unpack_from("=i", msg, 20)[0] not in node.hidden:
            name = dict(attrs(msg[32:])).get(IFLA_IFNAME, b"")
            if name.startswith(HIDDEN_PREFIXES):  # a new device, or a rename, to a name of the data plane's
                return _error_reply(msg, port, errno.EINVAL, "device names beginning with "
                                    f"{' or '.join(p.decode() for p in HIDDEN_PREFIXES)} are the eBPF SRv6 data plane's")
        if hidden_message(typ, msg, node.hidden) or hidden_rule_delete(typ, msg):  # the data plane's own helpers
            missing = errno.ENODEV if typ in (RTM_NEWLINK, RTM_DELLINK, RTM_SETLINK, RTM_NEWADDR, RTM_DELADDR) else errno.ENOENT
            return _error_reply(msg, port, missing)
        if typ not in (RTM_NEWROUTE, RTM_DELROUTE) or len(msg) < 16 + RTMSG.size:
            return PASS
        head, parts = _route_parts(msg)
        family = head[16]
        etype = next((struct.unpack_from("=H", p)[0] for t, p in parts if t & 0x3FFF == RTA_ENCAP_TYPE), None)
        if etype not in (seg6.LWTUNNEL_ENCAP_SEG6, seg6.LWTUNNEL_ENCAP_SEG6_LOCAL):
            return PASS
        encap = next((p for t, p in parts if t & 0x3FFF == RTA_ENCAP), b"")
        rest = [(t, p) for t, p in parts if t & 0x3FFF not in (RTA_ENCAP_TYPE, RTA_ENCAP)]
        ack = bool(flags & NLM_F_ACK)
        # what a dump shows and a request need not carry (RTA_CACHEINFO: iproute2's flush and
        # restore send dumped routes back) is left out; a delete keeps its key attributes only
        rest = [(t, p) for t, p in rest if t & 0x3FFF != RTA_CACHEINFO and (typ == RTM_NEWROUTE or t & 0x3FFF in ROUTE_ATTRS)]
        odd = sorted({t & 0x3FFF for t, _p in rest} - ROUTE_ATTRS)
        if RTA_NH_ID in odd:  # rtm_to_fib6_config / rtm_to_fib_config answer it before any encapsulation
            return _error_reply(msg, port, errno.EINVAL, "Nexthop specification and nexthop id are mutually exclusive")
        if odd:
            text = ("the eBPF SRv6 data plane does not take multipath SRv6 routes" if RTA_MULTIPATH in odd
                    else f"the eBPF SRv6 data plane does not take route attribute(s) {odd} with an SRv6 encapsulation")  # fmt: skip
            return _error_reply(msg, port, errno.EOPNOTSUPP, text)
        if typ == RTM_DELROUTE and family != AF_INET:
            # an IPv6 route is deleted by its key (ip6_route_del compares no encapsulation)
            err, tlvs = node.talk(_route_message(head, rest))
            return self._answer(msg, port, err, tlvs, ack)
        if etype == seg6.LWTUNNEL_ENCAP_SEG6_LOCAL and family != socket.AF_INET6:
            return _error_reply(msg, port, errno.EINVAL)  # seg6_local_build_state: IPv6 routes only
        try:
            b = Seg6Encap.from_encap(encap, family) if etype == seg6.LWTUNNEL_ENCAP_SEG6 else Seg6Local.from_encap(encap)
        except Seg6Error as e:
            if e.errno == errno.EOPNOTSUPP and typ == RTM_NEWROUTE and flags & NLM_F_EXCL and self._occupied(node, head, rest):
                # what the kernel takes and we do not forward: the kernel builds it, then finds the
                # place taken (fib6_add_rt2node, fib_table_insert: EEXIST), as for any other route
                return _error_reply(msg, port, errno.EEXIST)
            return _error_reply(msg, port, e.errno, e.extack)
        if (typ == RTM_NEWROUTE and isinstance(b, Seg6Local) and b.counters
                and not flags & (NLM_F_REPLACE | NLM_F_EXCL) and self._twin(node, head, rest, b)):
            # a counting route's program is its own, so its name differs from its twin's: the
            # kernel's seg6local compares the behaviour (counters only by presence), and an
            # append/prepend of the same route is EEXIST (fib6_add_rt2node, fib_table_insert)
            return _error_reply(msg, port, errno.EEXIST)
        try:
            fds, prog_id, headroom, close = self.load(b, family, node)
        except Seg6Error as e:
            return _error_reply(msg, port, e.errno, e.extack)
        try:
            # a route that counts names its program (for its counters); others are named by their
            # parameters alone, so that identical routes compare equal as the kernel's seg6 ones
            # do (bpf_lwt_prog_cmp compares names): append/prepend of a twin is EEXIST, an IPv4
            # delete with an encapsulation matches only the route that has it
            name = seg6.encode_name(b, prog_id if isinstance(b, Seg6Local) and b.counters else 0).encode() + b"\0"
            nested = b"".join(
                attr(hook | seg6.NLA_F_NESTED, attr(seg6.LWT_BPF_PROG_FD, struct.pack("=I", fd)) + attr(seg6.LWT_BPF_PROG_NAME, name))
                for hook, fd in sorted(fds.items()))  # fmt: skip
            if headroom:
                nested += attr(seg6.LWT_BPF_XMIT_HEADROOM, struct.pack("=I", headroom))
            rest += [(RTA_ENCAP_TYPE, struct.pack("=H", seg6.LWTUNNEL_ENCAP_BPF)), (RTA_ENCAP, nested)]
            err, tlvs = node.talk(_route_message(head, rest))
            if not err and typ == RTM_NEWROUTE:
                node.progs.add(prog_id)
            return self._answer(msg, port, err, tlvs, ack)
        except Seg6Error as e:
            return _error_reply(msg, port, e.errno, e.extack)
        finally:
            close()

    @staticmethod
    def _occupied(node: Node, head: bytes, rest: list[tuple[int, bytes]]) -> bool:
        """Whether an ``add`` (NLM_F_EXCL) of this route would find its place taken: a route of
        the same family, table, destination and metric (any device or encapsulation), which is
        EEXIST for the kernel (one RTM_GETROUTE dump)."""
        return any(True for _ in Service._same_place(node, head, rest, with_oif=False))

    @staticmethod
    def _same_place(node: Node, head: bytes, rest: list[tuple[int, bytes]], *, with_oif: bool = True) -> Iterator[list[tuple[int, bytes]]]:
        """The attributes of each route of the node at this route's place: family, table,
        destination, metric and (``with_oif``) device."""
        fam = head[16]
        default_metric = struct.pack("=I", 1024 if fam == socket.AF_INET6 else 0)  # IP6_RT_PRIO_USER; IPv4: 0

        def key(h: bytes, parts: list[tuple[int, bytes]]) -> tuple:
            a = {t & 0x3FFF: p for t, p in parts}
            table = a.get(RTA_TABLE, struct.pack("=I", h[20]))[:4]
            return h[17], h[19], table, a.get(1, b""), a.get(RTA_OIF) if with_oif else None, a.get(6, default_metric)[:4]

        want = key(head, rest)
        for m in node.dump(RTM_GETROUTE, RTMSG.pack(fam, 0, 0, 0, 0, 0, 0, 0, 0)):
            h2, parts = _route_parts(m)
            if key(h2, parts) == want:
                yield parts

    @staticmethod
    def _twin(node: Node, head: bytes, rest: list[tuple[int, bytes]], b: Seg6Local) -> bool:
        """Whether the node already has this route: same family, table, destination, metric and
        device, and the same seg6local behaviour (one RTM_GETROUTE dump)."""
        for parts in Service._same_place(node, head, rest):
            other = _ours(parts)
            if other is not None and isinstance(other[0], Seg6Local) and other[0] == b:
                return True
        return False

    @staticmethod
    def _answer(request: bytes, port: int, err: int, tlvs: list[tuple[int, bytes]], ack: bool = True) -> bytes | None:
        if not err and not ack:
            return None
        text = tlvs[0][1].rstrip(b"\0").decode(errors="replace") if tlvs else ""
        if "bpf" in text.lower() or "lwt" in text.lower():  # the kernel's words about our encap, not the agent's
            text = ""
        return _error_reply(request, port, err, text)

    def rewrite(self, datagram: bytes, node: Node | None = None) -> bytes:
        """A kernel datagram with our routes shown as the kernel's seg6/seg6local shows them, and
        the data plane's own helper devices, their addresses, routes, rules and neighbours left
        out (:func:`hidden_message`)."""
        out = b""
        for _ln, typ, flags, seq, pid, msg in _msgs(datagram):
            if node is not None and hidden_message(typ, msg, node.hidden):
                if not flags & NLM_F_MULTI:  # the answer to a get: "no such thing", as for a device that is not there
                    out += _message(NLMSG_ERROR, 0, seq, pid, struct.pack("=i", -errno.ENODEV) + msg[:16])
                continue
            if typ in (RTM_NEWROUTE, RTM_DELROUTE):
                msg = self._show(msg, node)
            out += msg + b"\0" * (-len(msg) % 4)
        return out

    def _show(self, msg: bytes, node: Node | None = None) -> bytes:
        head, parts = _route_parts(msg)
        etype = next((struct.unpack_from("=H", p)[0] for t, p in parts if t & 0x3FFF == RTA_ENCAP_TYPE), None)
        if etype != seg6.LWTUNNEL_ENCAP_BPF:
            return msg
        decoded = _ours(parts)
        if decoded is None:
            return msg
        b, prog_id = decoded
        if isinstance(b, Seg6Local):
            counts = None
            if b.counters and node is not None and node.owns(prog_id):  # never another node's program
                with contextlib.suppress(Exception):  # a route deleted meanwhile shows zeros
                    counts = self.counters(prog_id)
            new = b.encap_attrs(counts)
        else:
            new = b.encap_attrs()
        new_parts = []
        done = False
        for t, p in parts:
            if t & 0x3FFF in (RTA_ENCAP_TYPE, RTA_ENCAP):
                if not done:
                    new_parts += list(attrs(new))  # RTA_ENCAP unflagged, as lwtunnel_fill_encap nests it
                    done = True
                continue
            new_parts.append((t, p))
        return _route_message(head, new_parts)

    def genl(self, node: Node, m: tuple, port: int, peer: int = 0) -> bytes:
        """The ``SEG6`` generic netlink family (net/ipv6/seg6.c), answered here. Setting the
        tunnel source or an HMAC key wants CAP_NET_ADMIN in the initial user namespace
        (GENL_ADMIN_PERM): a process in a node's own user namespace (``peer``, an agent's confined
        shell) is answered EPERM, as the kernel answers it."""
        _ln, typ, flags, seq, _pid, msg = m
        cmd = msg[16] if len(msg) > 16 else 0
        body = dict(attrs(msg[20:]))
        if typ == GENL_ID_CTRL and cmd == CTRL_CMD_GETFAMILY:
            payload = bytes([CTRL_CMD_NEWFAMILY, 2, 0, 0]) + attr(CTRL_ATTR_FAMILY_NAME, b"SEG6\0") + attr(
                CTRL_ATTR_FAMILY_ID, struct.pack("=H", SEG6_FAMILY_ID)) + attr(CTRL_ATTR_VERSION, struct.pack("=I", 1)) + attr(
                CTRL_ATTR_HDRSIZE, struct.pack("=I", 0)) + attr(CTRL_ATTR_MAXATTR, struct.pack("=I", 7))  # fmt: skip
            return _message(GENL_ID_CTRL, 0, seq, port, payload)
        if typ != SEG6_FAMILY_ID:
            return _error_reply(msg, port, errno.EOPNOTSUPP)
        if cmd in (SEG6_CMD_SET_TUNSRC, SEG6_CMD_SETHMAC) and not _host_userns(peer):
            return _error_reply(msg, port, errno.EPERM)
        if cmd == SEG6_CMD_SET_TUNSRC:
            dst = body.get(SEG6_ATTR_DST)
            if dst is None or len(dst) < 16:
                return _error_reply(msg, port, errno.EINVAL)
            import ipaddress

            node.maps.set_tunsrc(str(ipaddress.IPv6Address(dst[:16])))
            return _error_reply(msg, port, 0)
        if cmd == SEG6_CMD_GET_TUNSRC:
            import ipaddress

            addr = ipaddress.IPv6Address(node.maps.tunsrc()).packed
            return _message(SEG6_FAMILY_ID, 0, seq, port, bytes([SEG6_CMD_GET_TUNSRC, 1, 0, 0]) + attr(SEG6_ATTR_DST, addr))
        if cmd == SEG6_CMD_DUMPHMAC:
            return _message(NLMSG_DONE, NLM_F_MULTI, seq, port, struct.pack("=i", 0))
        if cmd == SEG6_CMD_SETHMAC:
            return _error_reply(msg, port, errno.EOPNOTSUPP, "the eBPF SRv6 data plane does not do SRH HMAC")
        return _error_reply(msg, port, errno.EOPNOTSUPP)

    def refresh_next_hops(self) -> None:
        """End.DX4/DX6: re-point every node's next-hop tables that resolve differently now (at
        most every :data:`DX_REFRESH_S`; the kernel resolves nh4/nh6 per packet, this follows
        within that bound); and put back any rule of the decapsulation helpers a deletion took.
        A failure is logged, never fatal."""
        now = time.monotonic()
        if now - self._refreshed < DX_REFRESH_S:
            return
        self._refreshed = now
        for node in self.nodes.values():
            if not node.lock.acquire(blocking=False):
                continue  # the node's own request is being answered: its turn comes next period
            with contextlib.ExitStack() as held:
                held.callback(node.lock.release)
                dn = getattr(node, "decap", None)
                try:
                    if dn is not None:
                        dn.refresh(node.route_get, node.table_routes)
                        if dn.helpers:
                            dn.repair_rules(node.rules())
                    self.repair_helpers(node)
                except Exception:  # noqa: BLE001 -- logged; the next round tries again
                    traceback.print_exc()

    def repair_helpers(self, node: Node) -> int:
        """Put back any helper device of ``node`` that the node changed or deleted with an ``ip``
        or ``tc`` that bypasses its front (its root may: the helpers live in its namespace; the
        kernel's seg6 has no such object to break): a decapsulation helper (device, index,
        settings, sysctls, strip program: :meth:`decap.DecapNode.helper_intact`) or the GSO
        helper (device, settings, tc program). Cheap when nothing changed: one RTM_GETLINK dump
        and one RTM_GETTFILTER dump per helper. Returns how many were put back."""
        from substrate.dataplane.ebpf import loader

        dn = getattr(node, "decap", None)
        gso = getattr(node.maps, "gso", None) if getattr(node, "gso_ready", False) else None
        put = self._drop_foreign_rules(node, dn)
        if not (dn is not None and dn.helpers) and gso is None:
            return put
        links = node.links()
        for h in list(dn.helpers.values()) if dn is not None else []:
            if not dn.helper_intact(h, links.get(h.ifindex), node.ingress_progs(h.ifindex) if h.ifindex in links else []):
                print(json.dumps({"t": time.time(), "event": "helper restored", "node": node.name, "helper": h.name}),
                      file=sys.stderr, flush=True)
                dn.restore(h)
                put += 1
        for ifindex in sorted(node.hidden):
            put += self._drop_routes_via(node, ifindex) + self._drop_addresses(node, ifindex)
        if gso is not None:
            ifindex, prog = gso
            link = links.get(ifindex)
            if link is not None and link.name == loader.GSO_HELPER and link.v6_disabled != 0:
                # the re-encapsulated GSO packets enter IPv6 on it (the third reconciler attack, issue 35)
                from substrate import nsread

                with nsread.entered(node.netns), open(f"/proc/sys/net/ipv6/conf/{loader.GSO_HELPER}/disable_ipv6", "w") as f:
                    f.write("0")
                put += 1
            if not (link is not None and link.name == loader.GSO_HELPER and link.up and link.mtu == 65535
                    and node.ingress_progs(ifindex) == [prog]):
                print(json.dumps({"t": time.time(), "event": "helper restored", "node": node.name,
                                  "helper": loader.GSO_HELPER}), file=sys.stderr, flush=True)
                node.hidden.add(loader.gso_helper_up(os.path.basename(node.netns), node.maps))
                put += 1
        return put

    @staticmethod
    def _delete_dumped(node: Node, msg: bytes, typ: int, event: str, **fields: object) -> int:
        """Send a dumped object (``msg``, a whole netlink message) back to the node's kernel as the
        delete request ``typ`` (RTM_DELROUTE, RTM_DELADDR, RTM_DELRULE): exactly that object goes.
        Logs ``event``; returns 1 when the kernel deleted it, else 0."""
        err, _tlvs = node.talk(HDR.pack(len(msg), typ, NLM_F_REQUEST, 0, 0) + msg[16:])
        if err:
            return 0
        print(json.dumps({"t": time.time(), "event": event, "node": node.name, **fields}), file=sys.stderr, flush=True)
        return 1

    @staticmethod
    def _drop_routes_via(node: Node, ifindex: int) -> int:
        """Delete every route through helper ``ifindex`` but the kernel's own (its IPv6 multicast
        and link-local routes): no helper is any route's output device, so such a route is a
        node's, made with a tool that bypasses its front, and it sends traffic into a helper where
        it is lost (the second reconciler attack, issue 35). Returns how many went."""
        gone = 0
        for fam in (socket.AF_INET, socket.AF_INET6):
            for m in node.routes_via(fam, ifindex):
                if m[16 + 5] == 2:  # rtm_protocol RTPROT_KERNEL
                    continue
                gone += Service._delete_dumped(node, m, RTM_DELROUTE, "route through a helper deleted", ifindex=ifindex)
        return gone

    @staticmethod
    def _drop_addresses(node: Node, ifindex: int) -> int:
        """Delete every address on helper ``ifindex`` (a helper has none: ``addrgenmode none``; an
        address there makes a hidden ``local`` route that takes packets for it). One RTM_GETADDR
        dump per family, filtered by the kernel (strict: ifa_index); each deletion is the dumped
        address sent back (RTM_DELADDR). Returns how many went."""
        gone = 0
        for fam in (socket.AF_INET, socket.AF_INET6):
            for m in node.dump(22, struct.pack("=BBBBi", fam, 0, 0, 0, ifindex), strict=True):  # RTM_GETADDR, struct ifaddrmsg
                if struct.unpack_from("=i", m, 16 + 4)[0] != ifindex:
                    continue
                gone += Service._delete_dumped(node, m, 21, "address on a helper deleted", ifindex=ifindex)  # RTM_DELADDR
        return gone

    @staticmethod
    def _drop_foreign_rules(node: Node, dn: object | None) -> int:
        """Delete every policy rule on a helper's input (``iif sr6d*``, ``iif sr6gso``) or looking
        up a table the node's ip hides (at or above :data:`HIDDEN_TABLE_BASE`), but the
        decapsulation helpers' own two each (``lookup N`` and ``unreachable``, at
        :meth:`decap.DecapNode._pref`): another rule there sends a tenant's decapsulated or
        re-encapsulated packets into another tenant's table, or into a hidden table no capture
        shows (the second and third reconciler attacks, issue 35). A route in a hidden table no
        rule looks up decides nothing. One RTM_GETRULE dump; each deletion is the dumped rule
        sent back (RTM_DELRULE), so only it goes."""
        own: set[tuple[int, int, str, int, int]] = set()
        for h in (dn.helpers.values() if dn is not None else []):  # type: ignore[attr-defined]
            for fam in h.families:
                af = socket.AF_INET if fam == "-4" else socket.AF_INET6
                own |= {(af, dn._pref(0), h.name, h.table, 1), (af, dn._pref(1), h.name, 0, 7)}  # type: ignore[attr-defined]  # FR_ACT_TO_TBL, FR_ACT_UNREACHABLE
        gone = 0
        for m in node.dump(34, bytes(12)):  # RTM_GETRULE
            a = dict(attrs(m[16 + 12:]))
            iif = a.get(FRA_IIFNAME, b"").rstrip(b"\0").decode(errors="replace")
            table = struct.unpack_from("=I", a[FRA_TABLE])[0] if FRA_TABLE in a else m[16 + 4]
            action = m[16 + 7]
            key = (m[16], struct.unpack_from("=I", a[6])[0] if 6 in a else 0, iif, table if action == 1 else 0, action)
            if not (iif.startswith(OWN_DEVICE_PREFIXES) or (action == 1 and table >= HIDDEN_TABLE_BASE)) or key in own:
                continue
            gone += Service._delete_dumped(node, m, 33, "rule on a helper deleted", iif=iif, table=table)  # RTM_DELRULE
        return gone

    # -- the loop ----------------------------------------------------------------------------

    def serve(self, stop: Callable[[], bool]) -> None:
        """Serve until ``stop()`` is true: one thread per node (so that one node's big batch does
        not hold the others up: program loads, netlink and the helpers' commands release the
        GIL), and this thread refreshing the DX next hops and repairing the helpers every
        :data:`DX_REFRESH_S`. A node's requests and its refresh take turns (``Node.lock``)."""
        threads = [threading.Thread(target=self._serve_node, args=(node, stop), name=f"node-{node.name}", daemon=True)
                   for node in self.nodes.values()]  # fmt: skip
        for t in threads:
            t.start()
        tick = threading.Event()
        while not stop():
            tick.wait(DX_REFRESH_S)  # the refresh period, not a settle delay
            self.refresh_next_hops()

    def _serve_node(self, node: Node, stop: Callable[[], bool]) -> None:
        """Accept and answer ``node``'s connections (at most :data:`MAX_CONNECTIONS_PER_NODE`)."""
        sel = selectors.DefaultSelector()
        node.listener.setblocking(False)
        sel.register(node.listener, selectors.EVENT_READ, "listen")
        open_conns = 0
        while not stop():
            for key, _ev in sel.select(timeout=1.0):
                if key.data == "listen":
                    with contextlib.suppress(BlockingIOError, InterruptedError, OSError):
                        conn, _ = node.listener.accept()
                        if open_conns >= MAX_CONNECTIONS_PER_NODE:
                            conn.close()  # one node cannot take every descriptor of the lab's service
                            continue
                        conn.setblocking(True)
                        conn.settimeout(30)
                        open_conns += 1
                        sel.register(conn, selectors.EVENT_READ, "conn")
                    continue
                conn = key.fileobj
                try:
                    data = conn.recv(1 << 20)
                    if data:
                        pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
                        with node.lock:
                            answer = self.handle(node, data, pid)
                        conn.send(answer)
                        continue
                except OSError:
                    pass
                sel.unregister(conn)
                conn.close()
                open_conns -= 1


# -- process --------------------------------------------------------------------------------------


def _log(lab_dir: Path, **event: object) -> None:
    with contextlib.suppress(OSError), open(lab_dir / SOCKET_DIR / "supervisor.jsonl", "a") as f:
        f.write(json.dumps({"t": time.time(), **event}) + "\n")


def running(lab_dir: Path) -> int | None:
    """The pid of the lab's data-plane service (its supervisor) if it runs, else None."""
    from substrate.record import pid_alive

    try:
        info = json.loads((lab_dir / SOCKET_DIR / "service.json").read_text())
    except (OSError, ValueError):
        return None
    pid = int(info.get("pid", 0))
    return pid if pid and pid_alive(pid, int(info.get("start", 0))) else None


def stop(lab_dir: Path, timeout_s: float = 5.0) -> bool:
    """Stop the lab's data-plane service (SIGTERM to its supervisor, which ends its worker; SIGKILL
    after ``timeout_s``); whether one ran. Part of the lab's destroy: forwarding needs no service,
    only SRv6 changes do, and the lab is going."""
    from substrate.process import terminate

    pid = running(lab_dir)
    if pid is None:
        return False
    terminate(pid, timeout_s)  # the supervisor ends its worker first
    return True


def listen(lab_dir: Path, nodes: list[str]) -> dict[str, socket.socket]:
    """Listening SOCK_SEQPACKET sockets, one per node, mode 0600 (root of the host, and the node's
    root through its bind mount, which maps to the host's root)."""
    d = lab_dir / SOCKET_DIR
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for n in nodes:
        p = socket_path(lab_dir, n)
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.bind(str(p))
        os.chmod(p, 0o600)
        s.listen(16)
        out[n] = s
    return out


def main(argv: list[str]) -> int:
    """``python -m substrate.dataplane.ebpf.service LAB_DIR NODE=NETNS_PATH...``: supervise a
    worker serving the nodes; prints ``ready`` once every socket listens. Lives as long as the
    lab directory (a lab controller of its own: ``harness lab cleanup`` and the lab's destroy stop
    it); SIGTERM stops it and its worker."""
    from substrate.dataplane.ebpf import loader, programs
    from substrate.record import pid_start

    import resource

    lab_dir = Path(argv[0])
    pairs = dict(a.split("=", 1) for a in argv[1:])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # nodes x MAX_CONNECTIONS_PER_NODE, with room
    listeners = listen(lab_dir, list(pairs))
    maps = {n: loader.NodeMaps() for n in pairs}
    record = lab_dir / SOCKET_DIR / "service.json"  # read by stop() (the lab's destroy, harness lab cleanup)
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "start": pid_start(os.getpid())}))
    tmp.replace(record)
    print("ready", flush=True)
    state = {"stopping": False, "child": 0}

    def _term(*_a: object) -> None:
        state["stopping"] = True
        if state["child"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(state["child"], signal.SIGTERM)

    signal.signal(signal.SIGTERM, _term)
    restarts: list[float] = []
    while not state["stopping"] and lab_dir.exists():
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            nodes = {n: Node(n, pairs[n], listeners[n], maps[n]) for n in pairs}
            svc = Service(nodes, programs.install_programs, programs.read_counters)
            svc.serve(lambda: not lab_dir.exists())
            os._exit(0)
        state["child"] = pid
        status = 0
        with contextlib.suppress(ChildProcessError):
            _p, status = os.waitpid(pid, 0)
        state["child"] = 0
        if state["stopping"] or not lab_dir.exists():
            break
        now = time.monotonic()
        restarts = [t for t in restarts if now - t < 60] + [now]
        _log(lab_dir, event="worker died", status=status, restarts=len(restarts))
        if len(restarts) > MAX_RESTARTS_PER_MIN:  # a worker that keeps dying: restarts are spaced, never given up
            _log(lab_dir, event="restarts limited", reason=f"more than {MAX_RESTARTS_PER_MIN} restarts in a minute")
            deadline = restarts[0] + 60
            while time.monotonic() < deadline and not state["stopping"] and lab_dir.exists():
                time.sleep(0.5)  # the rate limit's own wait, not a settle delay
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
