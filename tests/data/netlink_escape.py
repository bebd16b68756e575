"""Raw rtnetlink attempts to act on other nodes' network namespaces (issue 17, item 1).

Written the way an agent in a node's root shell would: the standard library only (an AF_NETLINK
socket and struct), piped into ``python3 -`` through the A0 shell. For every namespace id the
node's own namespace knows (``RTM_GETNSID``, i.e. ``ip netns list-id``, and the
``IFLA_LINK_NETNSID`` of its veths), it tries to

- list that namespace's interfaces (``RTM_GETLINK`` dump with ``IFLA_TARGET_NETNSID``);
- create a veth pair inside it (``RTM_NEWLINK`` with ``IFLA_TARGET_NETNSID``), also with the peer
  end back in the node's own namespace (a tunnel between the two);
- delete the peer end of its own veth there (``RTM_DELLINK`` with ``IFLA_TARGET_NETNSID``, by
  the peer's index and by name: the way r6's eth3 was deleted in the issue);
- move an interface of its own (a fresh veth end) into it (``RTM_SETLINK`` with
  ``IFLA_TARGET_NETNSID``: the destination of a move) -- the "moved interface" way in;
- create a link bound to an interface of the target (``IFLA_LINK`` + ``IFLA_LINK_NETNSID``).

Prints one JSON object: ``nsids`` (what it found) and ``attempts`` (each with ``errno``, 0 when
the kernel accepted it, and ``detail``). Cleans up what it created in its own namespace.
"""

import json
import os
import socket
import struct

NETLINK_ROUTE = 0
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_SETLINK, RTM_GETNSID = 16, 17, 18, 19, 90
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 1, 4, 0x200, 0x400, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
IFLA_IFNAME, IFLA_LINK, IFLA_LINKINFO, IFLA_NET_NS_FD, IFLA_LINK_NETNSID, IFLA_TARGET_NETNSID = 3, 5, 18, 28, 37, 46
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER, NETNSA_NSID = 1, 2, 1, 1

seq = 0


def attr(kind, payload):
    n = 4 + len(payload)
    return struct.pack("HH", n, kind) + payload + b"\0" * ((4 - n % 4) % 4)


def u32(kind, v):
    return attr(kind, struct.pack("I", v))


def s32(kind, v):
    return attr(kind, struct.pack("i", v))


def name(kind, s):
    return attr(kind, s.encode() + b"\0")


def ifinfo(index=0, flags=0, change=0):
    return struct.pack("BxHiII", socket.AF_UNSPEC, 0, index, flags, change)


def request(kind, flags, body):
    """Send one request; return (errno, [payloads]) -- errno 0 when the kernel accepted it."""
    global seq
    seq += 1
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    try:
        s.bind((0, 0))
        s.send(struct.pack("IHHII", 16 + len(body), kind, flags | NLM_F_REQUEST, seq, 0) + body)
        out = []
        while True:
            data = s.recv(1 << 20)
            off = 0
            while off < len(data):
                n, t, _f, _s, _p = struct.unpack_from("IHHII", data, off)
                payload = data[off + 16:off + n]
                if t == NLMSG_ERROR:
                    err = -struct.unpack_from("i", payload)[0]
                    return err, out
                if t == NLMSG_DONE:  # a dump's error comes here
                    return (-struct.unpack_from("i", payload)[0] if len(payload) >= 4 else 0), out
                out.append(payload)
                off += (n + 3) & ~3
            if not flags & NLM_F_DUMP:
                return 0, out
    finally:
        s.close()


def attrs(buf, off):
    out = {}
    while off + 4 <= len(buf):
        n, kind = struct.unpack_from("HH", buf, off)
        if n < 4:
            break
        out[kind & 0x3FFF] = buf[off + 4:off + n]
        off += (n + 3) & ~3
    return out


def links(nsid=None):
    body = ifinfo() + (s32(IFLA_TARGET_NETNSID, nsid) if nsid is not None else b"")
    err, msgs = request(RTM_GETLINK, NLM_F_DUMP, body)
    out = []
    for m in msgs:
        index = struct.unpack_from("i", m, 4)[0]
        a = attrs(m, 16)
        out.append({
            "index": index,
            "name": a.get(IFLA_IFNAME, b"").rstrip(b"\0").decode(),
            "peer_index": struct.unpack("i", a[IFLA_LINK])[0] if IFLA_LINK in a else None,
            "link_nsid": struct.unpack("i", a[IFLA_LINK_NETNSID])[0] if IFLA_LINK_NETNSID in a else None,
        })
    return err, out


def nsids():
    err, msgs = request(RTM_GETNSID, NLM_F_DUMP, struct.pack("Bxxx", socket.AF_UNSPEC))
    found = set()
    for m in msgs:
        a = attrs(m, 4)
        if NETNSA_NSID in a:
            found.add(struct.unpack("i", a[NETNSA_NSID])[0])
    return found


def veth(name_a, name_b, outer=b"", peer=b""):
    info = attr(IFLA_INFO_KIND, b"veth\0") + attr(IFLA_INFO_DATA, attr(VETH_INFO_PEER, ifinfo() + name(IFLA_IFNAME, name_b) + peer))
    return ifinfo() + name(IFLA_IFNAME, name_a) + outer + attr(IFLA_LINKINFO, info)


def main():
    attempts = []

    def tried(what, nsid, result, detail=""):
        err = result[0] if isinstance(result, tuple) else result
        attempts.append({"attempt": what, "nsid": nsid, "errno": err, "detail": detail})

    _, own = links()
    ids = nsids() | {ln["link_nsid"] for ln in own if ln["link_nsid"] is not None and ln["link_nsid"] >= 0}
    peers = {ln["link_nsid"]: ln for ln in own if ln["link_nsid"] is not None and ln["link_nsid"] >= 0}
    own_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
    create = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    for i, nsid in enumerate(sorted(ids)):
        err, theirs = links(nsid)
        tried("list", nsid, err, ",".join(ln["name"] for ln in theirs))
        tried("create-veth-in", nsid, request(RTM_NEWLINK, create, veth(f"xa{i}", f"xb{i}", s32(IFLA_TARGET_NETNSID, nsid))))
        tried("create-veth-tunnel", nsid, request(
            RTM_NEWLINK, create, veth(f"xc{i}", f"xd{i}", s32(IFLA_TARGET_NETNSID, nsid), u32(IFLA_NET_NS_FD, own_ns))))
        peer = peers.get(nsid)
        if peer and peer["peer_index"]:
            target = s32(IFLA_TARGET_NETNSID, nsid)
            tried("create-on-peer", nsid, request(RTM_NEWLINK, create, ifinfo() + name(IFLA_IFNAME, f"xm{i}") + u32(IFLA_LINK, peer["peer_index"])
                                                  + s32(IFLA_LINK_NETNSID, nsid) + attr(IFLA_LINKINFO, attr(IFLA_INFO_KIND, b"macvlan\0"))))
            tried("delete-peer", nsid, request(RTM_DELLINK, NLM_F_ACK, ifinfo(peer["peer_index"]) + target))
            tried("delete-peer-by-name", nsid, request(RTM_DELLINK, NLM_F_ACK, ifinfo() + target + name(IFLA_IFNAME, peer["name"])))
        # the moved interface: a veth end of its own, moved into the target namespace
        made = request(RTM_NEWLINK, create, veth(f"xe{i}", f"xf{i}"))
        if made[0] == 0:
            idx = next(ln["index"] for ln in links()[1] if ln["name"] == f"xf{i}")
            # in RTM_SETLINK, IFLA_TARGET_NETNSID is where the device goes
            tried("move-own-veth-end", nsid, request(RTM_SETLINK, NLM_F_ACK, ifinfo(idx) + s32(IFLA_TARGET_NETNSID, nsid)))
        else:
            tried("make-own-veth", nsid, made, "could not create a veth in its own namespace")
    for ln in links()[1]:  # clean up what it made at home
        if ln["name"].startswith("x") and ln["name"][1:2] in "acdef":
            request(RTM_DELLINK, NLM_F_ACK, ifinfo(ln["index"]))
    print(json.dumps({"nsids": sorted(ids), "attempts": attempts}))


main()
