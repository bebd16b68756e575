"""Underlay address plan: SRv6 uSID locators, loopbacks, IS-IS NETs, base host links.

SRv6 uSID layout (RFC 9800, "Compressed SRv6 Segment List Encoding", NEXT-C-SID flavor):
a 32-bit locator block ``fcbb:bb00::/32`` followed by a 16-bit node ID gives each router a /48
locator (its uN SID); local functions (uA, uDT6, uDX4, ...) take the next 16 bits, so a function
SID is a /64 inside the locator. Up to six 16-bit C-SIDs fit in one 128-bit container after the
32-bit block (RFC 9800 section 4.1: locator-block length + n * C-SID length <= 128).

Numbering (an operator's choice; RFC 9800 leaves it open): a router's node ID is written with the
decimal digits of its number, so r12 owns ``fcbb:bb00:12::/48`` and has loopback ``fd00::12``.
Local function IDs come from ``0xe000..0xffff``, kept apart from node IDs (<= 0x9999) so that a
global uN value can never be mistaken for a local function.

Everything here is pure computation, unit-tested without a lab.
"""

from __future__ import annotations

import ipaddress
from ipaddress import IPv6Address, IPv6Interface, IPv6Network

#: RFC 9800 locator block used by every lab (32 bits).
LOCATOR_BLOCK = IPv6Network("fcbb:bb00::/32")
#: Block length and C-SID (node and function) length in bits, as given to ``seg6local ... flavors
#: next-csid lblen 32 nflen 16`` (kernel names: locator-block length, node-function length).
BLOCK_LEN = 32
CSID_LEN = 16
#: Local function IDs (uDT6, uDX4, ...) are allocated from this range, one /64 each.
LOCAL_FUNCTION_MIN = 0xE000
LOCAL_FUNCTION_MAX = 0xFFFF
#: Router loopbacks: ``fd00::<id>/128``.
LOOPBACK_NET = IPv6Network("fd00::/64")
#: Links from a PE to the base hosts of a generated topology: ``fd00:1:<id>:<k>::/64``.
BASE_HOST_NET = IPv6Network("fd00:1::/32")
#: IS-IS area of the underlay (RFC 1195-style NET ``49.0001.<system-id>.00``).
ISIS_AREA = "49.0001"


def usid_value(node_id: int) -> int:
    """The 16-bit uN value of a router: its number's decimal digits read as hex (12 -> 0x12).

    Raises:
        ValueError: node_id outside 1..9999.
    """
    if not 1 <= node_id <= 9999:
        raise ValueError(f"node_id must be in 1..9999, got {node_id}")
    return int(str(node_id), 16)


def locator(node_id: int) -> IPv6Network:
    """The router's /48 uSID locator, e.g. ``fcbb:bb00:12::/48`` for node 12."""
    base = int(LOCATOR_BLOCK.network_address) | (usid_value(node_id) << (128 - BLOCK_LEN - CSID_LEN))
    return IPv6Network((base, BLOCK_LEN + CSID_LEN))


def locator_address(node_id: int) -> IPv6Interface:
    """The address put on the router's ``sr0`` interface so that IS-IS advertises the locator.

    ``<locator>::1/48``: the connected /48 is what IS-IS carries; the kernel's End route for the
    /48 (lower metric) is what forwards. The ``::1`` host part is never a valid uSID container
    (a C-SID of 0 ends the container, and the trailing 1 is not a function), so it cannot shadow
    a real SID.
    """
    net = locator(node_id)
    return IPv6Interface(f"{net.network_address + 1}/{net.prefixlen}")


def function_sid(node_id: int, function: int) -> IPv6Network:
    """A local function SID (/64) of a router, e.g. node 3 function 0xe000 -> ``fcbb:bb00:3:e000::/64``.

    Raises:
        ValueError: function outside LOCAL_FUNCTION_MIN..LOCAL_FUNCTION_MAX.
    """
    if not LOCAL_FUNCTION_MIN <= function <= LOCAL_FUNCTION_MAX:
        raise ValueError(f"local function id must be in 0x{LOCAL_FUNCTION_MIN:x}..0x{LOCAL_FUNCTION_MAX:x}")
    base = int(locator(node_id).network_address) | (function << (128 - BLOCK_LEN - 2 * CSID_LEN))
    return IPv6Network((base, BLOCK_LEN + 2 * CSID_LEN))


def usid_container(csids: list[int]) -> IPv6Address:
    """Pack up to six 16-bit C-SIDs behind the locator block into one uSID container (RFC 9800 4.1).

    Unused trailing C-SIDs are zero (the end-of-container marker).

    Raises:
        ValueError: empty list, more than six C-SIDs, or a value outside 1..0xffff.
    """
    slots = (128 - BLOCK_LEN) // CSID_LEN
    if not 1 <= len(csids) <= slots:
        raise ValueError(f"a uSID container holds 1..{slots} C-SIDs, got {len(csids)}")
    value = int(LOCATOR_BLOCK.network_address)
    for i, c in enumerate(csids):
        if not 1 <= c <= 0xFFFF:
            raise ValueError(f"C-SID must be in 1..0xffff, got {c}")
        value |= c << (128 - BLOCK_LEN - CSID_LEN * (i + 1))
    return IPv6Address(value)


def usid_segment_list(via_node_ids: list[int], last_node_id: int, function: int) -> list[IPv6Address]:
    """The uSID segment list that steers a packet through routers ``via_node_ids`` (uN, in order)
    and ends on ``function`` of ``last_node_id`` (e.g. its uDT6).

    Returns one container when everything fits (at most six C-SIDs), else several, each full but
    the last (RFC 9800 section 4.1; the kernel's ``encap seg6 ... segs`` takes them in order).
    """
    csids = [usid_value(n) for n in via_node_ids] + [usid_value(last_node_id), function]
    slots = (128 - BLOCK_LEN) // CSID_LEN
    return [usid_container(csids[i : i + slots]) for i in range(0, len(csids), slots)]


def loopback(node_id: int) -> IPv6Interface:
    """The router's loopback ``fd00::<id>/128`` (e.g. ``fd00::12/128`` for node 12)."""
    return IPv6Interface((int(LOOPBACK_NET.network_address) | usid_value(node_id), 128))


def isis_net(node_id: int) -> str:
    """The IS-IS NET (ISO 10589 NSAP) of a router: ``49.0001.0000.0000.<id:04d>.00``."""
    return f"{ISIS_AREA}.0000.0000.{node_id:04d}.00"


def base_host_prefix(pe_node_id: int, k: int) -> IPv6Network:
    """The /64 of the k-th (0-based) base-host link of a PE: ``fd00:1:<id>:<k>::/64``.

    The PE holds ``::1``, the host ``::2``.
    """
    if not 0 <= k <= 0xFFFF:
        raise ValueError(f"host link index out of range: {k}")
    base = int(BASE_HOST_NET.network_address) | (usid_value(pe_node_id) << 80) | (k << 64)
    return IPv6Network((base, 64))


def nth_host(prefix: IPv6Network | ipaddress.IPv4Network, n: int) -> str:
    """The n-th address of a prefix with its length, e.g. (``fd00:1:1::/64``, 2) -> ``fd00:1:1::2/64``."""
    return f"{prefix.network_address + n}/{prefix.prefixlen}"
