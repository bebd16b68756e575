"""A2 device side in a real lab: the routers' NETCONF servers (substrate.netconf) through ncclient
and through raw SSH sessions (issue 12, item 6)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from substrate import Lab, Topology
from substrate.netconf.framing import EOM, Deframer, encode_chunked
from tests.conftest import unique_name

pytestmark = pytest.mark.lab

K = "urn:anibench:yang:kernel"
IF = "http://frrouting.org/yang/interface"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    from substrate.scenario.deploy import save_baseline

    with Lab.create(Topology.from_spec("line:3"), unique_name("t-nc")) as lab:
        save_baseline(lab)
        yield lab


def connect(lab: Lab, device: str = "r1"):  # noqa: ANN201 - ncclient Manager
    from servers.a2_netconf.server import connect as nc_connect
    from substrate.netconf import ensure_server

    m = nc_connect(ensure_server(lab)[device], timeout_s=30)
    m.timeout = 60
    return m


def desc_edit(ifname: str, text: str) -> str:
    from xml.sax.saxutils import escape

    return (f'<config xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><lib xmlns="{IF}"><interface><name>{ifname}'
            f"</name><description>{escape(text)}</description></interface></lib></config>")


def description(lab: Lab, node: str, ifname: str) -> str | None:
    text = lab.vtysh(node, "show running-config").stdout
    inside = False
    for line in text.splitlines():
        if not line.startswith(" "):
            inside = line.strip() == f"interface {ifname}"
        elif inside and line.strip().startswith("description "):
            return line.strip()[len("description "):]
    return None


def wait_for(cond, timeout_s: float = 30.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)  # poll interval, not a settle delay
    return cond()


# -- raw sessions (for what ncclient would never send) --------------------------------------------


async def _raw(lab: Lab, messages: list[bytes], device: str = "r1", timeout_s: float = 30.0) -> list[bytes | None]:
    import asyncssh

    from substrate.netconf import ensure_server

    ep = ensure_server(lab)[device]
    async with asyncssh.connect(ep.host, ep.port, username=ep.user, client_keys=[ep.key_file], known_hosts=None) as c:
        w, r, _ = await c.open_session(subsystem="netconf", encoding=None)
        buf = b""
        while EOM not in buf:
            buf += await asyncio.wait_for(r.read(65536), timeout_s)
        w.write(b'<hello xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><capabilities><capability>'
                b"urn:ietf:params:netconf:base:1.1</capability></capabilities></hello>" + EOM)
        d = Deframer()
        d.chunked = True
        out: list[bytes | None] = []
        for msg in messages:
            w.write(encode_chunked(msg))
            got: list[bytes] = []
            try:
                while not got:
                    data = await asyncio.wait_for(r.read(65536), timeout_s)
                    if not data:
                        break
                    got = d.feed(data)
            except TimeoutError:
                pass
            out.append(got[0] if got else None)
        return out


def raw(lab: Lab, messages: list[bytes], **kw) -> list[bytes | None]:  # noqa: ANN003
    return asyncio.run(_raw(lab, messages, **kw))


GET = b'<rpc xmlns="urn:ietf:params:xml:ns:netconf:base:1.0" message-id="9"><get-config><source><running/></source></get-config></rpc>'


# -- tests --------------------------------------------------------------------------------------


def test_hello_and_capabilities(lab: Lab) -> None:
    m = connect(lab)
    caps = set(m.server_capabilities)
    for c in ("urn:ietf:params:netconf:base:1.1", "urn:ietf:params:netconf:capability:candidate:1.0",
              "urn:ietf:params:netconf:capability:validate:1.1", "urn:ietf:params:netconf:capability:confirmed-commit:1.1",
              "urn:ietf:params:netconf:capability:rollback-on-error:1.0", "urn:ietf:params:netconf:capability:xpath:1.0"):
        assert c in caps, c
    assert any("module=anibench-kernel" in c for c in caps)
    assert any(c.startswith("urn:ietf:params:netconf:capability:with-defaults:1.0") for c in caps)
    assert int(m.session_id) > 0
    yang = m.get_schema("anibench-kernel").data
    assert "module anibench-kernel" in yang
    m.close_session()


def test_large_reply_spans_many_chunks(lab: Lab) -> None:
    msg = (b'<rpc xmlns="urn:ietf:params:xml:ns:netconf:base:1.0" message-id="1"><get-schema xmlns="urn:ietf:params:'
           b'xml:ns:yang:ietf-netconf-monitoring"><identifier>frr-isisd</identifier></get-schema></rpc>')
    (reply,) = raw(lab, [msg])
    assert reply is not None and b"module frr-isisd" in reply
    assert len(reply) > 3 * 16 * 1024  # the server writes 16 KiB chunks: this reply took four or more
    with open("/usr/share/yang/frr-isisd.yang", "rb") as f:
        assert f.read().strip()[-200:].replace(b"\n", b"") in reply.replace(b"\n", b"")


def test_end_of_message_marker_in_a_description_round_trips(lab: Lab) -> None:
    m = connect(lab)
    text = "to r2 ]]>]]> and <b>&amp; back"
    m.edit_config(desc_edit("eth1", text), target="candidate")
    m.commit()
    assert description(lab, "r1", "eth1") == text
    got = m.get_config("running", filter=("subtree", f'<lib xmlns="{IF}"><interface><name>eth1</name>'
                                                    "<description/></interface></lib>")).data_xml
    assert "to r2 ]]&gt;]]&gt; and &lt;b&gt;&amp;amp; back" in got
    m.edit_config(desc_edit("eth1", "to r2"), target="candidate")
    m.commit()
    m.close_session()


def test_second_session_gets_lock_denied_and_in_use_at_once(lab: Lab) -> None:
    from ncclient.operations.rpc import RPCError

    a, b = connect(lab), connect(lab)
    a.lock("running")
    try:
        with pytest.raises(RPCError) as e:
            b.lock("running")
        assert e.value.tag == "lock-denied" and str(a.session_id) in str(e.value.info)
        b.edit_config(desc_edit("eth1", "from b"), target="candidate")
        with pytest.raises(RPCError) as e:
            b.commit()
        assert e.value.tag == "in-use"
        assert description(lab, "r1", "eth1") == "to r2"
        b.discard_changes()
    finally:
        a.unlock("running")
    # the lock A1/A3-T and the held-lock fault take is the same lock
    with lab.config_lock(["r1"], holder="test holder"):
        with pytest.raises(RPCError) as e:
            b.lock("running")
        assert e.value.tag == "lock-denied" and "test holder" in e.value.message
    b.lock("running")
    b.unlock("running")
    a.close_session()
    b.close_session()


def test_confirmed_commit_expiry_restores_running(lab: Lab) -> None:
    m = connect(lab)
    before = description(lab, "r1", "eth1")
    m.edit_config(desc_edit("eth1", "tentative"), target="candidate")
    m.commit(confirmed=True, timeout="2")
    assert description(lab, "r1", "eth1") == "tentative"
    assert wait_for(lambda: description(lab, "r1", "eth1") == before)
    m.close_session()


def test_session_end_rolls_back_a_non_persistent_confirmed_commit(lab: Lab) -> None:
    m = connect(lab)
    before = description(lab, "r1", "eth1")
    m.edit_config(desc_edit("eth1", "until I go"), target="candidate")
    m.commit(confirmed=True, timeout="600")
    assert description(lab, "r1", "eth1") == "until I go"
    m.close_session()
    assert wait_for(lambda: description(lab, "r1", "eth1") == before)


def test_persist_then_follow_up_with_persist_id_then_expiry(lab: Lab) -> None:
    from ncclient.operations.rpc import RPCError

    before = description(lab, "r1", "eth1")
    a = connect(lab)
    a.edit_config(desc_edit("eth1", "first"), target="candidate")
    a.commit(confirmed=True, timeout="600", persist="tok-1")
    a.close_session()  # persistent: survives its session
    assert description(lab, "r1", "eth1") == "first"
    b = connect(lab)
    b.edit_config(desc_edit("eth1", "second"), target="candidate")
    with pytest.raises(RPCError) as e:  # a confirming commit must name the persist-id
        b.commit(confirmed=True, timeout="2")
    assert e.value.tag == "invalid-value"
    b.commit(confirmed=True, timeout="2", persist_id="tok-1")
    assert description(lab, "r1", "eth1") == "second"
    # expiry returns running to the state before the FIRST confirmed commit
    assert wait_for(lambda: description(lab, "r1", "eth1") == before)
    b.close_session()


def test_invalid_candidate_refused_by_validate_with_error_path(lab: Lab) -> None:
    from ncclient.operations.rpc import RPCError

    m = connect(lab)
    bad = (f'<config xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><kernel xmlns="{K}"><table><id>4242</id><route>'
           "<destination>fd99::/64</destination><metric>1024</metric><device>sr0</device><seg6local><action>End.DT6"
           "</action></seg6local></route></table></kernel></config>")
    with pytest.raises(RPCError) as e:  # test-then-set refuses it outright
        m.edit_config(bad, target="candidate")
    assert e.value.tag == "invalid-value" and "seg6local" in (e.value.path or "")
    m.edit_config(bad, target="candidate", test_option="set")
    with pytest.raises(RPCError) as e:
        m.validate("candidate")
    assert "seg6local" in (e.value.path or "") and "table" in e.value.message
    with pytest.raises(RPCError):
        m.commit()
    assert "4242" not in lab.exec("r1", ["ip", "-6", "route", "show", "table", "all"]).stdout
    m.discard_changes()
    m.close_session()


def test_commit_is_atomic_and_says_why(lab: Lab) -> None:
    from ncclient.operations.rpc import RPCError

    from substrate.devstate import capture

    m = connect(lab)
    before = capture(lab, "r1")
    # the description lands in FRR first; the route names a device the node does not have
    cfg = (f'<config xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><lib xmlns="{IF}"><interface><name>eth1</name>'
           f'<description>half</description></interface></lib><kernel xmlns="{K}"><table><id>4243</id><route>'
           "<destination>fd98::/64</destination><metric>1024</metric><device>nosuchdev0</device></route></table>"
           "</kernel></config>")
    m.edit_config(cfg, target="candidate")
    with pytest.raises(RPCError) as e:
        m.commit()
    assert e.value.tag == "operation-failed" and "restored" in e.value.message
    assert capture(lab, "r1").same_as(before), capture(lab, "r1").diff(before)
    m.discard_changes()
    m.close_session()


def test_get_config_shows_out_of_band_changes(lab: Lab) -> None:
    m = connect(lab)
    assert lab.exec("r1", ["ip", "-6", "route", "add", "fd97::/64", "table", "4244", "dev", "eth1"]).ok
    try:
        got = m.get_config("running", filter=("xpath", ({"k": K}, "/k:kernel/k:table[k:id='4244']"))).data_xml
        assert "fd97::/64" in got
        got = m.get_config("candidate", filter=("xpath", "/anibench-kernel:kernel/table[id='4244']")).data_xml
        assert "fd97::/64" in got  # an unedited candidate follows running
    finally:
        lab.exec("r1", ["ip", "-6", "route", "del", "fd97::/64", "table", "4244"])
    m.close_session()


def test_malformed_input_and_entities_are_refused(lab: Lab) -> None:
    bomb = (b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;'
            b'&lol;&lol;&lol;&lol;&lol;"><!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">'
            b'<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>'
            b'<rpc xmlns="urn:ietf:params:xml:ns:netconf:base:1.0" message-id="2"><get-config><source><running/>'
            b"</source><filter><x>&lol4;</x></filter></get-config></rpc>")
    xxe = (b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY e SYSTEM "file:///etc/shadow">]><rpc xmlns="urn:ietf:'
           b'params:xml:ns:netconf:base:1.0" message-id="3"><get-schema xmlns="urn:ietf:params:xml:ns:yang:ietf-'
           b'netconf-monitoring"><identifier>&e;</identifier></get-schema></rpc>')
    replies = raw(lab, [b"<rpc message-id='1'><get-config><source>", bomb, xxe, b"\xff\xfe not xml", GET,
                        b'<rpc xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><get/></rpc>',
                        b'<rpc xmlns="urn:ietf:params:xml:ns:netconf:base:1.0" message-id="4"><frobnicate/></rpc>'])
    assert all(r is not None for r in replies), replies
    for r in replies[:4]:
        assert b"malformed-message" in r, r
    assert b"root:" not in replies[2] and b"lol" not in replies[1]
    assert b"<data>" in replies[4] and b"rpc-error" not in replies[4]  # the session still works
    assert b"missing-attribute" in replies[5]
    assert b"operation-not-supported" in replies[6]
    # broken framing ends that session only; the server serves the next one
    bad = asyncio.run(_raw_bytes(lab, b"\n#99999999999\nxx"))
    assert bad is None
    assert b"<data>" in (raw(lab, [GET])[0] or b"")


async def _raw_bytes(lab: Lab, junk: bytes) -> bytes | None:
    import asyncssh

    from substrate.netconf import ensure_server

    ep = ensure_server(lab)["r1"]
    async with asyncssh.connect(ep.host, ep.port, username=ep.user, client_keys=[ep.key_file], known_hosts=None) as c:
        w, r, _ = await c.open_session(subsystem="netconf", encoding=None)
        buf = b""
        while EOM not in buf:
            buf += await asyncio.wait_for(r.read(65536), 30)
        w.write(b'<hello xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><capabilities><capability>'
                b"urn:ietf:params:netconf:base:1.1</capability></capabilities></hello>" + EOM + junk)
        data = await asyncio.wait_for(r.read(65536), 30)
        return data or None


async def _raw_base10(lab: Lab, messages: list[bytes], timeout_s: float = 30.0) -> list[bytes | None]:
    """A base:1.0-only peer (end-of-message framing for the whole session, RFC 6242 section 4.3)."""
    import asyncssh

    from substrate.netconf import ensure_server

    ep = ensure_server(lab)["r1"]
    async with asyncssh.connect(ep.host, ep.port, username=ep.user, client_keys=[ep.key_file], known_hosts=None) as c:
        w, r, _ = await c.open_session(subsystem="netconf", encoding=None)
        buf = b""
        while EOM not in buf:
            buf += await asyncio.wait_for(r.read(65536), timeout_s)
        w.write(b'<hello xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><capabilities><capability>'
                b"urn:ietf:params:netconf:base:1.0</capability></capabilities></hello>" + EOM)
        out: list[bytes | None] = []
        for msg in messages:
            w.write(msg + EOM)
            buf = b""
            try:
                while EOM not in buf:
                    data = await asyncio.wait_for(r.read(65536), timeout_s)
                    if not data:
                        break
                    buf += data
            except TimeoutError:
                pass
            out.append(buf.split(EOM)[0] if EOM in buf else None)
        return out


def test_a_base10_session_is_not_stalled_by_a_message_mentioning_hello(lab: Lab) -> None:
    """Only the session's first message decides the framing: a later message of a base:1.0 peer whose
    first bytes say "hello" (its message-id, a description) is answered, and so is the next one."""
    rpc = (b'<rpc xmlns="urn:ietf:params:xml:ns:netconf:base:1.0" message-id="%s"><get-config><source><running/>'
           b'</source><filter type="xpath" select="/anibench-kernel:kernel/anibench-kernel:srv6-encapsulation-source"/>'
           b"</get-config></rpc>")
    replies = asyncio.run(_raw_base10(lab, [rpc % b"hello", rpc % b"2", b"<hello/>", rpc % b"3"]))
    assert all(r is not None for r in replies), replies
    assert b'message-id="hello"' in replies[0] and b'message-id="2"' in replies[1] and b'message-id="3"' in replies[3]
    assert b"rpc-error" in replies[2]  # a second hello is an error, not a new framing choice


def test_kill_session_reaches_only_the_sessions_of_its_own_device(lab: Lab) -> None:
    """Every router is its own NETCONF server: kill-session on r1 naming a session of r2 is refused,
    and r2's session, its lock and its pending confirmed commit stay."""
    from ncclient.operations.rpc import RPCError

    on_r1, on_r2 = connect(lab, "r1"), connect(lab, "r2")
    cfg = (f'<config xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><kernel xmlns="{K}"><table><id>4251</id><route>'
           "<destination>fd31::/64</destination><metric>1024</metric><device>eth1</device></route></table></kernel>"
           "</config>")
    on_r2.edit_config(cfg, target="candidate")
    on_r2.commit(confirmed=True, timeout="300")
    on_r2.lock("running")
    try:
        with pytest.raises(RPCError) as e:
            on_r1.kill_session(on_r2.session_id)
        assert e.value.tag == "invalid-value" and "r1" in e.value.message
        assert "fd31::/64" in lab.exec("r2", ["ip", "-6", "route", "show", "table", "4251"]).stdout
        on_r2.commit()  # its session, and so its confirmed commit, is still there to confirm
        on_r2.unlock("running")
    finally:
        lab.exec("r2", ["ip", "-6", "route", "flush", "table", "4251"])
        on_r1.close_session()
        on_r2.close_session()


def test_candidate_edits_survive_a_confirmed_commit_rollback(lab: Lab) -> None:
    """Edits made to the candidate after a confirmed commit are not dropped when its timer rolls
    running back: the candidate still holds them and the next commit applies them (it answered <ok/>
    having applied nothing)."""
    m = connect(lab)
    table = "4253"

    def routes() -> str:
        return lab.exec("r1", ["ip", "-6", "route", "show", "table", table]).stdout

    def cfg(dest: str) -> str:
        return (f'<config xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><kernel xmlns="{K}"><table><id>{table}</id>'
                f"<route><destination>{dest}</destination><metric>1024</metric><device>eth1</device></route>"
                "</table></kernel></config>")

    try:
        m.edit_config(cfg("fd51::/64"), target="candidate")
        m.commit(confirmed=True, timeout="2")
        m.edit_config(cfg("fd52::/64"), target="candidate")
        assert wait_for(lambda: "fd51::/64" not in routes())  # the timer rolled running back
        assert "fd52::/64" in m.get_config("candidate", filter=("xpath", f"/anibench-kernel:kernel/table[id='{table}']")).data_xml
        m.commit()
        assert "fd52::/64" in routes() and "fd51::/64" not in routes()
    finally:
        lab.exec("r1", ["ip", "-6", "route", "flush", "table", table])
        m.close_session()


def test_a_follow_up_confirmed_commit_outlives_the_timer_it_replaced(lab: Lab) -> None:
    """A follow-up confirmed commit that holds the device while the previous confirm-timeout fires
    replaces that timer: its OK holds, the old timer's rollback does not run after it (it did: the
    device went back to its pre-commit state right after the follow-up's OK, and the confirming commit
    then said OK too). The follow-up is made long (many routes) so that the 1 s timer fires during it."""
    m = connect(lab)
    n = 300

    def cfg(routes: str) -> str:
        return (f'<config xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><kernel xmlns="{K}"><table><id>4252</id>'
                f"{routes}</table></kernel></config>")

    def route(dest: str) -> str:
        return f"<route><destination>{dest}</destination><metric>1024</metric><device>eth1</device></route>"

    def count() -> int:  # through the same device: served after any rollback queued before it
        xml = m.get_config("running", filter=("xpath", "/anibench-kernel:kernel/table[id='4252']")).data_xml
        return xml.count("<destination>")

    try:
        m.edit_config(cfg(route("fd41::/64")), target="candidate")
        m.commit(confirmed=True, timeout="1")
        m.edit_config(cfg("".join(route(f"fd42:{i:x}::/64") for i in range(n))), target="candidate")
        m.commit(confirmed=True, timeout="600")
        assert count() >= n  # the follow-up's OK holds (n + 1, or n if the old timer ran before it)
        m.cancel_commit()
        assert wait_for(lambda: count() == 0)
    finally:
        lab.exec("r1", ["ip", "-6", "route", "flush", "table", "4252"])
        m.close_session()


@pytest.mark.anyio
async def test_mcp_commit_never_turns_a_requested_safety_net_into_a_permanent_commit(lab: Lab, tmp_path) -> None:  # noqa: ANN001
    """A2 MCP commit with confirm_timeout or persist but without confirmed: ncclient drops both, so the
    call made a plain, permanent commit and answered "committed". It is refused, and nothing reaches
    the device; the same call with confirmed=true makes a confirmed commit that rolls back."""
    from servers.common import ServerConfig
    from servers.registry import build_server
    from tests.servers_support import connect as mcp_connect
    from tests.servers_support import text

    table = "4254"

    def routes() -> str:
        return lab.exec("r1", ["ip", "-6", "route", "show", "table", table]).stdout

    edit = (f'<kernel xmlns="{K}"><table><id>{table}</id><route><destination>fd61::/64</destination>'
            "<metric>1024</metric><device>eth1</device></route></table></kernel>")
    srv = build_server("A2", ServerConfig(lab=lab.name, trajectory=tmp_path / "t.jsonl", options={}))
    try:
        async with mcp_connect(srv) as c:
            r = await c.call_tool("edit_config", {"device": "r1", "config": edit})
            assert not r.is_error, text(r)
            for args in ({"confirm_timeout": 2}, {"persist": "tok"}, {"confirmed": True, "persist": "a", "persist_id": "b"}):
                r = await c.call_tool("commit", {"device": "r1", **args})
                assert r.is_error and "nothing was committed" in text(r), (args, text(r))
                assert "fd61::/64" not in routes(), args
            r = await c.call_tool("commit", {"device": "r1", "confirmed": True, "confirm_timeout": 2})
            assert not r.is_error, text(r)
            assert "fd61::/64" in routes()
            assert wait_for(lambda: "fd61::/64" not in routes())
    finally:
        srv.close()
        lab.exec("r1", ["ip", "-6", "route", "flush", "table", table])


@pytest.mark.parametrize("who", ["root", "netconf2", "NETCONF", ""])
def test_the_client_key_under_another_username_is_refused(lab: Lab, who: str) -> None:
    import asyncssh

    from substrate.netconf import ensure_server

    ep = ensure_server(lab)["r1"]

    async def attempt(user: str, key: str | asyncssh.SSHKey) -> None:
        async with asyncssh.connect(ep.host, ep.port, username=user, client_keys=[key], known_hosts=None,
                                    agent_path=None, password=None, login_timeout=30) as c:
            await c.run("true")  # not reached when authentication fails

    with pytest.raises(asyncssh.PermissionDenied):
        asyncio.run(attempt(who, ep.key_file))
    # another key under the right username: refused too
    with pytest.raises(asyncssh.PermissionDenied):
        asyncio.run(attempt(ep.user, asyncssh.generate_private_key("ssh-ed25519")))
    # and the right pair is let in (the refusals above are about the username and the key)
    assert raw(lab, [GET])[0] is not None


def test_endpoints_are_host_loopback_only(lab: Lab) -> None:
    from substrate.netconf import ensure_server

    eps = ensure_server(lab)
    assert set(eps) == set(lab.routers()) and all(ep.host == "127.0.0.1" for ep in eps.values())
    port = eps["r2"].port
    # inside a node 127.0.0.1 is the node's own loopback: no NETCONF there
    r = lab.exec("r1", ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], timeout_s=5)
    assert not r.ok


def test_kill_9_mid_commit_then_reset_leaves_no_half_applied_device(lab: Lab) -> None:
    from substrate import netconf
    from substrate.devstate import capture
    from substrate.scenario.deploy import load_baseline, reset

    m = connect(lab, "r3")
    routes = "".join(f"<route><destination>fd96:{i:x}::/64</destination><metric>1024</metric><type>unreachable</type>"
                     "</route>" for i in range(200))
    cfg = (f'<config xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><lib xmlns="{IF}"><interface><name>eth1</name>'
           f'<description>mid-commit</description></interface></lib><kernel xmlns="{K}"><table><id>4245</id>{routes}'
           "</table></kernel></config>")
    m.edit_config(cfg, target="candidate")
    errors: list[BaseException] = []

    def go() -> None:
        try:
            m.commit()
        except BaseException as e:  # noqa: BLE001 - the session dies with the server
            errors.append(e)

    t = threading.Thread(target=go)
    t.start()
    assert wait_for(lambda: description(lab, "r3", "eth1") == "mid-commit", 60)  # FRR lines went first
    pid = netconf.server_pid(lab)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    t.join(90)
    reset(lab)
    base = load_baseline(lab)["r3"]
    assert capture(lab, "r3").same_as(base), capture(lab, "r3").diff(base)
    # the server comes back on the next use
    m2 = connect(lab, "r3")
    assert "4245" not in m2.get_config("running").data_xml
    m2.close_session()


@pytest.mark.parametrize("edit", [
    f'<kernel xmlns="{K}"><table><id>abc</id></table></kernel>',  # a value of the wrong type
    f'<kernel xmlns="{K}"><nosuch/></kernel>',  # no such node
    '<x xmlns="urn:nowhere"/>',  # no such module
    f'<kernel xmlns="{K}"><table><route><destination>fd00::/64</destination></route></table></kernel>',  # no key
    f'<kernel xmlns="{K}" xmlns:nc="urn:ietf:params:xml:ns:netconf:base:1.0"><rule nc:operation="frob"/></kernel>',
])
def test_a_malformed_edit_is_refused_without_reading_the_device(lab: Lab, monkeypatch: pytest.MonkeyPatch,
                                                                 edit: str) -> None:
    """The edit is checked against the models before the device is read (a device read costs a
    capture in the node); a well-formed edit reads it once. The server runs in-process here, so
    that the reads can be counted (they still go to the real device)."""
    from substrate.netconf import device
    from substrate.netconf.server import NetconfServer

    reads: list[str] = []
    real = device.read

    def counted(lab_: Lab, node: str, **kw):  # noqa: ANN003, ANN202
        reads.append(node)
        return real(lab_, node, **kw)

    monkeypatch.setattr(device, "read", counted)

    def rpc(body: str) -> bytes:
        srv = NetconfServer(lab)
        s = srv.open_session("r1", "test")
        msg = (f'<rpc xmlns="urn:ietf:params:xml:ns:netconf:base:1.0" message-id="1"><edit-config><target><candidate/>'
               f"</target><config>{body}</config></edit-config></rpc>").encode()
        return asyncio.run(srv.handle(s, msg))

    out = rpc(edit)
    assert b"<rpc-error>" in out and reads == [], (out, reads)
    out = rpc(f'<kernel xmlns="{K}"><table><id>4246</id></table></kernel>')
    assert b"<ok/>" in out and reads == ["r1"], (out, reads)


def test_reset_ends_pending_confirmed_commits(lab: Lab) -> None:
    """A persistent confirmed commit outlives its session; a lab reset (between runs) must not
    leave its timer to roll a device back later, in another run."""
    from ncclient.operations.rpc import RPCError

    from substrate.scenario.deploy import reset

    before = description(lab, "r2", "eth1")
    m = connect(lab, "r2")
    m.edit_config(desc_edit("eth1", "pending"), target="candidate")
    m.commit(confirmed=True, timeout="600", persist="run-1")
    m.close_session()
    reset(lab)
    assert description(lab, "r2", "eth1") == before
    m = connect(lab, "r2")
    with pytest.raises(RPCError) as e:
        m.cancel_commit(persist_id="run-1")
    assert "no confirmed commit is pending" in e.value.message
    m.close_session()
