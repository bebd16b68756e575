"""ANI level A2: model-driven configuration over NETCONF/YANG (draft section 5.1, Table 1:
"standardized model-driven configuration with candidate datastores and confirmed commit",
RFC 6241, RFC 8342).

The server is a NETCONF client like any NMS: its device I/O is ncclient over real SSH to the
routers' NETCONF servers (:mod:`substrate.netconf`, one host-side process per lab, started
in the background as this server comes up). Devices commit independently: calls on different
devices run in parallel (tools run in worker threads; each device has its own session and
lock). One ncclient session per device is kept for the episode, so locks and
non-persistent confirmed commits live as long as the episode (RFC 6241 section 8.4: when the
session ends before the confirming commit, the device rolls back).

Tools: ``list_devices``, ``get_schema``, ``get_config``, ``get``, ``edit_config`` (target
candidate; payload as XML -- preferred -- or as RFC 7951 JSON), ``validate``, ``commit``
(optionally confirmed), ``cancel_commit``, ``discard_changes``, ``lock``, ``unlock``, ``wait``,
``submit``. An ``<rpc-error>`` becomes an MCP error result carrying its error-type, error-tag,
error-path, error-message and error-info.
"""

import json
import threading
import time
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ConfigDict, Field

from servers.common import AniServer, ServerConfig, ServerSetupError, level_options
from substrate.errors import SubstrateError

LEVEL = "A2"
NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
INSTRUCTIONS = (
    "Level A2 of anibench: NETCONF (RFC 6241) with YANG models on every router of an emulated multi-tenant SRv6 "
    "provider network (FRR 8.4 routers, SRv6 data plane and firewalls in the Linux kernel). Each router has a "
    "running datastore (what the device has now) and a candidate. Change a device by edit_config on its candidate "
    "(XML in the models' namespaces; nc:operation attributes merge/replace/create/delete/remove), check it with "
    "validate, make it live with commit (optionally a confirmed commit that rolls back unless confirmed), or drop "
    "it with discard_changes. Models: frr-interface (interfaces; with the anibench-kernel augment 'address' for "
    "interface addresses), frr-isisd (IS-IS), frr-staticd (static routes), and anibench-kernel: kernel routing "
    "tables and routes (incl. SRv6 seg6 encapsulation and seg6local SIDs), policy-routing rules, nftables, the SRv6 "
    "encapsulation source. Read a model with get_schema; read configuration with get_config (subtree or XPath "
    "filters keep answers small). A commit is atomic per device: all of it lands or the device is restored."
)
RPC_TIMEOUT_S = 90
EXAMPLE = (
    '<kernel xmlns="urn:anibench:yang:kernel"><table><id>101</id><route><destination>2001:db8:1::/64'
    '</destination><metric>1024</metric><device>eth5</device></route></table></kernel>'
)


class A2Options(BaseModel):
    """Level-specific options of A2 (``ServerConfig.options``)."""

    model_config = ConfigDict(extra="forbid")

    max_chars: int = Field(default=48_000, ge=2_000, le=400_000, description="Characters of XML or YANG per result page.")
    max_wait_s: float = Field(default=60.0, gt=0, le=600, description="Largest pause wait() grants.")
    connect_timeout_s: float = Field(default=30.0, gt=0, le=120, description="SSH connection deadline.")


class DeviceInfo(BaseModel):
    name: str
    role: str = Field(description="P (core router) or PE (provider edge router).")
    netconf: str = Field(description="The device's NETCONF endpoint (ssh host:port, user).")


class DevicesResult(BaseModel):
    devices: list[DeviceInfo]
    modules: list[str] = Field(description="YANG modules every device implements or imports, as name@revision.")
    capabilities: list[str] = Field(description="NETCONF capabilities of the devices (besides the modules).")
    example_edit: str = Field(description="An edit_config payload, for the shape.")


class Page(BaseModel):
    """A bounded piece of a long text."""

    text: str
    offset: int = Field(description="Character offset of this page in the whole text.")
    total_chars: int
    next_offset: int | None = Field(description="Pass as offset to read on; null when this page is the last.")


class ConfigResult(BaseModel):
    device: str
    datastore: str
    xml: Page


class OkResult(BaseModel):
    device: str
    status: str = Field(description="What the device did.")


class WaitResult(BaseModel):
    status: str


def page(text: str, offset: int, limit: int) -> Page:
    """``text[offset:offset+limit]`` with the offsets to read on."""
    if offset < 0 or (offset > len(text) and text):
        raise ToolError(f"offset {offset} is outside the text (0..{len(text)})")
    end = min(len(text), offset + limit)
    return Page(text=text[offset:end], offset=offset, total_chars=len(text), next_offset=end if end < len(text) else None)


def rpc_error_text(e: Exception) -> str:
    """An ncclient RPCError as one readable line (RFC 6241 Appendix A fields)."""
    errs = getattr(e, "errors", None) or [e]
    out = []
    for x in errs:
        parts = [f"error-tag {getattr(x, 'tag', None) or '?'}", f"error-type {getattr(x, 'type', None) or '?'}"]
        if getattr(x, "path", None):
            parts.append(f"error-path {x.path.strip()}")
        msg = (getattr(x, "message", None) or str(x) or "").strip()
        parts.append(f"error-message {msg!r}")
        info = getattr(x, "info", None)
        if info and "<" in str(info):
            import re

            kv = re.findall(r"<(?:\w+:)?([\w-]+)[^>]*>([^<]+)</", str(info))
            if kv:
                parts.append("error-info " + ", ".join(f"{k}={v}" for k, v in kv))
        out.append("; ".join(parts))
    return "rpc-error: " + " | ".join(out)


# -- RFC 7951 JSON -> XML ----------------------------------------------------------------------


def json_to_xml(doc: Any, namespaces: dict[str, str]) -> str:
    """RFC 7951 JSON configuration as a NETCONF ``<config>`` element: members named
    ``module:name`` where the module changes (top level always), objects for containers and list
    entries, arrays for lists and leaf-lists, ``[null]`` for an empty leaf, and RFC 7952
    metadata ``"@": {"ietf-netconf:operation": "delete"}`` (``"@leaf"`` for a leaf).

    Raises:
        ToolError: not RFC 7951 (the message says where).
    """
    from xml.sax.saxutils import escape, quoteattr

    if not isinstance(doc, dict) or not doc:
        raise ToolError('config_json must be an object of top-level nodes, e.g. {"anibench-kernel:kernel": {...}}')

    def ns_decl(value: str) -> str:
        if ":" in value:
            mod = value.split(":", 1)[0]
            if mod in namespaces:
                return f" xmlns:{mod}={quoteattr(namespaces[mod])}"
        return ""

    def member(name: str, value: Any, mod: str | None, meta: dict | None, where: str) -> str:
        m, _, local = name.rpartition(":")
        if m and m not in namespaces:
            raise ToolError(f"{where}: unknown module {m!r}; modules: {', '.join(sorted(namespaces))}")
        if not m and mod is None:
            raise ToolError(f"{where}: a top-level member must be named module:name")
        this = m or mod
        attrs = f' xmlns="{namespaces[this]}"' if this != mod else ""
        if meta:
            if not isinstance(meta, dict):
                raise ToolError(f"{where}: metadata must be an object")
            for k, v in meta.items():
                if k != "ietf-netconf:operation":
                    raise ToolError(f"{where}: unknown metadata {k!r} (only ietf-netconf:operation)")
                attrs += f' xmlns:nc="{NC_NS}" nc:operation={quoteattr(str(v))}'
        if isinstance(value, list):
            if value == [None]:
                return f"<{local}{attrs}/>"
            return "".join(member(name, v, mod, meta, f"{where}[{i}]") for i, v in enumerate(value))
        if isinstance(value, dict):
            inner = []
            for k, v in value.items():
                if k.startswith("@"):
                    continue
                inner.append(member(k, v, this, value.get("@") if isinstance(v, dict) else value.get("@" + k),
                                    f"{where}/{k}") if not isinstance(v, list) or not v or not isinstance(v[0], dict)
                             else "".join(member(k, e, this, e.get("@") if isinstance(e, dict) else None,
                                                 f"{where}/{k}[{i}]") for i, e in enumerate(v)))
            own_meta = value.get("@") if meta is None else None
            if own_meta:
                return member(name, {k: v for k, v in value.items() if k != "@"}, mod, own_meta, where)
            return f"<{local}{attrs}>{''.join(inner)}</{local}>"
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float, str)):
            text = str(value)
        elif value is None:
            raise ToolError(f"{where}: null is only allowed as [null] (an empty leaf)")
        else:
            raise ToolError(f"{where}: unsupported value {value!r}")
        return f"<{local}{attrs}{ns_decl(text)}>{escape(text)}</{local}>"

    body = "".join(member(k, v, None, doc.get("@" + k) if not isinstance(v, dict) else None, k)
                   for k, v in doc.items() if not k.startswith("@"))
    return f'<config xmlns="{NC_NS}">{body}</config>'


# -- device sessions ------------------------------------------------------------------------------

#: How long ncclient's session thread waits on the channel before it looks at its send queue
#: again (seconds). ncclient 0.7 queues each request for that thread, which sends it only after
#: its current wait -- ``ncclient.transport.session.TICK``, 0.1 s -- ends: every RPC idled about
#: 0.1 s before leaving (a 5-device edit-config + commit lost a second to it). A 10 ms wait costs
#: the idle thread about a hundred wakeups a second.
NCCLIENT_TICK_S = 0.01


def connect(endpoint: Any, *, timeout_s: float) -> Any:
    """An ncclient manager connected to one device's NETCONF endpoint
    (:class:`substrate.netconf.Endpoint`), with the send latency above cut.

    Raises:
        ncclient's transport errors (SSHError, AuthenticationError, ...), OSError.
    """
    import ncclient.transport.session as nc_session
    from ncclient import manager

    nc_session.TICK = min(nc_session.TICK, NCCLIENT_TICK_S)  # the loop reads the module's value on every turn
    return manager.connect(host=endpoint.host, port=endpoint.port, username=endpoint.user,
                           key_filename=endpoint.key_file, hostkey_verify=False, allow_agent=False,
                           look_for_keys=False, timeout=timeout_s)


class Sessions:
    """One ncclient session per device, opened on first use and reopened when it dropped."""

    def __init__(self, lab: Any, connect_timeout_s: float):
        self.lab = lab
        self.timeout = connect_timeout_s
        self._m: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.namespaces: dict[str, str] = {}
        self.modules: list[str] = []
        self.capabilities: list[str] = []

    def lock_of(self, device: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(device, threading.Lock())

    def get(self, device: str) -> Any:
        """The device's ncclient manager (connected)."""
        from substrate import netconf

        m = self._m.get(device)
        if m is not None and m.connected:
            return m
        try:
            ep = netconf.ensure_server(self.lab)[device]
            m = connect(ep, timeout_s=self.timeout)
        except KeyError:
            raise ToolError(f"{device} has no NETCONF server (not a router)") from None
        except SubstrateError as e:
            raise ToolError(f"the NETCONF server of the lab is not available: {e}") from None
        except Exception as e:  # noqa: BLE001 - ncclient's transport errors
            raise ToolError(f"cannot open a NETCONF session to {device}: {type(e).__name__}: {e}") from None
        m.timeout = RPC_TIMEOUT_S
        self._m[device] = m
        if not self.namespaces:
            self._read_capabilities(m)
        return m

    def _read_capabilities(self, m: Any) -> None:
        from urllib.parse import parse_qs, urlsplit

        for cap in m.server_capabilities:
            u = urlsplit(cap)
            qs = parse_qs(u.query)
            if "module" in qs:
                name = qs["module"][0]
                self.namespaces[name] = cap.split("?", 1)[0]
                self.modules.append(f"{name}@{qs.get('revision', [''])[0]}")
            else:
                self.capabilities.append(cap)
        self.modules.sort()

    def call(self, device: str, fn: Any) -> Any:
        """Run ``fn(manager)`` under the device's lock; ncclient errors become ToolErrors."""
        from ncclient.operations.errors import OperationError, TimeoutExpiredError
        from ncclient.operations.rpc import RPCError
        from ncclient.transport.errors import TransportError

        with self.lock_of(device):
            m = self.get(device)
            try:
                return fn(m)
            except RPCError as e:
                raise ToolError(f"{device}: {rpc_error_text(e)}") from None
            except TimeoutExpiredError:
                raise ToolError(f"{device}: no reply within {RPC_TIMEOUT_S} s; the operation may still complete. "
                                "Read the running datastore before retrying.") from None
            except (ValueError, TypeError, OperationError) as e:  # ncclient refused to build the request
                raise ToolError(f"{device}: the request could not be built: {e}") from None
            except TransportError as e:
                self._m.pop(device, None)
                raise ToolError(f"{device}: the NETCONF session dropped ({e}); the next call opens a new one. "
                                "Locks and non-persistent confirmed commits of the old session are gone.") from None

    def close(self) -> None:
        for m in list(self._m.values()):
            try:
                m.close_session()
            except Exception:  # noqa: BLE001, S110 - closing anyway
                pass
        self._m.clear()


# -- the server ------------------------------------------------------------------------------------


Datastore = Literal["running", "candidate"]


def build_server(config: ServerConfig, *, lab: object = None) -> AniServer:  # noqa: C901
    """The A2 server over ``config.lab``.

    Raises:
        ServerSetupError: bad options, lab missing or down, trajectory unwritable.
    """
    opts = level_options(A2Options, config, LEVEL)
    server = AniServer(config, level=LEVEL, instructions=INSTRUCTIONS, lab=lab)
    lab_ = server.lab
    routers = set(lab_.routers())
    server.device_names = [d for d in server.device_names if d in routers]
    if not server.device_names:
        raise ServerSetupError("A2 acts on routers (they run the NETCONF servers); the episode has none")
    sessions = Sessions(lab_, opts.connect_timeout_s)
    # the lab's NETCONF server starts on first use (about 2 s on 2 cores): start it now, in the
    # background, so that the agent's first call does not wait for it (a failure shows there)
    threading.Thread(target=_start_devices, args=(lab_,), name="a2-netconf-start", daemon=True).start()
    close = server.close

    def close_all() -> None:
        sessions.close()
        close()

    server.close = close_all  # type: ignore[method-assign]
    server.netconf_sessions = sessions  # type: ignore[attr-defined]

    def filter_arg(subtree: str | None, xpath: str | None) -> Any:
        """An ncclient filter: subtree elements (a list), or an XPath with the models' module
        names declared as prefixes (``/anibench-kernel:kernel/rule``)."""
        if subtree and xpath:
            raise ToolError("give either filter (subtree XML) or xpath, not both")
        if subtree:
            from lxml import etree

            from substrate.netconf.data import RpcError, parse_xml

            try:
                root = parse_xml(f"<filter>{subtree}</filter>")
            except RpcError as e:
                raise ToolError(f"filter is not well-formed XML: {e.message}") from None
            kids = [etree.tostring(c).decode() for c in root if isinstance(c.tag, str)]
            if not kids:
                raise ToolError("filter has no element; give e.g. <kernel xmlns=\"urn:anibench:yang:kernel\"/>")
            return kids
        if xpath:
            sessions.call(server.device_names[0], lambda m: None)
            return ("xpath", (dict(sessions.namespaces), xpath))
        return None

    # -- tools -----------------------------------------------------------------------------------

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="List devices and models")
    def list_devices() -> DevicesResult:
        """The routers of this episode with their NETCONF endpoints, the YANG modules they implement
        (read one with get_schema) and their NETCONF capabilities."""
        from substrate import netconf

        eps = netconf.ensure_server(lab_)
        first = server.device_names[0]
        sessions.call(first, lambda m: None)
        devs = [DeviceInfo(name=d, role=lab_.state(d).role.value,
                           netconf=f"ssh {eps[d].user}@{eps[d].host} -p {eps[d].port} -s netconf")
                for d in server.device_names]
        return DevicesResult(devices=devs, modules=sessions.modules, capabilities=sessions.capabilities,
                             example_edit=EXAMPLE)

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Get a YANG module")
    def get_schema(
        identifier: Annotated[str, Field(max_length=128, description="Module name, e.g. 'anibench-kernel' or 'frr-isisd'.")],
        version: Annotated[str | None, Field(max_length=32, description="Revision date; default: the one the devices use.")] = None,
        offset: Annotated[int, Field(ge=0, description="Character offset to read from (see next_offset).")] = 0,
    ) -> Page:
        """The YANG text of a module (NETCONF get-schema, RFC 6022), a page at a time."""
        text = sessions.call(server.device_names[0], lambda m: m.get_schema(identifier, version=version, format="yang").data)
        return page(text or "", offset, opts.max_chars)

    def read(device: str, source: str, subtree: str | None, xpath: str | None, with_defaults: str | None,
             offset: int, op: str) -> ConfigResult:
        name = server.device(device)
        flt = filter_arg(subtree, xpath)
        kw: dict[str, Any] = {}
        if with_defaults:
            kw["with_defaults"] = with_defaults

        def go(m: Any) -> str:
            if op == "get":
                return m.get(filter=flt, **kw).data_xml
            return m.get_config(source, filter=flt, **kw).data_xml

        xml = sessions.call(name, go)
        return ConfigResult(device=name, datastore=source if op == "get-config" else "operational",
                            xml=page(_strip_decl(xml), offset, opts.max_chars))

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Get configuration")
    def get_config(
        device: Annotated[str, Field(description="Router name, e.g. 'r1'.")],
        source: Annotated[Datastore, Field(description="running (the device now) or candidate.")] = "running",
        filter: Annotated[str | None, Field(max_length=20_000, description=(  # noqa: A002
            'Subtree filter (RFC 6241 section 6): XML naming what to return, e.g. <kernel xmlns="urn:anibench:yang:'
            'kernel"><table><id>101</id></table></kernel>.'))] = None,
        xpath: Annotated[str | None, Field(max_length=4000, description=(
            "XPath filter instead, with module names as prefixes, e.g. /anibench-kernel:kernel/rule."))] = None,
        with_defaults: Annotated[Literal["explicit", "report-all", "trim"] | None, Field(
            description="RFC 6243 mode; default explicit (what was set).")] = None,
        offset: Annotated[int, Field(ge=0, description="Character offset to read from (see xml.next_offset).")] = 0,
    ) -> ConfigResult:
        """Configuration of one device as YANG instance data (XML), from its running or candidate
        datastore; a page at a time (xml.next_offset). Filters keep answers small."""
        return read(device, source, filter, xpath, with_defaults, offset, "get-config")

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Get operational state")
    def get(
        device: Annotated[str, Field(description="Router name, e.g. 'r1'.")],
        filter: Annotated[str | None, Field(max_length=20_000, description="Subtree filter (XML).")] = None,  # noqa: A002
        xpath: Annotated[str | None, Field(max_length=4000, description="XPath filter instead.")] = None,
        offset: Annotated[int, Field(ge=0, description="Character offset to read from.")] = 0,
    ) -> ConfigResult:
        """Running configuration plus operational state (interface state, IS-IS adjacencies) of one
        device (NETCONF get), a page at a time."""
        return read(device, "running", filter, xpath, None, offset, "get")

    @server.ani_tool(kind="config", read_only=False, destructive=True, title="Edit the candidate")
    def edit_config(
        device: Annotated[str, Field(description="Router name, e.g. 'r1'.")],
        config: Annotated[str | None, Field(max_length=400_000, description=(
            "Preferred: the configuration as XML elements in the models' namespaces (the content of NETCONF "
            "<config>), with nc:operation attributes where needed (xmlns:nc='urn:ietf:params:xml:ns:netconf:base:1.0'"
            f"), e.g. {EXAMPLE}"))] = None,
        config_json: Annotated[dict[str, Any] | None, Field(description=(
            'Alternative: RFC 7951 JSON, e.g. {"anibench-kernel:kernel": {"table": [{"id": 101, "route": '
            '[{"destination": "2001:db8:1::/64", "metric": 1024, "device": "eth5"}]}]}}; operations as RFC 7952 '
            'metadata: {"@": {"ietf-netconf:operation": "delete"}} inside the object.'))] = None,
        default_operation: Annotated[Literal["merge", "replace", "none"], Field(description="RFC 6241 default-operation.")] = "merge",
        test_option: Annotated[Literal["test-then-set", "set", "test-only"], Field(
            description="test-then-set (default): refuse an edit that leaves the candidate invalid; set: check types "
                        "only (validate later); test-only: check without changing.")] = "test-then-set",
        error_option: Annotated[Literal["stop-on-error", "continue-on-error", "rollback-on-error"], Field(
            description="What happens when part of the edit fails.")] = "rollback-on-error",
    ) -> OkResult:
        """Change the candidate datastore of one device (NETCONF edit-config, target candidate).
        Nothing reaches the device until commit. Refused edits change nothing and say which node
        is wrong (error-path)."""
        name = server.device(device)
        if (config is None) == (config_json is None):
            raise ToolError("give the change as config (XML, preferred) or as config_json (RFC 7951), exactly one")
        if config_json is not None:
            sessions.call(name, lambda m: None)
            payload = json_to_xml(config_json, sessions.namespaces)
        else:
            stripped = config.strip()
            payload = stripped if stripped.startswith("<config") else f'<config xmlns="{NC_NS}">{stripped}</config>'
        try:
            from substrate.netconf.data import RpcError, parse_xml

            root = parse_xml(payload)
        except RpcError as e:
            raise ToolError(f"config is not usable XML: {e.message}") from None
        if not any(isinstance(c.tag, str) for c in root):
            raise ToolError(f"config holds no element to edit; e.g. {EXAMPLE}")
        sessions.call(name, lambda m: m.edit_config(payload, target="candidate", default_operation=default_operation,
                                                   test_option=test_option, error_option=error_option))
        return OkResult(device=name, status="candidate changed" if test_option != "test-only" else "edit is valid; "
                        "nothing changed (test-only)")

    @server.ani_tool(kind="validation", read_only=True, idempotent=True, title="Validate")
    def validate(
        device: Annotated[str, Field(description="Router name.")],
        source: Annotated[Datastore, Field(description="Datastore to validate.")] = "candidate",
    ) -> OkResult:
        """Validate a datastore against the YANG models (types, mandatory nodes, references, must
        constraints) and check the device can make the change (NETCONF validate)."""
        name = server.device(device)
        sessions.call(name, lambda m: m.validate(source=source))
        return OkResult(device=name, status=f"{source} is valid")

    @server.ani_tool(kind="config", read_only=False, destructive=True, title="Commit")
    def commit(
        device: Annotated[str, Field(description="Router name.")],
        confirmed: Annotated[bool, Field(description="A confirmed commit: rolls back unless confirmed by a later "
                                                    "commit within confirm_timeout (RFC 6241 8.4).")] = False,
        confirm_timeout: Annotated[int | None, Field(ge=1, le=3600, description="Seconds (default 600).")] = None,
        persist: Annotated[str | None, Field(max_length=128, description="Make the confirmed commit survive this "
                                                                       "session; confirm later with persist_id.")] = None,
        persist_id: Annotated[str | None, Field(max_length=128, description="Confirm (or extend) a persistent "
                                                                          "confirmed commit.")] = None,
    ) -> OkResult:
        """Make the candidate live on one device (NETCONF commit). Atomic per device: either all of
        the change lands, or the device is restored and the error says why."""
        name = server.device(device)
        if not confirmed and (confirm_timeout is not None or persist is not None):
            # ncclient drops both from a commit without <confirmed/>: the agent asked for a commit that
            # rolls back unless confirmed and would get a permanent one (RFC 6241 section 8.4.5.1)
            raise ToolError("confirm_timeout and persist make a confirmed commit: give confirmed=true with them "
                            "(nothing was committed)")
        if persist is not None and persist_id is not None:
            raise ToolError("give persist (start or restart a persistent confirmed commit) or persist_id (confirm or "
                            "extend one), not both (nothing was committed)")
        t0 = time.monotonic()
        sessions.call(name, lambda m: m.commit(confirmed=confirmed, timeout=str(confirm_timeout) if confirm_timeout
                                              else None, persist=persist, persist_id=persist_id))
        kind = "confirmed commit (confirm with commit before the timeout)" if confirmed else "committed"
        return OkResult(device=name, status=f"{kind} in {time.monotonic() - t0:.1f} s")

    @server.ani_tool(kind="config", read_only=False, destructive=True, idempotent=False, title="Cancel commit")
    def cancel_commit(
        device: Annotated[str, Field(description="Router name.")],
        persist_id: Annotated[str | None, Field(max_length=128, description="The persist value of a persistent confirmed commit.")] = None,
    ) -> OkResult:
        """Roll back a pending confirmed commit now (NETCONF cancel-commit)."""
        name = server.device(device)
        sessions.call(name, lambda m: m.cancel_commit(persist_id=persist_id))
        return OkResult(device=name, status="confirmed commit cancelled: running restored")

    @server.ani_tool(kind="config", read_only=False, destructive=False, idempotent=True, title="Discard changes")
    def discard_changes(device: Annotated[str, Field(description="Router name.")]) -> OkResult:
        """Throw away the candidate's uncommitted changes (the candidate becomes running again)."""
        name = server.device(device)
        sessions.call(name, lambda m: m.discard_changes())
        return OkResult(device=name, status="candidate reset to running")

    @server.ani_tool(kind="other", read_only=False, destructive=False, idempotent=False, title="Lock")
    def lock(
        device: Annotated[str, Field(description="Router name.")],
        target: Annotated[Datastore, Field(description="Datastore to lock.")] = "candidate",
    ) -> OkResult:
        """Lock a datastore of one device for this episode's session (NETCONF lock). Fails at once
        with lock-denied when someone else holds it."""
        name = server.device(device)
        sessions.call(name, lambda m: m.lock(target=target))
        return OkResult(device=name, status=f"{target} locked")

    @server.ani_tool(kind="other", read_only=False, destructive=False, idempotent=False, title="Unlock")
    def unlock(
        device: Annotated[str, Field(description="Router name.")],
        target: Annotated[Datastore, Field(description="Datastore to unlock.")] = "candidate",
    ) -> OkResult:
        """Release a lock this session holds (NETCONF unlock)."""
        name = server.device(device)
        sessions.call(name, lambda m: m.unlock(target=target))
        return OkResult(device=name, status=f"{target} unlocked")

    @server.ani_tool(kind="wait", read_only=True, idempotent=True, title="Wait")
    async def wait(
        seconds: Annotated[float, Field(ge=0, le=opts.max_wait_s, description=f"Seconds to pause (0-{opts.max_wait_s:g}).")],
    ) -> WaitResult:
        """Pause to let protocols converge or state settle."""
        await anyio.sleep(seconds)
        return WaitResult(status=f"{seconds:g} seconds elapsed")

    return server


def _start_devices(lab: Any) -> None:
    from substrate import netconf

    try:
        netconf.ensure_server(lab)
    except Exception:  # noqa: BLE001, S110 - the first tool call tries again and reports why
        pass


def _strip_decl(xml: str) -> str:
    if xml.startswith("<?xml"):
        return xml.split("?>", 1)[1].lstrip()
    return xml


_ = json
