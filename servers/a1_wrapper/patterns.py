"""Token patterns: the small language the A1 allowlist and blocklist are written in (pure logic).

A command is split into words; a pattern says which word sequences are allowed. Syntax (words of
the pattern are separated by spaces):

===================  ===========================================================================
``word``             that literal word
``a|b|c``            one of these literal words (no spaces around the bars)
``'{'``              a literal that is also pattern syntax (``{ } [ ] ( ) | ; ...``)
``<type>``           one word of a type (see :data:`TYPES`), e.g. ``<prefix6>``, ``<ifname>``
``<uint:1-10>``      an integer in a range; ``<num:0.2-5>`` a decimal number in a range
``[ x y ]``          optional sequence (``[ a | b ]``: optionally one of several)
``( a | b c )``      one of several sequences; ``( ... )*`` zero or more times
``{ a | b c }``      zero or more of the alternatives, in any order, each at most once
``...``              any number of words (the rest is checked by the device itself)
===================  ===========================================================================

Matching is by backtracking over the words (bounded: commands are short and the step count is
capped). On failure the matcher reports the furthest word it reached and what it expected there,
which is what an agent needs to fix the command.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

#: Upper bound on matcher steps per command (a pathological pattern/input pair fails closed).
MAX_STEPS = 200_000


class PatternError(ValueError):
    """A pattern in a data file is malformed (a bug in the data, reported at load time)."""


class TooComplex(ValueError):
    """Matching exceeded :data:`MAX_STEPS`."""


# -- word types ------------------------------------------------------------------------------------


def _ip(word: str, version: int | None, network: bool) -> bool:
    if not word or len(word) > 64 or not re.fullmatch(r"[0-9A-Fa-f:.]+(/\d{1,3})?", word):
        return False
    try:
        obj = ipaddress.ip_network(word, strict=False) if network else ipaddress.ip_address(word)
    except ValueError:
        return False
    return version is None or obj.version == version


def _prefix(version: int | None) -> Callable[[str], bool]:
    return lambda w: w == "default" or _ip(w, version, True)


_IFNAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,14}")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
_WORD = re.compile(r"[A-Za-z0-9._:/-]{1,64}")


def _uint(w: str, lo: int = 0, hi: int = 2**32 - 1) -> bool:
    return w.isdigit() and len(w) <= 10 and lo <= int(w) <= hi


def _int(w: str) -> bool:
    return bool(re.fullmatch(r"[+-]?\d{1,10}", w)) and abs(int(w)) < 2**31


def _table(w: str) -> bool:
    # 0 is "unspecified" in the kernel's API, not a table; local (255), main (254) and default
    # (253) are the kernel's own tables and appear in its default rules
    return w in ("main", "default", "local") or _uint(w, 1)


def _seglist(w: str) -> bool:
    parts = w.split(",")
    return 1 <= len(parts) <= 16 and all(_ip(p, 6, False) for p in parts)


def _portspec(w: str) -> bool:
    a, _, b = w.partition("-")
    return _uint(a, 0, 65535) and (not b or _uint(b, 0, 65535))


def _mark(w: str) -> bool:
    base = w.split("/", 1)
    return all(_uint(x) or bool(re.fullmatch(r"0x[0-9a-fA-F]{1,8}", x)) for x in base)


def _rate(w: str) -> bool:
    return bool(re.fullmatch(r"\d{1,9}/(second|minute|hour|day)", w)) or bool(
        re.fullmatch(r"\d{1,9}\s?(bytes|kbytes|mbytes)/(second|minute)", w)
    )


def _nftprio(w: str) -> bool:
    return _int(w) or bool(re.fullmatch(r"(raw|mangle|dstnat|filter|security|srcnat|out)([+-]\d{1,4})?", w))


def _nat_target(w: str) -> bool:
    if w.startswith("["):  # [addr6]:port
        m = re.fullmatch(r"\[([0-9A-Fa-f:]+)\](?::(\d{1,5}))?", w)
        return bool(m) and _ip(m.group(1), 6, False) and (m.group(2) is None or _uint(m.group(2), 1, 65535))
    host, _, port = w.rpartition(":") if w.count(":") == 1 else (w, "", "")
    return _ip(host, None, False) and (not port or _uint(port, 1, 65535)) or _ip(w, None, True)


#: Word types usable as ``<name>`` in patterns: name -> (check, description for error messages).
TYPES: dict[str, tuple[Callable[[str], bool], str]] = {
    "prefix6": (_prefix(6), "an IPv6 prefix, e.g. fd00:1::/64"),
    "prefix4": (_prefix(4), "an IPv4 prefix, e.g. 10.0.0.0/24"),
    "prefix": (_prefix(None), "an IP prefix, e.g. fd00:1::/64"),
    "addr6": (lambda w: _ip(w, 6, False), "an IPv6 address, e.g. fd00::2"),
    "addr4": (lambda w: _ip(w, 4, False), "an IPv4 address, e.g. 10.0.0.1"),
    "addr": (lambda w: _ip(w, None, False), "an IP address"),
    "ifname": (lambda w: bool(_IFNAME.fullmatch(w)), "an interface name, e.g. eth1"),
    "name": (lambda w: bool(_NAME.fullmatch(w)), "a name (letters, digits, _ and -; up to 32)"),
    "word": (lambda w: bool(_WORD.fullmatch(w)), "a word"),
    # FRR's WORD token: any characters but spaces (FRR stores names as UTF-8 bytes)
    "frrword": (lambda w: 0 < len(w) <= 256 and " " not in w and "\t" not in w, "a name (any characters but spaces)"),
    "uint": (_uint, "a non-negative integer"),
    "int": (_int, "an integer"),
    "table": (_table, "a routing table number (1-4294967295) or main, default, local"),
    "seglist": (_seglist, "a comma-separated list of IPv6 SIDs, e.g. fcbb:bb00:2:3:e000::"),
    "portspec": (_portspec, "a port or port range, e.g. 22 or 1000-2000"),
    "mark": (_mark, "a mark, e.g. 0x10 or 16/0xff"),
    "rate": (_rate, "a rate, e.g. 10/second"),
    "nftprio": (_nftprio, "a priority: an integer or filter|raw|mangle|dstnat|srcnat|security"),
    "nattarget": (_nat_target, "an address, optionally with :port"),
    "nftfam": (lambda w: w in ("ip", "ip6", "inet", "arp", "bridge", "netdev"), "an nftables family: ip|ip6|inet|arp|bridge|netdev"),
    "setref": (lambda w: w.startswith("@") and bool(_NAME.fullmatch(w[1:])), "a named set, e.g. @allowed"),
    "csv": (lambda w: bool(re.fullmatch(r"[a-z0-9_-]{1,24}(,[a-z0-9_-]{1,24}){0,8}", w)), "a word or comma-separated words, e.g. established,related"),
}


def _range_type(kind: str, lo: str, hi: str) -> tuple[Callable[[str], bool], str]:
    if kind == "uint":
        a, b = int(lo), int(hi)
        return (lambda w: _uint(w, a, b)), f"an integer from {a} to {b}"
    if kind == "num":
        x, y = float(lo), float(hi)

        def check(w: str) -> bool:
            return bool(re.fullmatch(r"\d{1,6}(\.\d{1,3})?", w)) and x <= float(w) <= y

        return check, f"a number from {lo} to {hi}"
    raise PatternError(f"unknown range type {kind!r} (use uint or num)")


# -- pattern AST -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lit:
    words: frozenset[str]

    @property
    def label(self) -> str:
        return "|".join(sorted(self.words))


@dataclass(frozen=True)
class Typ:
    name: str
    check: Callable[[str], bool] = field(compare=False)
    description: str = field(compare=False)

    @property
    def label(self) -> str:
        return f"<{self.name}> ({self.description})"


@dataclass(frozen=True)
class Seq:
    items: tuple[object, ...]


@dataclass(frozen=True)
class Opt:
    node: object


@dataclass(frozen=True)
class Alt:
    options: tuple[object, ...]


@dataclass(frozen=True)
class OptSet:
    options: tuple[object, ...]


@dataclass(frozen=True)
class Rep:
    node: object


@dataclass(frozen=True)
class Rest:
    pass


_SYNTAX = {"[", "]", "(", ")", ")*", "{", "}", "|", "..."}


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = text.split()
        self.i = 0

    def error(self, msg: str) -> PatternError:
        return PatternError(f"pattern {self.text!r}: {msg}")

    def parse(self) -> Seq:
        seq = self.seq(set())
        if self.i != len(self.toks):
            raise self.error(f"unexpected {self.toks[self.i]!r}")
        return seq

    def seq(self, stop: set[str]) -> Seq:
        items = []
        while self.i < len(self.toks) and self.toks[self.i] not in stop:
            items.append(self.item())
        return Seq(tuple(items))

    def alts(self, closers: set[str]) -> tuple[list[Seq], str]:
        stop = closers | {"|"}
        options = [self.seq(stop)]
        while self.i < len(self.toks) and self.toks[self.i] == "|":
            self.i += 1
            options.append(self.seq(stop))
        if self.i >= len(self.toks):
            raise self.error(f"missing {' or '.join(sorted(closers))}")
        closer = self.toks[self.i]
        self.i += 1
        return options, closer

    def item(self) -> object:
        t = self.toks[self.i]
        self.i += 1
        if t == "[":
            opts, _ = self.alts({"]"})
            return Opt(opts[0] if len(opts) == 1 else Alt(tuple(opts)))
        if t == "(":
            opts, closer = self.alts({")", ")*"})
            node: object = opts[0] if len(opts) == 1 else Alt(tuple(opts))
            return Rep(node) if closer == ")*" else node
        if t == "{":
            opts, _ = self.alts({"}"})
            return OptSet(tuple(opts))
        if t == "...":
            return Rest()
        if t in _SYNTAX:
            raise self.error(f"unexpected {t!r}")
        if len(t) >= 3 and t[0] == "'" and t[-1] == "'":
            return Lit(frozenset({t[1:-1]}))
        parts = t.split("|")
        if not any(p.startswith("<") for p in parts):
            return Lit(frozenset(parts))
        words = [p for p in parts if not p.startswith("<")]
        nodes: list[object] = [self.typ(p) for p in parts if p.startswith("<")]
        if words:
            nodes.append(Lit(frozenset(words)))
        return nodes[0] if len(nodes) == 1 else Alt(tuple(nodes))

    def typ(self, t: str) -> Typ:
        if not t.endswith(">"):
            raise self.error(f"bad type {t!r}")
        spec = t[1:-1]
        m = re.fullmatch(r"(uint|num):([0-9.]+)-([0-9.]+)", spec)
        if m:
            check, desc = _range_type(*m.groups())
            return Typ(spec, check, desc)
        if spec not in TYPES:
            raise self.error(f"unknown type <{spec}>; known: {', '.join(sorted(TYPES))}")
        check, desc = TYPES[spec]
        return Typ(spec, check, desc)


def compile_pattern(text: str, macros: dict[str, str] | None = None) -> Seq:
    """Parse a pattern, expanding ``@name`` macros (whole words) first.

    Raises:
        PatternError: malformed pattern, unknown type or macro.
    """
    macros = macros or {}
    for _ in range(10):  # macros may use macros
        words = text.split()
        if not any(w.startswith("@") and len(w) > 1 for w in words):
            break
        out = []
        for w in words:
            if w.startswith("@") and len(w) > 1:
                if w[1:] not in macros:
                    raise PatternError(f"pattern {text!r}: unknown macro {w}")
                out.append(macros[w[1:]])
            else:
                out.append(w)
        text = " ".join(out)
    return _Parser(text).parse()


# -- matching --------------------------------------------------------------------------------------


@dataclass
class MatchResult:
    """Outcome of matching words against a pattern."""

    ok: bool
    furthest: int = 0
    expected: set[str] = field(default_factory=set)
    prefix_ok: bool = False  # the words are a valid beginning of the pattern (all consumed, more wanted)


class _State:
    __slots__ = ("expected", "furthest", "steps")

    def __init__(self) -> None:
        self.furthest = -1
        self.expected: set[str] = set()
        self.steps = 0

    def fail(self, i: int, what: str) -> None:
        if i > self.furthest:
            self.furthest, self.expected = i, {what}
        elif i == self.furthest:
            self.expected.add(what)


def _m(node: object, toks: list[str], i: int, st: _State) -> Iterator[int]:  # noqa: C901
    st.steps += 1
    if st.steps > MAX_STEPS:
        raise TooComplex("command too complex to check")
    n = len(toks)
    if isinstance(node, Lit):
        if i < n and toks[i] in node.words:
            yield i + 1
        else:
            st.fail(i, node.label)
    elif isinstance(node, Typ):
        if i < n and node.check(toks[i]):
            yield i + 1
        else:
            st.fail(i, node.label)
    elif isinstance(node, Seq):
        yield from _seq(node.items, 0, toks, i, st)
    elif isinstance(node, Opt):
        yield from _m(node.node, toks, i, st)
        yield i
    elif isinstance(node, Alt):
        for o in node.options:
            yield from _m(o, toks, i, st)
    elif isinstance(node, OptSet):
        yield from _optset(node.options, frozenset(), toks, i, st)
    elif isinstance(node, Rep):
        yield from _rep(node.node, toks, i, st)
    elif isinstance(node, Rest):
        yield from range(n, i - 1, -1)
    else:  # pragma: no cover - compile_pattern builds only the classes above
        raise TypeError(node)


def _seq(items: tuple[object, ...], k: int, toks: list[str], i: int, st: _State) -> Iterator[int]:
    if k == len(items):
        yield i
        return
    for j in _m(items[k], toks, i, st):
        yield from _seq(items, k + 1, toks, j, st)


def _optset(options: tuple[object, ...], used: frozenset[int], toks: list[str], i: int, st: _State) -> Iterator[int]:
    for idx, o in enumerate(options):
        if idx in used:
            continue
        for j in _m(o, toks, i, st):
            if j > i:
                yield from _optset(options, used | {idx}, toks, j, st)
    yield i


def _rep(node: object, toks: list[str], i: int, st: _State) -> Iterator[int]:
    for j in _m(node, toks, i, st):
        if j > i:
            yield from _rep(node, toks, j, st)
    yield i


def match(pattern: Seq, words: list[str]) -> MatchResult:
    """Match ``words`` against a compiled pattern (full match).

    Raises:
        TooComplex: the step bound was reached.
    """
    st = _State()
    n = len(words)
    for j in _m(pattern, words, 0, st):
        if j == n:
            return MatchResult(ok=True, furthest=n)
        st.fail(j, "the end of the command (no more words)")
    return MatchResult(ok=False, furthest=max(st.furthest, 0), expected=st.expected, prefix_ok=st.furthest >= n)


def describe_failure(words: list[str], result: MatchResult, limit: int = 12) -> str:
    """``at 'foo' (word 5): expected one of a, b, <ifname> (...)`` or ``incomplete: expected ...``."""
    exp = sorted(result.expected)
    shown = ", ".join(exp[:limit]) + (f", ... ({len(exp) - limit} more)" if len(exp) > limit else "")
    if result.furthest >= len(words):
        return f"incomplete: after the last word expected {shown}"
    return f"at {words[result.furthest]!r} (word {result.furthest + 1}): expected {shown}"
