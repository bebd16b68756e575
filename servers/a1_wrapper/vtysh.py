"""Talking to FRR the way an operator's terminal does: one vtysh session per batch of lines, fed
on stdin, and its transcript split back into per-command responses (pure parsing + one exec).

vtysh reading a non-terminal stdin behaves like an interactive session: it prints the prompt and
each line it reads (``r1(config-router)# net 49.0001...``), then the response, and it carries on
after a rejected line, as a router does when configuration is pasted. That is NetConfArena's
"command-by-command echo, including acceptance or rejection messages" (section III-C), from the
real device. FRR reports a rejected command with lines beginning ``%`` (``% Unknown command``,
``% Invalid input``, ``% Configuration failed.``, ``% Failed to edit configuration.``, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PROMPT = re.compile(r"^[A-Za-z0-9_.-]+(\([A-Za-z0-9_.-]+\))?# ?")
_BARE = re.compile(r"[A-Za-z0-9_.-]+(\([A-Za-z0-9_.-]+\))?# ?")


@dataclass
class LineResult:
    """One line sent to vtysh and what FRR answered."""

    command: str
    prompt: str  # e.g. "r1(config-router)# " ("" when the echo was not found)
    output: str
    rejected: bool
    answered: bool = True  # False when vtysh ended before reaching this line

    @property
    def message(self) -> str:
        """The rejection text (FRR's % lines and what follows them), or ""."""
        if not self.rejected:
            return ""
        if not self.answered:
            return self.output
        lines = self.output.splitlines()
        for k, ln in enumerate(lines):
            if ln.startswith("%"):
                return " ".join(x.strip() for x in lines[k:] if x.strip())[:600]
        return self.output.strip()[:600]


def parse_transcript(sent: list[str], transcript: str) -> tuple[list[LineResult], str]:
    """Split a vtysh stdin-session transcript into per-line results.

    Args:
        sent: the lines fed to vtysh, in order.
        transcript: vtysh's stdout (banner, then ``PROMPT# LINE`` echoes and responses).

    Returns:
        The per-line results (unanswered ones marked, e.g. when vtysh died) and the transcript
        without the banner and the final bare prompt, as a router session would show it.
    """
    lines = transcript.splitlines()
    # echo positions, found in order
    pos: list[tuple[int, str]] = []
    k = 0
    for idx, ln in enumerate(lines):
        if k >= len(sent):
            break
        m = _PROMPT.match(ln)
        if m and ln[m.end() :].strip() == sent[k].strip():
            pos.append((idx, m.group(0)))
            k += 1
    results: list[LineResult] = []
    for j, cmd in enumerate(sent):
        if j >= len(pos):
            results.append(LineResult(cmd, "", "no answer: the FRR session ended before this line", True, answered=False))
            continue
        start = pos[j][0] + 1
        end = pos[j + 1][0] if j + 1 < len(pos) else len(lines)
        body = lines[start:end]
        if j + 1 >= len(pos):  # after the last echo: drop the trailing bare prompt(s)
            while body and _BARE.fullmatch(body[-1]):
                body.pop()
        out = "\n".join(body)
        rejected = any(b.startswith("%") for b in body)
        results.append(LineResult(cmd, pos[j][1], out + ("\n" if out else ""), rejected))
    first = pos[0][0] if pos else len(lines)
    shown = lines[first:]
    while shown and _BARE.fullmatch(shown[-1]):
        shown.pop()
    return results, "\n".join(shown) + ("\n" if shown else "")
