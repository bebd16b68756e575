"""The NETCONF server of a lab: one host-side process serving every router over SSH (RFC 6242).

Run as ``python -m substrate.netconf.server LAB`` (started by :func:`substrate.netconf.ensure_server`).
Each router gets its own SSH endpoint on 127.0.0.1 (a port picked by the kernel, recorded in
``<lab dir>/netconf/server.json``); nodes live in their own network namespaces, so nothing
inside the lab can reach these endpoints. Authentication: the user ``netconf`` with the lab's
client key (``<lab dir>/netconf/client_key``).

Protocol (RFC 6241): base:1.0 and base:1.1 (chunked framing after the hello when both peers
have it); ``:candidate``, ``:validate:1.1``, ``:confirmed-commit:1.1``, ``:rollback-on-error``,
``:xpath``, ``:with-defaults`` (basic mode explicit; report-all and trim), ietf-netconf-monitoring
``<get-schema>`` (RFC 6022). The running datastore is the device itself (read on every request);
the candidate is shared by the device's sessions and follows running until someone edits it.
The running lock is the device's configuration lock of :mod:`substrate.locks`, the same that A1
and A3-T take and that the held-lock fault holds: when it is held elsewhere, ``<lock>`` fails at
once with ``lock-denied`` and ``<commit>`` with ``in-use``.

Bad input never kills the server: a malformed message gets an ``<rpc-error>`` (or, for broken
framing, the session is closed as RFC 6242 requires); every operation error is an
``<rpc-error>`` per RFC 6241 Appendix A.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lxml import etree

from substrate.netconf import data, device, schema
from substrate.netconf.data import NC_NS, Flat, RpcError
from substrate.netconf.framing import Deframer, FramingError, encode_chunked, encode_eom
from substrate.netconf.keys import USER, server_dir

log = logging.getLogger("anibench.netconf")

BASE10 = "urn:ietf:params:netconf:base:1.0"
BASE11 = "urn:ietf:params:netconf:base:1.1"
MON_NS = "urn:ietf:params:xml:ns:yang:ietf-netconf-monitoring"
WD_NS = "urn:ietf:params:xml:ns:yang:ietf-netconf-with-defaults"
CAPABILITIES = [
    BASE10, BASE11,
    "urn:ietf:params:netconf:capability:candidate:1.0",
    "urn:ietf:params:netconf:capability:validate:1.1",
    "urn:ietf:params:netconf:capability:confirmed-commit:1.1",
    "urn:ietf:params:netconf:capability:rollback-on-error:1.0",
    "urn:ietf:params:netconf:capability:xpath:1.0",
    "urn:ietf:params:netconf:capability:with-defaults:1.0?basic-mode=explicit&also-supported=report-all,trim",
    f"{MON_NS}?module=ietf-netconf-monitoring&revision=2010-10-04",
]
#: RFC 6241 section 8.4.1: default confirm-timeout.
DEFAULT_CONFIRM_TIMEOUT = 600


def _q(tag: str, ns: str = NC_NS) -> str:
    return f"{{{ns}}}{tag}"


@dataclass
class Pending:
    """A confirmed commit waiting for its confirming commit (RFC 6241 section 8.4)."""

    rollback: Any  # DeviceState before the first confirmed commit
    session: int
    persist: str | None
    timer: asyncio.TimerHandle | None = None


@dataclass
class Store:
    """Per-device datastores and locks."""

    node: str
    candidate: Flat | None = None
    base: Flat | None = None
    dirty_by: int | None = None
    candidate_lock: int | None = None
    running_lock: int | None = None
    running_cm: Any = None
    pending: Pending | None = None
    mutex: asyncio.Lock = field(default_factory=asyncio.Lock)


class Session:
    """One NETCONF session on one device."""

    def __init__(self, server: NetconfServer, node: str, sid: int, peer: str):
        self.server, self.node, self.id, self.peer = server, node, sid, peer
        self.chan: Any = None
        self.deframer = Deframer()
        self.got_hello = False
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.worker: asyncio.Task | None = None
        self.closed = False

    def send(self, xml: bytes) -> None:
        if self.closed or self.chan is None:
            return
        self.chan.write(encode_chunked(xml) if self.deframer.chunked else encode_eom(xml))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.chan.close()
            self.queue.put_nowait(None)


class NetconfServer:
    """Every device's endpoint, sessions and datastores of one lab."""

    def __init__(self, lab: Any):
        self.lab = lab
        self.stores = {n: Store(n) for n in lab.routers()}
        self.sessions: dict[int, Session] = {}
        self.next_id = 1
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- sessions --------------------------------------------------------------------------------

    def open_session(self, node: str, peer: str) -> Session:
        s = Session(self, node, self.next_id, peer)
        self.next_id += 1
        self.sessions[s.id] = s
        return s

    async def end_session(self, s: Session) -> None:
        """Release what a session held: its locks, its uncommitted candidate changes, and a
        non-persistent confirmed commit it issued (rolled back: RFC 6241 section 8.4.1)."""
        s.close()
        self.sessions.pop(s.id, None)
        st = self.stores[s.node]
        async with st.mutex:
            if st.pending and st.pending.session == s.id and st.pending.persist is None:
                await self._rollback(st, "its session ended before the confirming commit")
            if st.candidate_lock == s.id:
                st.candidate_lock = None
            if st.dirty_by == s.id:
                st.candidate = st.base = st.dirty_by = None
            if st.running_lock == s.id:
                self._release_running(st)

    def _release_running(self, st: Store) -> None:
        if st.running_cm is not None:
            with contextlib.suppress(Exception):
                st.running_cm.__exit__(None, None, None)
        st.running_cm = None
        st.running_lock = None

    def _take_running(self, st: Store, sid: int) -> Any:
        """The device's configuration lock (non-blocking), as a context manager already entered.

        Raises:
            RpcError: lock-denied, naming the holder (and its session-id when it is a session here).
        """
        from substrate.locks import ConfigLockHeld

        if st.running_lock is not None and st.running_lock != sid:
            raise RpcError("lock-denied", f"the configuration of {st.node} is locked by NETCONF session "
                           f"{st.running_lock}", type="protocol", info={"session-id": str(st.running_lock)})
        cm = self.lab.config_lock([st.node], holder=f"NETCONF session {sid} on {st.node}", timeout_s=0)
        try:
            cm.__enter__()
        except ConfigLockHeld as e:
            raise RpcError("lock-denied", f"the configuration of {st.node} is locked by {e.holder or 'another session'}"
                           " (outside NETCONF)", type="protocol", info={"session-id": "0"}) from None
        return cm

    # -- datastores ------------------------------------------------------------------------------

    async def running(self, st: Store) -> Flat:
        flat, _ = await asyncio.to_thread(device.running, self.lab, st.node)
        return flat

    async def candidate(self, st: Store) -> Flat:
        """The candidate: running itself while nobody has edited it."""
        if st.candidate is None:
            return await self.running(st)
        return st.candidate

    async def _rollback(self, st: Store, why: str) -> None:
        p = st.pending
        if p is None:
            return
        if p.timer:
            p.timer.cancel()
        st.pending = None
        residual = await asyncio.to_thread(device.restore_state, self.lab, p.rollback)
        # the candidate's uncommitted edits stay: they are a change against the running data they
        # were made on (st.base), which a commit applies to whatever running is then; dropping
        # them made the next commit answer <ok/> having applied nothing
        log.warning("%s: confirmed commit rolled back (%s)%s", st.node, why,
                    f"; residual: {residual[:3]}" if residual else "")

    def _arm(self, st: Store, timeout: int) -> None:
        """(Re)start the confirm timer of the pending confirmed commit: when it fires, running goes
        back to the state before the first confirmed commit -- unless, by the time the rollback
        gets the device's mutex, the commit it was armed for was confirmed, cancelled or given a
        new timer by a follow-up confirmed commit (RFC 6241 section 8.4.5.1) that held the mutex
        as the old timer fired."""
        p = st.pending
        assert p is not None and self.loop is not None
        if p.timer:
            p.timer.cancel()

        def expire() -> None:
            async def go() -> None:
                async with st.mutex:
                    if st.pending is p and p.timer is handle:
                        await self._rollback(st, f"confirm-timeout of {timeout} s expired")
            asyncio.ensure_future(go())

        handle = self.loop.call_later(timeout, expire)
        p.timer = handle

    # -- RPC dispatch ----------------------------------------------------------------------------

    async def handle(self, s: Session, raw: bytes) -> bytes | None:
        """One message from a session: its reply (None when no reply is due)."""
        try:
            root = data.parse_xml(raw)
        except RpcError as e:
            return reply_error({}, e)
        if etree.QName(root).localname == "hello":
            return reply_error({}, RpcError("operation-failed", "a second <hello> is not allowed", type="rpc"))
        if root.tag != _q("rpc"):
            return reply_error({}, RpcError("unknown-element", f"expected <rpc>, got <{etree.QName(root).localname}>",
                                            type="rpc", info={"bad-element": etree.QName(root).localname}))
        attrs = dict(root.attrib)
        if "message-id" not in attrs:
            return reply_error({}, RpcError("missing-attribute", "<rpc> has no message-id", type="rpc",
                                            info={"bad-attribute": "message-id", "bad-element": "rpc"}))
        ops = [c for c in root if isinstance(c.tag, str)]
        if len(ops) != 1:
            return reply_error(attrs, RpcError("malformed-message" if not ops else "operation-not-supported",
                                               "an <rpc> carries exactly one operation", type="rpc"))
        op = ops[0]
        name = etree.QName(op).localname
        fn = getattr(self, "op_" + name.replace("-", "_"), None)
        ns = etree.QName(op).namespace
        if fn is None or (ns not in (NC_NS, MON_NS)) or (name == "get-schema") != (ns == MON_NS):
            return reply_error(attrs, RpcError("operation-not-supported", f"operation <{name}> is not supported",
                                               type="protocol", info={"bad-element": name}))
        st = self.stores[s.node]
        try:
            async with st.mutex:
                body = await fn(s, st, op)
        except RpcError as e:
            return reply_error(attrs, e)
        except Exception as e:  # noqa: BLE001 - never die on a request
            log.exception("%s: %s failed", s.node, name)
            return reply_error(attrs, RpcError("operation-failed", f"internal error in {name}: {type(e).__name__}: {e}"))
        if name in ("close-session",):
            s.server.loop.call_soon(lambda: asyncio.ensure_future(self.end_session(s)))  # type: ignore[union-attr]
        return reply(attrs, body)

    # -- operations -------------------------------------------------------------------------------

    @staticmethod
    def _datastore(op: etree._Element, which: str, allowed: tuple[str, ...]) -> str:
        el = op.find(_q(which))
        if el is None:
            raise RpcError("missing-element", f"<{which}> is required", type="protocol", info={"bad-element": which})
        kids = [c for c in el if isinstance(c.tag, str)]
        if len(kids) != 1:
            raise RpcError("bad-element", f"<{which}> names exactly one datastore", type="protocol",
                           info={"bad-element": which})
        ds = etree.QName(kids[0]).localname
        if ds not in allowed:
            raise RpcError("operation-not-supported" if ds in ("startup", "url", "running", "candidate")
                           else "invalid-value", f"<{which}> {ds} is not supported here; use {' or '.join(allowed)}",
                           type="protocol", info={"bad-element": ds})
        return ds

    async def _filtered(self, flat: Flat, op: etree._Element, extra: str = "") -> etree._Element:
        wd = op.find(_q("with-defaults", WD_NS))
        mode = (wd.text or "").strip() if wd is not None else "explicit"
        if mode not in ("explicit", "report-all", "trim", "report-all-tagged"):
            raise RpcError("invalid-value", f"with-defaults {mode!r}: use explicit, report-all or trim",
                           info={"bad-element": "with-defaults"})
        if mode == "report-all-tagged":
            raise RpcError("operation-not-supported", "with-defaults report-all-tagged is not supported")
        flt = op.find(_q("filter"))
        ftype = flt.get("type", "subtree") if flt is not None else None
        if ftype == "xpath":
            sel = flt.get("select")
            if not sel:
                raise RpcError("missing-attribute", "an xpath filter needs select", type="protocol",
                               info={"bad-attribute": "select", "bad-element": "filter"})
            flat = await asyncio.to_thread(data.xpath_select, flat, sel, dict(flt.nsmap))
        elif ftype not in (None, "subtree"):
            raise RpcError("bad-attribute", f"filter type {ftype!r}: use subtree or xpath", type="protocol",
                           info={"bad-attribute": "type", "bad-element": "filter"})
        xml = await asyncio.to_thread(lambda: schema.print_defaults(data.to_xml(flat), mode))
        out = data.parse_xml(f'<data xmlns="{NC_NS}">{xml}{extra}</data>')
        return data.subtree_filter(out, flt) if ftype == "subtree" else out

    async def op_get_config(self, s: Session, st: Store, op: etree._Element) -> etree._Element:
        ds = self._datastore(op, "source", ("running", "candidate"))
        flat = await (self.running(st) if ds == "running" else self.candidate(st))
        return await self._filtered(flat, op)

    async def op_get(self, s: Session, st: Store, op: etree._Element) -> etree._Element:
        flat = await self.running(st)
        state = await asyncio.to_thread(device.operational, self.lab, st.node)
        try:
            merged = {**flat, **data.to_flat(state, state=True)} if state else flat
        except schema.SchemaError:
            merged = flat
        return await self._filtered(merged, op)

    async def op_edit_config(self, s: Session, st: Store, op: etree._Element) -> None:
        self._datastore(op, "target", ("candidate",))
        opt = {k: (op.findtext(_q(k)) or "").strip() or None for k in ("default-operation", "test-option", "error-option")}
        dop = opt["default-operation"] or "merge"
        test = opt["test-option"] or "test-then-set"
        eopt = opt["error-option"] or "stop-on-error"
        for k, v, allowed in (("default-operation", dop, ("merge", "replace", "none")),
                              ("test-option", test, ("test-then-set", "set", "test-only")),
                              ("error-option", eopt, ("stop-on-error", "continue-on-error", "rollback-on-error"))):
            if v not in allowed:
                raise RpcError("invalid-value", f"{k} {v!r}: use {', '.join(allowed)}", type="protocol",
                               info={"bad-element": k})
        cfg = op.find(_q("config"))
        if cfg is None:
            if op.find(_q("url")) is not None:
                raise RpcError("operation-not-supported", "<url> is not supported (no :url capability)")
            raise RpcError("missing-element", "<config> is required", type="protocol", info={"bad-element": "config"})
        if st.candidate_lock not in (None, s.id):
            raise RpcError("in-use", f"the candidate of {st.node} is locked by session {st.candidate_lock}",
                           info={"session-id": str(st.candidate_lock)})
        # the edit against the models alone first: a malformed edit is refused without reading the device
        pre = await asyncio.to_thread(data.apply_edit, {}, cfg, default_operation=dop, error_option="continue-on-error",
                                      schema_only=True)
        tops = sum(isinstance(c.tag, str) for c in cfg)
        if pre.errors and (eopt != "continue-on-error" or len(pre.errors) == tops):
            raise pre.errors[0]
        base = st.base if st.candidate is not None else await self.running(st)
        cand = dict(st.candidate if st.candidate is not None else base)
        work = dict(cand)
        if dop == "replace":
            work = {}
        rep = await asyncio.to_thread(data.apply_edit, work, cfg, default_operation=dop, error_option=eopt,
                                      check_values=bool(pre.errors))
        if test in ("test-then-set", "test-only"):
            try:
                await asyncio.to_thread(data.validate, work)
            except schema.SchemaError as e:
                raise data.from_schema_error(e) from None
        if test != "test-only" and (rep.changed or dop == "replace"):
            st.candidate, st.base, st.dirty_by = work, base, s.id
        if rep.errors:
            raise rep.errors[0]

    async def op_copy_config(self, s: Session, st: Store, op: etree._Element) -> None:
        self._datastore(op, "target", ("candidate",))
        src = op.find(_q("source"))
        if src is not None and src.find(_q("config")) is not None:
            if st.candidate_lock not in (None, s.id):
                raise RpcError("in-use", f"the candidate of {st.node} is locked by session {st.candidate_lock}")
            work: Flat = {}
            await asyncio.to_thread(data.apply_edit, work, src.find(_q("config")))
            base = st.base if st.candidate is not None else await self.running(st)
            st.candidate, st.base, st.dirty_by = work, base, s.id
            return
        self._datastore(op, "source", ("running",))
        if st.candidate_lock not in (None, s.id):
            raise RpcError("in-use", f"the candidate of {st.node} is locked by session {st.candidate_lock}")
        st.candidate = st.base = st.dirty_by = None

    async def op_delete_config(self, s: Session, st: Store, op: etree._Element) -> None:
        raise RpcError("operation-not-supported", "delete-config: this device has no startup datastore (and running "
                       "cannot be deleted)", type="protocol")

    async def op_discard_changes(self, s: Session, st: Store, op: etree._Element) -> None:
        if st.candidate_lock not in (None, s.id):
            raise RpcError("in-use", f"the candidate of {st.node} is locked by session {st.candidate_lock}")
        st.candidate = st.base = st.dirty_by = None

    async def op_lock(self, s: Session, st: Store, op: etree._Element) -> None:
        ds = self._datastore(op, "target", ("running", "candidate"))
        if ds == "candidate":
            if st.candidate_lock is not None:
                raise RpcError("lock-denied", f"the candidate of {st.node} is locked by session {st.candidate_lock}",
                               type="protocol", info={"session-id": str(st.candidate_lock)})
            if st.candidate is not None and st.dirty_by not in (None, s.id):
                raise RpcError("lock-denied", f"the candidate of {st.node} holds uncommitted changes of session "
                               f"{st.dirty_by}", type="protocol", info={"session-id": str(st.dirty_by)})
            st.candidate_lock = s.id
            return
        if st.running_lock == s.id:
            raise RpcError("lock-denied", f"this session already holds the lock of {st.node}", type="protocol",
                           info={"session-id": str(s.id)})
        st.running_cm = await asyncio.to_thread(self._take_running, st, s.id)
        st.running_lock = s.id

    async def op_unlock(self, s: Session, st: Store, op: etree._Element) -> None:
        ds = self._datastore(op, "target", ("running", "candidate"))
        held = st.candidate_lock if ds == "candidate" else st.running_lock
        if held != s.id:
            raise RpcError("operation-failed", f"this session does not hold the {ds} lock of {st.node}"
                           + (f" (session {held} does)" if held else ""), type="protocol")
        if ds == "candidate":
            st.candidate_lock = None
        else:
            self._release_running(st)

    async def op_validate(self, s: Session, st: Store, op: etree._Element) -> None:
        src = op.find(_q("source"))
        if src is not None and src.find(_q("config")) is not None:
            work: Flat = {}
            await asyncio.to_thread(data.apply_edit, work, src.find(_q("config")))
        else:
            ds = self._datastore(op, "source", ("candidate", "running"))
            work = await (self.candidate(st) if ds == "candidate" else self.running(st))
        try:
            await asyncio.to_thread(data.validate, work)
        except schema.SchemaError as e:
            raise data.from_schema_error(e) from None
        if st.candidate is not None and st.base is not None:
            # the change must also be one the device can make
            await asyncio.to_thread(device.frr_lines, st.base, work)

    async def op_commit(self, s: Session, st: Store, op: etree._Element) -> None:
        confirmed = op.find(_q("confirmed")) is not None
        tmo_text = op.findtext(_q("confirm-timeout"))
        persist = op.findtext(_q("persist"))
        persist_id = op.findtext(_q("persist-id"))
        try:
            timeout = int(tmo_text) if tmo_text is not None else DEFAULT_CONFIRM_TIMEOUT
            if not 1 <= timeout <= 4294967295:
                raise ValueError
        except ValueError:
            raise RpcError("invalid-value", f"confirm-timeout {tmo_text!r}: seconds, 1..4294967295",
                           info={"bad-element": "confirm-timeout"}) from None
        if (tmo_text is not None or persist is not None) and not confirmed:
            raise RpcError("missing-element", "confirm-timeout and persist go with <confirmed/>", type="protocol",
                           info={"bad-element": "confirmed"})
        p = st.pending
        if p is not None:
            if p.persist is not None:
                if persist_id != p.persist:
                    raise RpcError("invalid-value", "a confirmed commit with persist is pending: give its persist-id"
                                   if persist_id is None else "persist-id does not match the pending confirmed commit",
                                   info={"bad-element": "persist-id"})
            elif p.session != s.id:
                raise RpcError("in-use", f"a confirmed commit of session {p.session} is pending on {st.node}; only "
                               "that session can confirm it", info={"session-id": str(p.session)})
        elif persist_id is not None:
            raise RpcError("invalid-value", "persist-id given but no confirmed commit with persist is pending",
                           info={"bad-element": "persist-id"})
        if st.candidate_lock not in (None, s.id):
            raise RpcError("in-use", f"the candidate of {st.node} is locked by session {st.candidate_lock}",
                           info={"session-id": str(st.candidate_lock)})
        own = st.running_lock == s.id
        cm = None
        if not own:
            try:
                cm = await asyncio.to_thread(self._take_running, st, s.id)
            except RpcError as e:
                raise RpcError("in-use", e.message, info=e.info) from None
        try:
            if confirmed and p is None:
                from substrate.devstate import capture

                snap = await asyncio.to_thread(capture, self.lab, st.node)
                st.pending = Pending(rollback=snap, session=s.id, persist=persist)
            if st.candidate is not None and st.base is not None:
                try:
                    await asyncio.to_thread(device.commit, self.lab, st.node, st.base, st.candidate)
                except RpcError:
                    if confirmed and p is None:
                        st.pending = None
                    raise
            st.candidate = st.base = st.dirty_by = None
            if confirmed:
                assert st.pending is not None
                st.pending.persist = persist if persist is not None else (st.pending.persist if p else None)
                if persist is None and p is not None and p.persist is not None:
                    st.pending.session = s.id
                self._arm(st, timeout)
            elif st.pending is not None:
                if st.pending.timer:
                    st.pending.timer.cancel()
                st.pending = None
        finally:
            if cm is not None:
                with contextlib.suppress(Exception):
                    cm.__exit__(None, None, None)

    async def op_cancel_commit(self, s: Session, st: Store, op: etree._Element) -> None:
        p = st.pending
        persist_id = op.findtext(_q("persist-id"))
        if p is None:
            raise RpcError("operation-failed", "no confirmed commit is pending", info={"bad-element": "cancel-commit"})
        if p.persist is not None and persist_id != p.persist:
            raise RpcError("invalid-value", "give the persist-id of the pending confirmed commit",
                           info={"bad-element": "persist-id"})
        if p.persist is None and p.session != s.id:
            raise RpcError("in-use", f"the pending confirmed commit belongs to session {p.session}",
                           info={"session-id": str(p.session)})
        await self._rollback(st, "cancel-commit")

    async def op_close_session(self, s: Session, st: Store, op: etree._Element) -> None:
        return None

    async def op_kill_session(self, s: Session, st: Store, op: etree._Element) -> None:
        text = (op.findtext(_q("session-id")) or "").strip()
        if not text.isdigit():
            raise RpcError("missing-element" if not text else "invalid-value", "kill-session needs a session-id",
                           type="protocol", info={"bad-element": "session-id"})
        sid = int(text)
        if sid == s.id:
            raise RpcError("invalid-value", "a session cannot kill itself (use close-session)", type="protocol")
        other = self.sessions.get(sid)
        if other is None or other.node != s.node:
            # session-ids are unique across the lab's endpoints, but each router is its own NETCONF
            # server: a session on another router is not one this device can kill (RFC 6241 7.9)
            raise RpcError("invalid-value", f"no session {sid} on {s.node}", type="protocol",
                           info={"bad-element": "session-id"})
        st.mutex.release()  # end_session takes the device's mutex
        try:
            await self.end_session(other)
        finally:
            await st.mutex.acquire()

    async def op_get_schema(self, s: Session, st: Store, op: etree._Element) -> etree._Element:
        ident = (op.findtext(_q("identifier", MON_NS)) or "").strip()
        version = (op.findtext(_q("version", MON_NS)) or "").strip() or None
        fmt = (op.findtext(_q("format", MON_NS)) or "yang").strip()
        if not ident:
            raise RpcError("missing-element", "get-schema needs an identifier", type="protocol",
                           info={"bad-element": "identifier"})
        if fmt.split(":")[-1] != "yang":
            raise RpcError("invalid-value", f"format {fmt!r}: only yang is available", info={"bad-element": "format"})
        try:
            text = schema.module_text(ident, version)
        except schema.SchemaError as e:
            raise RpcError("invalid-value", str(e), info={"bad-element": "identifier"}) from None
        el = etree.Element(_q("data", MON_NS), nsmap={None: MON_NS})
        el.text = text
        return el


# -- replies ------------------------------------------------------------------------------------


def reply(attrs: dict[str, str], body: etree._Element | None) -> bytes:
    root = etree.Element(_q("rpc-reply"), nsmap={None: NC_NS})
    for k, v in attrs.items():
        root.set(k, v)
    if body is None:
        etree.SubElement(root, _q("ok"))
    else:
        if body.tag != _q("data") and etree.QName(body).localname == "data" and etree.QName(body).namespace == MON_NS:
            root.append(body)
        else:
            d = etree.SubElement(root, _q("data"))
            d.extend(list(body)) if body.tag == _q("data") else d.append(body)
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8")


def reply_error(attrs: dict[str, str], e: RpcError) -> bytes:
    """An ``<rpc-reply>`` with one ``<rpc-error>`` (RFC 6241 section 4.3)."""
    root = etree.Element(_q("rpc-reply"), nsmap={None: NC_NS})
    for k, v in attrs.items():
        root.set(k, v)
    err = etree.SubElement(root, _q("rpc-error"))
    etree.SubElement(err, _q("error-type")).text = e.type
    etree.SubElement(err, _q("error-tag")).text = e.tag
    etree.SubElement(err, _q("error-severity")).text = e.severity
    if e.path:
        etree.SubElement(err, _q("error-path")).text = e.path
    msg = etree.SubElement(err, _q("error-message"))
    msg.set("{http://www.w3.org/XML/1998/namespace}lang", "en")
    msg.text = e.message[:4000]
    if e.info:
        info = etree.SubElement(err, _q("error-info"))
        for k, v in e.info.items():
            etree.SubElement(info, _q(k)).text = v
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8")


def hello(sid: int) -> bytes:
    root = etree.Element(_q("hello"), nsmap={None: NC_NS})
    caps = etree.SubElement(root, _q("capabilities"))
    for c in CAPABILITIES + [f"{m.namespace}?module={m.name}&revision={m.revision}" for m in schema.modules()]:
        etree.SubElement(caps, _q("capability")).text = c
    etree.SubElement(root, _q("session-id")).text = str(sid)
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8")


# -- SSH --------------------------------------------------------------------------------------------


def _ssh_classes(server: NetconfServer, node: str, client_key: Any):  # noqa: ANN202
    import asyncssh

    class SSH(asyncssh.SSHServer):
        def begin_auth(self, username: str) -> bool:
            return True

        def password_auth_supported(self) -> bool:
            return False

        def public_key_auth_supported(self) -> bool:
            return True

        def validate_public_key(self, username: str, key: Any) -> bool:
            # asyncssh's documented hook for public-key authentication (SSHServer.validate_public_key;
            # asyncssh then checks the client holds the private key): only the lab's client key, only
            # as user `netconf` (tests/test_a2_netconf.py: another username is refused)
            return username == USER and key.public_data == client_key.public_data

        def session_requested(self) -> Any:
            return NetconfSSHSession(server, node)

    class NetconfSSHSession(asyncssh.SSHServerSession):
        def __init__(self, srv: NetconfServer, nd: str):
            self.srv, self.node = srv, nd
            self.s: Session | None = None

        def connection_made(self, chan: Any) -> None:
            self.chan = chan

        def subsystem_requested(self, subsystem: str) -> bool:
            if subsystem != "netconf":
                return False
            peer = str(self.chan.get_extra_info("peername"))
            self.s = self.srv.open_session(self.node, peer)
            self.s.chan = self.chan
            self.s.worker = asyncio.ensure_future(_serve(self.srv, self.s))
            return True

        def shell_requested(self) -> bool:
            return False

        def exec_requested(self, command: str) -> bool:
            return False

        def data_received(self, data_: bytes, datatype: Any) -> None:
            s = self.s
            if s is None or s.closed:
                return
            try:
                for m in s.deframer.feed(data_):
                    s.queue.put_nowait(m)
            except FramingError as e:
                log.warning("%s session %d: framing error, closing: %s", self.node, s.id, e)
                asyncio.ensure_future(self.srv.end_session(s))

        def eof_received(self) -> bool:
            return False

        def connection_lost(self, exc: Exception | None) -> None:
            if self.s is not None:
                asyncio.ensure_future(self.srv.end_session(self.s))

    return SSH


async def _serve(server: NetconfServer, s: Session) -> None:
    """Send the hello, then answer messages in order until the session ends."""
    s.send(hello(s.id))
    while True:
        msg = await s.queue.get()
        if msg is None:
            return
        if not s.got_hello:
            try:
                root = data.parse_xml(msg)
            except RpcError:
                root = None
            if root is None or root.tag != _q("hello"):
                log.warning("%s session %d: first message is not a hello; closing", s.node, s.id)
                await server.end_session(s)
                return
            caps = {(c.text or "").strip() for c in root.iter(_q("capability"))}
            if root.find(_q("session-id")) is not None or not caps & {BASE10, BASE11}:
                await server.end_session(s)
                return
            s.got_hello = True
            try:
                for m in s.deframer.release(chunked=BASE11 in caps):
                    s.queue.put_nowait(m)
            except FramingError as e:
                log.warning("%s session %d: framing error, closing: %s", s.node, s.id, e)
                await server.end_session(s)
                return
            continue
        out = await server.handle(s, msg)
        if out is not None:
            s.send(out)


async def main_async(lab_name: str) -> None:
    import asyncssh

    from substrate.lab import Lab
    from substrate.netconf.keys import ensure_keys

    lab = Lab.attach(lab_name)
    d = server_dir(lab)
    host_key_path, client_key_path = ensure_keys(d)
    host_key = asyncssh.read_private_key(str(host_key_path))
    client_key = asyncssh.read_private_key(str(client_key_path))
    server = NetconfServer(lab)
    server.loop = asyncio.get_running_loop()
    schema.modules()  # load the schema before accepting anyone
    endpoints: dict[str, int] = {}
    listeners = []
    for node in server.stores:
        lst = await asyncssh.create_server(_ssh_classes(server, node, client_key), "127.0.0.1", 0,
                                           server_host_keys=[host_key], encoding=None, keepalive_interval=0,
                                           login_timeout=30)
        listeners.append(lst)
        endpoints[node] = lst.sockets[0].getsockname()[1]
    info = {"pid": os.getpid(), "started_at": time.time(), "host": "127.0.0.1", "user": USER,
            "client_key": str(client_key_path), "host_key": host_key.export_public_key().decode().strip(),
            "endpoints": endpoints}
    tmp = d / "server.json.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, d / "server.json")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    record = lab.dir / "lab.json"
    while not stop.is_set():  # the lab gone (destroyed, cleaned up): nothing left to serve
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=2.0)
        if not record.exists():
            break
    for lst in listeners:
        lst.close()
    for s in list(server.sessions.values()):
        s.close()
    with contextlib.suppress(OSError):
        if json.loads((d / "server.json").read_text()).get("pid") == os.getpid():
            (d / "server.json").unlink()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    if len(sys.argv) != 2:
        print("usage: python -m substrate.netconf.server LAB", file=sys.stderr)
        sys.exit(2)
    asyncio.run(main_async(sys.argv[1]))


if __name__ == "__main__":
    main()

_ = Path
