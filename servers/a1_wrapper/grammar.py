"""The A1 command grammar: which commands ``apply_config`` and ``execute_validation`` accept, and
how each becomes something to execute (pure logic; the data is ``allowlist.yaml`` and
``blocklist.yaml`` beside this module).

Every command is checked before anything runs, and a call is all-or-nothing at this stage: if
any command of any device is not allowed, nothing is applied and the error lists each bad
command with the forms allowed for its family. Accepted commands become either

- FRR configuration lines (family ``frr``), later fed to one vtysh session in configuration mode
  on the device's stdin (never a shell), tracked through FRR's modes so that each line is checked
  against the commands allowed in the mode it lands in; or
- argument lists (``ip``, ``nft``, probes, read-only forms) for ``Lab.exec``: the words of the
  command, matched against a token pattern, never a string for a shell.

The FRR mode model follows FRR's CLI: a line not found in the current node is looked up in the
enclosing nodes. It is an approximation (FRR may, say, keep a line in ``router bgp`` that the
model walked up to the top level for, or refuse a mode-entering line the model entered); FRR is
the final judge of where a line lands and answers in the echo. What the grammar guarantees is
that every line sent is an allowed command of an allowed mode, that no line carries shell or
control characters, and that nothing but vtysh's stdin and argv lists ever carries agent text.

Sources: NetConfArena section III-C (the compact interface: apply_config enters and leaves
configuration mode itself; execute_validation runs non-configuration commands such as show and
ping), FRR 8.4 CLI (modes and walk-up of unknown commands to the enclosing mode), ip-route(8),
ip-rule(8), nft(8), RFC 8986 / RFC 9800 (seg6local behaviours, NEXT-C-SID flavour).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from servers.a1_wrapper.patterns import MatchResult, Seq, TooComplex, compile_pattern, describe_failure, match

#: Bounds on one call.
MAX_LINE = 512
MAX_COMMANDS_PER_DEVICE = 500
#: `ip` first words that only iproute2 has (FRR's `ip ...` configuration commands are
#: `ip route PREFIX`, `ip address PREFIX`, `ip prefix-list`, `ip router isis`, `ip forwarding`).
_IP_KERNEL_OBJECTS = frozenset({
    "rule", "ru", "sr", "link", "l", "neigh", "neighbour", "neighbor", "n", "netns", "tunnel", "monitor",
    "xfrm", "nexthop", "nh", "maddr", "mroute", "tuntap", "token", "vrf", "ntable", "mptcp", "-batch",
})  # fmt: skip
_IP_VERBS = frozenset({"add", "del", "delete", "replace", "change", "append", "flush", "show", "list", "ls",
                       "get", "set", "save", "restore", "prepend", "test"})  # fmt: skip
_FILTERS = {"include": "include", "i": "include", "inc": "include", "exclude": "exclude", "e": "exclude",
            "exc": "exclude", "begin": "begin", "b": "begin", "grep": "include"}  # fmt: skip
PROBE_DEFAULTS = {
    "ping": [("-c", "5"), ("-i", "0.2"), ("-W", "1")],
    "traceroute": [("-n", None), ("-q", "1"), ("-w", "1"), ("-m", "16")],
}


@dataclass
class Command:
    """One accepted command, ready to run.

    ``family``: ``frr`` (a configuration line for vtysh), ``restate`` (a line of the running
    configuration outside what A1 manages, accepted only as a restatement of the device's
    current line: never sent), ``structure`` (``end`` / ``configure terminal``: apply_config
    enters and leaves configuration mode itself; never sent), ``comment``, the kernel families
    ``ip`` / ``nft`` (argv), and for validation ``show`` / ``probe`` / ``ipread`` / ``nftread``.
    """

    text: str = field(metadata={"doc": "The command as the agent wrote it (whitespace normalised)."})
    family: str = "frr"
    argv: list[str] | None = None  # kernel, probe and read-only forms
    mode: str | None = None  # FRR mode the line is applied in
    filter: tuple[str, str] | None = None  # validation output filter: (include|exclude|begin, text)
    #: FRR lines: the mode-entering lines in force when this line runs, outermost first (what
    #: must be sent again to reach its mode in a new vtysh session), and their indices in the plan
    ctx: tuple[str, ...] = ()
    ctx_index: tuple[int, ...] = ()
    negated: bool = False  # an FRR `no ...` line
    navigation: bool = False  # an FRR `exit` / `exit-address-family` / `quit` line
    index: int = -1  # position in the device's command list


@dataclass
class Problem:
    """One rejected command."""

    device: str
    index: int
    text: str
    reason: str
    help: str | None = None  # the allowed forms of the command's family, shown once per error

    def __str__(self) -> str:
        shown = self.text if len(self.text) <= 120 else self.text[:117] + "..."
        return f"{self.device} command {self.index + 1} {shown!r}: {self.reason}"


class GrammarError(ValueError):
    """Some commands are not allowed; ``problems`` lists each with what to fix."""

    def __init__(self, problems: list[Problem], hint: str = ""):
        self.problems = problems
        lines = [str(p) for p in problems[:12]]
        if len(problems) > 12:
            lines.append(f"... and {len(problems) - 12} more")
        helps: list[str] = []
        for p in problems:
            if p.help and p.help not in helps:
                helps.append(p.help)
        super().__init__("\n".join(lines + helps) + (f"\n{hint}" if hint else ""))


@dataclass
class FrrCommand:
    pattern: Seq
    text: str
    enters: str | None = None
    exits: bool = False
    no: bool = True
    example: str | None = None  # a line of this form; FRR 8.4 must parse it (tests/test_a1_grammar_frr.py)
    no_example: str | None = None  # its `no` form, when not "no " + example


@dataclass
class FrrMode:
    name: str
    title: str
    commands: list[FrrCommand]
    #: lines that reach this mode from the top level (for the FRR dry-run test)
    context: list[str] = field(default_factory=list)
    #: FRR commands of this mode that A1 does not offer: leading keywords -> why
    excluded: dict[str, str] = field(default_factory=dict)

    def exclusion(self, words: list[str]) -> tuple[str, str] | None:
        """(keywords, reason) of the exclusion covering a line's leading words, if any."""
        for key, why in self.excluded.items():
            kw = key.split()
            if [w.lower() for w in words[: len(kw)]] == kw:
                return key, why
        return None

    def keywords(self) -> list[str]:
        out: list[str] = []
        for c in self.commands:
            words = []
            for w in c.text.split()[:2]:
                if w.startswith(("<", "[", "(", "{", "...")):
                    break
                words.append(w)
            kw = " ".join(words)
            if kw and kw not in out:
                out.append(kw)
        return out


@dataclass
class FormFamily:
    name: str
    summary: str
    usage: list[str]
    forms: list[Seq]
    charset: re.Pattern[str] | None = None

    def match(self, words: list[str]) -> tuple[bool, MatchResult | None]:
        best: MatchResult | None = None
        for f in self.forms:
            r = match(f, words)
            if r.ok:
                return True, r
            if best is None or r.furthest > best.furthest:
                best = r
            elif r.furthest == best.furthest:
                best.expected |= r.expected
        return False, best

    def help(self) -> str:
        return f"allowed {self.name} forms ({self.summary}): " + " ; ".join(self.usage)


@dataclass
class BlockEntry:
    family: str
    pattern: Seq
    text: str
    why: str
    mode: str | None = None


def _charset(body: str) -> re.Pattern[str]:
    return re.compile(f"[{body}]*")


#: Unicode categories refused in FRR text: controls (C0, DEL, C1), surrogates (no UTF-8 form),
#: line and paragraph separators (they end a line in some readers). Everything else FRR stores
#: as UTF-8 bytes (descriptions, names), so A1 passes it on.
_FRR_REFUSED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})


def control_character_problem(raw: str) -> str | None:
    """Why ``raw`` may not be taken in any family -- it holds characters of
    :data:`_FRR_REFUSED_CATEGORIES` (a tab is whitespace) -- or None. Comment lines too: they are
    never sent, but they are echoed back and recorded, where a control character would garble
    the result (an escape sequence) or hide the lines after it."""
    bad = sorted({c for c in raw if c != "\t" and unicodedata.category(c) in _FRR_REFUSED_CATEGORIES})
    if not bad:
        return None
    shown = ", ".join(f"U+{ord(c):04X}" for c in bad[:6])
    return f"contains control characters ({shown}); send one command per line"


def frr_text_problem(raw: str) -> str | None:
    """Why a line may not go to vtysh, or None. What FRR 8.4's vtysh accepts as configuration
    text is accepted (any UTF-8: ``description Zürich–PoP ✓``); refused are the characters
    above (a tab is whitespace), a final ``?`` (vtysh answers it with help and configures
    nothing) and ``|`` followed by a space or the end (vtysh reads it as an output filter)."""
    bad = control_character_problem(raw)
    if bad:
        return bad
    text = raw.strip(" \t")
    if text.endswith("?"):
        return "ends with '?': vtysh answers a final '?' with help and configures nothing (put the '?' elsewhere)"
    if re.search(r"\|([ \t]|$)", text):
        return "contains '|' followed by a space or the end of the line: vtysh reads that as an output filter"
    return None


def frr_words(raw: str) -> list[str]:
    """A line's words as FRR splits them: on spaces and tabs only (a no-break space or other
    Unicode space is part of a word)."""
    return [w for w in re.split(r"[ \t]+", raw.strip(" \t")) if w]


def _bad_chars(text: str, charset: re.Pattern[str]) -> str:
    bad = sorted({c for c in text if not charset.fullmatch(c)})
    return "".join(repr(c)[1:-1] if c.isprintable() else f"\\x{ord(c):02x}" for c in bad)


def _data(name: str) -> str:
    return resources.files("servers.a1_wrapper").joinpath(name).read_text(encoding="utf-8")


class Grammar:
    """The loaded allowlist (and, for the ablation, the blocklist). Immutable after loading.

    Raises (constructor):
        PatternError / ValueError: a malformed data file.
    """

    def __init__(self, allowlist: dict[str, Any], blocklist: dict[str, Any] | None = None):
        macros = allowlist.get("macros", {})
        cs = {k: _charset(v) for k, v in allowlist["charsets"].items()}
        self.modes: dict[str, FrrMode] = {}
        for name, m in allowlist["frr"]["modes"].items():
            cmds = []
            for c in m["commands"]:
                spec = {"pattern": c} if isinstance(c, str) else dict(c)
                cmds.append(FrrCommand(
                    pattern=compile_pattern(spec["pattern"], macros), text=spec["pattern"], enters=spec.get("enters"),
                    exits=bool(spec.get("exits", False)), no=bool(spec.get("negatable", True)), example=spec.get("example"),
                    no_example=spec.get("no_example"),
                ))  # fmt: skip
            self.modes[name] = FrrMode(name, m.get("title", name), cmds, context=list(m.get("context", [])),
                                       excluded={" ".join(k.lower().split()): v for k, v in (m.get("excluded") or {}).items()})  # fmt: skip
        #: top-level lines of the running configuration outside what A1 manages, accepted only
        #: as restatements of the device's current line
        self.restatable = [compile_pattern(p, macros) for p in allowlist["frr"].get("restatable", [])]
        for mode in self.modes.values():
            for c in mode.commands:
                if c.enters and c.enters not in self.modes:
                    raise ValueError(f"FRR mode {mode.name}: {c.text!r} enters unknown mode {c.enters!r}")

        def families(section: str) -> dict[str, FormFamily]:
            out = {}
            for fname, f in allowlist[section].items():
                out[fname] = FormFamily(
                    name=fname, summary=f["summary"], usage=list(f["usage"]),
                    forms=[compile_pattern(p, macros) for p in f["forms"]],
                    charset=cs.get({"ipread": "ip", "nftread": "nft", "show": "frr"}.get(fname, fname)),
                )  # fmt: skip
            return out

        self.config_forms = families("config_forms")
        self.validation_forms = families("validation_forms")
        self.blocklist: list[BlockEntry] = []
        if blocklist:
            for e in blocklist.get("entries", []):
                self.blocklist.append(BlockEntry(
                    family=e["family"], pattern=compile_pattern(e["pattern"], macros), text=e["pattern"],
                    why=e["why"], mode=e.get("mode"),
                ))  # fmt: skip

    # -- loading ---------------------------------------------------------------------------------

    @classmethod
    def load(cls, blocklist: bool | str | Path = False, allowlist: str | Path | None = None) -> Grammar:
        """Load the packaged allowlist (or ``allowlist``), with the packaged blocklist when
        ``blocklist`` is True, or the blocklist file it names."""
        return _load(str(allowlist) if allowlist else None, str(blocklist) if not isinstance(blocklist, bool) else blocklist)

    # -- configuration ---------------------------------------------------------------------------

    def parse_config(self, device: str, lines: list[str], *, is_router: bool) -> list[Command]:
        """Check one device's configuration commands (apply_config).

        Raises:
            GrammarError: one or more commands are not allowed (each listed with what to fix).
        """
        problems: list[Problem] = []
        out: list[Command] = []
        counted = sum(1 for raw in lines if not (isinstance(raw, str) and _is_comment(raw)))
        if counted > MAX_COMMANDS_PER_DEVICE:
            raise GrammarError([Problem(device, MAX_COMMANDS_PER_DEVICE, "", f"too many commands ({counted}); "
                                        f"send at most {MAX_COMMANDS_PER_DEVICE} per device per call")])  # fmt: skip
        stack = _Stack()
        for i, raw in enumerate(lines):
            if not isinstance(raw, str):
                problems.append(Problem(device, i, repr(raw)[:60], "not a string"))
                continue
            if _is_comment(raw):
                why = control_character_problem(raw)
                if why:
                    problems.append(Problem(device, i, raw.strip(" \t")[:60], why))
                    continue
                out.append(Command(text=raw.strip(" \t"), family="comment", index=i))
                continue
            words = frr_words(raw)
            text = " ".join(words)
            if len(raw) > MAX_LINE:
                problems.append(Problem(device, i, text, f"longer than {MAX_LINE} characters"))
                continue
            if words[0] == "nft" or _is_kernel_ip(words):
                # a kernel command ends the current vtysh session: FRR lines after it start again
                # at the top configuration level
                stack.reset()
                if any(ord(c) < 32 and c not in " \t" or ord(c) == 127 for c in raw):
                    problems.append(Problem(device, i, text, "contains control characters; send one command per line"))
                    continue
                odd = sorted({c for c in raw if ord(c) > 127})
                if odd:  # before splitting: Python would split on Unicode spaces and drop them
                    shown = ", ".join(f"U+{ord(c):04X}" for c in odd[:6])
                    problems.append(Problem(device, i, text, f"characters not allowed in {words[0]} commands: {shown} "
                                                             "(ASCII only: each command is run as an argument list)"))  # fmt: skip
                    continue
                words = raw.split()
                cmd = self._kernel(device, i, " ".join(words), words, self.config_forms, problems)
                if cmd is not None:
                    cmd.index = i
                    out.append(cmd)
                continue
            if not is_router:
                problems.append(Problem(device, i, text, f"{device} is a host and runs no FRR; only the ip and nft forms "
                                                         "apply to it", help=self.config_forms["ip"].help()))  # fmt: skip
                continue
            why = frr_text_problem(raw)
            if why:
                problems.append(Problem(device, i, text, why))
                continue
            cmd = self._frr_line(device, i, text, words, stack, problems)
            if cmd is not None:
                cmd.index = i
                out.append(cmd)
        if problems:
            raise GrammarError(problems)
        return out

    def _kernel(self, device: str, i: int, text: str, words: list[str], families: dict[str, FormFamily],
                problems: list[Problem], family_name: str | None = None) -> Command | None:  # fmt: skip
        fam_name = family_name or ("nft" if words[0] == "nft" else "ip")
        fam = families[fam_name]
        assert fam.charset is not None
        bad = _bad_chars(text, fam.charset)
        if bad:
            problems.append(Problem(device, i, text, f"characters not allowed in {fam_name} commands: {bad} "
                                                     "(no shell syntax: each command is run as an argument list)"))  # fmt: skip
            return None
        if fam_name in ("nft", "nftread"):
            words = nft_words(text)
        try:
            ok, res = fam.match(words)
        except TooComplex as e:
            problems.append(Problem(device, i, text, str(e)))
            return None
        if not ok:
            detail = describe_failure(words, res) if res is not None else ""
            problems.append(Problem(device, i, text, f"not an allowed {fam_name} form ({detail})", help=fam.help()))
            return None
        if fam_name in ("ip", "nft"):
            blocked = self._blocked(fam_name, None, words)
            if blocked:
                problems.append(Problem(device, i, text, blocked))
                return None
        return Command(text=text, family=fam_name, argv=list(words))

    def _blocked(self, family: str, mode: str | None, words: list[str]) -> str | None:
        for e in self.blocklist:
            if e.family != family or (e.mode is not None and e.mode != mode):
                continue
            try:
                if match(e.pattern, words).ok:
                    return f"blocked by the destructive-command blocklist ({e.text!r}: {e.why})"
            except TooComplex:
                return "blocked: too complex to check against the blocklist"
        return None

    def _frr_line(self, device: str, i: int, text: str, words: list[str], stack: _Stack,
                  problems: list[Problem]) -> Command | None:  # fmt: skip
        w0 = words[0].lower()
        if w0 == "end" and len(words) == 1 or (len(words) <= 2 and "configure".startswith(w0) and len(w0) >= 4
                                                and (len(words) == 1 or "terminal".startswith(words[1].lower()))):  # fmt: skip
            # the frame of a pasted configuration (and show running-config's last line): apply_config
            # enters and leaves configuration mode itself, so these only return to the top level
            stack.reset()
            return Command(text=text, family="structure")
        if w0 in ("do", "show"):
            problems.append(Problem(device, i, text, "show commands are not configuration; run them with execute_validation"))
            return None
        if words == ["exit"] or words == ["quit"]:
            if stack.depth > 1:
                left = stack.names[-1]
                ctx = stack.ctx()
                stack.pop()
                return Command(text=text, family="frr", mode=left, ctx=ctx[0], ctx_index=ctx[1], navigation=True)
            problems.append(Problem(device, i, text, "'exit' at the top configuration level would leave configuration "
                                                     "mode; apply_config leaves it by itself at the end"))  # fmt: skip
            return None
        negate = w0 == "no"
        body = words[1:] if negate else words
        best: tuple[MatchResult, str] | None = None
        try:
            for depth in range(stack.depth - 1, -1, -1):
                mode = self.modes[stack.names[depth]]
                for c in mode.commands:
                    r = match(c.pattern, body)
                    ok = r.ok or (negate and c.no and bool(body) and r.prefix_ok and r.furthest >= 1)
                    if negate and not c.no:
                        ok = False
                    if ok:
                        blocked = self._blocked("frr", mode.name, words)
                        if blocked:
                            problems.append(Problem(device, i, text, blocked))
                            return None
                        stack.truncate(depth + 1)
                        ctx = stack.ctx()
                        cmd = Command(text=text, family="frr", mode=mode.name, ctx=ctx[0], ctx_index=ctx[1],
                                      negated=negate, navigation=c.exits and not negate)  # fmt: skip
                        if not negate and c.exits and stack.depth > 1:
                            stack.pop()
                        elif not negate and c.enters:
                            stack.push(c.enters, text, i)
                        return cmd
                    if r.furthest >= 1 and (best is None or r.furthest > best[0].furthest):
                        best = (r, mode.title)
                excluded = mode.exclusion(body)
                if excluded is not None:
                    restated = self._restatable(body if not negate else words, depth)
                    if restated:
                        stack.truncate(1)
                        return Command(text=text, family="restate", mode="config")
                    problems.append(Problem(device, i, text, f"'{excluded[0]}' is outside what A1 manages: {excluded[1]}"
                                            + (" (a line show running-config prints is accepted as it is, unchanged)"
                                               if self._restatable(body, 0, any_depth=True) else "")))  # fmt: skip
                    return None
        except TooComplex as e:
            problems.append(Problem(device, i, text, str(e)))
            return None
        here = self.modes[stack.names[-1]]
        top = self.modes["config"]
        detail = ""
        if best is not None:
            detail = f" ({describe_failure(body, best[0])})"
        allowed = f"FRR commands allowed in {here.title} mode: {', '.join(here.keywords())}"
        if here is not top:
            allowed += f"; at the top level: {', '.join(top.keywords())}"
        allowed += " (each may be preceded by 'no'). Kernel state uses the ip and nft forms."
        problems.append(Problem(device, i, text, f"not an allowed FRR configuration command in {here.title} mode{detail}",
                                help=allowed))  # fmt: skip
        return None

    def _restatable(self, words: list[str], depth: int, any_depth: bool = False) -> bool:
        """The line is one of the top-level lines A1 accepts only as a restatement."""
        if depth != 0 and not any_depth:
            return False
        try:
            return any(match(p, words).ok for p in self.restatable)
        except TooComplex:
            return False

    # -- validation ------------------------------------------------------------------------------

    def parse_validation(self, device: str, lines: list[str], *, is_router: bool) -> list[Command]:
        """Check one device's validation commands (execute_validation): read-only forms only.

        Raises:
            GrammarError: one or more commands are not allowed.
        """
        problems: list[Problem] = []
        out: list[Command] = []
        if len(lines) > MAX_COMMANDS_PER_DEVICE:
            raise GrammarError([Problem(device, MAX_COMMANDS_PER_DEVICE, "", f"too many commands ({len(lines)}); "
                                        f"send at most {MAX_COMMANDS_PER_DEVICE} per device per call")])  # fmt: skip
        for i, raw in enumerate(lines):  # noqa: PLR1702
            if not isinstance(raw, str):
                problems.append(Problem(device, i, repr(raw)[:60], "not a string"))
                continue
            text = " ".join(frr_words(raw))
            if not text:
                continue
            if len(raw) > MAX_LINE:
                problems.append(Problem(device, i, text, f"longer than {MAX_LINE} characters"))
                continue
            if any(c != "\t" and unicodedata.category(c) in _FRR_REFUSED_CATEGORIES for c in raw):
                problems.append(Problem(device, i, text, "contains control characters; send one command per line"))
                continue
            flt = None
            cmd_text = text
            if "|" in text:
                cmd_text, _, rest = text.partition("|")
                cmd_text = cmd_text.strip()
                fw = rest.split(None, 1)
                if len(fw) != 2 or fw[0] not in _FILTERS or "|" in fw[1]:
                    problems.append(Problem(device, i, text, "after '|' only one filter is allowed: "
                                                             "| include TEXT, | exclude TEXT or | begin TEXT"))  # fmt: skip
                    continue
                flt = (_FILTERS[fw[0]], fw[1].strip())
            words = cmd_text.split()
            if not words:
                problems.append(Problem(device, i, text, "empty command before '|'"))
                continue
            w0 = words[0]
            fam_name = {"show": "show", "sh": "show", "ping": "probe", "ping6": "probe", "traceroute": "probe",
                        "traceroute6": "probe", "ip": "ipread", "nft": "nftread"}.get(w0)  # fmt: skip
            if fam_name is None:
                problems.append(Problem(device, i, text, "not a read-only command", help=(
                    "execute_validation accepts: " + " | ".join(u for f in self.validation_forms.values() for u in f.usage)
                    + ". Configuration goes through apply_config.")))  # fmt: skip
                continue
            if fam_name == "show":
                if not is_router:
                    problems.append(Problem(device, i, text, f"{device} is a host and runs no FRR: use ping, traceroute, "
                                                             "ip ... show or nft list there"))  # fmt: skip
                    continue
                why = frr_text_problem(cmd_text)
                if why:
                    problems.append(Problem(device, i, text, why))
                    continue
                words = frr_words(cmd_text)
                words[0] = "show"
                out.append(Command(text=text, family="show", argv=None, filter=flt, mode=None))
                out[-1].argv = words
                continue
            cmd = self._kernel(device, i, cmd_text, words, self.validation_forms, problems, family_name=fam_name)
            if cmd is None:
                continue
            if fam_name == "probe":
                cmd.argv = with_probe_defaults(cmd.argv or words)
            cmd.text, cmd.filter = text, flt
            out.append(cmd)
        if problems:
            raise GrammarError(problems)
        return out


class _Stack:
    """FRR's mode stack while checking lines: mode names, and for each entered mode the line
    (and its index) that entered it."""

    def __init__(self) -> None:
        self.names = ["config"]
        self.lines: list[tuple[str, int]] = []

    @property
    def depth(self) -> int:
        return len(self.names)

    def reset(self) -> None:
        self.truncate(1)

    def truncate(self, depth: int) -> None:
        del self.names[depth:]
        del self.lines[depth - 1 :]

    def push(self, mode: str, line: str, index: int) -> None:
        self.names.append(mode)
        self.lines.append((line, index))

    def pop(self) -> None:
        self.truncate(self.depth - 1)

    def ctx(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        return tuple(t for t, _ in self.lines), tuple(k for _, k in self.lines)


def _is_comment(raw: str) -> bool:
    """An empty line, or a comment: FRR ignores lines whose first character is '!' or '#'."""
    text = raw.strip(" \t")
    return not text or text[0] in "!#"


def _is_kernel_ip(words: list[str]) -> bool:
    if words[0] != "ip" or len(words) < 2:
        return False
    w1 = words[1]
    if w1.startswith("-") or w1 in _IP_KERNEL_OBJECTS:
        return True
    return w1 in ("route", "ro", "r", "address", "addr", "a") and len(words) >= 3 and words[2] in _IP_VERBS


def nft_words(text: str) -> list[str]:
    """Words of an nft command: ``{`` ``}`` and ``;`` are words of their own, and so are commas
    inside braces (nft joins its arguments with spaces, so the meaning is unchanged)."""
    out: list[str] = []
    cur = ""
    depth = 0
    for ch in text:
        if ch.isspace() or ch in "{};" or (ch == "," and depth > 0):
            if cur:
                out.append(cur)
                cur = ""
            if ch in "{};,":
                out.append(ch)
                depth += 1 if ch == "{" else -1 if ch == "}" else 0
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def with_probe_defaults(argv: list[str]) -> list[str]:
    """A probe's argv with the bounding defaults it lacks (ping: -c 5 -i 0.2 -W 1; traceroute:
    -n -q 1 -w 1 -m 16), so that no probe runs unbounded."""
    prog = argv[0].rstrip("6")
    have = set(argv[1:])
    extra: list[str] = []
    for flag, value in PROBE_DEFAULTS.get(prog, []):
        if flag not in have:
            extra += [flag] if value is None else [flag, value]
    return [argv[0], *extra, *argv[1:]]


@functools.cache
def _load(allowlist: str | None, blocklist: bool | str) -> Grammar:
    allow = yaml.safe_load(Path(allowlist).read_text() if allowlist else _data("allowlist.yaml"))
    block = None
    if blocklist is True:
        block = yaml.safe_load(_data("blocklist.yaml"))
    elif isinstance(blocklist, str):
        block = yaml.safe_load(Path(blocklist).read_text())
    return Grammar(allow, block)


def apply_filter(text: str, flt: tuple[str, str] | None) -> str:
    """Cisco/FRR-style output filter, as plain substring matching (no regular expressions, so an
    agent cannot make the server spin): include / exclude keep or drop lines containing the text;
    begin starts at the first line containing it."""
    if flt is None:
        return text
    op, needle = flt
    lines = text.splitlines()
    if op == "include":
        lines = [ln for ln in lines if needle in ln]
    elif op == "exclude":
        lines = [ln for ln in lines if needle not in ln]
    else:
        for k, ln in enumerate(lines):
            if needle in ln:
                lines = lines[k:]
                break
        else:
            lines = []
    return "\n".join(lines) + ("\n" if lines else "")
