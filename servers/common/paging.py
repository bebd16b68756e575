"""Bounded tool results and the paging handle that reads the rest (every level).

Every result a server sends is bounded by the size of the one JSON-RPC message that carries it
(``ServerConfig.max_message_bytes``, default :data:`DEFAULT_MAX_MESSAGE_BYTES`), measured as it
goes on the wire: the text content, the structured copy beside it and the JSON escaping of both
(a quote in a command's output costs about six bytes once it sits in the text copy of a JSON
result inside a JSON-RPC message). Many MCP clients read stdio with a line limit -- asyncio's
default ``StreamReader`` limit is 64 KiB, and a longer message crashes them -- so the default
keeps every message well under 64 KiB, and a result's text well under the output size at which
clients warn (see :data:`DEFAULT_MAX_MESSAGE_BYTES`).

When a result is larger, :func:`fit_result` cuts its longest strings (a command's output, a
device's echo or configuration), keeping the same number of leading characters of each, so the
result keeps its schema; the full text of each cut string goes into the server's
:class:`OutputStore`, and the kept part ends with a marker naming the output id and the offset to
continue from::

    [... cut by anibench: 1234567 more characters; read them with read_output(output_id="out-3", offset=4012) ...]

The ``read_output`` tool (registered on every level by :class:`~servers.common.server.AniServer`)
returns the next page of a stored output, itself bounded the same way. Offsets count characters
(Unicode code points) of the full text. Error texts are cut the same way. A result that cannot be
brought under the bound by cutting strings (thousands of small fields) is kept whole as one
output and answered with an error result that says the call completed and how to read it.

The mechanism is generic: any tool result of any level is bounded after the tool returns, with
no code in the tool.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic_core
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, JSONRPCResponse, TextContent

#: Default bound on one JSON-RPC message (bytes of UTF-8 JSON, without the newline): 40 KiB. The
#: text a client shows the model is about half of it (the structured copy is the other half), so a
#: result stays near 20,000 characters -- about 5,000 to 7,000 tokens -- well under the output size
#: clients warn about (Claude Code: 10,000 tokens) and refuse (25,000), and the message far under
#: asyncio's default 64 KiB ``StreamReader`` line limit (issue 11; issue 10 set 60 KiB for the line
#: limit alone).
DEFAULT_MAX_MESSAGE_BYTES = 40 * 1024
#: Smallest bound a server accepts (the marker, the handle and the result's own fields must fit).
MIN_MAX_MESSAGE_BYTES = 4 * 1024
#: Default memory for stored outputs per server; the oldest outputs are dropped beyond it.
DEFAULT_STORE_BYTES = 64 * 1024 * 1024
#: Strings shorter than this are never cut (cutting them would save too little).
MIN_CUT_CHARS = 64
#: Request id used for measuring when the real one is unknown (as long as a UUID string).
_PLACEHOLDER_ID = "00000000-0000-0000-0000-000000000000"


def cut_marker(output_id: str, offset: int, total: int, tool: str = "read_output") -> str:
    """The line appended to a cut text: how much is left and the call that reads it (``tool`` is
    the server's name for read_output, which a ``--tool-prefix`` changes)."""
    return (f"\n[... cut by anibench: {total - offset} more characters; read them with "
            f'{tool}(output_id="{output_id}", offset={offset}) ...]')  # fmt: skip


#: The marker at the end of a cut text (what :func:`cut_marker` writes).
CUT_MARKER = re.compile(r'\n\[\.\.\. cut by anibench: \d+ more characters; read them with '
                        r'[A-Za-z0-9_-]*read_output\(output_id="(out-\d+)", offset=(\d+)\) \.\.\.\]$')


async def complete(value: Any, read_page: Callable[[str, int], Awaitable[dict[str, Any] | None]]) -> Any:
    """For clients (the harness's scripted agents): ``value`` (a structured result) with every
    cut string replaced by its full text, read page by page with ``read_page(output_id, offset)``
    (which calls read_output and returns its structured result, or None when that failed).

    Raises:
        ValueError: a page could not be read.
    """
    if isinstance(value, dict):
        return {k: await complete(v, read_page) for k, v in value.items()}
    if isinstance(value, list):
        return [await complete(v, read_page) for v in value]
    if not isinstance(value, str):
        return value
    m = CUT_MARKER.search(value)
    if m is None:
        return value
    oid, offset = m.group(1), int(m.group(2))
    out = value[: m.start()]
    while offset is not None:
        page = await read_page(oid, offset)
        if page is None:
            raise ValueError(f"cannot read output {oid} at offset {offset}")
        out += page["text"]
        offset = page["next_offset"]
    return out


class OutputStore:
    """Full texts of cut results, by output id (``out-<n>``), oldest dropped past a memory bound.
    Thread-safe.

    Args:
        max_bytes: bound on the UTF-8 size of all kept texts together (one text larger than it
            is still kept, alone).
    """

    def __init__(self, max_bytes: int = DEFAULT_STORE_BYTES, tool: str = "read_output"):
        #: the server's name of the read_output tool (named in error texts)
        self.tool = tool
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._texts: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._size = 0
        self._next = 0
        self._dropped = 0

    def reserve(self) -> str:
        """A fresh output id (not yet holding a text)."""
        with self._lock:
            self._next += 1
            return f"out-{self._next}"

    def put(self, output_id: str, text: str) -> None:
        """Keep ``text`` under ``output_id`` (from :meth:`reserve`)."""
        size = len(text.encode("utf-8", errors="replace"))
        with self._lock:
            self._texts[output_id] = (text, size)
            self._size += size
            while self._size > self.max_bytes and len(self._texts) > 1:
                _, (_, s) = self._texts.popitem(last=False)
                self._size -= s
                self._dropped += 1

    def get(self, output_id: object) -> str:
        """The full text of ``output_id``.

        Raises:
            ToolError: unknown id, or an output dropped to stay within the memory bound.
        """
        with self._lock:
            if isinstance(output_id, str) and output_id in self._texts:
                return self._texts[output_id][0]
            known = list(self._texts)[-5:]
            issued = self._next
        shown = repr(output_id)[:40]
        if isinstance(output_id, str) and output_id.startswith("out-") and output_id[4:].isdigit() \
                and 0 < int(output_id[4:]) <= issued:  # fmt: skip
            raise ToolError(f"output {shown} is no longer kept (this server keeps the most recent cut outputs, "
                            f"{self.max_bytes // (1024 * 1024)} MiB in all); run the command again")  # fmt: skip
        hint = f"; recent outputs: {', '.join(known)}" if known else "; no output has been cut in this episode"
        raise ToolError(f"unknown output id {shown}: output ids come from a cut result's marker "
                        f'({self.tool}(output_id="out-N", offset=K)){hint}')  # fmt: skip


# -- measuring -------------------------------------------------------------------------------------


def message_bytes(result: CallToolResult, request_id: Any = None) -> int:
    """Bytes of the JSON-RPC response line that carries ``result``, serialized as the SDK writes
    it (``CallToolResult`` dumped by alias without None fields, inside a ``JSONRPCResponse``
    dumped with ``exclude_unset``)."""
    rid = request_id if isinstance(request_id, str | int) and not isinstance(request_id, bool) else _PLACEHOLDER_ID
    body = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    wire = JSONRPCResponse(jsonrpc="2.0", id=rid, result=body).model_dump_json(by_alias=True, exclude_unset=True)
    return len(wire.encode("utf-8", errors="replace"))


def _largest(n: int, fits: Callable[[int], bool]) -> int:
    """The largest k in [0, n] with ``fits(k)``, assuming monotonicity; -1 when even 0 fails."""
    if fits(n):
        return n
    if not fits(0):
        return -1
    lo, hi = 0, n  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _strings(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], str]]:
    """Every string leaf of a JSON value with its path (dict keys and list indices)."""
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _strings(v, (*path, k))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in _strings(v, (*path, i))]
    return []


def _replace(value: Any, path: tuple[Any, ...], new: str) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        out = dict(value)
        out[head] = _replace(value[head], rest, new)
        return out
    out_list = list(value)
    out_list[head] = _replace(value[head], rest, new)
    return out_list


#: The output id markers carry while a cut is searched for (as long as any real one).
_SEARCH_ID = "out-9999999999"
#: Room the marker takes (characters); a string is cut only where that makes it shorter.
_MARKER_ROOM = len(cut_marker("out-0000000000", 10**12, 10**13, tool="x" * 64))


def _cut(s: str, k: int) -> bool:
    """``s`` is cut when ``k`` characters are kept of it (only if that shortens it)."""
    return len(s) > k + _MARKER_ROOM


def _list_lengths(value: Any) -> list[int]:
    """The length of every list in a JSON value."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in _list_lengths(v)]
    if isinstance(value, list):
        return [len(value), *(n for v in value for n in _list_lengths(v))]
    return []


def _shorten(value: Any, m: int) -> Any:
    """A copy of a JSON value with every list cut to its first ``m`` items."""
    if isinstance(value, dict):
        return {k: _shorten(v, m) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten(v, m) for v in value[:m]]
    return value


def _text_of_structured(structured: Any, wrapped: bool) -> str:
    """The text content of a structured result: its JSON without indentation (the SDK indents
    by 2, which costs a model a third more tokens for nested results and says nothing more)."""
    shown = structured.get("result") if wrapped and isinstance(structured, dict) else structured
    return pydantic_core.to_json(shown, fallback=str).decode()


class Fitter:
    """Bounds results and error texts of one server to ``max_message_bytes`` (see module doc)."""

    def __init__(self, store: OutputStore, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self.store = store
        self.max_message_bytes = max_message_bytes

    # -- results ---------------------------------------------------------------------------

    def fit_result(self, result: CallToolResult, *, wrapped: bool = False, request_id: Any = None) -> CallToolResult:
        """``result`` itself when its message fits, else a copy with its longest strings cut
        (structured results: in the structured copy, the text content re-derived from it;
        text-only results: in the text blocks), each with a marker and its full text stored.
        A structured result that cutting strings cannot bound (many small items) has its longest
        lists shortened as well, the whole result stored, and a marker saying so appended to its
        first text field (:meth:`_shorten_lists`): it keeps its schema and its error flag.

        Args:
            result: the tool's result as the SDK built it.
            wrapped: the structured content is ``{"result": value}`` and the text shows ``value``.
            request_id: the JSON-RPC id of the call (its length counts).
        """
        if result.structured_content is not None and not result.is_error:  # the text copy, compact
            text = _text_of_structured(result.structured_content, wrapped)
            if [getattr(c, "text", None) for c in result.content] != [text]:
                result = result.model_copy(update={"content": [TextContent(type="text", text=text)]})
        if message_bytes(result, request_id) <= self.max_message_bytes:
            return result
        if result.structured_content is not None:
            return (self._cut_structured(result, result.structured_content, wrapped, request_id)
                    or self._shorten_lists(result, wrapped, request_id)
                    or self._whole(result, wrapped, request_id))  # fmt: skip
        blocks = list(result.content)
        leaves = [((i,), b.text) for i, b in enumerate(blocks) if isinstance(b, TextContent) and len(b.text) > MIN_CUT_CHARS]

        def build(k: int, ids: dict[tuple[Any, ...], str]) -> CallToolResult:
            new = list(blocks)
            for (i,), s in leaves:
                if _cut(s, k):
                    new[i] = TextContent(type="text", text=s[:k] + cut_marker(ids.get((i,), _SEARCH_ID), k, len(s), self.store.tool))
            return result.model_copy(update={"content": new})

        return self._finish(leaves, build, request_id) or self._whole(result, wrapped, request_id)

    def _finish(self, leaves: list[tuple[tuple[Any, ...], str]], build: Callable[[int, dict[tuple[Any, ...], str]], CallToolResult],
                request_id: Any) -> CallToolResult | None:  # fmt: skip
        """The result ``build(k, ids)`` with the largest ``k`` (characters kept of each cut leaf)
        that fits, the cut leaves stored under fresh ids; None when nothing fits. The search
        measures with a placeholder id at least as long as any real one."""
        longest = max((len(s) for _, s in leaves), default=0)
        k = _largest(longest, lambda k: message_bytes(build(k, {}), request_id) <= self.max_message_bytes)
        if k < 0:
            return None
        ids = {p: self.store.reserve() for p, s in leaves if _cut(s, k)}
        for p, s in leaves:
            if p in ids:
                self.store.put(ids[p], s)
        return build(k, ids)

    def _cut_structured(self, result: CallToolResult, data: Any, wrapped: bool, request_id: Any,
                        keep: tuple[Any, ...] | None = None) -> CallToolResult | None:  # fmt: skip
        """``result`` with structured copy ``data`` whose longest strings (but the one at path
        ``keep``) are cut to fit, the text re-derived from it; None when cutting is not enough."""
        leaves = [(p, s) for p, s in _strings(data) if len(s) > MIN_CUT_CHARS and p != keep]

        def build(k: int, ids: dict[tuple[Any, ...], str]) -> CallToolResult:
            out: Any = data
            for p, s in leaves:
                if _cut(s, k):
                    out = _replace(out, p, s[:k] + cut_marker(ids.get(p, _SEARCH_ID), k, len(s), self.store.tool))
            return result.model_copy(update={"structured_content": out,
                                             "content": [TextContent(type="text", text=_text_of_structured(out, wrapped))]})  # fmt: skip

        return self._finish(leaves, build, request_id)

    def _shorten_lists(self, result: CallToolResult, wrapped: bool, request_id: Any) -> CallToolResult | None:
        """Many small items (a list of 350 rejected commands, each with its reason) cannot be
        bounded by cutting strings: every list is shortened to its first ``m`` items (the largest
        ``m`` that fits, strings cut as well where needed), the whole result is stored as one
        output, and the first top-level text field (e.g. a ``summary``) gets a marker that says
        so and how to read it. The result keeps its schema and its error flag. None when the
        structure has no such field or even empty lists do not fit."""
        structured = result.structured_content
        shown = structured.get("result") if wrapped and isinstance(structured, dict) else structured
        if wrapped or not isinstance(shown, dict):
            return None
        first = next((k for k, v in shown.items() if isinstance(v, str)), None)
        longest = max((n for n in _list_lengths(shown)), default=0)
        if first is None or longest == 0:
            return None
        full = _text_of_structured(structured, wrapped)
        oid = self.store.reserve()

        def attempt(m: int) -> CallToolResult | None:
            data = _shorten(shown, m)
            notice = (f"\n[... cut by anibench: lists of this result longer than {m} item(s) show their first {m}; the "
                      f"whole result ({len(full)} characters of JSON) is output {oid}: read it with "
                      f'{self.store.tool}(output_id="{oid}", offset=0) ...]')  # fmt: skip
            data[first] = data[first] + notice
            return self._cut_structured(result, data, wrapped, request_id, keep=(first,))

        if attempt(0) is None:
            return None
        m = _largest(longest - 1, lambda m: attempt(m) is not None)
        self.store.put(oid, full)
        return attempt(m)

    def _whole(self, result: CallToolResult, wrapped: bool, request_id: Any) -> CallToolResult:
        """The last resort: the whole result's text kept as one output, answered with an error
        result saying so (its structured copy could not be sent within the bound)."""
        if result.structured_content is not None:
            full = _text_of_structured(result.structured_content, wrapped)
        else:
            full = "\n".join(getattr(b, "text", "") for b in result.content)
        oid = self.store.reserve()
        self.store.put(oid, full)
        size = message_bytes(result, request_id)
        done = "failed" if result.is_error else "completed"
        text = (f"the call {done}, but its result ({size} bytes as a JSON-RPC message) cannot be cut below this "
                f"server's bound of {self.max_message_bytes} bytes per message, so it was not sent; its text "
                f"({len(full)} characters of JSON) is kept as output {oid}: read it with "
                f'{self.store.tool}(output_id="{oid}", offset=0), or ask for less (fewer devices, a narrower command)')  # fmt: skip
        return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)

    # -- error texts -----------------------------------------------------------------------

    def fit_error(self, message: str, *, request_id: Any = None) -> str:
        """An error text cut (with the marker, the full text stored) so that the error result
        carrying it fits the bound."""

        def size(text: str) -> int:
            return message_bytes(CallToolResult(content=[TextContent(type="text", text=text)], is_error=True), request_id)

        if size(message) <= self.max_message_bytes:
            return message
        oid = self.store.reserve()

        def build(k: int) -> str:
            return message[:k] + cut_marker(oid, k, len(message), self.store.tool)

        k = _largest(len(message), lambda k: size(build(k)) <= self.max_message_bytes)
        self.store.put(oid, message)
        return build(max(k, 0))

    # -- pages -----------------------------------------------------------------------------

    def page(self, output_id: str, offset: int, max_chars: int | None, make: Callable[[str, int, int], Any],
             request_id: Any = None) -> Any:  # fmt: skip
        """The largest page of ``output_id`` from ``offset`` (at most ``max_chars``) whose result,
        built by ``make(text, offset, end)`` and serialized like a tool result, fits the bound.

        Raises:
            ToolError: unknown output, offset past the end, or not even one character fits.
        """
        full = self.store.get(output_id)
        if offset > len(full):
            raise ToolError(f"offset {offset} is past the end of output {output_id} ({len(full)} characters)")
        stop = len(full) if max_chars is None else min(len(full), offset + max_chars)

        def fits(n: int) -> bool:
            model = make(full, offset, offset + n)
            res = CallToolResult(content=[TextContent(type="text", text=model.model_dump_json())],
                                 structured_content=model.model_dump(mode="json"))  # fmt: skip
            return message_bytes(res, request_id) <= self.max_message_bytes

        n = _largest(stop - offset, fits)
        if n <= 0 and stop > offset:
            raise ToolError("not even one character of the output fits this server's message bound")
        return make(full, offset, offset + max(n, 0))
