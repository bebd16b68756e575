"""Pure-logic tests of the ANI servers (no lab): token patterns, the A1 grammar and blocklist,
vtysh transcript parsing, A0 command classification, the recorder and the episode rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from servers.a0_shell.classify import classify_shell, shell_rejected
from servers.a1_wrapper.grammar import Grammar, GrammarError, apply_filter, nft_words, with_probe_defaults
from servers.a1_wrapper.patterns import PatternError, compile_pattern, describe_failure, match
from servers.a1_wrapper.vtysh import Answer, run_lines, split_echo
from servers.common.recorder import CallRecord, TrajectoryRecorder, bound_arguments, bound_text, read_trajectory
from servers.common.server import Episode
from substrate.process import ExecResult
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
    # the frame of a pasted configuration is accepted and only returns to the top level
    assert [c.family for c in ok(g, ["configure terminal", "router isis CORE", "end", "conf t", "end"])] == \
        ["structure", "frr", "structure", "structure", "structure"]  # fmt: skip
    assert "not an allowed FRR configuration command in global" in bad(g, ["router isis CORE", "end", "net 49.0001.00"])
    assert "execute_validation" in bad(g, ["do show run"])
    assert "execute_validation" in bad(g, ["show running-config"])
    assert "would leave configuration mode" in bad(g, ["exit"])
    # FRR lines go to vtysh as arguments, never to a shell: what FRR takes as text is accepted
    for meta in (";", "&", "$", "`", ">", "<", "\\", "'", '"'):
        (cmd,) = ok(g, [f"router isis CORE{meta}x"])
        assert cmd.text == f"router isis CORE{meta}x", meta
    assert "output filter" in bad(g, ["router isis CORE | reboot"])
    assert "control characters" in bad(g, ["router isis CORE\x1b[2J"])
    assert "not an allowed FRR configuration command" in bad(g, ["write memory"])
    assert "not an allowed FRR configuration command" in bad(g, ["start-shell bash"])
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
    assert "allowed ip forms" in bad(g, ["ip -6 route add fd00::/64 dev eth1 table 0"])  # "unspecified", not a table
    assert "characters not allowed in ip" in bad(g, ["ip -6 route add fd00::/64 dev eth1;reboot"])
    assert "allowed nft forms" in bad(g, ["nft -f /etc/passwd"])
    assert "allowed nft forms" in bad(g, ["nft add rule inet f c meta l4proto tcp log accept"])
    assert "characters not allowed in nft" in bad(g, ['nft add table inet "x"'])


@pytest.mark.parametrize("comment", ["#l{XEnI(w\x85*N27", "! note \x1b[2J", "#\x00", "! a\u2028b"])
def test_a_comment_with_a_control_character_is_refused_like_any_line(g: Grammar, comment: str) -> None:
    """Found by the A1 fuzz (its seed made reproducible): a comment line is never sent, but it is
    echoed and recorded, and a control character poisons a call whichever line holds it."""
    assert "contains control characters" in bad(g, ["interface eth1", comment])
    assert [c.family for c in ok(g, ["! a plain comment", "# another"])] == ["comment", "comment"]


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


# -- vtysh: per-line answers without a terminal ---------------------------------------------------

LONG = "ipv6 prefix-list PL-LONG-NAME-" + "X" * 200 + " seq 5 permit fd99:1234:5678:9abc::/64 le 128"


def test_split_echo_is_exact_whatever_the_line_length() -> None:
    sent = ["configure terminal", LONG, "router isis CORE", "net 49.bogus"]
    out = (f"r1# configure terminal\nr1(config)# {LONG}\nr1(config)# router isis CORE\n"
           "r1(config-router)# net 49.bogus\n% Failed to edit configuration.\n\nYANG error(s):\n Unsatisfied pattern\n")  # fmt: skip
    echoes = split_echo(sent, out)
    assert [p for p, _ in echoes] == ["r1# ", "r1(config)# ", "r1(config)# ", "r1(config-router)# "]
    assert echoes[3][1].startswith("% Failed to edit configuration.") and echoes[1][1] == ""
    # an answer that merely contains a later command is not its echo
    assert len(split_echo(["a b", "c"], "r1# a b\n% no c here\nc\n")) == 1


class FakeVtysh:
    """Stands in for vtysh -E -c ... (the FRR behaviour measured on 8.4): echo each command,
    stop at the first command in ``refuse`` with exit status 1."""

    def __init__(self, refuse: dict[str, str]):
        self.refuse, self.calls = refuse, []

    def __call__(self, argv: list[str]) -> ExecResult:
        sent = argv[3::2]
        self.calls.append(sent)
        out = []
        for c in sent:
            out.append(f"r1(config)# {c}")
            if c in self.refuse:
                out.append(self.refuse[c])
                return ExecResult("r1", argv, 1, "\n".join(out) + "\n", "", 0.0)
        return ExecResult("r1", argv, 0, "\n".join(out) + "\n", "", 0.0)


def test_run_lines_continues_after_a_refusal_in_the_same_mode() -> None:
    fake = FakeVtysh({"bad one": "% Unknown command: bad one", "silent": ""})
    lines = ["a", "bad one", "b", "silent", "c"]
    answers = run_lines(fake, lines, preamble=lambda i, _: ["configure terminal", "router isis CORE"])
    assert [a.status for a in answers] == ["accepted", "refused", "accepted", "refused", "accepted"]
    assert answers[1].message == "% Unknown command: bad one" and answers[3].message == ""
    assert len(fake.calls) == 3 and fake.calls[1][:2] == ["configure terminal", "router isis CORE"]
    # a line whose mode cannot be entered is not run, and the session ends before nothing else
    fake = FakeVtysh({"router bgp 65001": "bgpd is not running"})
    answers = run_lines(fake, ["x"], preamble=lambda i, _: ["configure terminal", "router bgp 65001"])
    assert answers[0].status == "not_run" and "bgpd is not running" in answers[0].output
    assert isinstance(answers[0], Answer)


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


def test_episode_texts_name_the_trajectory_file_to_the_operator_only(tmp_path, caplog) -> None:  # noqa: ANN001
    """The operator (stderr) learns where the episode is recorded; the agent never sees a host path
    (issue 11 item 7)."""
    traj = tmp_path / "t.jsonl"
    prev = [{"seq": 1, "kind": "read", "is_error": False}, {"seq": 2, "kind": "submit", "is_error": False, "ended_at": 5.0}]
    ep = Episode(budget=10, previous=prev, trajectory=traj)
    note = ep.continued_note()
    assert note is not None and str(traj) in note and "2 call(s) so far, submitted at call 2" in note
    seq, reason = ep.begin()
    msg = ep.refusal_message(reason or "", seq)
    assert msg.startswith("the episode has ended: submit was called (call 2)") and str(tmp_path) not in msg
    assert str(traj) in caplog.text and "new --trajectory" in caplog.text
    with pytest.raises(ToolError) as e:
        ep.submit(4)
    assert "the episode has ended" in str(e.value) and str(tmp_path) not in str(e.value)
    spent = Episode(budget=1, previous=prev[:1], trajectory=traj)
    assert "budget already spent" in (spent.continued_note() or "")
    seq, reason = spent.begin()
    assert reason == "budget" and str(tmp_path) not in spent.refusal_message(reason, seq)
    fresh = Episode(budget=10, trajectory=traj)
    assert fresh.continued_note() is None


def test_registry() -> None:
    assert levels() == ["A0", "A1", "A2", "A3-T", "A3-R", "A4"]
    assert normalize_level("a1") == "A1"
    with pytest.raises(KeyError, match="registered: A0, A1"):
        normalize_level("A7")


def test_running_config_rendering() -> None:
    from servers.a1_wrapper.server import render_state
    from substrate.devstate import DeviceState, LinkState

    nft = ("table inet f {\n\tchain fwd {\n\t\ttype filter hook forward priority filter; policy accept;\n"
           '\t\toifname "eth3" jump t1\n\t\tip6 daddr fd10::/64 tcp dport { 22, 80 } counter packets 3 bytes 240 drop\n'
           "\t}\n\tchain t1 {\n\t}\n\tset s6 {\n\t\ttype ipv6_addr\n\t\tflags interval\n\t\telements = { fd00::/64,\n"
           "\t\t\t     fd01::/64 }\n\t}\n}")  # fmt: skip
    st = DeviceState(node="r1", routes6=["fd00:9::/64 table 100 encap seg6 mode encap segs fcbb:bb00:2:e000:: dev eth1"],
                     rules6=["priority 100 from fd00:1:1::/64 lookup 100"], addresses=["fd00::1/128 dev lo"],
                     links={"lo": LinkState(up=True, mtu=65536), "eth1": LinkState(kind="veth", up=False, mtu=1500)},
                     nft=nft, tunsrc="fd00::1", frr_config="frr version 8.4.4\nrouter isis CORE\nexit\n")  # fmt: skip
    text = render_state(st, is_router=True)
    for frag in ("router isis CORE", "ip -6 route add fd00:9::/64 table 100 encap seg6", "ip -6 rule add priority 100",
                 "ip sr tunsrc set fd00::1", "eth1: veth DOWN mtu 1500", "lo: up mtu 65536; fd00::1/128",
                 "nft add table inet f\n",
                 "nft add chain inet f fwd { type filter hook forward priority filter ; policy accept ; }\n",
                 "nft add chain inet f t1\n", "nft add set inet f s6 { type ipv6_addr ; flags interval ; }\n",
                 "nft add element inet f s6 { fd00::/64, fd01::/64 }\n", "nft add rule inet f fwd oifname eth3 jump t1\n",
                 "nft add rule inet f fwd ip6 daddr fd10::/64 tcp dport { 22, 80 } counter drop\n"):  # fmt: skip
        assert frag in text, frag
    # every line of it is an accepted apply_config command (or a comment)
    Grammar.load().parse_config("r1", text.splitlines(), is_router=True)


# -- bounded results and the paging handle (servers.common.paging) ------------------------------------


def test_fitter_cuts_the_longest_strings_and_pages_keep_the_bound() -> None:
    import anyio
    from mcp_types import CallToolResult, TextContent

    from servers.common.paging import Fitter, OutputStore, complete, message_bytes

    store = OutputStore()
    fit = Fitter(store, 8192)
    big = {"a": "x" * 20_000, "b": 'q"\\é\x01' * 3000, "c": "short", "n": 5}
    res = CallToolResult(content=[TextContent(type="text", text=json.dumps(big))], structured_content=big)
    out = fit.fit_result(res, request_id=12345)
    assert message_bytes(out, 12345) <= 8192 and out.structured_content["c"] == "short" and out.structured_content["n"] == 5
    assert json.loads(out.content[0].text) == out.structured_content  # the text is the structured copy's JSON

    async def page(oid: str, off: int) -> dict:
        from servers.common.server import OutputPage

        def make(full: str, a: int, b: int) -> OutputPage:
            return OutputPage(output_id=oid, offset=a, text=full[a:b], next_offset=b if b < len(full) else None,
                              total_chars=len(full))  # fmt: skip

        p = fit.page(oid, off, None, make)
        r = CallToolResult(content=[TextContent(type="text", text=p.model_dump_json())], structured_content=p.model_dump())
        assert message_bytes(r) <= 8192
        return p.model_dump()

    assert anyio.run(complete, out.structured_content, page) == big
    # small results pass untouched; error texts are cut with a marker of their own
    small = CallToolResult(content=[TextContent(type="text", text="{}")], structured_content={})
    assert fit.fit_result(small) is small
    # the text copy of a structured result is sent as compact JSON (issue 11: indentation costs tokens)
    indented = CallToolResult(content=[TextContent(type="text", text='{\n  "a": [\n    1\n  ]\n}')],
                              structured_content={"a": [1]})
    assert fit.fit_result(indented).content[0].text == '{"a":[1]}'
    err = fit.fit_error("e" * 50_000)
    assert len(err) < 8192 and "read_output(output_id=" in err
    # a result of many small strings that no cut can bound: kept whole, answered with how to read it
    many = {f"k{i}": "v" * 60 for i in range(500)}
    whole = fit.fit_result(CallToolResult(content=[TextContent(type="text", text="x")], structured_content=many))
    assert whole.is_error and "the call completed" in whole.content[0].text and "read_output" in whole.content[0].text


def test_output_store_drops_the_oldest_past_its_bound() -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    from servers.common.paging import OutputStore

    st = OutputStore(max_bytes=100)
    a, b = st.reserve(), st.reserve()
    st.put(a, "x" * 80)
    st.put(b, "y" * 80)
    assert st.get(b) == "y" * 80
    with pytest.raises(ToolError, match="no longer kept"):
        st.get(a)
    with pytest.raises(ToolError, match="unknown output id"):
        st.get("out-99")


# -- the argument policy (servers.common.args) ---------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "seconds": {"type": "number"},
        "timeout_s": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "device": {"type": "string"},
        "commands": {"type": "object", "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}},
        "ops": {"type": "array", "items": {"$ref": "#/$defs/Op"}},
    },
    "$defs": {"Op": {"type": "object", "properties": {"spec": {"type": "object", "properties": {"vlan": {"type": "integer"}}}}}},
}


@pytest.mark.parametrize(("args", "want", "problems"), [
    ({"seconds": True}, {"seconds": True}, ["seconds: true is a boolean, not a number"]),
    ({"timeout_s": False}, {"timeout_s": False}, ["timeout_s: false is a boolean, not a number"]),
    ({"seconds": "30"}, {"seconds": 30}, []),
    ({"seconds": "2.5"}, {"seconds": 2.5}, []),
    ({"seconds": "NaN"}, {"seconds": "NaN"}, []),  # left for validation, which names the type
    ({"seconds": "true"}, {"seconds": "true"}, []),
    ({"device": "5"}, {"device": "5"}, []),
    ({"commands": '{"r1": "x"}'}, {"commands": {"r1": "x"}}, []),
    ({"commands": {"r1": '["a"]'}}, {"commands": {"r1": '["a"]'}}, []),  # a string is allowed there: kept
    ({"ops": '[{"spec": {"vlan": "7"}}]'}, {"ops": [{"spec": {"vlan": 7}}]}, []),  # at every depth
    ({"ops": [{"spec": '{"vlan": true}'}]}, {"ops": [{"spec": {"vlan": True}}]}, ["ops[0].spec.vlan: true is a boolean, not a number"]),
])  # fmt: skip
def test_argument_policy(args: dict, want: dict, problems: list[str]) -> None:
    from servers.common.args import normalize

    got, why = normalize(args, SCHEMA)
    assert (got, why) == (want, problems)


# -- A1: a line's outcome from FRR's answer and the read-back ----------------------------------------


@pytest.mark.parametrize(("line", "status", "output", "changed", "was", "now", "down", "outcome", "why"), [
    ("lsp-gen-interval 2", "accepted", "", True, False, True, [], "applied", ""),
    # the segment changed, but not this line's doing: it is not in the configuration and nothing in its mode moved
    ("metric-style wide", "accepted", "", True, False, False, [], "unchanged", "default value"),
    ("lsp-gen-interval 2", "accepted", "", False, True, True, [], "unchanged", "already in the running configuration"),
    ("isis hello-multiplier 3", "accepted", "", False, False, False, [], "unchanged", "changed nothing"),  # a default value
    ("description x", "accepted", "", False, False, False, ["isisd"], "rejected", "isisd is not running"),
    ("no net 49.0001.00", "accepted", "", False, False, False, [], "rejected", "nothing to remove"),
    ("no net 49.0001.00", "accepted", "", True, False, False, [], "applied", ""),
    ("no ipv6 route fd99::/64 blackhole", "accepted", "% Refusing to remove a non-existent route", False, False, False, [],
     "rejected", "(FRR: % Refusing to remove a non-existent route)"),
    ("no bgp ebgp-requires-policy", "accepted", "", False, True, True, [], "unchanged", "already"),  # a setting shown as 'no'
    ("bogus", "refused", "% Unknown command: bogus", False, False, False, [], "rejected", "% Unknown command: bogus"),
    ("no access-list X permit any", "refused", "", False, False, False, [], "rejected", "without a message"),
    ("set metric 5", "accepted", "% warning of some kind", False, False, False, [], "rejected", "FRR answered"),
    ("set metric 5", "accepted", "% warning of some kind", True, False, True, [], "applied", "FRR: % warning"),
])  # fmt: skip
def test_frr_line_outcomes(line: str, status: str, output: str, changed: bool, was: bool, now: bool, down: list[str],
                           outcome: str, why: str) -> None:  # fmt: skip
    from servers.a1_wrapper.apply import DeviceRun
    from servers.a1_wrapper.grammar import Command

    c = Command(text=line, negated=line.startswith("no "))
    got = DeviceRun._frr_outcome(c, Answer(line, status, "r1(config)# ", output), changed=changed, was=was, now=now, down=down)
    assert got[0] == outcome and why in got[1], got
    # stored in another form (an abbreviation, a replaced value): something moved in its mode
    if outcome == "unchanged" and changed and not was:
        again = DeviceRun._frr_outcome(c, Answer(line, status, "", output), changed=True, was=False, now=False, touched=True)
        assert again[0] == "applied"


def test_a1_routes_compare_by_attributes_not_words() -> None:
    """An agent's `ip route add` arguments and the canonical form of the same route compare
    equal (defaults, aliases, order); another device, metric, table or SID parameter does not."""
    from servers.a1_wrapper.kernel import route_units as u

    def same(a: str, b: str, fam: int = 6) -> bool:
        return u(a.split(), fam) == u(b.split(), fam)

    assert same("fd99:5::/64 dev eth1", "fd99:5::/64 metric 1024 dev eth1")
    assert same("fd99:6::/64 via fe80::1 dev eth1 table 100", "fd99:6::/64 table 100 metric 1024 via fe80::1 dev eth1")
    assert same("blackhole fd99:8::/64", "blackhole fd99:8::/64 metric 1024 dev lo")
    assert same("fd99:9::/64 dev eth1 proto static preference 7", "fd99:9::/64 metric 7 proto 4 dev eth1")
    assert same("10.9.1.0/24 dev eth1 table main", "10.9.1.0/24 dev eth1", 4)
    assert same("fcbb:bb00:1:e0::/64 encap seg6local action End.DT6 table 100 dev sr0",
                "fcbb:bb00:1:e0::/64 metric 1024 encap seg6local action End.DT6 table 100 dev sr0")  # fmt: skip
    assert not same("fcbb:bb00:1:e0::/64 encap seg6local action End.DT6 table 100 dev sr0",
                    "fcbb:bb00:1:e0::/64 metric 1024 encap seg6local action End.DT6 table 101 dev sr0")  # fmt: skip
    assert not same("fd99:5::/64 dev eth1", "fd99:5::/64 metric 1024 dev eth2")
    assert not same("fd99:5::/64 dev eth1", "fd99:5::/64 metric 1 dev eth1")
    assert not same("fd99:5::/64 dev eth1", "fd99:5::/64 table 7 metric 1024 dev eth1")
    assert u("fd99:5::/64 nexthop via fe80::1 dev eth1".split(), 6) is None


def test_a3r_modify_states_the_whole_record() -> None:
    """A record moved to another PE on a port of the same name becomes a modify stating pe AND
    pe_interface (the planner refuses a move without the port): the reconciler's change set states
    the desired record, not only the fields that differ (found by the change-set task at A4)."""
    from servers.a3_reconciled.source import ops_toward

    site = {"tenant": "t1", "pe": "r2", "pe_interface": "eth5", "prefix6": "fd10::/64", "prefix4": None}
    moved = {**site, "pe": "r11"}
    ops, where = ops_toward({"tenant_site": {"t1s7": moved}}, {"tenant_site": {"t1s7": site}})
    assert ops == [{"op": "modify", "service_class": "tenant_site", "id": "t1s7",
                    "spec": {"tenant": "t1", "pe": "r11", "pe_interface": "eth5", "prefix6": "fd10::/64"}}]
    assert where == ["records/tenant_site/t1s7.yaml"]
    assert ops_toward({"tenant_site": {"t1s7": site}}, {"tenant_site": {"t1s7": site}}) == ([], [])


def test_reconcile_status_never_calls_an_applied_head_pending() -> None:
    """reconcile_status's summary (issue 35, the reconciler attack's finding 8): with HEAD applied
    and no reconciler running it said "pending -- HEAD is not applied yet (they carry commit X)",
    X being HEAD. Now it says HEAD was applied and that nothing checks for drift."""
    from servers.a3_reconciled import reconciler as rc
    from servers.a3_reconciled.server import summary_of

    head = "e8dddaebccee" + "0" * 28
    rec = rc.ReconcileRecord(n=3, started=0.0, commit=head, trigger="commit", result="applied")
    st = rc.ReconcileStatus(epoch="e", applied_commit=head, last=rec)
    text = summary_of(st, head, running=False, in_sync=False)
    assert "pending" not in text and "HEAD was applied" in text and "no reconciler" in text.lower(), text
    older = rc.ReconcileStatus(epoch="e", applied_commit="1" * 40, last=rec)
    assert "pending -- HEAD is not applied yet (they carry commit 111111111111)" in summary_of(older, head, running=True, in_sync=False)
