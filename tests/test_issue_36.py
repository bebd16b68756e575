"""Issue 36: the oracle's validity on the eBPF data plane -- what issue 19 could not finish
without a lab: the floating IP's hairpin from a CE of the tenant on another PE, with its
non-vacuity test (broken through the substrate, the check fails)."""

from __future__ import annotations

import re

import pytest


def _handle(lab, node: str, chain: str, contains: str) -> str:  # noqa: ANN001
    """The handle of the one rule of ``ip fip_hairpin`` chain ``chain`` on ``node`` holding ``contains``."""
    r = lab.exec(node, ["nft", "-a", "list", "chain", "ip", "fip_hairpin", chain])
    assert r.returncode == 0, r.stderr
    hits = [ln for ln in r.stdout.splitlines() if contains in ln and "# handle" in ln]
    assert len(hits) == 1, (contains, r.stdout)
    return hits[0].rsplit("# handle", 1)[1].strip()


def _ok(lab, node: str, argv: list[str]) -> None:  # noqa: ANN001
    r = lab.exec(node, argv)
    assert r.returncode == 0, (node, argv, r.stderr)


def test_every_ipv4_ce_of_a_floating_ips_tenant_gets_a_hairpin_probe_and_rule() -> None:
    """Rendering (pure): each floating IP has a hairpin probe from every other IPv4 CE of its
    tenant, counted at the site's CE, and each such CE's port has the DNAT rule on its own PE;
    only the site's own PE source-NATs."""
    from substrate.scenario import build, load_manifest
    from substrate.scenario.layers.floating_ip import HAIRPIN_TABLE
    from substrate.scenario.layers.l3vpn import ce_addr
    from tests.conftest import REPO

    sc = build(load_manifest(REPO / "manifests" / "srv6-brownfield.yaml"), seed=9, density=2)
    by_id = {i.id: i for i in sc.invariants}
    for f in sc.floating_ips:
        s = sc.site(f.site)
        ce = ce_addr(s.prefix4, 2)
        others = [o for o in sc.tenant(f.tenant).sites if o.prefix4 and o.id != s.id]
        assert others, f.id
        for o in others:
            inv = by_id[f"floating_ip/{f.id}/hairpin/{o.id}"]
            assert inv.kind == "reach_at" and inv.params == {"src": o.ce, "dst": f.address, "family": 4,
                                                            "dst_node": s.ce, "dst_at": ce}
            table = sc.node_config[o.pe].nft[HAIRPIN_TABLE]
            assert f'iifname "{o.pe_if}" ip daddr {f.address} dnat to {ce}' in table
            snat = [ln for ln in table.splitlines() if "snat to" in ln and f"ip daddr {ce} " in ln]
            assert bool(snat) == (o.pe == s.pe), (o.pe, snat)


@pytest.mark.lab
def test_hairpin_from_a_ce_on_another_pe_fails_when_its_pe_does_not_translate(campaign_lab) -> None:
    """A CE of the floating IP's tenant on another PE reaches the floating address, answered by
    the site's CE (baseline). Broken through the substrate: (1) the DNAT rule of that CE's port
    deleted on its PE -- its hairpin check fails (nothing arrives, no reply) while the external
    host's check and the site CE's own hairpin pass; (2) that rule rewritten to another CE of
    the tenant -- replies come back (from the wrong CE), yet nothing arrives at the site's CE:
    the check fails."""
    from substrate.scenario.deploy import reset
    from substrate.scenario.layers.l3vpn import ce_addr
    from substrate.scenario.observer import observe

    lab, sc = campaign_lab
    reset(lab)
    f = sc.floating_ips[0]
    site = sc.site(f.site)
    remote = [o for o in sc.tenant(f.tenant).sites if o.prefix4 and o.pe != site.pe]
    assert len(remote) >= 2, "the small campaign scenario's floating IP has two IPv4 sites of its tenant on another PE"
    o, decoy = remote[0], remote[1]
    by_id = {i.id: i for i in sc.invariants}
    probe, own, ext = by_id[f"floating_ip/{f.id}/hairpin/{o.id}"], by_id[f"floating_ip/{f.id}/hairpin"], by_id[f"floating_ip/{f.id}/reach"]
    ce = ce_addr(site.prefix4, 2)
    try:
        base = observe(lab, [probe, own, ext])
        assert all(v.ok for v in base), [(v.id, v.detail) for v in base if not v.ok]
        h = _handle(lab, o.pe, "prerouting", f'iifname "{o.pe_if}" ip daddr {f.address} dnat to {ce}')
        _ok(lab, o.pe, ["nft", "delete", "rule", "ip", "fip_hairpin", "prerouting", "handle", h])
        pv, ov, ev = observe(lab, [probe, own, ext])
        assert ov.ok and ev.ok, (ov.detail, ev.detail)
        assert not pv.ok and "0 replies, 0 probes arrived" in pv.detail, pv.detail
        reset(lab)
        h = _handle(lab, o.pe, "prerouting", f'iifname "{o.pe_if}" ip daddr {f.address} dnat to {ce}')
        _ok(lab, o.pe, ["nft", "replace", "rule", "ip", "fip_hairpin", "prerouting", "handle", h, "iifname", o.pe_if,
                        "ip", "daddr", f.address, "dnat", "to", ce_addr(decoy.prefix4, 2)])
        pv = observe(lab, [probe])[0]
        assert not pv.ok and "0 probes arrived" in pv.detail and "0 replies" not in pv.detail, pv.detail
    finally:
        reset(lab)


# -- the adversarial attack's findings (changes designed to pass every check) --------------------------


def _pe_site(sc):  # noqa: ANN001, ANN202
    """The floating IP's site (on a PE with other tenants' sites too) and its tenant."""
    f = sc.floating_ips[0]
    return sc.site(f.site), sc.tenant(f.tenant)


def _attacks(sc):  # noqa: ANN001, ANN202
    """Attack name -> (node, shell command, ids of the checks that must fail), on the floating
    IP's site and PE of the small campaign scenario."""
    from substrate.scenario.layers.l3vpn import ce_addr, sid_of

    s, t = _pe_site(sc)
    other = next(x for x in sc.tenants if x.id != t.id)
    used = {int(r.split()[0].split(":")[3], 16) for r in sc.node_config[s.pe].routes6 if "seg6local" in r.split()}
    free = next(f for f in range(0xE0F0, 0xEFFF) if f not in used)
    # probes from a CE on the same PE: policy routing consults the local table first (ip-rule(8),
    # priority 0) on any SRv6 data plane; a remote CE's probe is decapsulated by End.DT6, whose
    # lookup is the data plane's own (the kernel's looks in the table only; the eBPF one, through
    # its helper's rules, after the local table: a difference reported in issue 36)
    ces_here = {x.ce for x in sc.all_sites() if x.pe == s.pe}
    into = [i.id for i in sc.invariants if i.kind == "reach" and i.params.get("dst_node") == s.ce
            and i.params["family"] == 6 and i.params["src"] in ces_here]
    return {
        # a tenant port's TCP 7 sent into the provider's main table (the SIDs, the underlay)
        "rule_leak": (s.pe, f"ip -6 rule add priority 999 iif {s.pe_if} ipproto tcp dport 7 lookup main",
                      [f"device/{s.pe}/rules/6"]),
        # marked IPv4 packets looked up in another tenant's table
        "rule4_mark": (s.pe, f"ip -4 rule add priority 998 fwmark 0x77 lookup {other.table}", [f"device/{s.pe}/rules/4"]),
        # a second End.DT6 into the tenant's table on a free function: a backdoor for any SRv6 packet
        "backdoor_sid": (s.pe, f"ip -6 route add {sid_of(sc, s.pe, free)} metric 1024 encap seg6local action End.DT6 "
                               f"table {t.table} count dev sr0", [f"device/{s.pe}/sids"]),
        # the PE answers for its site's CE (the CE's address on the PE's loopback): replies come back
        "hijack": (s.pe, f"ip -6 addr add {ce_addr(s.prefix6, 2)}/128 dev lo", into),
        # a shaper on the site's port: pings and handshakes pass, bulk traffic crawls
        "shaper": (s.pe, f"tc qdisc replace dev {s.pe_if} root tbf rate 64kbit burst 4k latency 50ms", [f"device/{s.pe}/ports"]),
        # the site's port MTU lowered: small probes pass, full-size packets do not
        "mtu": (s.pe, f"ip link set {s.pe_if} mtu 1280", [f"device/{s.pe}/ports"]),
    }


@pytest.mark.lab
@pytest.mark.parametrize("attack", ["rule_leak", "rule4_mark", "backdoor_sid", "hijack", "shaper", "mtu"])
def test_each_attack_that_passed_every_check_now_fails_one(campaign_lab, attack: str) -> None:
    """The adversarial attack on the oracle (issue 36): changes made through the substrate and
    designed to pass every check. Before this issue each of these passed every baseline
    invariant of the small campaign scenario (no check read the policy rules or the set of
    local SIDs, and a reach probe counted replies, whoever sent them); now the named checks pass
    at baseline and fail with the change, which the lab reset then undoes exactly. (The hijack
    alone is also caught by the old reach checks of remote sites, whose replies the PE cannot
    route back; with main-table routes back to them it passed: the attack's report.)"""
    from substrate.scenario.deploy import reset
    from substrate.scenario.observer import observe

    lab, sc = campaign_lab
    node, cmd, ids = _attacks(sc)[attack]
    assert ids
    by_id = {i.id: i for i in sc.invariants}
    invs = [by_id[x] for x in ids]
    reset(lab)
    try:
        base = observe(lab, invs)
        assert all(v.ok for v in base), [(v.id, v.detail) for v in base if not v.ok]
        r = lab.exec(node, ["sh", "-c", cmd])
        assert r.returncode == 0, r.stderr
        after = observe(lab, invs)
        assert not any(v.ok for v in after), [(v.id, v.detail) for v in after if v.ok]
        if attack == "hijack":  # the replies come from the PE: nothing arrives at the CE
            assert all("0 probes arrived" in v.detail and "0 replies" not in v.detail for v in after), [v.detail for v in after]
        rep = reset(lab)
        assert rep.exact, rep.residual  # the reset takes the change back (rule_leak: test_a_rule_on_a_protocol_...)
    finally:
        reset(lab)


def test_rule_and_sid_shapes_read_rendered_and_kernel_forms_alike() -> None:
    """The shapes the router-state checks compare (pure): a rendered rule or SID and the
    kernel's JSON of it are equal; a mark and a SID's function are not compared (allocation
    choices), every other selector or parameter is."""
    from substrate.scenario.observer import kernel_rule_shape, kernel_sid_shape, rendered_rule_shape, rendered_sid_shape

    assert rendered_rule_shape(6, "priority 900 to fcbb:bb00::/32 lookup main") == \
        kernel_rule_shape(6, {"priority": 900, "src": "all", "dst": "fcbb:bb00::", "dstlen": 32, "table": "main"})
    assert rendered_rule_shape(4, "priority 1100 fwmark 0x100 lookup 100") == \
        kernel_rule_shape(4, {"priority": 1100, "src": "all", "fwmark": "0x77", "table": "100"})
    assert rendered_rule_shape(6, "priority 1000 iif eth3 lookup 100") != \
        kernel_rule_shape(6, {"priority": 1000, "src": "all", "iif": "eth3", "ipproto": "tcp", "dport": 7, "table": "100"})
    assert rendered_sid_shape("fcbb:bb00:8:e000::/64 metric 1024 encap seg6local action End.DT6 table 100 count dev sr0") == \
        kernel_sid_shape({"dst": "fcbb:bb00:8:e0ff::/64", "encap": "seg6local", "action": "End.DT6", "table": "100"})
    assert kernel_sid_shape({"dst": "fcbb:bb00:8::/48", "encap": "seg6local", "action": "End"}) is None


def test_a_rule_on_a_protocol_is_captured_in_a_form_ip_rule_reads_back() -> None:
    """Found by the attack: ``ip -N -j rule`` prints ``"ipproto": "ipproto-6"``, which the reset
    replayed as ``ip rule del ... ipproto ipproto-6`` and ip refused: an agent's ``ipproto tcp``
    rule survived every reset (reset not exact, every later run on the lab a harness error)."""
    from substrate.devstate import rule_args

    got = rule_args({"priority": 999, "src": "all", "iif": "eth4", "ipproto": "ipproto-6", "dport": 7, "table": "254"})
    assert got == "priority 999 iif eth4 ipproto 6 dport 7 lookup main"


_INJECT = """
import socket, struct, ipaddress, sys
src, dst, sid = (ipaddress.IPv6Address(a) for a in sys.argv[1:4])
icmp = struct.pack("!BBHHH", 128, 0, 0, 0x3636, 1) + b"sid-injection" * 4
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b)); s = (s >> 16) + (s & 0xffff); s += s >> 16
    return (~s) & 0xffff
ph = src.packed + dst.packed + struct.pack("!I3xB", len(icmp), 58)
icmp = icmp[:2] + struct.pack("!H", csum(ph + icmp)) + icmp[4:]
inner = struct.pack("!IHBB", 6 << 28, len(icmp), 58, 64) + src.packed + dst.packed + icmp
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, 41)  # the kernel adds the outer header (next header 41)
for _ in range(3):
    s.sendto(inner, (str(sid), 0))
"""


@pytest.mark.lab
@pytest.mark.xfail(strict=True, reason="open (issue 36 attack): PEs do not filter packets from a CE port addressed to "
                   "the SID block (RFC 8754 section 5.1), so a CE can send IPv6-in-IPv6 to another tenant's End.DT6 SID "
                   "and reach that tenant's sites; no isolation invariant probes it")
def test_a_ce_cannot_inject_into_another_tenant_through_its_sid(campaign_lab) -> None:
    """A CE of tenant A sends an echo request, encapsulated in IPv6 (next header 41), to tenant
    B's End.DT6 SID on another PE: the rule ``priority 900 to <SID block> lookup main`` of A's
    PE comes before A's circuit rule, the underlay carries it, and B's PE decapsulates it into
    B's table, which delivers it to B's CE. Isolation requires that nothing arrives (counted at
    B's CE, ahead of any filter)."""
    from substrate.scenario.deploy import reset
    from substrate.scenario.layers.l3vpn import ce_addr, sid_of

    lab, sc = campaign_lab
    reset(lab)
    a = sc.site("t1s2")
    b_t = next(t for t in sc.tenants if t.id != a.tenant and any(s.pe != a.pe for s in t.sites))
    b = next(s for s in b_t.sites if s.pe != a.pe and s.prefix6 != a.prefix6)
    sid = sid_of(sc, b.pe, b_t.dt6_functions[b.pe]).split("/")[0]
    table = "table inet sidinj {\n chain c {\n  type filter hook prerouting priority -400; policy accept;\n" \
            "  icmpv6 type echo-request counter\n }\n}\n"
    try:
        assert lab.exec(b.ce, ["nft", "-f", "-"], input=table).returncode == 0
        r = lab.exec(a.ce, ["python3", "-c", _INJECT, ce_addr(a.prefix6, 2), ce_addr(b.prefix6, 2), sid])
        assert r.returncode == 0, r.stderr
        got = lab.exec(b.ce, ["nft", "list", "table", "inet", "sidinj"]).stdout
        arrived = int(re.search(r"counter packets (\d+)", got).group(1))
        assert arrived == 0, f"{arrived} injected echo requests from {a.ce} ({a.tenant}) arrived at {b.ce} ({b.tenant}) via {sid}"
    finally:
        lab.exec(b.ce, ["nft", "delete", "table", "inet", "sidinj"])
        reset(lab)


def test_nft_rules_in_another_order_pass_only_where_no_packet_matches_both() -> None:
    """nft evaluates a chain in order, first verdict wins: a reordering between rules that test
    one key for different values changes nothing (the reference operator appended r22's hairpin
    DNAT where the renderer sorts it, and failed); between overlapping rules it is a change."""
    from substrate.scenario.observer import same_behaviour_order

    head = "type nat hook prerouting priority dstnat; policy accept;"
    a = 'iifname "eth6" ip daddr 198.51.100.10 dnat to 10.0.7.2'
    b = 'iifname "eth5" ip daddr 198.51.100.11 dnat to 10.0.17.2'
    assert same_behaviour_order([head, a, b], [head, b, a])
    assert not same_behaviour_order([head, a, b], [a, head, b])  # the chain's header is no rule
    accept, drop = "ip6 saddr fd10::/64 tcp dport 22 accept", "tcp dport 22 drop"
    assert not same_behaviour_order([accept, drop], [drop, accept])  # the drop now wins
    # a statement is no match: "meta mark set" tests nothing
    m1, m2 = 'iifname "eth3" meta mark set 0x1', 'iifname "eth3" meta mark 0x2 accept'
    assert not same_behaviour_order([m1, m2], [m2, m1])
    assert not same_behaviour_order([a, a, b], [b, a, a])  # duplicates: not told apart
    # IPv4 and IPv6 rules of one accept never match one packet
    a4, a6 = "ip saddr 10.1.1.0/24 ip daddr 10.1.2.0/24 tcp dport 22 accept", "ip6 saddr fd10::/64 ip6 daddr fd10:0:0:1::/64 tcp dport 22 accept"
    assert same_behaviour_order([a6, a4, drop], [a4, a6, drop])
    # an adversarial reviewer's pairs: one packet can match both (a wildcard, an operator, a named
    # set, a map, a mask, a key inside a log string or after ct, a rule rewriting the key)
    for x, y in [('iifname "eth*" accept', 'iifname "eth1" drop'), ("tcp dport >= 1000 accept", "tcp dport 8080 drop"),
                 ("ip daddr @blocked drop", "ip daddr 10.0.0.1 accept"), ("ip daddr vmap { 10.0.0.1 : drop }", "ip daddr 10.0.0.1 accept"),
                 ("meta mark & 0x0000ff00 == 0x00000100 drop", "meta mark 0x00000101 accept"),
                 ('ip saddr 1.2.3.4 log prefix "x tcp dport 22 " drop', "tcp dport 80 accept"),
                 ("ct original ip daddr 10.0.0.1 drop", "ip daddr 10.0.0.2 accept"),
                 ("ip daddr 10.0.0.1 ip daddr set 10.0.0.2", "ip daddr 10.0.0.2 drop")]:
        assert not same_behaviour_order([x, y], [y, x]), (x, y)


def test_every_seg6local_route_but_a_locators_end_is_a_local_sid() -> None:
    """A /128 (printed without its length) or /80 End.DT6 inside the PE's locator wins the
    longest match as a /64 does: the SID check counted /64s only (an adversarial reviewer's
    finding). A locator's End (/48) is the underlay's and stays out."""
    from substrate.scenario.observer import kernel_sid_shape, rendered_sid_shape

    dt6 = {"encap": "seg6local", "action": "End.DT6", "table": "200"}
    assert kernel_sid_shape({"dst": "fcbb:bb00:6:f00d::", **dt6}) == "action End.DT6 table 200"
    assert kernel_sid_shape({"dst": "fcbb:bb00:6:f00d::/80", **dt6}) == "action End.DT6 table 200"
    assert kernel_sid_shape({"dst": "fcbb:bb00:6::/48", **dt6}) == "action End.DT6 table 200"
    assert kernel_sid_shape({"dst": "fcbb:bb00:6::/48", "encap": "seg6local", "action": "End", "flavors": ["next-csid"]}) is None
    assert rendered_sid_shape("fcbb:bb00:6::/48 encap seg6local action End flavors next-csid lblen 32 nflen 16 count dev sr0 metric 1") is None
    assert rendered_sid_shape("fcbb:bb00:6:e001::/64 metric 1024 encap seg6local action End.DX4 nh4 10.0.4.2 count dev sr0") \
        == "action End.DX4 nh4 10.0.4.2"
