"""Pure-logic tests of the ANI servers (no lab): token patterns, the A1 grammar and blocklist,
vtysh transcript parsing, A0 command classification, the recorder and the episode rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servers.a0_shell.classify import classify_shell, shell_rejected
from servers.a1_wrapper.grammar import Grammar, GrammarError, apply_filter, nft_words, with_probe_defaults
from servers.a1_wrapper.patterns import PatternError, compile_pattern, describe_failure, match
from servers.a1_wrapper.vtysh import parse_transcript
from servers.common.recorder import CallRecord, TrajectoryRecorder, bound_arguments, bound_text, read_trajectory
from servers.common.server import Episode
from servers.registry import levels, normalize_level


@pytest.fixture(scope="module")
def g() -> Grammar:
    return Grammar.load()


@pytest.fixture(scope="module")
def gb() -> Grammar:
    return Grammar.load(blocklist=True)


def ok(gram: Grammar, lines: list[str], router: bool = True) -> list:
    return gram.parse_config("r1", lines, is_router=router)


def bad(gram: Grammar, lines: list[str], router: bool = True) -> str:
    with pytest.raises(GrammarError) as ei:
        gram.parse_config("r1", lines, is_router=router)
    return str(ei.value)


# -- patterns ----------------------------------------------------------------------------------


def test_pattern_language() -> None:
    p = compile_pattern("ip [ -6|-4 ] route add <prefix6> { table <table> | metric <uint> | ( nexthop dev <ifname> )* } [ ... ]")
    assert match(p, "ip -6 route add fd00::/64".split()).ok
    assert match(p, "ip route add fd00::/64 metric 5 table 100".split()).ok
    assert match(p, "ip route add fd00::/64 nexthop dev eth1 nexthop dev eth2 extra words".split()).ok
    assert not match(p, "ip route add 10.0.0.0/8".split()).ok
    strict = compile_pattern("ip [ -6|-4 ] route add <prefix6> { table <table> | metric <uint> }")
    r = match(strict, "ip route add fd00::/64 metric x".split())
    assert not r.ok and "<uint>" in describe_failure("ip route add fd00::/64 metric x".split(), r)
    r = match(p, "ip route".split())
    assert r.prefix_ok and "incomplete" in describe_failure(["ip", "route"], r)
    # each option at most once
    assert not match(compile_pattern("x { a | b }"), ["x", "a", "a"]).ok
    # mixed literal/type alternation inside one word
    p2 = compile_pattern("from <prefix>|all")
    assert match(p2, ["from", "all"]).ok and match(p2, ["from", "fd00::/8"]).ok and not match(p2, ["from", "x"]).ok
    assert match(compile_pattern("'{' <uint:1-3> '}'"), ["{", "2", "}"]).ok
    assert not match(compile_pattern("<num:0.2-1>"), ["0.1"]).ok
    with pytest.raises(PatternError):
        compile_pattern("a <nosuchtype>")
    with pytest.raises(PatternError):
        compile_pattern("a [ b")


# -- A1 grammar: FRR lines -----------------------------------------------------------------------


def test_frr_modes_walk_up_and_enter(g: Grammar) -> None:
    cmds = ok(g, ["router isis CORE", "lsp-gen-interval 2", "interface eth1", "isis metric 20", "exit",
                  "router bgp 65000", "address-family ipv6 unicast", "neighbor fd00::2 activate", "exit-address-family",
                  "bgp router-id 1.1.1.1", "! comment", "", "no router isis OLD"])  # fmt: skip
    modes = [c.mode for c in cmds]
    assert modes == ["config", "router-isis", "config", "interface", "interface", "config", "router-bgp",
                     "address-family", "address-family", "router-bgp", None, None, "config"]  # fmt: skip
    # a sub-mode command after its mode was left is refused with the allowed keywords
    msg = bad(g, ["interface eth1", "exit", "isis metric 10"])
    assert "not an allowed FRR configuration command in global configuration mode" in msg
    assert "interface, router isis" in msg


def test_frr_refusals_say_what_to_fix(g: Grammar) -> None:
    assert "leave out 'configure terminal' and 'end'" in bad(g, ["configure terminal"])
    assert "leave out" in bad(g, ["end"])
    assert "execute_validation" in bad(g, ["do show run"])
    assert "execute_validation" in bad(g, ["show running-config"])
    assert "would leave configuration mode" in bad(g, ["exit"])
    for meta in (";", "|", "&", "$", "`", ">", "<", "\\", "'", '"'):
        assert "characters not allowed" in bad(g, [f"router isis CORE{meta} reboot"]), meta
    assert "control characters" in bad(g, ["router isis CORE\x1b[2J"])
    assert "outside what A1 manages" in bad(g, ["write memory"])
    assert "outside what A1 manages" in bad(g, ["start-shell bash"])
    assert "incomplete" in bad(g, ["interface"])
    assert "is a host and runs no FRR" in bad(g, ["ipv6 route fd00::/64 eth1"], router=False)
    # every problem of a call is listed at once
    msg = bad(g, ["bogus one", "router isis CORE", "bogus two"])
    assert "command 1 'bogus one'" in msg and "command 3 'bogus two'" in msg


def test_no_forms_allow_shorter_arguments(g: Grammar) -> None:
    ok(g, ["no route-map RM", "no interface eth9", "interface eth1", "no shutdown", "no isis passive"])
    assert "not an allowed" in bad(g, ["no bogus"])


def test_kernel_command_resets_frr_mode(g: Grammar) -> None:
    msg = bad(g, ["router isis CORE", "ip -6 route add fd00::/64 dev eth1", "lsp-gen-interval 2"])
    assert "command 3" in msg  # after a kernel command, FRR lines start at the top level again


# -- A1 grammar: kernel forms ---------------------------------------------------------------------

DEVSTATE_FORMS = [
    # canonical forms substrate.devstate writes (get_running_config shows them with `ip -6 route add`)
    "fcbb:bb00:1::/48 metric 1 encap seg6local action End flavors next-csid lblen 32 nflen 16 count dev sr0",
    "fd00:99::/64 table 100 metric 1024 encap seg6 mode encap segs fcbb:bb00:2:3:e000:: dev eth1",
    "fcbb:bb00:3:e000::/64 encap seg6local action End.DT6 table 100 count dev sr0",
    "fcbb:bb00:3:e001::/64 encap seg6local action End.DX4 nh4 10.0.0.2 dev sr0",
    "::/0 metric 1024 via fd00:1:1::1 dev eth1",
    "fd00:5::/64 proto static nexthop via fe80::1 dev eth1 nexthop via fe80::2 dev eth2 weight 2",
    "blackhole fd00:6::/64 table 100",
]


@pytest.mark.parametrize("args", DEVSTATE_FORMS)
def test_devstate_route_forms_parse(g: Grammar, args: str) -> None:
    (cmd,) = ok(g, [f"ip -6 route add {args}"], router=False)
    assert cmd.family == "ip" and cmd.argv == ["ip", "-6", "route", "add", *args.split()]


def test_kernel_forms_are_argv(g: Grammar) -> None:
    cmds = ok(g, [
        "ip -6 rule add priority 100 from fd00:1:1::/64 lookup 100",
        "ip sr tunsrc set fd00::1",
        "nft add table inet filt",
        "nft add chain inet filt input { type filter hook input priority 0 ; policy accept ; }",
        "nft add rule inet filt input ip6 saddr {fd00::/16,fd01::/16} tcp dport { 22, 80 } counter accept",
        "nft add rule inet filt input ct state established,related accept",
        "nft add rule ip nat post ip saddr 10.0.0.0/8 oifname eth2 snat to 192.0.2.1",
        "nft delete rule inet filt input handle 7",
    ])  # fmt: skip
    assert cmds[4].argv[8:14] == ["{", "fd00::/16", ",", "fd01::/16", "}", "tcp"]
    assert all(c.argv for c in cmds)


def test_kernel_refusals(g: Grammar) -> None:
    msg = bad(g, ["ip -6 route add fd00::/64 foo bar"])
    assert "at 'foo' (word 6)" in msg and "allowed ip forms" in msg and "encap seg6" in msg
    assert "allowed ip forms" in bad(g, ["ip netns exec other bash"])
    assert "allowed ip forms" in bad(g, ["ip -n anibench-x-r2 route add fd00::/64 dev eth1"])
    assert "allowed ip forms" in bad(g, ["ip -batch /etc/passwd"])
    assert "allowed ip forms" in bad(g, ["ip -6 route add fd00::/64 dev eth1 table 255"])  # the local table
    assert "characters not allowed in ip" in bad(g, ["ip -6 route add fd00::/64 dev eth1;reboot"])
    assert "allowed nft forms" in bad(g, ["nft -f /etc/passwd"])
    assert "allowed nft forms" in bad(g, ["nft add rule inet f c meta l4proto tcp log accept"])
    assert "characters not allowed in nft" in bad(g, ['nft add table inet "x"'])


def test_frr_ip_commands_are_not_kernel(g: Grammar) -> None:
    cmds = ok(g, ["ip route 10.0.0.0/8 eth1", "interface eth1", "ip address 10.0.0.1/24", "ip router isis CORE"])
    assert [c.family for c in cmds] == ["frr"] * 4


# -- blocklist ---------------------------------------------------------------------------------------

DESTRUCTIVE = [
    ["no router isis CORE"],
    ["router isis CORE", "no net 49.0001.0000.0000.0001.00"],
    ["interface eth1", "shutdown"],
    ["interface eth1", "no ipv6 router isis CORE"],
    ["no ipv6 forwarding"],
    ["nft flush ruleset"],
    ["nft delete table inet filter"],
    ["ip -6 route flush table 100"],
    ["ip -6 rule flush"],
    ["ip -6 route del fcbb:bb00:1::/48 metric 1 encap seg6local action End flavors next-csid lblen 32 nflen 16 dev sr0"],
]


@pytest.mark.parametrize("lines", DESTRUCTIVE)
def test_blocklist_is_an_ablation_on_top_of_the_allowlist(g: Grammar, gb: Grammar, lines: list[str]) -> None:
    ok(g, lines)  # allowed without the blocklist
    assert "blocked by the destructive-command blocklist" in bad(gb, lines)


def test_blocklist_leaves_ordinary_changes(gb: Grammar) -> None:
    ok(gb, ["interface eth1", "no shutdown", "isis metric 30", "router isis CORE", "lsp-gen-interval 2",
            "ip -6 route add fd00:9::/64 dev eth1", "nft add table inet t"])  # fmt: skip


# -- validation forms --------------------------------------------------------------------------------


def test_validation_forms(g: Grammar) -> None:
    cmds = g.parse_validation("r1", ["show isis neighbor", "show running-config | include isis", "ping fd00::3",
                                     "traceroute -m 5 fd00::3", "ip -6 route show table 100", "ip -6 -j route",
                                     "nft -a list ruleset", "ip route get fd00::3"], is_router=True)  # fmt: skip
    assert [c.family for c in cmds] == ["show", "show", "probe", "probe", "ipread", "ipread", "nftread", "ipread"]
    assert cmds[1].filter == ("include", "isis")
    assert cmds[2].argv == ["ping", "-c", "5", "-i", "0.2", "-W", "1", "fd00::3"]
    assert cmds[3].argv == ["traceroute", "-n", "-q", "1", "-w", "1", "-m", "5", "fd00::3"]
    with pytest.raises(GrammarError) as ei:
        g.parse_validation("h1", ["show version", "ping -c 100 fd00::1", "cat /etc/passwd", "ip -6 route add fd00::/64 dev eth1",
                                  "show ip route | sh", "ping -f fd00::1"], is_router=False)  # fmt: skip
    msg = str(ei.value)
    for frag in ("is a host and runs no FRR", "<uint:1-10>", "not a read-only command", "allowed ipread forms",
                 "only one filter", "command 6"):  # fmt: skip
        assert frag in msg, frag


def test_helpers() -> None:
    assert nft_words("add rule inet f c tcp dport {22,80} accept") == \
        ["add", "rule", "inet", "f", "c", "tcp", "dport", "{", "22", ",", "80", "}", "accept"]  # fmt: skip
    assert nft_words("add rule inet f c ct state established,related accept")[7] == "established,related"
    assert with_probe_defaults(["ping", "-c", "2", "x"]) == ["ping", "-i", "0.2", "-W", "1", "-c", "2", "x"]
    text = "a isis\nb\nc isis\n"
    assert apply_filter(text, ("include", "isis")) == "a isis\nc isis\n"
    assert apply_filter(text, ("exclude", "isis")) == "b\n"
    assert apply_filter(text, ("begin", "b")) == "b\nc isis\n"
    assert apply_filter(text, None) == text


# -- vtysh transcripts ------------------------------------------------------------------------------

TRANSCRIPT = """
Hello, this is FRRouting (version 8.4.4).
Copyright 1996-2005 Kunihiro Ishiguro, et al.

r1# configure terminal
r1(config)# router isis CORE
r1(config-router)# net 49.bogus
% Failed to edit configuration.

YANG error(s):
 Unsatisfied pattern
r1(config-router)# lsp-gen-interval 2
r1(config-router)# end
r1# 
"""


def test_parse_transcript() -> None:
    sent = ["configure terminal", "router isis CORE", "net 49.bogus", "lsp-gen-interval 2", "end"]
    results, shown = parse_transcript(sent, TRANSCRIPT)
    assert [r.rejected for r in results] == [False, False, True, False, False]
    assert results[2].message.startswith("% Failed to edit configuration. YANG error(s):")
    assert results[1].prompt == "r1(config)# "
    assert shown.startswith("r1# configure terminal\n") and shown.endswith("r1(config-router)# end\n")
    assert "Hello" not in shown
    # vtysh died after two lines: the rest is unanswered and counted as rejected
    results, _ = parse_transcript(sent, "r1# configure terminal\nr1(config)# router isis CORE\n")
    assert [r.answered for r in results] == [True, True, False, False, False]
    assert results[3].rejected and "ended" in results[3].message


# -- A0 classification --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        ("vtysh -c 'show isis neighbor'", "validation"),
        ("ip -6 route show table 100; ping -c 3 fd00::3", "validation"),
        ("ip -6 route", "validation"),
        ("nft list ruleset | grep drop", "validation"),
        ("cat /etc/frr/frr.conf 2>/dev/null", "validation"),
        ("vtysh -c 'configure terminal' -c 'router isis CORE'", "config"),
        ("ip -6 route add fd00::/64 dev eth1", "config"),
        ("echo 1 > /proc/sys/net/ipv6/conf/all/forwarding", "config"),
        ("sysctl -w net.ipv6.conf.all.forwarding=0", "config"),
        ("nft flush ruleset", "config"),
        ("rm -rf /etc/frr", "config"),
        ("cat x | tee /tmp/y", "config"),
        ("'unbalanced", "config"),
        ("", "config"),
        # writes hidden behind a reading program or a wrapper (found by an audit)
        ('printf "route del 10.0.2.0/24 table 102\\n" | ip -4 -batch -', "config"),
        ("env ip -4 route add 10.0.0.0/24 dev eth1", "config"),
        ("echo $(ip -6 route flush table 101)", "config"),
        ("echo `ip link set eth1 down`", "config"),
        ("awk 'BEGIN{system(\"ip link set eth1 down\")}'", "config"),
        ("ip -force -batch /tmp/x", "config"),
        ("ip -6 route show | awk '{print $1}'", "validation"),
        ("FOO=1 env BAR=2 ip -6 route show", "validation"),
    ],
)
def test_classify_shell(command: str, kind: str) -> None:
    assert classify_shell(command) == kind


def test_shell_rejected() -> None:
    assert shell_rejected("validation", 127, "bash: x: command not found") is not None
    assert shell_rejected("validation", 1, "1 packets transmitted, 0 received") is None  # a failed ping is a result
    assert shell_rejected("config", 2, "RTNETLINK answers: File exists") == "exit status 2"
    assert "FRR refused" in (shell_rejected("config", 0, "% Unknown command: bogus") or "")


# -- recorder and episode -------------------------------------------------------------------------------


def _rec(seq: int, **kw: object) -> CallRecord:
    base = dict(seq=seq, level="A0", tool="t", arguments={}, kind="read", is_error=False, tool_error=False,
                started_at=1.0, ended_at=2.0, duration_s=1.0)  # fmt: skip
    base.update(kw)
    return CallRecord(**base)  # type: ignore[arg-type]


def test_recorder_appends_lines_and_survives_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "t.jsonl"
    rec = TrajectoryRecorder(path)
    rec.append(_rec(1))
    rec.close()
    with open(path, "a") as f:
        f.write('{"seq": 2, "torn')  # a crash mid-line
    assert [r["seq"] for r in read_trajectory(path)] == [1]
    rec = TrajectoryRecorder(path)  # the next record starts on a fresh line
    rec.append(_rec(3, kind="submit"))
    rec.close()
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["seq"] == 3 and len(lines) == 3
    path.write_text('{"seq": 1}\nnot json\n{"seq": 2}\n')  # damage in the middle is an error, not skipped
    with pytest.raises(ValueError, match="line 2"):
        read_trajectory(path)


def test_bounds() -> None:
    assert bound_text("x" * 10, 5).startswith("xxxxx\n[... 5 more bytes")
    args, cut = bound_arguments({"a": "y" * 100_000})
    assert cut and isinstance(args, str) and len(args) < 70_000
    assert bound_arguments({"a": 1}) == ({"a": 1}, False)
    # a lone surrogate (valid JSON, not encodable as UTF-8) is recorded as its escape, never lost
    assert bound_text("x\udcff") == "x\\udcff"
    assert bound_arguments({"k\ud800": ["\udcff"]}) == ({"k\\ud800": ["\\udcff"]}, False)


def test_episode_budget_submit_and_resume() -> None:
    ep = Episode(budget=3)
    assert ep.begin() == (1, None)
    assert ep.begin() == (2, None)
    ep.submit(2)
    assert ep.ended.is_set() and ep.ended_reason == "submit"
    assert ep.begin() == (3, "episode_ended")
    ep2 = Episode(budget=2)
    ep2.begin(), ep2.begin()
    assert ep2.begin() == (3, "budget") and "budget spent" in ep2.refusal_message("budget", 3)
    ep2.after_call()
    assert ep2.ended.is_set() and ep2.ended_reason == "budget"
    # a restarted server continues the recorded episode
    prev = [{"seq": 1, "kind": "read", "is_error": False}, {"seq": 2, "kind": "submit", "is_error": False, "ended_at": 5.0}]
    ep3 = Episode(budget=10, previous=prev)
    assert ep3.seq == 2 and ep3.begin() == (3, "episode_ended")
    assert Episode(budget=10, previous=prev).continued_note() is None  # no file: nothing to name


def test_episode_texts_name_the_trajectory_file(tmp_path) -> None:  # noqa: ANN001
    traj = tmp_path / "t.jsonl"
    prev = [{"seq": 1, "kind": "read", "is_error": False}, {"seq": 2, "kind": "submit", "is_error": False, "ended_at": 5.0}]
    ep = Episode(budget=10, previous=prev, trajectory=traj)
    note = ep.continued_note()
    assert note is not None and str(traj) in note and "2 call(s) so far, submitted at call 2" in note
    seq, reason = ep.begin()
    msg = ep.refusal_message(reason or "", seq)
    assert msg.startswith("the episode has ended: submit was called (call 2)") and str(traj) in msg and "new --trajectory" in msg
    spent = Episode(budget=1, previous=prev[:1], trajectory=traj)
    assert "budget already spent" in (spent.continued_note() or "")
    seq, reason = spent.begin()
    assert reason == "budget" and str(traj) in spent.refusal_message(reason, seq)
    fresh = Episode(budget=10, trajectory=traj)
    assert fresh.continued_note() is None


def test_registry() -> None:
    assert levels() == ["A0", "A1", "A2", "A3-T"]
    assert normalize_level("a1") == "A1"
    with pytest.raises(KeyError, match="registered: A0, A1"):
        normalize_level("A7")


def test_running_config_rendering_and_bounds() -> None:
    from servers.a1_wrapper.server import _bound, render_state
    from substrate.devstate import DeviceState, LinkState

    st = DeviceState(node="r1", routes6=["fd00:9::/64 table 100 encap seg6 mode encap segs fcbb:bb00:2:e000:: dev eth1"],
                     rules6=["priority 100 from fd00:1:1::/64 lookup 100"], addresses=["fd00::1/128 dev lo"],
                     links={"lo": LinkState(up=True, mtu=65536), "eth1": LinkState(kind="veth", up=False, mtu=1500)},
                     nft="table inet f {\n}", tunsrc="fd00::1", frr_config="frr version 8.4.4\nrouter isis CORE\nexit\n")  # fmt: skip
    text = render_state(st, is_router=True)
    for frag in ("router isis CORE", "ip -6 route add fd00:9::/64 table 100 encap seg6", "ip -6 rule add priority 100",
                 "ip sr tunsrc set fd00::1", "table inet f {", "eth1: veth DOWN mtu 1500", "lo: up mtu 65536; fd00::1/128"):  # fmt: skip
        assert frag in text, frag
    out = _bound({"a": "x" * 10_000, "b": "y" * 100, "c": "z" * 50_000}, per=20_000, total=24_000, hint="ask for less")
    assert out["b"] == "y" * 100
    assert "more bytes not shown" in out["a"] and out["a"].endswith("[ask for less]\n")
    assert sum(len(v) for v in out.values()) < 24_000 + 600
