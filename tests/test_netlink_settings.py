"""substrate.netlink.settings against iproute2's own view, in a real namespace (no lab)."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from substrate import netlink

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces)")


def test_every_devices_neighbour_parameters_are_read_however_many_devices() -> None:
    """Kernel 6.18's neighbour-table dump (net/core/neighbour.c neightbl_dump_info) resumes the
    second table skipping as many entries as the first table had, when the first table's entries
    fill the dump's first message exactly: read on a fresh socket (page-sized first message), a
    node with 14 or 15 devices lost every ``ndisc_cache`` device entry, and a reset later found
    them "only here" (seen on the eBPF data plane, whose helper devices brought a PE to 15)."""
    ns = f"nlt-{uuid.uuid4().hex[:6]}"  # not anibench-*: harness lab cleanup (other tests) removes those
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        for i in range(30):  # one more device each time: one count makes the ARP table fill the first message exactly
            subprocess.run(["ip", "-n", ns, "link", "add", f"b{i}", "type", "bridge"], check=True)
            _links, neigh = netlink.settings(f"/run/netns/{ns}")
            devices = {"lo", *(f"b{k}" for k in range(i + 1))}
            for table in ("arp_cache", "ndisc_cache"):
                missing = {d for d in devices if f"{table}/{d}" not in neigh}
                assert not missing, f"{len(devices)} devices: {table} lacks {sorted(missing)[:4]}"
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
