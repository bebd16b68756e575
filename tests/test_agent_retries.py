"""The competent scripted operator's retry rule at every level (issue 20, item 8): which tool
results are transient refusals worth a pause and a retry, and the A0 script being safe to run
again after a partial run. Pure (the A3-T end-to-end retry is in tests/test_a3t_recovery.py)."""

from __future__ import annotations

from harness.agents.base import Reply
from harness.agents.scripted import a0_script, transient
from substrate.scenario.apply import config_delta
from substrate.scenario.model import NodeConfig


def test_transient_refusals_at_each_level() -> None:
    # errors: a held lock, a device that did not answer, an earlier rollback still pending
    assert transient(Reply(ok=False, text="the configuration of r6 is locked by another session (fault f7); waited 5.0 s."))
    assert transient(Reply(ok=False, text="cannot read the devices before changing them (...); nothing was changed. Retry later"))
    assert not transient(Reply(ok=False, text="change set rejected:\n- ops[0].spec.prefix6: fd10::/48 is not a /64"))
    # A3-T results
    a3 = {"change_id": "c1", "status": "rolled_back", "transient": True}
    assert transient(Reply(ok=True, text="", data=a3))
    assert not transient(Reply(ok=True, text="", data={**a3, "transient": False}))  # the change set broke something
    assert not transient(Reply(ok=True, text="", data={**a3, "status": "applied"}))
    assert transient(Reply(ok=True, text="", data={**a3, "status": "cancelled", "transient": False}))
    # A1: a device whose FRR did not answer
    a1 = {"summary": "PARTLY APPLIED", "devices": {"r1": {"rejected": [{"command": "ipv6 address fd10::1/64",
                                                                           "message": "timed out after 10 s"}], "error": None},
                                                    "r2": {"rejected": [], "error": None}}}  # fmt: skip
    assert transient(Reply(ok=True, text="", data=a1))
    a1["devices"]["r1"]["rejected"][0]["message"] = "% Unknown command"  # type: ignore[index]
    assert not transient(Reply(ok=True, text="", data=a1))
    # A0: cut by its timeout, or FRR down
    assert transient(Reply(ok=True, text="", data={"device": "r1", "exit_status": 124, "stderr": "", "stdout": ""}))
    assert transient(Reply(ok=True, text="", data={"device": "r1", "exit_status": 0, "stderr": "zebra is not running\n", "stdout": ""}))
    assert not transient(Reply(ok=True, text="", data={"device": "r1", "exit_status": 1, "stderr": "RTNETLINK answers: Invalid argument"}))


def test_a0_script_can_run_again_after_a_partial_run() -> None:
    d = config_delta("r1", NodeConfig(), NodeConfig(rules6=["priority 1000 iif eth4 lookup 100"],
                                                    routes6=["fd10::/64 table 100 metric 1024 dev eth4"]))  # fmt: skip
    script = a0_script(d)
    # the rule is deleted tolerantly before it is added, so a second run does not stop at "File exists"
    assert script.index("rule del priority 1000 iif eth4 lookup 100") < script.index("rule add priority 1000 iif eth4 lookup 100")
    assert "ip -6 -force -batch" in script and "route replace fd10::/64" in script
