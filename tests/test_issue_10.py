"""Issue 10 -- the ANI servers must tell the agent the truth. Every reproduction of the issue,
and other inputs of the same kinds, against real labs through real MCP clients:

1. A1 lines longer than any terminal are reported as FRR answered them;
2. commands that changed nothing (no-op deletes, daemons not running) are rejected, with why;
3. (the allowlist against FRR's parser: tests/test_a1_grammar_frr.py);
4. UTF-8 text FRR accepts is accepted and round-trips byte for byte;
5. get_running_config applied back is accepted as a no-op, with no IS-IS adjacency flap
   (every router of a brownfield and of a line:3 lab);
6. one summary, consistent with the error flag;
7. A0: MCP cancellation kills the command; the stdio server exits when its client goes away;
8. truncated outputs are paged to the end by a client reading stdio with asyncio's default
   64 KiB line limit; unreadable input lines get the JSON-RPC parse error.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servers.a0_shell.server import build_server as build_a0
from servers.a1_wrapper.server import build_server as build_a1
from servers.common import ServerConfig, read_trajectory
from servers.common.paging import DEFAULT_MAX_MESSAGE_BYTES
from substrate import Lab, Topology
from substrate.devstate import capture
from tests.conftest import REPO, unique_name
from tests.servers_support import RawStdio, connect, data, text

pytestmark = [pytest.mark.lab, pytest.mark.anyio]
SMALL = REPO / "tests" / "data" / "small-brownfield.yaml"
MARKER = re.compile(r'read_output\(output_id="(out-\d+)", offset=(\d+)\)')


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab.create(Topology.from_spec("line:3"), unique_name("t-i10")) as lab:
        yield lab


@pytest.fixture(scope="module")
def brownfield() -> Iterator[Lab]:
    from substrate.scenario import build, load_manifest
    from substrate.scenario.deploy import deploy_scenario

    lab = deploy_scenario(build(load_manifest(SMALL)), unique_name("t-i10bf"))
    try:
        yield lab
    finally:
        lab.destroy()


def a1(lab: Lab, tmp_path: Path | None = None, **kw: Any):  # noqa: ANN201
    traj = tmp_path / "t.jsonl" if tmp_path is not None else None
    return build_a1(ServerConfig(lab=lab.name, trajectory=traj, **kw), lab=lab)


async def apply(c: Any, commands: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """apply_config: (isError, the result: structured, or the JSON after an error's summary line).
    Checks the one-summary rule on the way: an error exactly when the summary says NOTHING."""
    r = await c.call_tool("apply_config", {"commands": commands})
    if r.is_error:
        head, _, body = text(r).partition("\n")
        res = json.loads(body)
        assert res["summary"] == head
    else:
        res = r.structured_content
    assert r.is_error == res["summary"].startswith("NOTHING"), res["summary"]
    assert "PARTLY" not in res["summary"] or not r.is_error
    return r.is_error, res


def running(lab: Lab, node: str) -> str:
    return lab.vtysh(node, "show running-config").stdout


def consistent(lab: Lab, node: str, lines: list[str], dev: dict[str, Any]) -> None:
    """What apply_config reported matches the router: every FRR line reported applied is in the
    running configuration (in its mode), no line reported rejected is (a line reported unchanged
    may set a default value, which FRR does not show)."""
    from servers.a1_wrapper.apply import config_lines
    from servers.a1_wrapper.grammar import Grammar

    now = config_lines(running(lab, node))
    rejected = {x["command"] for x in dev["rejected"]}
    for c in Grammar.load().parse_config(node, lines, is_router=True):
        if c.family != "frr" or c.navigation or c.negated:
            continue
        if c.text in dev["applied"]:
            assert (c.ctx, c.text) in now, f"reported applied but absent: {c.text!r}"
        elif c.text in rejected and c.text not in dev["applied"] + dev["unchanged"]:
            assert (c.ctx, c.text) not in now, f"reported rejected but present: {c.text!r}"


def flaps(lab: Lab, node: str) -> list[str]:
    """IS-IS adjacency flap counters of ``node`` (FRR's own count per neighbour)."""
    return re.findall(r"Adjacency flaps: (\d+)", lab.vtysh(node, "show isis neighbor detail").stdout)


# -- item 1: long lines ------------------------------------------------------------------------------

LONG_PL = "ipv6 prefix-list PL-LONG-NAME-XXXXXXXXXXXXXXXXXXXX seq 5 permit fd99:1234:5678:9abc::/64 le 128"


async def test_long_lines_are_reported_as_frr_answered(lab: Lab) -> None:
    desc = "description " + "long-description-" * 28  # 488 characters, far past any terminal width
    rm = "route-map RM-" + "N" * 200 + " permit 10"
    cmds = {"r1": [LONG_PL, "ipv6 route fd99:5::/64 blackhole", "interface eth2", desc, "exit",
                   "router isis CORE", "lsp-timers gen-interval 1 refresh-interval 900 max-lifetime 1200", "exit", rm,
                   "set metric 100", "exit",
                   "ipv6 prefix-list PL-LONG-NAME-YYYYYYYYYYYYYYYYYYYY seq 10 permit fd99:1234:5678:9abc::/64 le 999",
                   "ipv6 route fd99:6::/64 blackhole"]}  # fmt: skip
    before = capture(lab, "r1")
    async with connect(a1(lab)) as c:
        err, res = await apply(c, cmds)
        r1 = res["devices"]["r1"]
        assert not err and res["summary"].startswith("PARTLY APPLIED: 1 of 10 command(s) REJECTED"), res["summary"]
        assert [x["command"] for x in r1["rejected"]] == [cmds["r1"][11]]
        assert "% " in r1["rejected"][0]["message"]  # FRR's own answer: le 999 is out of range
        assert set(r1["applied"]) == {LONG_PL, "ipv6 route fd99:5::/64 blackhole", desc, rm, "set metric 100",
                                      "ipv6 route fd99:6::/64 blackhole"}  # fmt: skip
        consistent(lab, "r1", cmds["r1"], r1)
        cfg = running(lab, "r1")
        for line in (LONG_PL, "ipv6 route fd99:5::/64 blackhole", desc, rm, "ipv6 route fd99:6::/64 blackhole"):
            assert line in cfg, line
        assert "PL-LONG-NAME-YYYY" not in cfg
        data(await c.call_tool("rollback", {"device": "r1", "snapshot_id": r1["snapshot_id"]}))
    assert capture(lab, "r1").same_as(before)


# -- item 2: commands that changed nothing -----------------------------------------------------------

NO_OPS = [
    ["no access-list NONEXISTENT permit any"],  # FRR refuses silently (vtysh exit status 1)
    ["no ipv6 prefix-list NONEXISTENT"],  # FRR says nothing, status 0
    ["no route-map NONEXISTENT"],
    ["no ipv6 route fd99:77::/64 blackhole"],  # "% Refusing to remove a non-existent route", status 0
    ["interface lo", "no description"],
    ["router isis CORE", "no redistribute ipv6 static level-2"],
    ["no interface eth77"],
    ["ip -6 rule del priority 999 lookup 999"],
    ["ip -6 route del fd99:88::/64 dev eth1"],
    ["nft delete table inet nonexistent"],
]


@pytest.mark.parametrize("lines", NO_OPS, ids=lambda x: x[-1])
async def test_commands_that_change_nothing_are_rejected(lab: Lab, lines: list[str]) -> None:
    before = capture(lab, "r2")
    async with connect(a1(lab)) as c:
        err, res = await apply(c, {"r2": lines})
    r2 = res["devices"]["r2"]
    assert err and r2["applied"] == []
    assert [x["command"] for x in r2["rejected"]] == [lines[-1]], r2
    assert r2["rejected"][0]["message"], r2
    assert capture(lab, "r2").same_as(before)


async def test_a_line_repeated_in_one_call_changes_the_router_once(lab: Lab) -> None:
    """Found by the issue-10 tester: a line sent twice in one call (a pasted block repeated, a
    mode entered twice) was reported applied twice; the second changed nothing."""
    lines = ["ipv6 route fd99:41::/64 blackhole", "ipv6 route fd99:41::/64 blackhole", "interface eth9", "description a",
             "exit", "interface eth9", "description a", "exit", "router isis CORE", "lsp-gen-interval 2",
             "lsp-gen-interval 2", "exit", "ipv6 prefix-list PL41 seq 5 permit fd99:41::/64",
             "ipv6 prefix-list PL41 seq 5 permit fd99:41::/64"]  # fmt: skip
    async with connect(a1(lab)) as c:
        err, res = await apply(c, {"r1": lines})
        r1 = res["devices"]["r1"]
        try:
            assert not err and r1["rejected"] == [], r1
            assert r1["applied"] == [lines[0], "interface eth9", "description a", "lsp-gen-interval 2", lines[12]], r1
            assert r1["unchanged"] == [lines[1], "interface eth9", "description a", "router isis CORE",
                                       "lsp-gen-interval 2", lines[13]], r1  # fmt: skip
        finally:
            data(await c.call_tool("rollback", {"device": "r1", "snapshot_id": r1["snapshot_id"]}))


async def test_a_default_value_beside_a_replaced_value_is_unchanged(lab: Lab) -> None:
    """Found by the issue-10 tester: `isis metric 10` (FRR's default, not shown) sent with
    `isis hello-interval 2` (which replaced `isis hello-interval 1`) was reported applied: the
    removed old value looked like an unexplained change in its mode."""
    lines = ["interface eth1", "isis metric 10", "isis hello-interval 2", "description new", "exit",
             "router isis CORE", "lsp-mtu 1497", "set-overload-bit"]  # fmt: skip
    async with connect(a1(lab)) as c:
        err, res = await apply(c, {"r1": lines})
        r1 = res["devices"]["r1"]
        try:
            assert not err and r1["rejected"] == [], r1
            assert r1["applied"] == ["isis hello-interval 2", "description new", "set-overload-bit"], r1
            assert r1["unchanged"] == ["interface eth1", "isis metric 10", "router isis CORE", "lsp-mtu 1497"], r1
            consistent(lab, "r1", lines, r1)
        finally:
            data(await c.call_tool("rollback", {"device": "r1", "snapshot_id": r1["snapshot_id"]}))


ROUTES_AS_WRITTEN = [  # as an agent writes them: defaults left out, words in its own order
    "ip -6 route add fd99:51::/64 dev eth1", "ip -6 route add fd99:52::/64 via fe80::1 dev eth1 table 100",
    "ip -6 route add fcbb:bb00:1:e051::/64 encap seg6local action End.DT6 table 100 dev sr0",
    "ip -6 route add fd99:53::/64 encap seg6 mode encap segs fcbb:bb00:2::,fcbb:bb00:3:: dev eth1",
    "ip -6 route add blackhole fd99:54::/64", "ip -4 route add 10.9.51.0/24 dev eth1 proto static",
]


async def test_a_route_sent_again_as_written_is_unchanged(lab: Lab) -> None:
    """Found by the issue-10 tester: an `ip -6 route add` sent again exactly as the agent first
    wrote it (defaults left out) was rejected with the kernel's "File exists", and alone it made
    the call an error; only the canonical form get_running_config prints was recognised. A
    different route to the same destination is still rejected."""
    async with connect(a1(lab)) as c:
        err, res = await apply(c, {"r1": ROUTES_AS_WRITTEN})
        sid = res["devices"]["r1"]["snapshot_id"]
        try:
            assert not err and res["devices"]["r1"]["applied"] == ROUTES_AS_WRITTEN, res["summary"]
            before = capture(lab, "r1")
            err, res = await apply(c, {"r1": ROUTES_AS_WRITTEN})
            assert not err and res["summary"].startswith("no change: all 6 command(s)"), res["summary"]
            assert res["devices"]["r1"]["unchanged"] == ROUTES_AS_WRITTEN
            err, res = await apply(c, {"r1": ["ip -6 route add fd99:51::/64 dev eth2"]})
            assert err and "File exists" in res["devices"]["r1"]["rejected"][0]["message"]
            assert capture(lab, "r1").same_as(before)
        finally:
            data(await c.call_tool("rollback", {"device": "r1", "snapshot_id": sid}))


async def test_a_policy_rule_sent_again_is_unchanged(lab: Lab) -> None:
    """Found by the issue-10 tester: `ip -6 rule add from P lookup T` (no priority) sent again
    was added again at the next free priority (three copies after three calls), and `fwmark 16`
    did not match the `fwmark 0x10` the kernel shows."""
    first = ["ip -6 rule add from fd99:61::/64 lookup 100", "ip -4 rule add fwmark 0x10 lookup 100"]
    again = ["ip -6 rule add from fd99:61::/64 table 100", "ip -4 rule add fwmark 16 lookup 100",
             "ip -6 rule add from fd99:61::/64 lookup 100"]  # fmt: skip
    async with connect(a1(lab)) as c:
        err, res = await apply(c, {"r1": first})
        sid = res["devices"]["r1"]["snapshot_id"]
        try:
            assert not err and res["devices"]["r1"]["applied"] == first, res["summary"]
            before = capture(lab, "r1")
            err, res = await apply(c, {"r1": again})
            assert not err and res["devices"]["r1"]["unchanged"] == again, res["summary"]
            assert capture(lab, "r1").same_as(before)
        finally:
            data(await c.call_tool("rollback", {"device": "r1", "snapshot_id": sid}))


async def test_an_nft_rule_sent_again_in_other_words_is_unchanged(lab: Lab) -> None:
    """Found by the issue-10 tester: an nft rule the chain already had, written in words nft
    prints otherwise (`mark 16` for `meta mark 0x00000010`, an uncompressed address, a protocol
    match nft folds into the port match), was added a second time and reported applied."""
    same = [("meta mark 0x10 drop", "mark 16 drop"), ("ip6 daddr fd00:0:0:1::0/64 drop", "ip6 daddr fd00:0:0:1::/64 drop"),
            ("meta l4proto udp udp dport 53 accept", "udp dport 53 accept")]  # fmt: skip
    lines = ["nft add table inet dupt", "nft add chain inet dupt c"]
    lines += [f"nft add rule inet dupt c {r}" for pair in same for r in pair]
    lines += ["nft add rule inet dupt c mark 17 drop"]  # another rule: added
    before = capture(lab, "r2")
    async with connect(a1(lab)) as c:
        err, res = await apply(c, {"r2": lines})
        r2 = res["devices"]["r2"]
        try:
            assert not err and r2["rejected"] == [], r2
            assert r2["applied"] == lines[:3] + [lines[4], lines[6], lines[8]], r2
            assert r2["unchanged"] == [lines[3], lines[5], lines[7]], r2
            listed = lab.exec("r2", ["nft", "list", "chain", "inet", "dupt", "c"]).stdout
            assert listed.count(" drop\n") + listed.count(" accept\n") == 4, listed
        finally:
            data(await c.call_tool("rollback", {"device": "r2", "snapshot_id": r2["snapshot_id"]}))
    assert capture(lab, "r2").same_as(before)


async def test_nft_flushes_and_deletes_that_remove_nothing_are_rejected(lab: Lab) -> None:
    """Found by the issue-10 tester: an nft flush of an empty chain, table or ruleset was
    reported unchanged (the verb was read as the object's name), where an ip flush that removes
    nothing is rejected."""
    lines = ["nft add table inet e", "nft add chain inet e c", "nft flush chain inet e c", "nft flush table inet e",
             "nft delete table inet e", "nft flush ruleset"]  # fmt: skip
    before = capture(lab, "r2")
    assert before.nft == ""
    async with connect(a1(lab)) as c:
        err, res = await apply(c, {"r2": lines})
    r2 = res["devices"]["r2"]
    assert not err and r2["applied"] == [lines[0], lines[1], lines[4]] and r2["unchanged"] == [], r2
    assert [x["command"] for x in r2["rejected"]] == [lines[2], lines[3], lines[5]], r2
    assert all("nothing to remove" in x["message"] for x in r2["rejected"]), r2
    assert capture(lab, "r2").same_as(before)


async def test_a_no_line_that_removes_something_is_applied(lab: Lab) -> None:
    async with connect(a1(lab)) as c:
        _, res = await apply(c, {"r2": ["ipv6 prefix-list PLX seq 5 permit fd99::/64", "interface eth1", "description x"]})
        sid = res["devices"]["r2"]["snapshot_id"]
        err, res = await apply(c, {"r2": ["no ipv6 prefix-list PLX", "interface eth1", "no description", "no description"]})
        r2 = res["devices"]["r2"]
        assert not err and r2["applied"] == ["no ipv6 prefix-list PLX", "no description"]
        assert [x["command"] for x in r2["rejected"]] == ["no description"]  # the second had nothing left to remove
        assert "changed nothing" in r2["rejected"][0]["message"]
        data(await c.call_tool("rollback", {"device": "r2", "snapshot_id": sid}))


async def test_lines_for_daemons_that_are_not_running_are_rejected(tmp_path: Path) -> None:
    with Lab.create(Topology.from_spec("line:2"), unique_name("t-i10d")) as lab:
        assert lab.kill_daemon("r2", "staticd") and lab.kill_daemon("r2", "isisd")
        async with connect(a1(lab, tmp_path)) as c:
            err, res = await apply(c, {"r2": [
                "router bgp 65001", "bgp router-id 1.1.1.1",  # bgpd is off in this lab
                "ipv6 route fd99:5::/64 blackhole",  # staticd killed
                "interface eth1", "isis metric 20",  # isisd killed
                "description still fine",  # zebra runs
            ]})  # fmt: skip
        r2 = res["devices"]["r2"]
        assert not err and r2["applied"] == ["description still fine"]
        why = {x["command"]: x["message"] for x in r2["rejected"]}
        assert why["router bgp 65001"] == "bgpd is not running"
        assert why["bgp router-id 1.1.1.1"].startswith("not run: the line that enters its mode ('router bgp 65001')")
        assert why["ipv6 route fd99:5::/64 blackhole"] == "staticd is not running"
        assert why["isis metric 20"] == "isisd is not running"
        assert "router bgp" not in running(lab, "r2") and "fd99:5::/64" not in running(lab, "r2")
        rec = read_trajectory(tmp_path / "t.jsonl")[0]
        assert rec["is_error"] and not rec["tool_error"] and len(rec["rejected"]) == 4


# -- item 4: UTF-8 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text_", ["Zürich–PoP ✓", "東京 PoP 👨‍👩‍👧", "rtl שלום, a\u00a0b", "quotes \"x\" 'y' $HOME; a|b"])
async def test_utf8_that_frr_accepts_round_trips(lab: Lab, text_: str) -> None:
    line = f"description {text_}"
    async with connect(a1(lab)) as c:
        err, res = await apply(c, {"r3": ["interface eth1", line]})
        assert not err and res["devices"]["r3"]["applied"] == [line]
        assert f" {line}\n" in running(lab, "r3")  # byte for byte, as FRR stores it
        cfg = data(await c.call_tool("get_running_config", {"devices": ["r3"]}))["r3"]
        assert f" {line}\n" in cfg
        err, res = await apply(c, {"r3": cfg})
        assert not err and res["devices"]["r3"]["applied"] == []
        data(await c.call_tool("rollback", {"device": "r3", "snapshot_id": res["devices"]["r3"]["snapshot_id"]}))


async def test_control_characters_stay_refused(lab: Lab) -> None:
    async with connect(a1(lab)) as c:
        for bad in ("x\x07", "x\x1b[2J", "x\u2028y", "x\x85"):
            r = await c.call_tool("apply_config", {"commands": {"r3": ["interface eth1", f"description {bad}"]}})
            assert r.is_error and "control characters" in text(r), bad


# -- item 5: get_running_config applied back --------------------------------------------------------------


async def round_trip(lab: Lab) -> None:
    s = a1(lab, max_message_bytes=16 * 1024 * 1024)
    routers = s.device_names
    before = {n: capture(lab, n) for n in routers}
    adjacencies = {n: flaps(lab, n) for n in routers}
    async with connect(s) as c:
        for n in routers:
            cfg = data(await c.call_tool("get_running_config", {"devices": [n]}))[n]
            err, res = await apply(c, {n: cfg})
            dev = res["devices"][n]
            assert not err and res["summary"].startswith("no change: all "), (n, res["summary"])
            assert dev["applied"] == [] and dev["rejected"] == [] and dev["unchanged"], (n, res["summary"])
    for n in routers:
        now = capture(lab, n)
        assert now.same_as(before[n]), (n, before[n].diff(now))
        assert flaps(lab, n) == adjacencies[n], (n, lab.vtysh(n, "show isis neighbor detail").stdout)


async def test_running_config_applies_back_as_a_no_op_line3(lab: Lab) -> None:
    await round_trip(lab)


async def test_running_config_applies_back_as_a_no_op_brownfield(brownfield: Lab) -> None:
    await round_trip(brownfield)


RICH = [  # what an operator might have configured: every part must come back as it was
    "router bgp 65001", "bgp router-id 10.0.0.1", "no bgp ebgp-requires-policy", "neighbor fd00::2 remote-as 65002",
    "address-family ipv6 unicast", "neighbor fd00::2 activate", "network fd99:1::/64", "exit-address-family", "exit",
    "ipv6 prefix-list PL6 seq 5 permit fd99::/32 le 64", "ip prefix-list PL4 seq 5 permit 10.9.0.0/16 le 24",
    "access-list ACL4 seq 5 permit 10.9.0.0/16", "ipv6 access-list ACL6 seq 5 deny fd99:2::/64",
    "route-map RM-Zürich permit 10", "match ipv6 address prefix-list PL6", "set metric 50", "description tenant ✓", "exit",
    "ipv6 route fd99:1::/64 blackhole", "ip route 10.9.1.0/24 blackhole",
    "interface eth1", "description uplink – r2 ✓", "isis metric 30", "exit",
    "router isis CORE", "redistribute ipv6 static level-2", "exit",
    "ip -6 route add fd99:3::/64 table 200 encap seg6 mode encap.red segs fcbb:bb00:2:e000:: dev eth1",
    "ip -6 route add fcbb:bb00:1:e007::/64 encap seg6local action End.DT6 table 200 count dev sr0",
    "ip -4 route add unreachable 0.0.0.0/0 table 200 metric 4278198272",
    "ip -6 rule add priority 1200 iif eth2 lookup 200", "ip -4 rule add priority 1201 fwmark 0x10/0xff lookup 200",
    "nft add table inet anibench_rt", "nft add chain inet anibench_rt forward_t { type filter hook forward priority filter ; policy accept ; }",
    "nft add chain inet anibench_rt t1", "nft add set inet anibench_rt nets { type ipv6_addr ; flags interval ; }",
    "nft add element inet anibench_rt nets { fd99:4::/64, fd99:5::/64 }",
    "nft add rule inet anibench_rt forward_t oifname eth2 jump t1",
    "nft add rule inet anibench_rt t1 ip6 saddr @nets tcp dport { 22, 80 } counter drop",
    "nft add rule inet anibench_rt t1 ct state established,related accept",
    "nft add table ip anibench_nat", "nft add chain ip anibench_nat pre { type nat hook prerouting priority dstnat ; }",
    "nft add rule ip anibench_nat pre iifname eth2 ip daddr 198.51.100.9 dnat to 10.9.1.2",
]


#: IS-IS as netlab writes it, multi-topology included (issue 10: such a change reported "not
#: applied" cut a router off); metric-style wide is FRR's default here and is not shown.
NETLAB_ISIS = ["router isis CORE", "is-type level-2-only", "metric-style wide", "topology ipv6-unicast",
               "log-adjacency-changes", "exit", "interface eth1", "isis network point-to-point",
               "isis circuit-type level-2-only", "isis metric 15", "exit"]  # fmt: skip


async def test_a_richer_configuration_applies_back_as_a_no_op(tmp_path: Path) -> None:
    with Lab.create(Topology.from_spec("line:2"), unique_name("t-i10rc")) as lab:
        lab.start_daemon("r1", "bgpd", load_config=False)
        async with connect(a1(lab)) as c:
            err, res = await apply(c, {"r1": NETLAB_ISIS, "r2": NETLAB_ISIS})
            for n in ("r1", "r2"):
                dev = res["devices"][n]
                assert not err and dev["applied"] == ["topology ipv6-unicast", "isis circuit-type level-2-only",
                                                       "isis metric 15"], dev  # fmt: skip
                assert "metric-style wide" in dev["unchanged"]
                consistent(lab, n, NETLAB_ISIS, dev)
            for n in ("r1", "r2"):
                await until(lambda n=n: " Up " in lab.vtysh(n, "show isis neighbor").stdout, f"{n}'s adjacency is up")
            err, res = await apply(c, {"r1": RICH})
            assert not err and res["devices"]["r1"]["rejected"] == [], res["summary"]
        await round_trip(lab)


async def test_kernel_state_a1_cannot_write_applies_back_as_comments(lab: Lab) -> None:
    """Found by the issue-10 tester: a route with `pref high`, one over a nexthop object and an
    nft rule with a comment (set through the shell, as A0 or an operator would) were printed by
    get_running_config as commands apply_config refused, so the whole text could not be applied
    back. What A1 cannot write is shown as a `!` comment; `pref low|medium|high` is a route form."""
    from servers.a1_wrapper.server import NOT_A_FORM

    setup = ("ip -6 route add fd99:a1::/64 dev eth1 pref high && ip -6 nexthop add id 4711 via fe80::1 dev eth1 && "
             "ip -6 route add fd99:a2::/64 nhid 4711 && nft add table inet cmt && nft add chain inet cmt c && "
             "nft add rule inet cmt c ip6 saddr fd00::1 counter drop comment '\"tenant a\"'")  # fmt: skip
    before0 = capture(lab, "r3")
    lab.check([lab.sh("r3", setup)])
    try:
        before = capture(lab, "r3")
        async with connect(a1(lab)) as c:
            cfg = data(await c.call_tool("get_running_config", {"devices": ["r3"]}))["r3"]
            assert "\nip -6 route add fd99:a1::/64 metric 1024 dev eth1 pref high\n" in cfg
            shown = [ln for ln in cfg.splitlines() if ln.startswith(NOT_A_FORM)]
            assert len(shown) == 2 and "nhid 4711" in shown[0] and "comment" in shown[1], shown
            err, res = await apply(c, {"r3": cfg})
            assert not err and res["summary"].startswith("no change: all "), res["summary"]
        assert capture(lab, "r3").same_as(before)
    finally:
        lab.sh("r3", "ip -6 route del fd99:a1::/64; ip -6 route del fd99:a2::/64; ip nexthop del id 4711; nft delete table inet cmt")
    assert capture(lab, "r3").same_as(before0)


async def test_a_restated_header_must_match_the_device(lab: Lab) -> None:
    async with connect(a1(lab)) as c:
        r = await c.call_tool("apply_config", {"commands": {"r1": ["hostname r9", "ipv6 route fd99:9::/64 blackhole"]}})
        assert r.is_error and text(r).startswith("NOTHING APPLIED: these commands are not allowed")
        assert "r1's running configuration has no such line" in text(r)
    assert "fd99:9::/64" not in running(lab, "r1")


# -- item 6: one summary ------------------------------------------------------------------------------------


async def test_summaries_are_one_consistent_message(lab: Lab) -> None:
    async with connect(a1(lab, devices="all")) as c:
        err, res = await apply(c, {"h1": ["ip -6 route add fd00:96::/64 via fd00:99::99 dev eth1"]})  # no such gateway
        assert err and res["summary"].startswith("NOTHING APPLIED: 1 of 1 command(s) REJECTED (h1: ip -6 route add")
        assert "applied" not in res["summary"].split(")")[-1]
        err, res = await apply(c, {"h1": ["ip -6 route add fd00:95::/64 dev eth1", "ip -6 route del fd00:94::/64 dev eth1"]})
        assert not err and res["summary"].startswith("PARTLY APPLIED: 1 of 2 command(s) REJECTED and not applied")
        assert res["summary"].endswith("the other 1 accepted: 1 changed the device")
        data(await c.call_tool("rollback", {"device": "h1", "snapshot_id": res["devices"]["h1"]["snapshot_id"]}))


# -- arguments: one policy at every level ------------------------------------------------------------------


async def test_booleans_are_never_numbers_and_json_strings_are_read(lab: Lab) -> None:
    async with connect(a1(lab)) as c:
        r = await c.call_tool("wait", {"seconds": True})
        assert r.is_error and "seconds: true is a boolean, not a number" in text(r)
        assert data(await c.call_tool("wait", {"seconds": "0.1"})) == {"status": "0.1 seconds elapsed"}
        r = await c.call_tool("wait", {"seconds": "ten"})
        assert r.is_error and "seconds" in text(r)
        got = data(await c.call_tool("get_running_config", {"devices": '["r2"]'}))
        assert list(got) == ["r2"]
        err, res = await apply(c, json.loads(json.dumps({"r2": "router isis CORE"})))  # a string of lines
        assert not err
        r = await c.call_tool("apply_config", {"commands": json.dumps({"r2": ["router isis CORE"]})})
        assert not r.is_error, text(r)
    async with connect(build_a0(ServerConfig(lab=lab.name), lab=lab)) as c:
        r = await c.call_tool("run_shell", {"device": "r1", "command": "true", "timeout_s": True})
        assert r.is_error and "timeout_s: true is a boolean, not a number" in text(r)
        assert data(await c.call_tool("run_shell", {"device": "r1", "command": "true", "timeout_s": "5"}))["exit_status"] == 0
        r = await c.call_tool("run_shell", {"device": 1, "command": "true"})
        assert r.is_error


# -- item 7: cancellation and the client going away ---------------------------------------------------------


def running_in(lab: Lab, node: str, pattern: str) -> bool:
    """A process whose command line starts with ``pattern`` runs in ``node`` (anchored, so the
    namespace-entering wrapper of this very check, whose arguments contain it, does not count)."""
    return lab.exec(node, ["pgrep", "-f", f"^{pattern}"], timeout_s=10).returncode == 0


async def until(cond: Any, what: str, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, f"not within {within_s} s: {what}"
        await asyncio.sleep(0.1)


async def test_cancellation_kills_the_command_and_is_recorded(lab: Lab, tmp_path: Path) -> None:
    traj = tmp_path / "t.jsonl"
    mark = f"/tmp/cancel-{uuid.uuid4().hex[:8]}"
    cmd = f"sleep 31; echo x > {mark}"
    async with RawStdio.start("A0", lab.name, "--trajectory", str(traj)) as c:
        rid = await c.call("tools/call", {"name": "run_shell", "arguments": {"device": "r1", "command": cmd, "timeout_s": 60}})
        await until(lambda: running_in(lab, "r1", "sleep 31"), "the command runs")
        await c.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid, "reason": "test"}})
        await until(lambda: not running_in(lab, "r1", "sleep 31"), "the command's process group is killed")
        # the cancelled request is not answered (MCP); the server goes on serving
        nxt = await c.call("tools/call", {"name": "list_devices", "arguments": {}})
        seen = []
        while True:
            msg = await c.recv()
            seen.append(msg.get("id"))
            if msg.get("id") == nxt:
                break
        assert rid not in seen
    assert lab.exec("r1", ["test", "-e", mark]).returncode != 0
    (rec,) = [r for r in read_trajectory(traj) if r["tool"] == "run_shell"]
    assert rec["cancelled"] and rec["is_error"] and "process group on r1 was killed" in rec["error"], json.dumps(rec)


async def test_a1_cancellation_kills_what_runs_and_runs_nothing_more(lab: Lab, tmp_path: Path) -> None:
    traj = tmp_path / "t.jsonl"
    async with RawStdio.start("A1", lab.name, "--trajectory", str(traj)) as c:
        rid = await c.call("tools/call", {"name": "execute_validation", "arguments": {"commands": {
            "r3": ["ping -c 10 -i 1 -W 1 fd00::1", "ping -c 9 -i 1 -W 1 fd00::1"]}}})  # fmt: skip
        await until(lambda: running_in(lab, "r3", "ping -c 10"), "the first probe runs")
        await c.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid}})
        await until(lambda: not running_in(lab, "r3", "ping -c 10"), "the probe is killed")
        assert not (await c.tool("get_topology", {})).get("isError")  # served on; the second probe never started
        assert not running_in(lab, "r3", "ping -c 9")
    rec = read_trajectory(traj)[0]
    assert rec["tool"] == "execute_validation" and rec["cancelled"] and rec["is_error"], json.dumps(rec)[:1500]


async def test_a1_cancelled_mid_batch_records_what_the_router_took(lab: Lab, tmp_path: Path) -> None:
    """Found by the issue-10 tester: an FRR batch cancelled mid-way recorded the line its killed
    vtysh was running as not applied ("may or may not have taken effect") while FRR had taken
    it: the record said one line fewer had changed the router than had. The read-back decides."""
    traj = tmp_path / "t.jsonl"
    lines = [f"ipv6 prefix-list CANCEL seq {5 * i} permit fd99:{i:x}::/64" for i in range(1, 451)]

    def present() -> list[str]:
        return [ln for ln in running(lab, "r3").splitlines() if ln.startswith("ipv6 prefix-list CANCEL ")]

    try:
        async with RawStdio.start("A1", lab.name, "--trajectory", str(traj)) as c:
            rid = await c.call("tools/call", {"name": "apply_config", "arguments": {"commands": {"r3": lines}}})
            await until(lambda: len(present()) >= 20, "the batch is under way", within_s=60)
            await c.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid}})
            await until(lambda: any(r["tool"] == "apply_config" for r in read_trajectory(traj)), "the call is recorded", 60)
        (rec,) = read_trajectory(traj)
        assert rec["cancelled"], json.dumps(rec)[:1500]
        now = present()
        assert 20 <= len(now) < len(lines)
        m = re.search(r"(\d+) command\(s\) changed the device", rec["error"])
        assert m and int(m.group(1)) == len(now), (rec["error"], len(now))
        recorded = {x.split(": ", 2)[1] for x in rec["rejected"]}
        assert not recorded & set(now), sorted(recorded & set(now))
    finally:
        lab.vtysh("r3", "configure terminal", "no ipv6 prefix-list CANCEL")


async def test_stdio_server_exits_when_the_client_goes_away(lab: Lab, tmp_path: Path) -> None:
    traj = tmp_path / "t.jsonl"
    mark = f"/tmp/gone-{uuid.uuid4().hex[:8]}"
    async with RawStdio.start("A0", lab.name, "--trajectory", str(traj)) as c:
        await c.call("tools/call", {"name": "run_shell",
                                    "arguments": {"device": "r2", "command": f"sleep 32; echo y > {mark}", "timeout_s": 60}})  # fmt: skip
        await until(lambda: running_in(lab, "r2", "sleep 32"), "the command runs")
        c.proc.stdin.close()
        await asyncio.wait_for(c.proc.wait(), timeout=20)  # bounded: the server exits, it does not wait 32 s
        assert not running_in(lab, "r2", "sleep 32")
    assert lab.exec("r2", ["test", "-e", mark]).returncode != 0
    (rec,) = read_trajectory(traj)
    assert rec["cancelled"] and "killed" in rec["error"]


# -- item 8: paging under a 64 KiB line limit; parse errors ------------------------------------------------


async def read_to_end(c: RawStdio, text_: str) -> str:
    """The full text of a (possibly cut) string, following its marker with read_output."""
    m = MARKER.search(text_[-300:])
    if not m:
        return text_
    oid, off = m.group(1), int(m.group(2))
    out = text_[:off]
    pages = 0
    while off is not None:
        page = (await c.tool("read_output", {"output_id": oid, "offset": off}))["structuredContent"]
        assert page["offset"] == off and page["output_id"] == oid
        out += page["text"]
        off = page["next_offset"]
        pages += 1
    assert pages >= 1
    return out


async def test_a_result_of_many_small_items_keeps_its_error_flag_and_summary(lab: Lab) -> None:
    """Found by the issue-10 tester: a partly applied call with many rejected commands (each a
    short command and reason: nothing to cut) came back as an error ("cannot be cut below this
    server's bound") without its summary, although something was applied. Its lists are
    shortened instead, the summary says so, and read_output gives the whole result."""
    lines = ["ip -6 route add fd97::/64 dev eth1"] + [f"ip -6 route del fd99:{i:x}::/64 dev eth1" for i in range(60)]
    async with RawStdio.start("A1", lab.name, "--max-message-bytes", "8192") as c:
        res = await c.tool("apply_config", {"commands": {"r1": lines}})
        try:
            assert not res.get("isError"), res["content"][0]["text"][:500]
            assert max(len(ln) for ln in c.lines) <= 8192
            sc = res["structuredContent"]
            assert sc["summary"].startswith("PARTLY APPLIED: 60 of 61 command(s) REJECTED"), sc["summary"]
            m = MARKER.search(sc["summary"])
            assert m and "lists of this result longer than" in sc["summary"] and m.group(2) == "0", sc["summary"]
            assert 0 < len(sc["devices"]["r1"]["rejected"]) < 60
            whole = json.loads(await read_to_end(c, f'[... read_output(output_id="{m.group(1)}", offset=0) ...]'))
            assert [x["command"] for x in whole["devices"]["r1"]["rejected"]] == lines[1:]
            assert whole["devices"]["r1"]["applied"] == lines[:1] and whole["summary"] == sc["summary"][: m.start()].split("\n[")[0]
        finally:
            await c.tool("apply_config", {"commands": {"r1": ["ip -6 route del fd97::/64 dev eth1"]}})


async def test_an_output_cut_at_the_capture_limit_keeps_whole_characters(lab: Lab) -> None:
    """Found by the issue-10 tester: a stream cut at the byte cap in the middle of a UTF-8
    character ended in U+FFFD, a character the device never printed."""
    s = build_a0(ServerConfig(lab=lab.name, options={"max_output_bytes": 1024}), lab=lab)
    async with connect(s) as c:
        for char, n in (("é", 1000), ("€", 700), ("🚀", 600)):  # 2, 3 and 4 bytes
            res = data(await c.call_tool("run_shell", {"device": "r1", "command": f"printf a; printf '{char}%.0s' $(seq {n})"}))
            total = 1 + n * len(char.encode())
            kept = 1 + (1023 // len(char.encode())) * len(char.encode())
            head, _, tail = res["stdout"].partition("\n[... ")
            assert res["truncated"] and "\ufffd" not in res["stdout"], res["stdout"][-80:]
            assert head == "a" + char * ((kept - 1) // len(char.encode())), head[-10:]
            assert tail.startswith(f"{total - kept} more bytes dropped"), tail


async def test_large_outputs_are_paged_to_the_end_under_the_64k_line_limit(lab: Lab) -> None:
    async with RawStdio.start("A0", lab.name) as c:
        res = await c.tool("run_shell", {"device": "r1", "command": "seq 1 300000"})
        stdout = res["structuredContent"]["stdout"]
        assert not res["structuredContent"]["truncated"] and MARKER.search(stdout[-300:]), stdout[-300:]
        assert await read_to_end(c, stdout) == "".join(f"{i}\n" for i in range(1, 300001))
        # the worst escaping: quotes, backslashes, non-ASCII and control characters
        res = await c.tool("run_shell", {"device": "r1", "command": "for i in $(seq 3000); do printf '\"\\\\é\\001\\t%s\\n' $i; done"})
        want = "".join(f'"\\é\x01\t{i}\n' for i in range(1, 3001))
        assert await read_to_end(c, res["structuredContent"]["stdout"]) == want
        # an error text is cut the same way
        res = await c.tool("run_shell", {"device": "r1", "command": "seq 1 100000; sleep 30", "timeout_s": 0.5})
        assert res["isError"]
        assert max(len(x) for x in c.lines) <= DEFAULT_MAX_MESSAGE_BYTES


async def test_a1_results_are_bounded_and_paged(brownfield: Lab) -> None:
    async with RawStdio.start("A1", brownfield.name) as c:
        res = await c.tool("get_running_config", {"devices": ["r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"]})
        got = res["structuredContent"]
        full = {d: await read_to_end(c, t) for d, t in got.items()}
        assert all(MARKER.search(t[-300:]) is None for t in full.values())
        assert all("router isis CORE" in t for t in full.values())
        assert max(len(x) for x in c.lines) <= DEFAULT_MAX_MESSAGE_BYTES
    assert any(MARKER.search(t[-300:]) for t in got.values())  # something was cut


async def test_lines_that_are_not_json_rpc_get_the_json_rpc_error(lab: Lab) -> None:
    async with RawStdio.start("A0", lab.name) as c:
        await c.send("this is not json")
        msg = await c.recv()
        assert msg["id"] is None and msg["error"]["code"] == -32700
        await c.send('{"jsonrpc": "2.0", "id": 77, "method": 5}')
        msg = await c.recv()
        assert msg["id"] == 77 and msg["error"]["code"] == -32600
        res = await c.tool("list_devices", {})  # still serving
        assert not res.get("isError")
