"""Talking to FRR line by line, each line's answer taken from FRR itself, with nothing that
depends on a terminal (pure parsing + the loop around one exec per batch).

A batch runs as one vtysh process given its lines as arguments -- ``vtysh -E -c L1 -c L2 ...``:
no terminal, no line editor, no shell. vtysh runs the ``-c`` commands in order in one session,
prints each after the prompt before its answer (``-E``), and stops at the first command FRR
refuses, exiting with status 1 (FRR 8.4 ``vtysh/vtysh_main.c``). So every line echoed before
the last one was accepted; the last echoed line was refused when the status is not 0 (its answer
is what FRR printed after it, and on stderr, e.g. ``bgpd is not running``, or nothing: some
refusals are silent); lines never echoed were not run. The rest of the batch then runs in a new
vtysh process that first re-enters the mode it belongs to (the caller's ``preamble``). A line's
answer does not depend on its length or on any terminal width (a pasted session through vtysh's
line editor scrolls long lines sideways, which made their echo unrecognisable).

The same loop runs ``show`` commands for execute_validation (no preamble).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

#: vtysh's prompt: ``HOST# `` or ``HOST(MODE)# `` (FRR lib/command.c node prompts).
_PROMPT = re.compile(r"[^\s()#]+(\([^\s()]*\))?# ")

Status = str  # "accepted" | "refused" | "not_run" | "unknown"


@dataclass
class Answer:
    """One line and FRR's answer to it.

    ``status``: ``accepted`` (FRR went on past it), ``refused`` (FRR stopped at it: status 1),
    ``not_run`` (never sent, or vtysh stopped before it; ``output`` says why), ``unknown``
    (the session was killed while it ran: it may or may not have taken effect).
    """

    command: str
    status: Status
    prompt: str = ""
    output: str = ""

    @property
    def warning(self) -> str:
        """FRR's ``%`` lines (and what follows them) in an accepted line's answer, or ""."""
        lines = self.output.splitlines()
        for k, ln in enumerate(lines):
            if ln.startswith("%"):
                return " ".join(x.strip() for x in lines[k:] if x.strip())[:600]
        return ""

    @property
    def message(self) -> str:
        """FRR's answer in one line (bounded), or ""."""
        return " ".join(x.strip() for x in self.output.splitlines() if x.strip())[:600]


def split_echo(sent: list[str], stdout: str) -> list[tuple[str, str]]:
    """(prompt, answer) of each command of ``sent`` that ``vtysh -E`` echoed, in order: an echo
    is a line that is exactly a prompt followed by the next command sent; the answer is what
    follows it up to the next echo."""
    out: list[tuple[str, list[str]]] = []
    k = 0
    for ln in stdout.split("\n"):
        if k < len(sent):
            cmd = sent[k]
            if ln.endswith(cmd) and _PROMPT.fullmatch(ln[: len(ln) - len(cmd)]):
                out.append((ln[: len(ln) - len(cmd)], []))
                k += 1
                continue
        if out:
            out[-1][1].append(ln)
    return [(p, "\n".join(body).strip("\n")) for p, body in out]


def argv_for(sent: list[str]) -> list[str]:
    """The vtysh command line that runs ``sent`` in one session, echoing each command."""
    return ["vtysh", "-E", *chain.from_iterable(("-c", c) for c in sent)]


def run_lines(
    run: Callable[[list[str]], Any],
    lines: list[str],
    *,
    preamble: Callable[[int, list[Answer | None]], list[str] | str] = lambda i, answers: [],
    cancel: threading.Event | None = None,
) -> list[Answer]:
    """Run ``lines`` through vtysh and return one :class:`Answer` per line.

    Args:
        run: runs an argv in the device and returns a ``substrate.process.ExecResult``.
        lines: the lines, in order.
        preamble: for line ``i`` (and the answers so far), the commands that reach its mode in a
            new session (e.g. ``["configure terminal", "router isis CORE"]``), or a reason not
            to run it.
        cancel: stop before starting a new session when set (and the exec kills the running one).
    """
    n = len(lines)
    answers: list[Answer | None] = [None] * n
    failed: dict[tuple[str, ...], str] = {}  # a preamble that failed -> why
    i = 0

    def rest(start: int, status: Status, why: str) -> None:
        for j in range(start, n):
            if answers[j] is None:
                answers[j] = Answer(lines[j], status, output=why)

    while i < n:
        if cancel is not None and cancel.is_set():
            rest(i, "not_run", "not run: the call was cancelled")
            break
        pre = preamble(i, answers)
        if isinstance(pre, str):
            answers[i] = Answer(lines[i], "not_run", output=pre)
            i += 1
            continue
        if tuple(pre) in failed:
            answers[i] = Answer(lines[i], "not_run", output=failed[tuple(pre)])
            i += 1
            continue
        sent = [*pre, *lines[i:]]
        r = run(argv_for(sent))
        echoes = split_echo(sent, r.stdout)
        stopped = "timed out" if r.timed_out else "cancelled" if getattr(r, "cancelled", False) else ""
        err = r.stderr.strip()
        if len(echoes) <= len(pre):
            if not stopped and r.returncode != 0 and echoes:
                bad, (_, said) = pre[len(echoes) - 1], echoes[-1]
                why = " ".join((said + " " + err).split()) or f"refused without a message (vtysh exit status {r.returncode})"
                failed[tuple(pre)] = f"not run: entering its mode with {bad!r} failed: {why[:400]}"
                answers[i] = Answer(lines[i], "not_run", output=failed[tuple(pre)])
                i += 1
                continue
            why = stopped or f"vtysh exit status {r.returncode}"
            rest(i, "not_run", f"not run: the FRR session ended before this line ({why}{': ' + err[:300] if err else ''})")
            break
        done = len(echoes) - len(pre)
        for j in range(done):
            prompt, said = echoes[len(pre) + j]
            answers[i + j] = Answer(lines[i + j], "accepted", prompt, said)
        last = answers[i + done - 1]
        assert last is not None
        if stopped:
            last.status = "unknown"
            last.output = (last.output + f"\n% {stopped}: the FRR session was killed while this line ran; it may or "
                           "may not have taken effect").strip("\n")  # fmt: skip
            rest(i + done, "not_run", f"not run: the FRR session was {'killed' if stopped == 'cancelled' else stopped}")
            break
        if r.returncode != 0:
            last.status = "refused"
            if err:
                last.output = (last.output + "\n" + err).strip("\n")
            i += done
            continue
        if i + done < n:
            rest(i + done, "not_run", "not run: the FRR session ended before this line")
            break
        i = n
    return [a if a is not None else Answer(lines[k], "not_run", output="not run") for k, a in enumerate(answers)]
