"""A2 pieces without a lab: RFC 6242 framing, the YANG modules (pyang --strict), datastore edits
and filters on flat data, RFC 7951 JSON payloads, the operator's payloads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from substrate.netconf import data, schema
from substrate.netconf.data import RpcError
from substrate.netconf.framing import EOM, Deframer, FramingError, encode_chunked, encode_eom

K = "urn:anibench:yang:kernel"
NC = data.NC_NS


def test_framing_round_trip_eom_and_chunked() -> None:
    d = Deframer()
    hello = b"<hello/>"
    rpc = b"<rpc>" + b"x]]>]]>y" * 5000 + b"</rpc>"
    out = d.feed(encode_eom(hello) + encode_chunked(rpc, chunk=7)[:100])
    assert out == [hello] and d.hold  # nothing after the hello is read before the framing is chosen
    assert d.release(chunked=True) == []
    rest = encode_chunked(rpc, chunk=7)[100:]
    got = []
    for i in range(0, len(rest), 333):  # arbitrary cuts across chunk headers
        got += d.feed(rest[i:i + 333])
    assert got == [rpc]


@pytest.mark.parametrize("junk", [b"\n#0\nx", b"\n#abc\n", b"garbage", b"\n##\n", b"\n#99999999999\n"])
def test_framing_errors(junk: bytes) -> None:
    d = Deframer()
    d.chunked = True
    with pytest.raises(FramingError):
        d.feed(junk)


def test_eom_message_bound() -> None:
    d = Deframer(max_message=1000)
    with pytest.raises(FramingError):
        d.feed(b"a" * 2000)
    assert EOM == b"]]>]]>"


def test_every_module_passes_pyang_strict() -> None:
    paths = [str(m.path) for m in schema.modules() if m.path is not None]
    assert any("anibench-kernel" in p for p in paths)
    r = subprocess.run([sys.executable, "-m", "pyang", "--strict", "-p", f"{schema.OWN_YANG_DIR}:{schema.FRR_YANG_DIR}",
                        *paths], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def cfg(body: str) -> object:
    return data.parse_xml(f'<config xmlns="{NC}" xmlns:nc="{NC}">{body}</config>')


ROUTE = (f'<kernel xmlns="{K}"><table><id>101</id><route><destination>2001:db8::/64</destination><metric>1024</metric>'
         "<device>eth5</device><seg6><mode>encap.red</mode><segment>fcbb:bb00:0002:e000::</segment></seg6></route>"
         "</table></kernel>")


def test_edit_operations() -> None:
    f: data.Flat = {}
    data.apply_edit(f, cfg(ROUTE))
    key = "/anibench-kernel:kernel/table[id='101']/route[destination='2001:db8::/64'][metric='1024']"
    assert f[key + "/seg6/segment[.='fcbb:bb00:2:e000::']"] == "fcbb:bb00:2:e000::"  # canonical
    with pytest.raises(RpcError) as e:
        data.apply_edit(f, cfg(ROUTE.replace("<route>", '<route nc:operation="create">')))
    assert e.value.tag == "data-exists"
    data.apply_edit(f, cfg(ROUTE.replace("<route>", '<route nc:operation="replace">').replace("eth5", "eth6")
                           .replace("<seg6><mode>encap.red</mode><segment>fcbb:bb00:0002:e000::</segment></seg6>", "")))
    assert f[key + "/device"] == "eth6" and not any("seg6" in k for k in f)
    data.apply_edit(f, cfg(f'<kernel xmlns="{K}"><table nc:operation="delete"><id>101</id></table></kernel>'))
    assert f == {}
    with pytest.raises(RpcError) as e:
        data.apply_edit(f, cfg(f'<kernel xmlns="{K}"><table nc:operation="delete"><id>101</id></table></kernel>'))
    assert e.value.tag == "data-missing"
    data.apply_edit(f, cfg(f'<kernel xmlns="{K}"><table nc:operation="remove"><id>101</id></table></kernel>'))


def test_bad_edits_change_nothing_and_name_the_node() -> None:
    f: data.Flat = {}
    data.apply_edit(f, cfg(ROUTE))
    before = dict(f)
    for body, tag in ((ROUTE.replace("1024", "x"), "invalid-value"),
                      (f'<kernel xmlns="{K}"><nosuch/></kernel>', "unknown-element"),
                      ('<foo xmlns="urn:nowhere"/>', "unknown-namespace"),
                      (ROUTE.replace("<route>", '<route nc:operation="frob">'), "bad-attribute"),
                      (f'<kernel xmlns="{K}"><table><route/></table></kernel>', "missing-element")):
        with pytest.raises(RpcError) as e:
            data.apply_edit(f, cfg(ROUTE.replace("2001:db8::", "2001:db8:1::") + body))
        assert e.value.tag == tag, (body, e.value)
        assert f == before
    bad = dict(f)
    bad.pop("/anibench-kernel:kernel/table[id='101']/route[destination='2001:db8::/64'][metric='1024']/seg6/mode")
    with pytest.raises(schema.SchemaError) as se:
        data.validate(bad)
    assert "seg6" in (se.value.path or "")


def test_parse_refuses_dtds() -> None:
    for x in (b'<!DOCTYPE a [<!ENTITY b "c">]><a>&b;</a>', b'<!DOCTYPE a SYSTEM "file:///etc/passwd"><a/>', b"<a>"):
        with pytest.raises(RpcError) as e:
            data.parse_xml(x)
        assert e.value.tag == "malformed-message"


def test_filters() -> None:
    f: data.Flat = {}
    data.apply_edit(f, cfg(ROUTE + ROUTE.replace("101", "102")))
    root = data.parse_xml(f'<data xmlns="{NC}">{data.to_xml(f)}</data>')
    flt = data.parse_xml(f'<filter xmlns="{NC}"><kernel xmlns="{K}"><table><id>102</id><route><device/></route>'
                         "</table></kernel></filter>")
    from lxml import etree

    out = etree.tostring(data.subtree_filter(root, flt)).decode()
    assert "<id>102</id>" in out and "<id>101</id>" not in out and "<device>eth5</device>" in out and "seg6" not in out
    got = data.xpath_select(f, "/k:kernel/k:table[k:id='101']", {"k": K})
    assert got and all("id='101'" in k for k in got)


def test_rfc7951_json_payload() -> None:
    from servers.a2_netconf.server import json_to_xml

    ns = {m.name: m.namespace for m in schema.modules()}
    x = json_to_xml({"anibench-kernel:kernel": {"table": [{"id": 101, "route": [
        {"destination": "2001:db8::/64", "metric": 1024, "device": "eth5", "seg6local": {"action": "End.DT6", "table": 101,
                                                                                         "count": [None]}},
        {"destination": "2001:db8:1::/64", "metric": 1024, "@": {"ietf-netconf:operation": "delete"}}]}]}}, ns)
    f = {"/anibench-kernel:kernel/table[id='101']": "",
         "/anibench-kernel:kernel/table[id='101']/route[destination='2001:db8:1::/64'][metric='1024']": ""}
    data.apply_edit(f, data.parse_xml(x))
    assert "/anibench-kernel:kernel/table[id='101']/route[destination='2001:db8::/64'][metric='1024']/seg6local/count" in f
    assert not any("2001:db8:1::" in k for k in f)


def test_operator_payload_round_trips_through_the_model() -> None:
    from harness.agents.a2_operator import edit_payload
    from substrate.netconf.device import parse_route, parse_rule
    from substrate.scenario.apply import ConfigDelta

    adds = ["-6 route replace fd10::/64 table 101 metric 1024 encap seg6 mode encap.red segs fcbb:bb00:2:e000:: dev sr0",
            "-6 route replace fcbb:bb00:1:e001::/64 metric 1024 encap seg6local action End.DX4 nh4 10.0.0.2 count dev sr0",
            "-6 rule add priority 1000 iif eth5 lookup 101", "-4 route replace unreachable 0.0.0.0/0 table 101 metric 4278198272"]
    for a in adds:
        words = a.split()[3:]
        args = " ".join(words)
        if "rule" in a:
            assert parse_rule(args, 6).args() == args
        else:
            assert parse_route(args).args() == args
    f: data.Flat = {}
    data.apply_edit(f, cfg(edit_payload(ConfigDelta(node="r1", additions=adds, frr=["interface eth5",
                                                                                    "ipv6 address fd10::1/64", "exit"]))))
    data.validate(f)
    assert "/frr-interface:lib/interface[name='eth5']/anibench-kernel:address[ip='fd10::1']/prefix-length" in f


def test_an_edit_of_many_top_level_elements_builds_each_value_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking an edit's values builds each element's own entries, not the whole result per element:
    n top-level elements cost n whole-result builds (quadratic: 500 elements took 33 s with every
    device's NETCONF waiting on the schema lock). The entries built stay linear in the edit."""
    built: list[int] = []
    real = data._build

    def counting(flat):  # noqa: ANN001, ANN202
        built.append(len(flat))
        return real(flat)

    monkeypatch.setattr(data, "_build", counting)
    n = 200
    tops = "".join(f'<kernel xmlns="{K}"><table><id>4260</id><route><destination>fd70:{i:x}::/64</destination>'
                   "<metric>1024</metric><device>eth1</device></route></table></kernel>" for i in range(n))
    f: data.Flat = {}
    data.apply_edit(f, cfg(tops))
    assert sum(f"fd70:{i:x}::/64" in k for k in f for i in (0, n - 1)) >= 2
    assert sum(built) <= 4 * len(f), (sum(built), len(f))
    # a bad value among them is still found, by element (continue-on-error skips only that one)
    bad = tops.replace("fd70:7::/64", "fd70:zz::/64")
    g: data.Flat = {}
    rep = data.apply_edit(g, cfg(bad), error_option="continue-on-error")
    assert len(rep.errors) == 1 and "fd70:zz" in rep.errors[0].message
    assert not any("fd70:7::/64" in k for k in g) and any("fd70:8::/64" in k for k in g)


def test_a_message_of_tiny_chunks_costs_its_size_not_a_list_of_chunks() -> None:
    """RFC 6242 allows 1-byte chunks: a message's memory follows its data, not its chunk count
    (16 MiB of 1-byte chunks took about a gigabyte in the lab's NETCONF server)."""
    import tracemalloc

    n = 50_000
    d = Deframer()
    d.chunked = True
    wire = b"\n#1\nx" * n
    tracemalloc.start()
    try:
        got = []
        for i in range(0, len(wire), 32768):  # as SSH delivers it
            got += d.feed(wire[i:i + 32768])
        got += d.feed(b"\n##\n")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == [b"x" * n]
    assert peak < 8 * n, peak  # the message twice (buffer and result) and SSH-sized reads; a list was ~60 bytes a chunk
