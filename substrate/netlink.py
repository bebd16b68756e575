"""Read-only rtnetlink dumps in a node's network namespace, from the host process.

Device-state capture must see every per-interface IPv4/IPv6 setting and neighbour-table parameter
(``/proc/sys/net/ipv{4,6}/{conf,neigh}/IF/*``: about a thousand files on a router, the largest
part of a capture's cost when read one file at a time). The kernel gives all of them in two dumps:
``RTM_GETLINK`` carries each interface's IPv4 and IPv6 ``devconf`` arrays (``IFLA_AF_SPEC``:
``IFLA_INET_CONF``, ``IFLA_INET6_CONF``, and the IPv6 token), and ``RTM_GETNEIGHTBL`` each
table's per-interface parameters (``NDTA_PARMS``). They are compared as raw values, so a setting
this module has no name for still counts; the files are read only for an interface whose values
changed (to know which to write back).

The socket is opened from a thread that enters the namespace (``setns(2)`` affects the calling
thread only) and returns at once; the dump then runs from the host. Nothing is written and no
packet leaves the host namespace. Sources: linux/rtnetlink.h, linux/if_link.h, linux/neighbour.h,
net/ipv4/devinet.c (inet_fill_link_af), net/ipv6/addrconf.c (inet6_fill_link_af).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
import threading
from collections.abc import Iterator

from substrate import nsread
from substrate.errors import SubstrateError

RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWNEIGHTBL, RTM_GETNEIGHTBL = 64, 66
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFLA_IFNAME, IFLA_AF_SPEC, IFLA_EXT_MASK = 3, 26, 29
RTEXT_FILTER_SKIP_STATS = 1 << 3
IFLA_INET_CONF = 1
IFLA_INET6_CONF, IFLA_INET6_TOKEN = 2, 7
NDTA_NAME, NDTA_PARMS = 1, 6
NDTPA_IFINDEX, NDTPA_REFCNT, NDTPA_REACHABLE_TIME = 1, 2, 3
#: Neighbour parameters that move by themselves: the reference count and the reachable time the
#: kernel draws at random around the base reachable time (RFC 4861 section 6.3.2).
_NDTPA_VOLATILE = frozenset({NDTPA_REFCNT, NDTPA_REACHABLE_TIME})

_lock = threading.Lock()


class NetlinkError(SubstrateError):
    """A namespace could not be entered or a dump failed."""


def _socket_in(netns_path: str, family: int = socket.AF_NETLINK, proto: int = socket.NETLINK_ROUTE) -> socket.socket:
    """A netlink socket (NETLINK_ROUTE unless ``proto`` says) bound to the network namespace at
    ``netns_path`` (a socket keeps the namespace it was created in; entered by ``nsread.entered``).

    Raises:
        NetlinkError: the namespace could not be opened or entered.
    """
    try:
        with nsread.entered(netns_path):
            return socket.socket(family, socket.SOCK_RAW, proto)
    except nsread.NamespaceReadError as e:
        raise NetlinkError(str(e)) from None


def _attrs(buf: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of the netlink attributes in ``buf[start:end]``."""
    end = len(buf) if end is None else end
    p = start
    while p + 4 <= end:
        alen, atype = struct.unpack_from("HH", buf, p)
        if alen < 4:
            break
        yield atype & 0x3FFF, buf[p + 4 : p + alen]
        p += (alen + 3) & ~3


def _dump(netns_path: str, msg_type: int, body: bytes, want: int, *, proto: int = socket.NETLINK_ROUTE,
          dump: bool = True, sock: socket.socket | None = None) -> list[bytes]:
    """The messages of type ``want`` answering one request (each: header stripped): a dump
    (until ``NLMSG_DONE``), or with ``dump`` false a plain get (its one answer). ``sock``: a
    socket of the namespace to reuse (kept open), else one is made for the request."""
    if sock is None:
        with _lock:  # setns and socket creation are quick; one thread at a time keeps them simple
            own = _socket_in(netns_path, socket.AF_NETLINK, proto)
        with own:
            return _dump(netns_path, msg_type, body, want, proto=proto, dump=dump, sock=own)
    sock.settimeout(10)
    flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else 0)
    sock.send(struct.pack("IHHII", 16 + len(body), msg_type, flags, 1, 0) + body)
    out: list[bytes] = []
    while True:
        buf = sock.recv(1 << 20)
        off = 0
        while off + 16 <= len(buf):
            length, mtype, _flags, _seq, _pid = struct.unpack_from("IHHII", buf, off)
            if mtype == NLMSG_DONE:
                return out
            if mtype == NLMSG_ERROR:
                (err,) = struct.unpack_from("i", buf, off + 16)
                if err:
                    raise NetlinkError(f"request {msg_type} failed: {os.strerror(-err)}")
            elif mtype == want:
                out.append(buf[off + 16 : off + length])
                if not dump:
                    return out
            off += (length + 3) & ~3


#: NETLINK_XFRM and its messages (linux/xfrm.h): SA and SP counts, default policies.
NETLINK_XFRM = 6
XFRM_MSG_NEWSADINFO, XFRM_MSG_GETSADINFO, XFRM_MSG_NEWSPDINFO, XFRM_MSG_GETSPDINFO = 34, 35, 36, 37
XFRM_MSG_GETDEFAULT = 40
XFRMA_SAD_CNT, XFRMA_SPD_INFO = 1, 1
XFRM_USERPOLICY_ACCEPT = 2


def xfrm_empty(netns_path: str) -> bool:
    """Whether the namespace holds no IPsec state: no security association, no security policy
    (socket policies included) and every default policy accepting -- what ``ip xfrm state``,
    ``ip xfrm policy`` and ``ip xfrm policy getdefault`` show of a namespace nobody configured.
    Three small requests (``XFRM_MSG_GETSADINFO``, ``XFRM_MSG_GETSPDINFO``, ``XFRM_MSG_GETDEFAULT``:
    linux/xfrm.h, net/xfrm/xfrm_user.c), no dump. Anything unexpected in an answer counts as not
    empty (the caller then reads the state in full).

    Raises:
        NetlinkError: the namespace could not be entered or a request failed.
    """
    flags = struct.pack("I", 0)
    sad = _dump(netns_path, XFRM_MSG_GETSADINFO, flags, XFRM_MSG_NEWSADINFO, proto=NETLINK_XFRM, dump=False)
    spd = _dump(netns_path, XFRM_MSG_GETSPDINFO, flags, XFRM_MSG_NEWSPDINFO, proto=NETLINK_XFRM, dump=False)
    dflt = _dump(netns_path, XFRM_MSG_GETDEFAULT, b"\0\0\0\0", XFRM_MSG_GETDEFAULT, proto=NETLINK_XFRM, dump=False)
    if len(sad) != 1 or len(spd) != 1 or len(dflt) != 1 or len(dflt[0]) < 3:
        return False
    sa_count = [struct.unpack("I", v[:4])[0] for t, v in _attrs(sad[0], 4) if t == XFRMA_SAD_CNT and len(v) >= 4]
    sp_counts = [struct.unpack("6I", v[:24]) for t, v in _attrs(spd[0], 4) if t == XFRMA_SPD_INFO and len(v) >= 24]
    return sa_count == [0] and len(sp_counts) == 1 and not any(sp_counts[0]) and \
        all(b == XFRM_USERPOLICY_ACCEPT for b in dflt[0][:3])  # fmt: skip


def settings(netns_path: str) -> tuple[dict[str, str], dict[str, str]]:
    """Every per-interface IP setting and neighbour parameter of the namespace, each as one
    comparable string (two dumps):

    - per interface, its IPv4 and IPv6 settings (every ``conf/IF`` sysctl) and IPv6 token:
      ``{ifname: "token:...;v4:1,0,...;v6:1,64,..."}``;
    - per neighbour table and interface (``arp_cache/eth1``; ``arp_cache/-``: the table's own),
      its parameters (every ``neigh/IF`` sysctl) but the volatile ones (reference count,
      randomised reachable time).

    Raises:
        NetlinkError.
    """
    body = struct.pack("BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0) + struct.pack("HHI", 8, IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS)
    links: dict[str, str] = {}
    names: dict[int, str] = {}
    # one socket for both dumps: the link dump's reads raise what the kernel allocates per dump
    # message (max_recvmsg_len, net/netlink/af_netlink.c) to 32 KiB. Kernel 6.18's neighbour-table
    # dump (neightbl_dump_info) resumes the second table skipping as many entries as the first one
    # had when the first table's entries fill a message exactly: on a fresh socket (page-sized
    # first message) a node with 14 or 15 devices lost every ndisc_cache device entry.
    with _lock:
        sock = _socket_in(netns_path, socket.AF_NETLINK, socket.NETLINK_ROUTE)
    with sock:
        link_msgs = _dump(netns_path, RTM_GETLINK, body, RTM_NEWLINK, sock=sock)
        tbl_msgs = _dump(netns_path, RTM_GETNEIGHTBL, struct.pack("Bxxx", socket.AF_UNSPEC), RTM_NEWNEIGHTBL, sock=sock)
    for msg in link_msgs:
        (index,) = struct.unpack_from("i", msg, 4)
        name, parts = "", []
        for atype, payload in _attrs(msg, 16):
            if atype == IFLA_IFNAME:
                name = payload.rstrip(b"\0").decode(errors="replace")
            elif atype == IFLA_AF_SPEC:
                for family, inner in _attrs(payload):
                    for ctype, value in _attrs(inner):
                        if family == socket.AF_INET and ctype == IFLA_INET_CONF:
                            parts.append("v4:" + ",".join(map(str, struct.unpack(f"{len(value) // 4}I", value))))
                        elif family == socket.AF_INET6 and ctype == IFLA_INET6_CONF:
                            parts.append("v6:" + ",".join(map(str, struct.unpack(f"{len(value) // 4}i", value))))
                        elif family == socket.AF_INET6 and ctype == IFLA_INET6_TOKEN:
                            parts.append("token:" + value.hex())
        if name:
            names[index] = name
            links[name] = ";".join(sorted(parts))
    neigh: dict[str, str] = {}
    for msg in tbl_msgs:
        table, dev, params = "", "-", []
        for atype, payload in _attrs(msg, 4):  # after struct ndtmsg (family, padding)
            if atype == NDTA_NAME:
                table = payload.rstrip(b"\0").decode(errors="replace")
            elif atype == NDTA_PARMS:
                for ptype, value in _attrs(payload):
                    if ptype == NDTPA_IFINDEX:
                        (idx,) = struct.unpack("I", value[:4])
                        dev = names.get(idx, f"#{idx}") if idx else "-"
                    elif ptype not in _NDTPA_VOLATILE:
                        params.append(f"{ptype}={value.hex()}")
        if table:
            neigh[f"{table}/{dev}"] = ",".join(sorted(params))
    return links, neigh


# -- change monitor -------------------------------------------------------------------------------

#: rtnetlink multicast groups a :class:`ChangeMonitor` joins (linux/rtnetlink.h, enum
#: rtnetlink_groups): interfaces, traffic control, addresses, routes, rules, per-family netconf
#: (forwarding and the like), MPLS routes, nexthop objects. Neighbour entries are watched on a socket
#: of their own (:data:`RTNLGRP_NEIGH`): most of them move by themselves.
RTNLGRP_WATCHED = (1, 4, 5, 7, 8, 9, 11, 19, 24, 25, 27, 29, 32)
#: rtnetlink's neighbour group; of its announcements only static entries count as a change: state
#: NUD_PERMANENT (0x80) or NUD_NOARP (0x40), or flag NTF_PROXY (0x08) (linux/neighbour.h). A static
#: entry made before the monitor started and deleted since, and a proxy entry (kernel 6.18 announces
#: none: ``ip monitor neigh`` shows nothing for ``neigh add proxy``), are seen at the reconciler's full check.
RTNLGRP_NEIGH = 3
NUD_STATIC, NTF_PROXY = 0x80 | 0x40, 0x08
RTM_NEWNEIGH, RTM_DELNEIGH, NDA_DST = 28, 29, 1
#: nf_tables' multicast group (linux/netfilter/nfnetlink.h: NFNLGRP_NFTABLES) on NETLINK_NETFILTER.
NFNLGRP_NFTABLES = 7
NETLINK_NETFILTER = 12
SOL_NETLINK, NETLINK_ADD_MEMBERSHIP = 270, 1


class ChangeMonitor:
    """Whether a network namespace's kernel state may have changed since last asked: a netlink
    socket (from the host, opened in the namespace) subscribed to the rtnetlink groups of
    :data:`RTNLGRP_WATCHED` and to nf_tables' group, read without blocking. Every change the kernel
    makes to links, addresses, routes, rules, qdiscs, netconf settings or nftables is announced
    there (rtnetlink(7), nfnetlink); a lost announcement (``ENOBUFS``: the receive buffer
    overflowed) counts as a change. Costs nothing while nothing changes.

    Raises (constructor):
        NetlinkError: the namespace could not be entered or the groups could not be joined.
    """

    def __init__(self, netns_path: str):
        self.path = netns_path
        self.inode = os.stat(netns_path).st_ino
        self.socks: list[socket.socket] = []
        self.neigh: socket.socket | None = None
        #: (ifindex, destination) of the entries announced static since the monitor started
        self.static_neigh: set[tuple[int, bytes]] = set()
        try:
            with _lock:
                route = _socket_in(netns_path)
                self.socks.append(route)
                nft = _socket_in(netns_path, socket.AF_NETLINK, NETLINK_NETFILTER)
                self.socks.append(nft)
                neigh = _socket_in(netns_path)
                self.socks.append(neigh)
                self.neigh = neigh
            for sock, groups in ((route, RTNLGRP_WATCHED), (nft, (NFNLGRP_NFTABLES,)), (neigh, (RTNLGRP_NEIGH,))):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
                sock.bind((0, 0))
                for g in groups:
                    with contextlib.suppress(OSError):  # a group this kernel lacks (MPLS, nexthop objects)
                        sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, g)
                sock.setblocking(False)
        except OSError as e:
            self.close()
            raise NetlinkError(f"cannot watch {netns_path}: {e.strerror or e}") from None

    def changed(self) -> bool:
        """Whether anything was announced since the last call (reads every pending message), or
        the namespace at the path is another one now (re-created)."""
        got = False
        for sock in self.socks:
            while True:
                try:
                    data = sock.recv(1 << 16)
                    if not data:
                        break
                    got = self._neighbours(data) or got if sock is self.neigh else True
                except BlockingIOError:
                    break
                except OSError:  # ENOBUFS: announcements were lost
                    got = True
        try:
            return got or os.stat(self.path).st_ino != self.inode
        except OSError:
            return True

    def _neighbours(self, data: bytes) -> bool:
        """Whether neighbour announcements ``data`` touch a static entry: one announced static, or
        one seen static since the monitor started that changed or went (its delete announces the
        state it had last only when it was static: tracked by key)."""
        msgs = neighbour_messages(data)
        if msgs is None:
            return True
        got = False
        for mtype, key, static in msgs:
            if static or key in self.static_neigh:
                got = True
            if static and mtype == RTM_NEWNEIGH:
                self.static_neigh.add(key)
            else:
                self.static_neigh.discard(key)
        return got

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        self.socks = []


def neighbour_messages(data: bytes) -> list[tuple[int, tuple[int, bytes], bool]] | None:
    """The rtnetlink neighbour announcements of a datagram (``RTM_NEWNEIGH``/``RTM_DELNEIGH``:
    nlmsghdr, struct ndmsg -- family, 3 pad bytes, ifindex, u16 state, u8 flags, u8 type -- then
    attributes, NDA_DST among them; linux/neighbour.h) as ``(message type, (ifindex, destination),
    static)``, static meaning a :data:`NUD_STATIC` state or a proxy entry, but not the no-ARP entry
    of a multicast destination (the kernel's own: :func:`substrate.devstate._neigh_args`). None
    when the datagram cannot be parsed (counted as a change)."""
    out = []
    off = 0
    bo = sys.byteorder
    while off + 16 <= len(data):
        length, mtype = int.from_bytes(data[off:off + 4], bo), int.from_bytes(data[off + 4:off + 6], bo)
        if length < 28 or off + length > len(data):
            return None
        ifindex = int.from_bytes(data[off + 20:off + 24], bo, signed=True)
        state, flags = int.from_bytes(data[off + 24:off + 26], bo), data[off + 26]
        dst, a = b"", off + 28
        while a + 4 <= off + length:
            alen, atype = int.from_bytes(data[a:a + 2], bo), int.from_bytes(data[a + 2:a + 4], bo)
            if alen < 4:
                return None
            if atype == NDA_DST:
                dst = data[a + 4:a + alen]
            a += (alen + 3) & ~3
        multicast = (len(dst) == 16 and dst[0] == 0xFF) or (len(dst) == 4 and 224 <= dst[0] <= 239)
        static = bool(state & 0x80 or (state & NUD_STATIC and not multicast) or flags & NTF_PROXY)
        out.append((mtype, (ifindex, dst), static))
        off += (length + 3) & ~3
    return out
