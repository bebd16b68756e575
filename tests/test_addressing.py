"""Unit tests of the underlay address plan (RFC 9800 uSID layout)."""

from __future__ import annotations

from ipaddress import IPv6Address, IPv6Network

import pytest

from substrate import addressing as a


def test_locator_is_a_48_in_the_block_named_by_decimal_digits() -> None:
    assert a.locator(1) == IPv6Network("fcbb:bb00:1::/48")
    assert a.locator(12) == IPv6Network("fcbb:bb00:12::/48")
    assert a.locator(9999) == IPv6Network("fcbb:bb00:9999::/48")
    assert a.locator(25).subnet_of(a.LOCATOR_BLOCK)
    with pytest.raises(ValueError):
        a.locator(10000)


def test_function_sid_and_container_layout() -> None:
    assert a.function_sid(3, 0xE000) == IPv6Network("fcbb:bb00:3:e000::/64")
    assert a.function_sid(3, 0xE000).subnet_of(a.locator(3))
    # the note's verified path: r1 encapsulates to fcbb:bbXX:200:300:fe00:: (block, r2, r3, function)
    assert a.usid_container([0x2, 0x3, 0xE000]) == IPv6Address("fcbb:bb00:2:3:e000::")
    with pytest.raises(ValueError):
        a.usid_container([1] * 7)  # 32-bit block + 7 x 16 > 128
    with pytest.raises(ValueError):
        a.function_sid(3, 0x12)


def test_segment_list_splits_into_containers_of_six() -> None:
    one = a.usid_segment_list([2, 5], 9, 0xE001)
    assert one == [IPv6Address("fcbb:bb00:2:5:9:e001::")]
    many = a.usid_segment_list([1, 2, 3, 4, 5, 6], 7, 0xE000)
    assert many == [IPv6Address("fcbb:bb00:1:2:3:4:5:6"), IPv6Address("fcbb:bb00:7:e000::")]


def test_loopback_net_and_host_prefix() -> None:
    assert str(a.loopback(12)) == "fd00::12/128"
    assert a.isis_net(7) == "49.0001.0000.0000.0007.00"
    assert a.base_host_prefix(12, 0) == IPv6Network("fd00:1:12::/64")
    assert a.base_host_prefix(12, 1) == IPv6Network("fd00:1:12:1::/64")
    assert str(a.locator_address(4)) == "fcbb:bb00:4::1/48"
