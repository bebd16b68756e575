"""The generic device-transaction machinery without a lab (substrate.journal): items a change sets
with their before-values, the commands that put them back, normalized comparison, the journal
file, and the startup-configuration edit (substrate.frr.edit_startup_config). The lab side
(undo, recovery, killed servers) is in tests/test_a3t_recovery.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from substrate import journal as jr
from substrate.devstate import DeviceState, LinkState
from substrate.frr import edit_startup_config
from substrate.scenario.apply import config_delta
from substrate.scenario.model import NodeConfig

TABLE = ("table inet tenant_fw {\n\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n"
         "\t\toifname \"eth4\" jump t1\n\t}\n\tchain t1 {\n\t\tip6 daddr fd10::/64 tcp dport 80 counter drop\n\t}\n}\n")  # fmt: skip
#: as ``nft list ruleset`` shows it: counter values, a blank line between chains
LISTED = TABLE.replace("\t}\n\tchain t1", "\t}\n\n\tchain t1").replace("counter drop", "counter packets 4 bytes 240 drop")


def before_state() -> DeviceState:
    return DeviceState(
        node="r1",
        routes6=["fd10::/64 table 100 metric 1024 dev eth3", "unreachable ::/0 table 100 metric 4278198272 dev lo"],
        rules6=["priority 1000 iif eth3 lookup 100"],
        addresses=["fd10::2/64 dev eth1"],
        links={"eth4": LinkState(kind="veth", up=False, mtu=1500), "eth3": LinkState(kind="veth", up=True, mtu=1500)},
        nft="table ip other {\n}\n" + LISTED,
        sysctls={"net/netfilter/nf_hooks_lwtunnel": "0"},
    )


def test_items_carry_before_values_and_undo_puts_exactly_them_back() -> None:
    old = NodeConfig(routes6=["fd10::/64 table 100 metric 1024 dev eth3"], rules6=["priority 1000 iif eth3 lookup 100"],
                     nft={"inet tenant_fw": TABLE}, frr=["interface eth3\n ipv6 address fd10::1/64"])  # fmt: skip
    new = NodeConfig(
        links_up=["eth4"], addresses=["fd10:0:0:1::2/64 dev eth4"],
        routes6=["fd10::/64 table 100 metric 1024 encap seg6 mode encap.red segs fcbb:bb00:2:e000:: dev sr0",
                 "fd10:0:0:1::/64 table 100 metric 1024 dev eth4"],
        rules6=["priority 1000 iif eth4 lookup 100"], nft={}, sysctls={"net/netfilter/nf_hooks_lwtunnel": "1"},
        frr=["interface eth4\n ipv6 address fd10:0:0:1::1/64"],
    )  # fmt: skip
    delta = config_delta("r1", old, new)
    frr = jr.FrrView({"zebra": "interface eth3\n ipv6 address fd10::1/64\nexit\n"})
    items = {(i.kind, i.key): i for i in jr.items_of(delta, before_state(), frr)}
    assert items[("route6", "fd10::/64 table 100 metric 1024")].before == "fd10::/64 table 100 metric 1024 dev eth3"
    assert items[("route6", "fd10:0:0:1::/64 table 100 metric 1024")].before is None
    assert (items[("rule6", "priority 1000 iif eth3 lookup 100")].before, items[("rule6", "priority 1000 iif eth3 lookup 100")].after) == \
        ("present", None)  # fmt: skip
    assert (items[("link", "eth4")].before, items[("link", "eth4")].after) == ("down", "up")
    assert items[("nft", "inet tenant_fw")].before == LISTED and items[("nft", "inet tenant_fw")].after is None
    assert items[("sysctl", "net/netfilter/nf_hooks_lwtunnel")].before == "0"
    assert items[("frr", "interface eth3\tipv6 address fd10::1/64")].before == "present"
    assert items[("frr", "interface eth4\tipv6 address fd10:0:0:1::1/64")].before is None
    undo = jr.delta_setting("r1", [(i, i.before) for i in items.values()])
    assert sorted(undo.describe()) == sorted([
        "- -6 route del fd10:0:0:1::/64 table 100 metric 1024", "- -6 rule del priority 1000 iif eth4 lookup 100",
        "- addr del fd10:0:0:1::2/64 dev eth4", "- link set eth4 down",
        "+ -6 route replace fd10::/64 table 100 metric 1024 dev eth3", "+ -6 rule add priority 1000 iif eth3 lookup 100",
        "~ nft table inet tenant_fw: replace", "~ sysctl net/netfilter/nf_hooks_lwtunnel=0",
        "~ frr: interface eth3", "~ frr: ipv6 address fd10::1/64", "~ frr: exit",
        "~ frr: interface eth4", "~ frr: no ipv6 address fd10:0:0:1::1/64", "~ frr: exit"])  # fmt: skip
    assert undo.nft["inet tenant_fw"] == LISTED
    # the items of the other table, other routes, other links are not the change's: not items
    assert ("link", "eth3") not in items and not any(k == ("nft", "ip other") for k in items)


def test_a_port_mtu_is_an_item_undone_to_its_value_before() -> None:
    """The reconciler's MTU repair (``link set IF mtu N``) is a journaled item: its before-value is
    the captured MTU and undoing it sets that MTU back."""
    from substrate.scenario.apply import ConfigDelta

    items = jr.items_of(ConfigDelta(node="r1", additions=["link set eth3 mtu 1400"]), before_state(), None)
    assert [(i.kind, i.key, i.before, i.after) for i in items] == [("mtu", "eth3", "1500", "1400")]
    assert jr.delta_setting("r1", [(i, i.before) for i in items]).additions == ["link set eth3 mtu 1500"]


def test_a_line_removed_with_nested_lines_keeps_each_daemons_subtree() -> None:
    """Removing an FRR line that has lines nested under it removes them too (``no route-map X
    permit 10``; ``no address-family`` in ``router bgp``): its item keeps each daemon's copy of the
    whole subtree, with the lines it is nested in (issue 13: the undo put back the first line
    only); a line without nested lines keeps none, and the forward script is unchanged."""
    from substrate.devstate import frr_daemon_delta, frr_subtree
    from substrate.scenario.apply import ConfigDelta, frr_lines

    rmap = "route-map X permit 10\n match ipv6 address prefix-list P\n set metric 42\nexit\n"
    bgpd = ("router bgp 64500\n bgp router-id 1.1.1.1\n !\n address-family ipv6 unicast\n  network fd00::/48\n"
            "  neighbor fd00::2 activate\n exit-address-family\nexit\n!\n" + rmap + "ipv6 prefix-list P seq 5 permit fd00::/48\n")
    frr = jr.FrrView({"zebra": rmap, "bgpd": bgpd, "isisd": "router isis CORE\n net 49.0001.0000.0000.0001.00\nexit\n"})
    changes = [("", "route-map X permit 10", False), ("router bgp 64500", "address-family ipv6 unicast", False),
               ("", "ipv6 prefix-list P seq 5 permit fd00::/48", False)]
    delta = ConfigDelta(node="r1", frr_changes=changes, frr=frr_lines(changes))
    items = {i.key: i for i in jr.items_of(delta, before_state(), frr)}
    assert items["\troute-map X permit 10"].frr_daemons == {"bgpd": "route-map X permit 10\n match ipv6 address prefix-list P\n"
                                                            " set metric 42\n", "zebra": frr_subtree(rmap, "", "route-map X permit 10")}
    af = items["router bgp 64500\taddress-family ipv6 unicast"]
    assert af.before == "present" and af.frr_daemons == {"bgpd": "router bgp 64500\n address-family ipv6 unicast\n  network fd00::/48\n"
                                                                 "  neighbor fd00::2 activate\n"}  # fmt: skip
    assert items["\tipv6 prefix-list P seq 5 permit fd00::/48"].frr_daemons is None
    # the items serialize with their subtrees (journal files); an older entry without them still reads
    assert jr.Item.model_validate_json(af.model_dump_json()) == af
    assert jr.Item.model_validate({"kind": "frr", "key": "\tx", "before": "present", "after": None}).frr_daemons is None
    # what undo sends bgpd: the nested stanza in its context, then each of its lines in it
    # (the context line too: entering an existing ``router bgp`` changes nothing)
    assert frr_daemon_delta("", af.frr_daemons["bgpd"]) == [
        "configure terminal", "router bgp 64500", "end", "configure terminal", "router bgp 64500", "address-family ipv6 unicast",
        "end", "configure terminal", "router bgp 64500", "address-family ipv6 unicast", "network fd00::/48", "end",
        "configure terminal", "router bgp 64500", "address-family ipv6 unicast", "neighbor fd00::2 activate", "end"]  # fmt: skip
    # the subtree found; absent when the daemon does not hold it
    assert frr_subtree(bgpd, "router bgp 64500", "network fd00::/48") == "router bgp 64500\n address-family ipv6 unicast\n  network fd00::/48\n"
    assert frr_subtree(rmap, "router bgp 64500", "address-family ipv6 unicast") == ""


def test_a_stanza_the_change_creates_is_undone_whole() -> None:
    """A stanza created by the change (lines under a head absent before) is an item of its own:
    undone by ``no HEAD``, its lines not negated (which would re-enter, so re-create, it); an
    interface's stanza is not (FRR does not delete an interface that exists): its lines are."""
    old = NodeConfig(frr=["interface eth3\n ipv6 address fd10::1/64"])
    new = NodeConfig(frr=["interface eth3\n ipv6 address fd10::1/64", "interface eth4\n ipv6 address fd10:0:0:1::1/64",
                          "route-map X permit 10\n match ipv6 address prefix-list P\n set metric 42"])  # fmt: skip
    delta = config_delta("r1", old, new)
    frr = jr.FrrView({"zebra": "interface eth3\n ipv6 address fd10::1/64\nexit\n"})
    items = jr.items_of(delta, before_state(), frr)
    keys = [i.key for i in items if i.kind == "frr"]
    assert keys[-1] == "\troute-map X permit 10" and "\tinterface eth4" not in keys, keys  # after its lines (startup config)
    assert (items[-1].before, items[-1].after) == (None, "present")
    undo = jr.delta_setting("r1", [(i, i.before) for i in items if i.kind == "frr"])
    assert undo.frr == ["no route-map X permit 10", "interface eth4", "no ipv6 address fd10:0:0:1::1/64", "exit"], undo.frr
    # committed: the startup configuration gets the stanza once, with its lines
    conf = edit_startup_config("frr version 8.4.4\n!\nend\n", [(*i.key.split("\t"), i.after is not None) for i in items if i.kind == "frr"])
    assert conf.count("route-map X permit 10") == 1 and " set metric 42" in conf, conf


def test_values_compare_in_normalized_form() -> None:
    st = before_state()
    assert jr.same_value("nft", jr.value_of(st, None, "nft", "inet tenant_fw"), TABLE)
    assert not jr.same_value("nft", LISTED, TABLE.replace("80", "81"))
    assert jr.same_value("nft", "meta mark set 0x00000100", "meta mark set 0x100")
    got = jr.value_of(st, None, "route6", "unreachable ::/0 table 100 metric 4278198272")
    assert jr.same_value("route6", got, "unreachable ::/0 table 100 metric 4278198272")
    assert jr.same_value("rule6", None, None) and not jr.same_value("rule6", "present", None)
    assert jr.nft_tables(st.nft) == {"ip other": "table ip other {\n}\n", "inet tenant_fw": LISTED}


def test_journal_entries_are_durable_per_phase_and_closed_by_reset(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    lab = SimpleNamespace(dir=tmp_path)
    monkeypatch.setattr(jr, "_epoch", lambda _lab: "e1")
    j = jr.Journal(lab, "a3t")  # type: ignore[arg-type]
    e = j.begin("c4", [jr.DeviceRecord(node="r1", items=[])], holder="A3-T server pid 1", payload={"draft": {"x": 1}})
    on_disk = json.loads((tmp_path / "journal" / "a3t-c4.json").read_text())
    assert on_disk["phase"] == "applying" and on_disk["payload"] == {"draft": {"x": 1}}
    j.mark(e, "validating")
    assert [x.txn for x in j.unfinished()] == ["c4"] and j.get("c4").phase == "validating"  # type: ignore[union-attr]
    assert e.tag == "anibench-txn:e1:a3t-c4"
    assert jr.close_unfinished(lab, "lab reset") == ["a3t-c4"]  # type: ignore[arg-type]
    assert j.unfinished() == [] and j.get("c4").history[-1].note == "lab reset"  # type: ignore[union-attr]
    monkeypatch.setattr(jr, "_epoch", lambda _lab: "e2")
    assert j.get("c4") is None  # another baseline epoch
    assert j.prune() == 1 and not list((tmp_path / "journal").iterdir())


def test_startup_config_edit_is_idempotent_and_keeps_the_rest() -> None:
    conf = "frr defaults traditional\nhostname r6\n!\ninterface eth4\n description to CE c8\nexit\n!\nrouter isis CORE\n net 49.1\nexit\n!\nend\n"
    add = [("interface eth4", "ipv6 address fd10:0:0:4::1/64", True), ("interface eth9", "ip address 10.0.0.1/24", True)]
    once = edit_startup_config(conf, add)
    assert edit_startup_config(once, add) == once
    assert "interface eth4\n description to CE c8\n ipv6 address fd10:0:0:4::1/64\nexit" in once
    assert once.rstrip().endswith("interface eth9\n ip address 10.0.0.1/24\nexit\n!\nend")
    back = edit_startup_config(once, [(h, ln, False) for h, ln, _ in add])
    assert "fd10:0:0:4::1/64" not in back and "10.0.0.1" not in back and "router isis CORE\n net 49.1\nexit" in back


def test_startup_config_removal_reaches_every_stanza_of_the_head_and_leaves_no_empty_head() -> None:
    """A deployed frr.conf holds a port's underlay stanza and, after it, its service stanza (the
    same head twice): a removed service's line goes from the second too (it stayed, and a daemon
    restart brought the deleted site's address back), and a stanza left without lines goes whole
    (no bare ``interface eth9`` / ``exit``); a top-level line heading a stanza (a route-map entry)
    goes with its nested lines (issue 35)."""
    conf = ("hostname r1\n!\ninterface eth4\n description to CE c2\nexit\n!\ninterface eth4\n ipv6 address fd10:0:0:1::1/64\n!\n"
            "interface eth9\n ip address 10.0.0.1/24\nexit\n!\nroute-map X permit 10\n match ipv6 address prefix-list P\n"
            " set metric 4\nexit\n!\nrouter isis CORE\n net 49.1\nexit\n!\nend\n")
    gone = [("interface eth4", "ipv6 address fd10:0:0:1::1/64", False), ("interface eth9", "ip address 10.0.0.1/24", False),
            ("", "route-map X permit 10", False)]
    out = edit_startup_config(conf, gone)
    assert out == "hostname r1\n!\ninterface eth4\n description to CE c2\nexit\n!\nrouter isis CORE\n net 49.1\nexit\n!\nend\n", out
    assert edit_startup_config(out, gone) == out


def test_frr_lines_negate_as_frr_accepts() -> None:
    """An absent line is negated the way FRR takes it back: ``no description`` without its text
    (FRR 8.4 refuses ``no description TEXT``), and a ``no X`` line by ``X``, not ``no no X``
    (found undoing a journal item of a description)."""
    from substrate.scenario.apply import frr_lines

    changes = [("interface eth1", "description core link", False), ("interface eth1", "no ipv6 nd suppress-ra", False),
               ("", "ip forwarding", False), ("router isis CORE", "lsp-gen-interval 1", True)]
    assert frr_lines(changes) == ["no ip forwarding", "interface eth1", "no description", "ipv6 nd suppress-ra", "exit",
                                  "router isis CORE", "lsp-gen-interval 1", "exit"]
