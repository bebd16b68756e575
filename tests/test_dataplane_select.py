"""Which SRv6 data plane a lab uses (substrate.dataplane.select), on this machine's real kernel."""

from __future__ import annotations

import os

import pytest

from substrate import dataplane
from substrate.errors import EnvironmentProblem

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the kernel probe needs root")


def test_mode_comes_from_the_option_then_the_environment_then_auto(monkeypatch) -> None:
    monkeypatch.delenv(dataplane.ENV, raising=False)
    assert dataplane.mode_from(None) == "auto"
    monkeypatch.setenv(dataplane.ENV, "EBPF")
    assert dataplane.mode_from(None) == "ebpf"
    assert dataplane.mode_from("kernel") == "kernel"
    with pytest.raises(EnvironmentProblem, match=r"unknown data plane 'vpp'.*auto, kernel, ebpf"):
        dataplane.mode_from("vpp")


def test_kernel_is_chosen_exactly_when_the_probe_finds_seg6() -> None:
    from substrate.features import probe

    has_seg6 = all(p in probe().present for p in dataplane.KERNEL_SEG6_PROBES)
    kernel = dataplane.select("kernel")
    assert (kernel.dataplane == "kernel") is has_seg6
    if not has_seg6:
        assert "MISSING: seg6-encap" in kernel.line() and kernel.line().startswith("data plane: NONE usable")
    auto = dataplane.select("auto")
    if has_seg6:
        assert auto.dataplane == "kernel"
    else:  # auto never picks a data plane whose own status says no
        assert auto.dataplane == ("ebpf" if dataplane.ebpf_status()[0] else None)
        assert "kernel: the kernel lacks seg6" in auto.reason


def test_a_lab_is_refused_in_one_line_naming_the_data_plane_when_none_can_run() -> None:
    from substrate.features import require

    if dataplane.select().dataplane:
        require()  # does not raise
        return
    with pytest.raises(EnvironmentProblem) as e:
        require()
    assert "data plane: NONE usable" in str(e.value) and "\n" not in str(e.value)


def test_the_feature_line_of_an_ebpf_lab_does_not_call_the_kernels_seg6_required() -> None:
    """On the eBPF data plane the kernel's missing seg6 is said as not needed (a new user read
    "MISSING (required): seg6-encap ..." on a lab that ran)."""
    from substrate.features import probe

    rep = probe()
    line = rep.line("ebpf")
    seg6 = [m for m in rep.missing_required if m in dataplane.KERNEL_SEG6_PROBES]
    assert not any(f"MISSING (required): {m}" in line for m in seg6), line
    if seg6:
        assert "not needed on the eBPF data plane" in line and "MISSING (required)" in rep.line()
