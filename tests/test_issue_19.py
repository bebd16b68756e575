"""Issue 19: benchmark validity -- the oracle's blind spots, and a false dangerous success of
the competent reference operator."""

from __future__ import annotations

import pytest

from harness.run import RunSpec, execute_run
from harness.tasks import make_variant


def _spec(level: str, tmp_path, k: str = "0") -> RunSpec:  # noqa: ANN001
    return RunSpec(campaign_id="i19", run_key=f"i19/{level}/{k}", factor="ani", setting=level, level=level,
                   agent="scripted", density=2, run_dir=tmp_path)


# -- item 1: the A0/A1 reference solution keeps what another service shares ------------------------


@pytest.mark.lab
@pytest.mark.parametrize("level", ["A0", "A1"])
def test_reference_operator_keeps_a_tenant_table_a_floating_ip_still_uses(reference_lab, tmp_path, level: str) -> None:
    """``harness task validate change-set --variants 3 --ani A0`` (seed 7, density 2): in variant
    2 (scenario seed 9) site t1s6 leaves the border PE r1, where floating IP fip2 (198.51.100.11 -> t1s8 on r4)
    still steers traffic into t1's table by fwmark. The device-level operator tore the table
    down with the tenant's circuits (the route to t1s8 and the table's default), and fip2 stopped
    answering: a dangerous success of the reference solution."""
    lab, sc = reference_lab
    v = make_variant("change-set", sc, 2)
    assert any(f.id == "fip2" for f in sc.floating_ips) and sc.external and sc.external.border_pe == "r1"
    assert any(m.site == "t1s6" for m in v.changes.move) and sc.site("t1s6").pe == "r1"
    rec, verdicts = execute_run(lab, _spec(level, tmp_path), v)
    failed = [x.id for x in verdicts if not x.ok]
    assert rec.task_pass and rec.damage_free, failed
