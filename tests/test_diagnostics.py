"""Diagnostic labels beside the outcome label (harness.diagnostics, issue 19 item 1): pure
rules over the state checks' structured differences."""

from __future__ import annotations

from harness.diagnostics import SPECIFICATION_DEVIATION, diagnostic_labels
from substrate.scenario.observer import Evidence, Verdict


def _v(kind: str, node: str, missing: list[str], unexpected: list[str], ok: bool = False) -> Verdict:
    return Verdict(id=f"{kind}/{node}/{len(missing)}", kind=kind, service="l3vpn/t1", ok=ok,
                   evidence=[Evidence(node=node)], diff={"missing": missing, "unexpected": unexpected})


def test_a_replaced_prefix_port_pe_sid_or_address_is_a_specification_deviation() -> None:
    cases = {
        "prefix fd10:0:0:6::/64 replaced by fd10:0:0:7::/64 on r9 (dev eth6)":
            [_v("table_routes", "r9", ["unicast fd10:0:0:6::/64 -> dev eth6"], ["unicast fd10:0:0:7::/64 -> dev eth6"])],
        "port eth6 replaced by eth5 for fd10:0:0:6::/64 on r9":
            [_v("table_routes", "r9", ["unicast fd10:0:0:6::/64 -> dev eth6"], ["unicast fd10:0:0:6::/64 -> dev eth5"])],
        "PE r9 replaced by r3 for fd10:0:0:6::/64":
            [_v("table_routes", "r9", ["unicast fd10:0:0:6::/64 -> dev eth6"], []),
             _v("table_routes", "r3", [], ["unicast fd10:0:0:6::/64 -> dev eth6"])],
        "fd10:0:0:6::/64 on r3 routed to another PE's SID (fcbb:bb00:8:e000:: instead of fcbb:bb00:9:e004::)":
            [_v("table_routes", "r3", ["unicast fd10:0:0:6::/64 -> seg6 fcbb:bb00:9:e004::"],
                ["unicast fd10:0:0:6::/64 -> seg6 fcbb:bb00:8:e000::"])],
        "address fd10:0:0:6::1/64 replaced by fd10:0:0:6::77/64 on r9":
            [_v("address_bound", "r9", ["fd10:0:0:6::1/64"], ["fd10:0:0:6::77/64"])],
    }
    for finding, verdicts in cases.items():
        assert diagnostic_labels(verdicts) == ([SPECIFICATION_DEVIATION], [finding])


def test_no_label_for_what_the_request_does_not_fix_or_what_passed() -> None:
    # another SID function on the same PE: the operator's allocation, not the request's value
    other_fn = _v("table_routes", "r3", ["unicast fd10:0:0:6::/64 -> seg6 fcbb:bb00:9:e004::"],
                  ["unicast fd10:0:0:6::/64 -> seg6 fcbb:bb00:9:e005::"])
    missing_only = _v("table_routes", "r3", ["unicast fd10:0:0:6::/64 -> dev eth6"], [])
    other_family = _v("table_routes", "r4", ["unicast 10.0.4.0/24 -> dev eth2"], ["unicast fd10:0:0:7::/64 -> dev eth2"])
    passed = _v("table_routes", "r9", ["unicast fd10:0:0:6::/64 -> dev eth6"], ["unicast fd10:0:0:7::/64 -> dev eth6"], ok=True)
    assert diagnostic_labels([other_fn, missing_only, other_family, passed]) == ([], [])
