"""SRv6 route state as the kernel's seg6 keeps it, without the kernel's seg6 (pure, no I/O).

The eBPF data plane stores an SRv6 route as a real kernel route with an ``encap bpf`` program
whose LWT program name (``LWT_BPF_PROG_NAME``, at most 256 bytes, net/core/lwt_bpf.c) carries the
route's SRv6 parameters: ``anibench:<prog id>:<base64url of kind byte + body>``. This module

- reads the ``RTA_ENCAP`` of an ``encap seg6`` (``LWTUNNEL_ENCAP_SEG6``) or ``encap seg6local``
  (``LWTUNNEL_ENCAP_SEG6_LOCAL``) request as iproute2 6.1 sends it, and checks it as the kernel's
  ``seg6_build_state`` / ``seg6_local_build_state`` do (net/ipv6/seg6_iptunnel.c,
  net/ipv6/seg6_local.c, kernel 6.1-6.18), answering with the kernel's errno and extack text;
- encodes it into the program name, and decodes a name back into the ``RTA_ENCAP_TYPE`` /
  ``RTA_ENCAP`` attributes the kernel's seg6 would dump for that route (``seg6_fill_encap_info``:
  the tunnel info cut to the SRH's own length; ``seg6_local_fill_encap``: the action then every
  parameter in ascending attribute order, counters included when the route counts).

Netlink attribute helpers (:func:`attrs`, :func:`attr`) work on raw bytes in host byte order.
"""

from __future__ import annotations

import base64
import errno
import ipaddress
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

# include/uapi/linux/lwtunnel.h
LWTUNNEL_ENCAP_BPF, LWTUNNEL_ENCAP_SEG6, LWTUNNEL_ENCAP_SEG6_LOCAL = 6, 5, 7
LWT_BPF_IN, LWT_BPF_OUT, LWT_BPF_XMIT, LWT_BPF_XMIT_HEADROOM = 1, 2, 3, 4
LWT_BPF_PROG_FD, LWT_BPF_PROG_NAME = 1, 2
#: net/core/lwt_bpf.c: MAX_PROG_NAME, with the terminating NUL.
MAX_PROG_NAME = 256
# include/uapi/linux/seg6_iptunnel.h
SEG6_IPTUNNEL_SRH = 1
SEG6_IPTUN_MODE_INLINE, SEG6_IPTUN_MODE_ENCAP, SEG6_IPTUN_MODE_L2ENCAP = 0, 1, 2
SEG6_IPTUN_MODE_ENCAP_RED, SEG6_IPTUN_MODE_L2ENCAP_RED = 3, 4
MODE_NAMES = {0: "inline", 1: "encap", 2: "l2encap", 3: "encap.red", 4: "l2encap.red"}
# include/uapi/linux/seg6_local.h
(SEG6_LOCAL_ACTION, SEG6_LOCAL_SRH, SEG6_LOCAL_TABLE, SEG6_LOCAL_NH4, SEG6_LOCAL_NH6, SEG6_LOCAL_IIF,
 SEG6_LOCAL_OIF, SEG6_LOCAL_BPF, SEG6_LOCAL_VRFTABLE, SEG6_LOCAL_COUNTERS, SEG6_LOCAL_FLAVORS) = range(1, 12)
SEG6_LOCAL_CNT_PAD, SEG6_LOCAL_CNT_PACKETS, SEG6_LOCAL_CNT_BYTES, SEG6_LOCAL_CNT_ERRORS = 1, 2, 3, 4
SEG6_LOCAL_FLV_OPERATION, SEG6_LOCAL_FLV_LCBLOCK_BITS, SEG6_LOCAL_FLV_LCNODE_FN_BITS = 1, 2, 3
SEG6_LOCAL_FLV_OP_NEXT_CSID = 4
END, END_X, END_T, END_DX2, END_DX6, END_DX4, END_DT6, END_DT4, END_B6, END_B6_ENCAP = range(1, 11)
END_BPF, END_DT46 = 15, 16
ACTION_NAMES = {1: "End", 2: "End.X", 3: "End.T", 4: "End.DX2", 5: "End.DX6", 6: "End.DX4", 7: "End.DT6",
                8: "End.DT4", 9: "End.B6", 10: "End.B6.Encaps", 11: "End.BM", 12: "End.S", 13: "End.AS",
                14: "End.AM", 15: "End.BPF", 16: "End.DT46"}  # fmt: skip
#: Per action: (required attributes, optional attributes) -- net/ipv6/seg6_local.c seg6_action_table
#: (kernel 6.1+); counters are optional for every action.
ACTION_ATTRS: dict[int, tuple[frozenset[int], frozenset[int]]] = {
    END: (frozenset(), frozenset({SEG6_LOCAL_FLAVORS})),
    END_X: (frozenset({SEG6_LOCAL_NH6}), frozenset({SEG6_LOCAL_OIF, SEG6_LOCAL_FLAVORS})),
    END_T: (frozenset({SEG6_LOCAL_TABLE}), frozenset()),
    END_DX6: (frozenset({SEG6_LOCAL_NH6}), frozenset()),
    END_DX4: (frozenset({SEG6_LOCAL_NH4}), frozenset()),
    END_DT6: (frozenset(), frozenset({SEG6_LOCAL_TABLE, SEG6_LOCAL_VRFTABLE})),
    END_DT4: (frozenset({SEG6_LOCAL_VRFTABLE}), frozenset()),
    END_DT46: (frozenset({SEG6_LOCAL_VRFTABLE}), frozenset()),
    END_B6: (frozenset({SEG6_LOCAL_SRH}), frozenset()),
    END_B6_ENCAP: (frozenset({SEG6_LOCAL_SRH}), frozenset()),
}
#: Behaviours the eBPF data plane forwards (the others are refused in one line, never accepted
#: and silently not forwarded).
EBPF_ACTIONS = frozenset({END, END_DX4, END_DX6, END_DT6, END_DT4, END_DT46})
NLA_F_NESTED = 1 << 15
#: The SRH flag iproute2 sets with ``hmac KEYID`` (linux/seg6.h SR6_FLAG1_HMAC).
SR6_FLAG1_HMAC = 1 << 3
NAME_PREFIX = "anibench:"


class Seg6Error(Exception):
    """A request the kernel's seg6 would refuse, or one the eBPF data plane cannot carry.

    Attributes:
        errno: the positive errno the kernel answers with.
        extack: the extended-ack message (iproute2 prints it as ``Error: <text>.``), or "".
    """

    def __init__(self, err: int, extack: str = ""):
        super().__init__(f"{extack or errno.errorcode.get(err, err)} ({errno.errorcode.get(err, err)})")
        self.errno = err
        self.extack = extack


def attrs(buf: bytes) -> Iterator[tuple[int, bytes]]:
    """The (type without flags, payload) of each netlink attribute in ``buf`` (``struct nlattr``,
    4-byte aligned); stops at a malformed length, as the kernel's nla_parse would refuse it."""
    off = 0
    while off + 4 <= len(buf):
        ln, typ = struct.unpack_from("=HH", buf, off)
        if ln < 4 or off + ln > len(buf):
            return
        yield typ & 0x3FFF, buf[off + 4:off + ln]
        off += (ln + 3) & ~3


def attr(typ: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    raw = struct.pack("=HH", 4 + len(payload), typ) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _srh_ok(srh: bytes) -> bool:
    """net/ipv6/seg6.c seg6_validate_srh(srh, len, reduced=false): type 4, length matching the
    header's own, Segments Left <= Last Entry, Last Entry within the header, TLVs well formed."""
    if len(srh) < 8:
        return False
    _nh, hdrlen, typ, sl, first = struct.unpack_from("=BBBBB", srh)
    if typ != 4 or ((hdrlen + 1) << 3) != len(srh) or sl > first:
        return False
    if first > hdrlen // 2 - 1:
        return False
    off = 8 + (first + 1) * 16
    while off < len(srh):  # TLVs: the kernel takes each as type, length, value (no Pad1 case)
        if off + 2 > len(srh):
            return False
        off += 2 + srh[off + 1]
    return off == len(srh)


def srh_segments(srh: bytes) -> list[str]:
    """The SRH's segment list in travel order (Segment List[Last Entry] first, RFC 8754 2.1)."""
    first = srh[4]
    segs = [str(ipaddress.IPv6Address(srh[8 + 16 * i:24 + 16 * i])) for i in range(first + 1)]
    return segs[::-1]


@dataclass(frozen=True)
class Seg6Encap:
    """An ``encap seg6`` route: mode and SRH (``struct seg6_iptunnel_encap``).

    Attributes:
        mode: SEG6_IPTUN_MODE_* (``encap`` 1, ``encap.red`` 3, ``inline`` 0, l2 modes 2, 4).
        srh: the SRH as given, cut to its own length (``(hdrlen + 1) * 8`` bytes).
    """

    mode: int
    srh: bytes

    @classmethod
    def from_encap(cls, encap: bytes, family: int) -> Seg6Encap:
        """Parse and check the nested RTA_ENCAP of a request (seg6_build_state).

        Raises:
            Seg6Error: EINVAL where the kernel answers EINVAL; EOPNOTSUPP for what the eBPF
                data plane does not forward (inline and L2 modes), with one line saying so.
        """
        info = dict(attrs(encap)).get(SEG6_IPTUNNEL_SRH)
        if info is None or len(info) < 4 + 8 + 16:
            raise Seg6Error(errno.EINVAL)
        (mode,) = struct.unpack_from("=i", info)
        if mode not in MODE_NAMES or (mode == SEG6_IPTUN_MODE_INLINE and family != 10):
            raise Seg6Error(errno.EINVAL)
        srh = info[4:]
        if not _srh_ok(srh):
            raise Seg6Error(errno.EINVAL)
        if mode not in (SEG6_IPTUN_MODE_ENCAP, SEG6_IPTUN_MODE_ENCAP_RED):
            raise Seg6Error(errno.EOPNOTSUPP, f"the eBPF SRv6 data plane does not forward seg6 mode {MODE_NAMES[mode]}")
        if srh[5] & SR6_FLAG1_HMAC:  # iproute2's `hmac KEYID` (RFC 8754 2.1.2): the kernel signs each packet
            raise Seg6Error(errno.EOPNOTSUPP, "the eBPF SRv6 data plane does not do SRH HMAC (hmac KEYID)")
        return cls(mode, srh)

    @property
    def segments(self) -> list[str]:
        """The segment list in travel order."""
        return srh_segments(self.srh)

    def body(self) -> bytes:
        """What the kernel dumps as SEG6_IPTUNNEL_SRH (and what the name carries)."""
        return struct.pack("=i", self.mode) + self.srh

    def encap_attrs(self) -> bytes:
        """RTA_ENCAP_TYPE and RTA_ENCAP as the kernel's seg6 dumps them (RTA_ENCAP 22, TYPE 21)."""
        return attr(21, struct.pack("=H", LWTUNNEL_ENCAP_SEG6)) + attr(22, attr(SEG6_IPTUNNEL_SRH, self.body()))


@dataclass(frozen=True)
class Seg6Local:
    """An ``encap seg6local`` route.

    Attributes:
        action: SEG6_LOCAL_ACTION_* (End 1 ... End.DT46 16).
        params: attribute type -> payload, for every parameter but the counters.
        counters: the route counts (``count``): packets, bytes, errors are dumped with it.
    """

    action: int
    params: dict[int, bytes] = field(default_factory=dict)
    counters: bool = False

    @classmethod
    def from_encap(cls, encap: bytes) -> Seg6Local:
        """Parse and check the nested RTA_ENCAP of a request (seg6_local_build_state).

        Raises:
            Seg6Error: EINVAL for a missing, unknown or misplaced parameter (the kernel's
                answer); EOPNOTSUPP for a behaviour the eBPF data plane does not forward.
        """
        got = dict(attrs(encap))
        raw = got.pop(SEG6_LOCAL_ACTION, None)
        if raw is None or len(raw) < 4:
            raise Seg6Error(errno.EINVAL)
        (action,) = struct.unpack_from("=I", raw)
        counters = got.pop(SEG6_LOCAL_COUNTERS, None) is not None
        if action not in ACTION_NAMES:
            raise Seg6Error(errno.EINVAL)
        unsupported = Seg6Error(errno.EOPNOTSUPP, f"the eBPF SRv6 data plane does not forward seg6local action {ACTION_NAMES[action]}")
        if action not in ACTION_ATTRS:
            raise unsupported
        required, optional = ACTION_ATTRS[action]
        present = set(got)
        if not required <= present:
            raise Seg6Error(errno.EINVAL)
        for typ in present - required - optional:  # parse_nla_action reads only the action's own
            del got[typ]  # attributes: others are ignored, neither kept nor shown
        if action == END_DT6 and len(present & {SEG6_LOCAL_TABLE, SEG6_LOCAL_VRFTABLE}) != 1:
            raise Seg6Error(errno.EINVAL, "table or vrftable must be specified")  # seg6_end_dt6_build
        sizes = {SEG6_LOCAL_TABLE: 4, SEG6_LOCAL_VRFTABLE: 4, SEG6_LOCAL_NH4: 4, SEG6_LOCAL_NH6: 16,
                 SEG6_LOCAL_IIF: 4, SEG6_LOCAL_OIF: 4}  # fmt: skip
        for typ, payload in got.items():
            if typ in sizes and len(payload) < sizes[typ]:
                raise Seg6Error(errno.EINVAL)
        params = {t: (p[:sizes[t]] if t in sizes else p) for t, p in got.items()}
        if SEG6_LOCAL_FLAVORS in params:
            params[SEG6_LOCAL_FLAVORS] = _check_flavors(params[SEG6_LOCAL_FLAVORS])
        if SEG6_LOCAL_SRH in params and not _srh_ok(params[SEG6_LOCAL_SRH]):
            raise Seg6Error(errno.EINVAL)
        if action not in EBPF_ACTIONS:  # checked as the kernel would first: a malformed request is EINVAL
            raise unsupported
        return cls(action, params, counters)

    def u32(self, typ: int) -> int | None:
        """A u32 parameter (table, vrftable, oif), or None."""
        p = self.params.get(typ)
        return None if p is None else struct.unpack_from("=I", p)[0]

    def flavors(self) -> tuple[int, int, int] | None:
        """(operation bitmap, locator-block bits, node+function bits) of the NEXT-C-SID flavor, or None."""
        p = self.params.get(SEG6_LOCAL_FLAVORS)
        if p is None:
            return None
        f = dict(attrs(p))
        op = struct.unpack_from("=I", f[SEG6_LOCAL_FLV_OPERATION])[0]
        return op, f.get(SEG6_LOCAL_FLV_LCBLOCK_BITS, b"\x20")[0], f.get(SEG6_LOCAL_FLV_LCNODE_FN_BITS, b"\x10")[0]

    def body(self) -> bytes:
        """The name's body: the action, a counters flag, then the parameters as attributes."""
        return struct.pack("=IB", self.action, 1 if self.counters else 0) + b"".join(
            attr(t, self.params[t]) for t in sorted(self.params))

    @classmethod
    def from_body(cls, body: bytes) -> Seg6Local:
        """Inverse of :meth:`body`."""
        action, counters = struct.unpack_from("=IB", body)
        return cls(action, dict(attrs(body[5:])), bool(counters))

    def encap_attrs(self, counts: tuple[int, int, int] | None = None) -> bytes:
        """RTA_ENCAP_TYPE and RTA_ENCAP as the kernel's seg6local dumps them: the action, then the
        parameters in ascending attribute order, counters (packets, bytes, errors: ``counts``,
        zeros when None) when the route counts."""
        parts = {t: attr(t | NLA_F_NESTED, p) if t == SEG6_LOCAL_FLAVORS else attr(t, p) for t, p in self.params.items()}
        if self.counters:
            parts[SEG6_LOCAL_COUNTERS] = _counters_attr(counts)
        inner = attr(SEG6_LOCAL_ACTION, struct.pack("=I", self.action)) + b"".join(parts[t] for t in sorted(parts))
        return attr(21, struct.pack("=H", LWTUNNEL_ENCAP_SEG6_LOCAL)) + attr(22, inner)


def _counters_attr(counts: tuple[int, int, int] | None) -> bytes:
    p, b, e = counts or (0, 0, 0)
    return attr(SEG6_LOCAL_COUNTERS | NLA_F_NESTED, attr(SEG6_LOCAL_CNT_PACKETS, struct.pack("=Q", p))
                + attr(SEG6_LOCAL_CNT_BYTES, struct.pack("=Q", b)) + attr(SEG6_LOCAL_CNT_ERRORS, struct.pack("=Q", e)))


def _check_flavors(payload: bytes) -> bytes:
    """net/ipv6/seg6_local.c parse_nla_flavors: an operation bitmap is required (EINVAL, no
    message); only NEXT-C-SID is supported (others: EOPNOTSUPP, "Unsupported Flavor
    operation(s)"); lengths default to 32 and 16 bits and must be multiples of 8, each at least 8
    and at most 120, with block + node/function <= 128 (seg6_chk_next_csid_cfg: EINVAL, one message
    for all, "Invalid Locator Block/Node Function lengths"; kernel 6.1, checked against it by the
    conformance suite). Returns the canonical nested payload (operation, then both lengths), as
    the kernel dumps it."""
    f = dict(attrs(payload))
    op = f.get(SEG6_LOCAL_FLV_OPERATION)
    if op is None or len(op) < 4:
        raise Seg6Error(errno.EINVAL)
    (ops,) = struct.unpack_from("=I", op)
    if ops & ~(1 << SEG6_LOCAL_FLV_OP_NEXT_CSID) or not ops:
        raise Seg6Error(errno.EOPNOTSUPP, "Unsupported Flavor operation(s)")
    lb = f.get(SEG6_LOCAL_FLV_LCBLOCK_BITS, b"\x20")[0]
    nf = f.get(SEG6_LOCAL_FLV_LCNODE_FN_BITS, b"\x10")[0]
    if lb + nf > 128 or not 8 <= lb <= 120 or lb % 8 or not 8 <= nf <= 120 or nf % 8:
        raise Seg6Error(errno.EINVAL, "Invalid Locator Block/Node Function lengths")
    return (attr(SEG6_LOCAL_FLV_OPERATION, struct.pack("=I", ops)) + attr(SEG6_LOCAL_FLV_LCBLOCK_BITS, bytes([lb]))
            + attr(SEG6_LOCAL_FLV_LCNODE_FN_BITS, bytes([nf])))


Behaviour = Seg6Encap | Seg6Local


def encode_name(b: Behaviour, prog_id: int) -> str:
    """The LWT program name that carries ``b`` (``anibench:<prog id>:<base64url>``).

    Raises:
        Seg6Error: EOPNOTSUPP when it would not fit the kernel's 256-byte name (about ten
            segments), saying so.
    """
    kind = LWTUNNEL_ENCAP_SEG6 if isinstance(b, Seg6Encap) else LWTUNNEL_ENCAP_SEG6_LOCAL
    name = f"{NAME_PREFIX}{prog_id}:" + base64.urlsafe_b64encode(bytes([kind]) + b.body()).decode().rstrip("=")
    if len(name) >= MAX_PROG_NAME:
        raise Seg6Error(errno.EOPNOTSUPP, "the eBPF SRv6 data plane takes at most 10 segments per route")
    return name


def decode_name(name: str) -> tuple[Behaviour, int] | None:
    """Inverse of :func:`encode_name`: (behaviour, program id), or None for a name not ours."""
    if not name.startswith(NAME_PREFIX):
        return None
    try:
        pid, b64 = name[len(NAME_PREFIX):].split(":", 1)
        raw = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
        if raw[0] == LWTUNNEL_ENCAP_SEG6:
            return Seg6Encap(struct.unpack_from("=i", raw, 1)[0], raw[5:]), int(pid)
        if raw[0] == LWTUNNEL_ENCAP_SEG6_LOCAL:
            return Seg6Local.from_body(raw[1:]), int(pid)
    except (ValueError, IndexError, struct.error):
        return None
    return None
