"""The eBPF data plane's SRv6 route state (substrate.dataplane.ebpf.seg6): pure, no lab.

The request bytes are what iproute2 6.1 sends for the command in each test's docstring (the
layout of include/uapi/linux/seg6*.h); the checks are those of the kernel's seg6_build_state and
seg6_local_build_state.
"""

from __future__ import annotations

import errno
import ipaddress
import struct

import pytest

from substrate.dataplane.ebpf import seg6
from substrate.dataplane.ebpf.seg6 import Seg6Encap, Seg6Error, Seg6Local, attr, attrs


def _srh(segs: list[str]) -> bytes:
    """The SRH iproute2 builds for ``segs S1,..,Sn``: reversed list, SL = LE = n-1."""
    n = len(segs)
    return bytes([0, 2 * n, 4, n - 1, n - 1, 0, 0, 0]) + b"".join(ipaddress.IPv6Address(s).packed for s in reversed(segs))


def _seg6_encap(mode: int, segs: list[str]) -> bytes:
    return attr(seg6.SEG6_IPTUNNEL_SRH, struct.pack("=i", mode) + _srh(segs))


def test_an_encap_route_round_trips_through_its_program_name() -> None:
    """``encap seg6 mode encap.red segs fcbb:bbbb:200:300:fe00::,fcbb:cccc::``"""
    b = Seg6Encap.from_encap(_seg6_encap(seg6.SEG6_IPTUN_MODE_ENCAP_RED, ["fcbb:bbbb:200:300:fe00::", "fcbb:cccc::"]), 10)
    assert b.segments == ["fcbb:bbbb:200:300:fe00::", "fcbb:cccc::"]
    name = seg6.encode_name(b, 4242)
    assert name.startswith("anibench:4242:") and len(name) < seg6.MAX_PROG_NAME
    back, pid = seg6.decode_name(name)
    assert (back, pid) == (b, 4242)
    (t1, p1), (t2, p2) = attrs(back.encap_attrs())
    assert (t1, struct.unpack("=H", p1)[0]) == (21, seg6.LWTUNNEL_ENCAP_SEG6)
    assert dict(attrs(p2))[seg6.SEG6_IPTUNNEL_SRH] == b.body()


@pytest.mark.parametrize(("mode", "family", "want"), [
    (seg6.SEG6_IPTUN_MODE_INLINE, 2, errno.EINVAL),  # inline on an IPv4 route: the kernel's EINVAL
    (9, 10, errno.EINVAL),  # no such mode
    (seg6.SEG6_IPTUN_MODE_L2ENCAP, 10, errno.EOPNOTSUPP),  # valid for the kernel, not forwarded here: said so
])  # fmt: skip
def test_encap_modes_are_refused_as_the_kernel_does_or_said_unsupported(mode: int, family: int, want: int) -> None:
    with pytest.raises(Seg6Error) as e:
        Seg6Encap.from_encap(_seg6_encap(mode, ["fc00::1"]), family)
    assert e.value.errno == want
    assert (want == errno.EOPNOTSUPP) == ("eBPF" in e.value.extack)


def test_an_srh_whose_length_or_segments_left_disagree_is_einval() -> None:
    good = _srh(["fc00::1", "fc00::2"])
    for bad in (good[:-16], bytes([0, 4, 4, 3, 1, 0, 0, 0]) + good[8:], bytes([0, 4, 5, 1, 1, 0, 0, 0]) + good[8:]):
        with pytest.raises(Seg6Error) as e:
            Seg6Encap.from_encap(attr(seg6.SEG6_IPTUNNEL_SRH, struct.pack("=i", 1) + bad), 10)
        assert e.value.errno == errno.EINVAL


def _local(action: int, *params: bytes, count: bool = False) -> bytes:
    out = attr(seg6.SEG6_LOCAL_ACTION, struct.pack("=I", action)) + b"".join(params)
    return out + (attr(seg6.SEG6_LOCAL_COUNTERS | seg6.NLA_F_NESTED, b"") if count else b"")


def test_end_with_next_csid_and_counters_dumps_in_the_kernels_attribute_order() -> None:
    """``encap seg6local action End flavors next-csid lblen 32 nflen 16 count``: the dump has the
    action, then counters (10), then flavors (11), as seg6_local_fill_encap walks attributes."""
    flv = attr(seg6.SEG6_LOCAL_FLV_OPERATION, struct.pack("=I", 1 << seg6.SEG6_LOCAL_FLV_OP_NEXT_CSID)) + attr(
        seg6.SEG6_LOCAL_FLV_LCBLOCK_BITS, b"\x20") + attr(seg6.SEG6_LOCAL_FLV_LCNODE_FN_BITS, b"\x10")
    b = Seg6Local.from_encap(_local(seg6.END, attr(seg6.SEG6_LOCAL_FLAVORS | seg6.NLA_F_NESTED, flv), count=True))
    assert b.flavors() == (1 << seg6.SEG6_LOCAL_FLV_OP_NEXT_CSID, 32, 16) and b.counters
    back, _ = seg6.decode_name(seg6.encode_name(b, 7))
    assert back == b
    _t, encap = list(attrs(back.encap_attrs((5, 600, 1))))[1]
    order = [t for t, _p in attrs(encap)]
    assert order == [seg6.SEG6_LOCAL_ACTION, seg6.SEG6_LOCAL_COUNTERS, seg6.SEG6_LOCAL_FLAVORS]
    counters = dict(attrs(dict(attrs(encap))[seg6.SEG6_LOCAL_COUNTERS]))
    assert struct.unpack("=Q", counters[seg6.SEG6_LOCAL_CNT_BYTES])[0] == 600


@pytest.mark.parametrize(("encap", "want", "text"), [
    (_local(seg6.END_DT6), errno.EINVAL, ""),  # End.DT6 without a table
    (_local(seg6.END_DX4, attr(seg6.SEG6_LOCAL_TABLE, struct.pack("=I", 100))), errno.EINVAL, ""),  # no nh4, a stray table
    (_local(99), errno.EINVAL, ""),  # no such action
    (_local(seg6.END_BPF), errno.EOPNOTSUPP, "End.BPF"),  # a behaviour this data plane does not forward
    (_local(seg6.END, attr(seg6.SEG6_LOCAL_FLAVORS | seg6.NLA_F_NESTED, attr(seg6.SEG6_LOCAL_FLV_OPERATION, struct.pack("=I", 2)))),
     errno.EOPNOTSUPP, "Unsupported Flavor operation(s)"),  # PSP, not NEXT-C-SID (the kernel's words, conformance)
    (_local(seg6.END, attr(seg6.SEG6_LOCAL_FLAVORS | seg6.NLA_F_NESTED, attr(seg6.SEG6_LOCAL_FLV_OPERATION, struct.pack("=I", 16))
                           + attr(seg6.SEG6_LOCAL_FLV_LCBLOCK_BITS, b"\x0c"))), errno.EINVAL, "Invalid Locator Block/Node Function lengths"),
])  # fmt: skip
def test_seg6local_requests_are_checked_as_the_kernel_checks_them(encap: bytes, want: int, text: str) -> None:
    with pytest.raises(Seg6Error) as e:
        Seg6Local.from_encap(encap)
    assert e.value.errno == want and text in e.value.extack


def test_a_route_too_long_for_a_program_name_is_refused_in_one_line() -> None:
    segs = [f"fc00:{i:x}::1:2:3:4" for i in range(12)]
    b = Seg6Encap.from_encap(_seg6_encap(seg6.SEG6_IPTUN_MODE_ENCAP, segs), 10)
    with pytest.raises(Seg6Error) as e:
        seg6.encode_name(b, 1)
    assert e.value.errno == errno.EOPNOTSUPP and "at most 10 segments" in e.value.extack


def test_names_not_ours_or_damaged_are_not_decoded() -> None:
    assert seg6.decode_name("encap_xmit") is None
    assert seg6.decode_name("anibench:12:!!!") is None
    assert seg6.decode_name("anibench:x:BQ") is None
