"""Classifying raw shell commands for the process metrics (pure functions).

A0 has a single action, ``run_shell``, so the ``kind`` NetConfArena's metrics need (III-D: error
and repeat rates over configuration and validation actions) has to be inferred from the command.
The rule is conservative: a command is ``validation`` only when every simple command in it is a
known read-only program used in a read-only way (``show``-only vtysh, ``ip ... show``, ``ping``,
``cat``, ...) and nothing is redirected into a file; anything else is ``config``.

Likewise "rejected by the device" (the record's ``is_error``) cannot be read off a shell's exit
status alone (a failed ping is a result, not a rejection). A call is counted as rejected when the
shell could not run the program (exit 126/127), when FRR refused a command (its ``% Unknown
command`` family of messages), or when a ``config`` command exited non-zero.
"""

from __future__ import annotations

import re
import shlex

#: Programs that only read state whatever their arguments (bounded list, data-like).
READ_ONLY_PROGRAMS = frozenset({
    "cat", "ls", "head", "tail", "grep", "egrep", "fgrep", "wc", "echo", "printf", "hostname", "ps", "pgrep",
    "ping", "ping6", "traceroute", "traceroute6", "tracepath", "mtr", "ss", "netstat", "tcpdump", "sort", "uniq",
    "cut", "awk", "tr", "jq", "date", "uptime", "free", "df", "id", "whoami", "true", "false", "pwd",
    "which", "type", "stat", "file", "less", "more", "column", "nl", "seq", "sleep", "test", "[", "md5sum",
    "sha256sum", "diff", "cmp", "find", "uname", "arp", "route", "ifconfig", "nstat", "lsof", "dmesg", "journalctl",
    "exit", ":",
})  # fmt: skip
#: `ip` objects and the verbs that only read.
_IP_READ_VERBS = frozenset({"show", "list", "ls", "lst", "get", "help", "monitor"})
_FRR_REJECTION = re.compile(r"^% (Unknown command|Invalid input|Command incomplete|Ambiguous command|"
                            r"Configuration failed|Failed to edit configuration)", re.M)  # fmt: skip
_SPLIT = re.compile(r"\|\||&&|[;|&\n]")


def _simple_commands(command: str) -> list[list[str]] | None:
    """The simple commands of a shell line as word lists, or None when it cannot be parsed."""
    out = []
    for part in _SPLIT.split(command):
        part = part.strip()
        if not part:
            continue
        try:
            words = shlex.split(part, comments=True)
        except ValueError:
            return None
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]  # VAR=value prefixes
        if words and words[0] in ("sudo", "timeout", "nice", "command", "exec", "time", "env"):
            words = [w for w in words[1:] if not re.fullmatch(r"-\S*|\d+(\.\d+)?[smh]?|[A-Za-z_][A-Za-z0-9_]*=.*", w)] or words
        if words:
            out.append(words)
    return out


def _read_only(words: list[str]) -> bool:
    prog = words[0].rsplit("/", 1)[-1]
    args = words[1:]
    if prog in READ_ONLY_PROGRAMS:
        if prog == "find" and any(a in ("-delete", "-exec", "-execdir", "-fprint", "-fprintf", "-fls") for a in args):
            return False
        if prog in ("sort",) and any(a.startswith("-o") for a in args):
            return False
        if prog == "awk" and any(x in a for a in args for x in ("system", "getline", ">", "|")):
            return False  # awk can run commands and write files
        return True
    if prog in ("ip", "bridge"):
        if any(a in ("-batch", "-b", "-force") for a in args):
            return False  # commands read from a file or stdin: may write
        rest = [a for a in args if not a.startswith("-")]
        if len(rest) <= 1:
            return True  # `ip route` / `ip -6 addr`: show is the default verb
        return rest[1] in _IP_READ_VERBS or (rest[0] == "sr" and rest[-1] == "show")
    if prog == "vtysh":
        cmds = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-c", "--command")]
        return bool(cmds) and all(c.strip().split()[0] in ("show", "sh") for c in cmds if c.strip())
    if prog == "nft":
        rest = [a for a in args if not a.startswith("-")]
        return bool(rest) and rest[0] in ("list", "describe")
    if prog in ("iptables", "ip6tables", "iptables-save", "ip6tables-save"):
        return prog.endswith("-save") or any(a in ("-L", "-S", "--list", "--list-rules") for a in args)
    if prog == "sysctl":
        return not any(a in ("-w", "--write", "-p", "--load") or "=" in a for a in args)
    if prog == "ethtool":
        return not any(a.startswith("-s") or a.startswith("-K") or a.startswith("-G") for a in args)
    if prog == "sed":
        return not any(a.startswith("-i") or a == "--in-place" for a in args)
    return False


def classify_shell(command: object) -> str:
    """``validation`` for a read-only command line, ``config`` for anything else (see module
    docstring). Non-strings and unparsable lines are ``config``."""
    if not isinstance(command, str) or not command.strip():
        return "config"
    # output redirection into a file writes state (2>/dev/null and >&2 do not)
    stripped = re.sub(r"\d?>>?\s*/dev/null|\d?>&\d", "", command)
    if re.search(r"(?<![<>=!])>", stripped) or "tee " in stripped:
        return "config"
    if "$(" in stripped or "`" in stripped or "<(" in stripped:
        return "config"  # a command inside a command: whatever it runs may write (conservative)
    cmds = _simple_commands(stripped)
    if not cmds:
        return "config"
    return "validation" if all(_read_only(w) for w in cmds) else "config"


def shell_rejected(kind: str, exit_status: int, output: str) -> str | None:
    """Why the device rejected a shell command, or None (see module docstring)."""
    if exit_status in (126, 127):
        return f"the shell could not run the program (exit {exit_status})"
    m = _FRR_REJECTION.search(output)
    if m:
        return f"FRR refused a command: {m.group(0)}"
    if kind == "config" and exit_status != 0:
        return f"exit status {exit_status}"
    return None
