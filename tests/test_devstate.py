"""Device state capture/restore: exact, minimal, and honest about what it cannot restore."""

from __future__ import annotations

import pytest

from substrate import Lab, Topology
from substrate.devstate import (
    DeviceState,
    capture,
    capture_many,
    frr_interface_addresses,
    normalize_nft,
    restore,
    route_args,
    route_del_args,
)
from tests.conftest import reachable, unique_name


def test_route_canonical_form_keeps_route_table_apart_from_dt6_table() -> None:
    dt6 = {"dst": "fcbb:bb00:1:e000::/64", "encap": "seg6local", "action": "End.DT6", "table": "100",
           "dev": "sr0", "protocol": "boot", "metric": 1024, "stats64": {"packets": 3}}
    args = route_args(dt6, 6, table="200")
    assert args == "fcbb:bb00:1:e000::/64 table 200 metric 1024 encap seg6local action End.DT6 table 100 count dev sr0"
    assert route_del_args(args) == "fcbb:bb00:1:e000::/64 table 200 metric 1024"
    assert route_args({"dst": "fd00::2", "protocol": "isis", "dev": "eth1"}, 6) is None  # FRR owns it
    assert route_args({"dst": "fd00:1::/64", "protocol": "kernel", "dev": "eth1"}, 6) is None  # from an address
    enc = {"dst": "default", "encap": "seg6", "mode": "encap.red", "segs": ["fcbb:bb00:2:e000::"], "dev": "eth1"}
    assert route_args(enc, 6) == "::/0 encap seg6 mode encap.red segs fcbb:bb00:2:e000:: dev eth1"


def test_nft_counters_do_not_count_as_a_difference() -> None:
    a = "table inet f {\n chain c {\n  ip daddr 10.0.0.1 counter packets 5 bytes 420 drop\n }\n}"
    b = a.replace("packets 5 bytes 420", "packets 0 bytes 0")
    assert normalize_nft(a) == normalize_nft(b)
    assert DeviceState(node="x", nft=a).same_as(DeviceState(node="x", nft=b))


MUTATION = """
ip -6 route add fd10::/64 encap seg6 mode encap.red segs fcbb:bb00:2:e000:: dev eth1 table 100
ip -6 route add fcbb:bb00:1:e000::/64 encap seg6local action End.DT6 table 100 count dev sr0
ip route add 10.1.0.0/24 dev eth1 table 100
ip -6 rule add from fd10::/64 lookup 100 pref 1000
nft add table inet f
nft add chain inet f fwd '{ type filter hook forward priority 0; policy accept; }'
nft add rule inet f fwd ip6 daddr fd10::1 counter drop
ip addr add 192.0.2.1/24 dev eth2
ip link set eth2 down
ip -6 route del fcbb:bb00:1::/48 metric 1
ip link del sr0
echo 0 > /proc/sys/net/ipv6/conf/all/forwarding
"""


@pytest.mark.lab
def test_restore_is_exact_and_only_touches_what_differs() -> None:
    with Lab.create(Topology.from_spec("line:3"), unique_name("t-dev")) as lab:
        base = capture_many(lab)
        assert base["r1"].frr_config and "router isis CORE" in base["r1"].frr_config
        assert base["h1"].frr_config is None
        lab.check([lab.sh("r1", MUTATION)])
        lab.check([lab.vtysh("r1", "configure terminal", "interface eth1", "isis metric 55")])
        mutated = capture(lab, "r1")
        diff = mutated.diff(base["r1"])
        assert any("fd10::/64" in d for d in diff) and "~ link sr0: bridge up mtu 1500 -> absent" not in diff
        assert any(d.startswith("~ link sr0: absent") for d in diff)
        assert "~ FRR running configuration differs" in diff
        rep = restore(lab, base["r1"], mutated)
        assert rep.changed and rep.residual == [], rep.residual
        assert capture(lab, "r1").same_as(base["r1"])
        # untouched nodes need nothing
        assert not restore(lab, base["r2"]).changed
        # the data plane works again: h1 reaches h3 through the restored locator and forwarding
        lab.wait_converged(timeout_s=30)
        assert reachable(lab, "h1", "fd00:1:3::2")
        # and the reverse direction: back to the mutated state, exactly
        assert restore(lab, mutated).residual == []
        assert capture(lab, "r1").same_as(mutated)


@pytest.mark.lab
def test_deleted_veth_is_reported_not_hidden() -> None:
    with Lab.create(Topology.from_spec("line:2:nohosts"), unique_name("t-dev")) as lab:
        base = capture(lab, "r1")
        lab.check([lab.exec("r1", ["ip", "link", "del", "eth1"])])
        rep = restore(lab, base)
        assert any("eth1" in r and "cannot be re-created" in r for r in rep.residual)


def test_frr_interface_addresses_are_read_per_interface_in_kernel_form() -> None:
    conf = ("interface eth2\n ipv6 address fd00:1:1:0::1/64\n ip address 10.0.0.1/24\nexit\n!\n"
            "router isis CORE\n net 49.0001.0000.0000.0001.00\nexit\n!\ninterface sr0\n ipv6 address fcbb:bb00:1::1/48\nexit\n")
    assert frr_interface_addresses(conf) == {"fd00:1:1::1/64 dev eth2", "10.0.0.1/24 dev eth2", "fcbb:bb00:1::1/48 dev sr0"}
    assert frr_interface_addresses("") == set()


@pytest.mark.lab
def test_neighbour_entries_and_interface_sysctls_are_restored(line3) -> None:
    """Found by an audit: a static neighbour entry, echo_ignore_all and a per-interface
    disable_ipv6 outlived a reset and damaged the next run."""
    lab = line3
    base = capture(lab, "r2")
    assert base.sysctls["net/ipv6/conf/eth1/disable_ipv6"] == "0" and base.neighbors == []
    lab.check([lab.sh("r2", "ip -6 neigh replace fd00:1:1::99 lladdr 02:00:00:00:00:01 dev eth1 nud permanent; "
                            "echo 1 > /proc/sys/net/ipv6/icmp/echo_ignore_all; "
                            "echo 1 > /proc/sys/net/ipv6/conf/eth2/disable_ipv6")])
    mutated = capture(lab, "r2")
    assert mutated.neighbors == ["fd00:1:1::99 dev eth1 lladdr 02:00:00:00:00:01 nud permanent"]
    diff = mutated.diff(base)
    assert any("echo_ignore_all" in d for d in diff) and any("eth2/disable_ipv6" in d for d in diff)
    rep = restore(lab, base, mutated)
    assert rep.residual == [], rep.residual
    assert capture(lab, "r2").same_as(base)
    lab.wait_converged(timeout_s=30)
    assert reachable(lab, "h1", "fd00:1:3::2") and reachable(lab, "h1", "fd00::2")
