"""apply_config on one device: every command's outcome as the device decided it.

Each command ends in one of:

- ``applied``: the device accepted it and its configuration changed;
- ``unchanged``: the device accepted it and already had it (a line of its running
  configuration sent again, a route that is already there): nothing changed, nothing is wrong;
- ``rejected``: it did not take effect -- the device refused it (FRR's or the kernel tool's
  message; some FRR refusals are silent: "refused without a message"), or it was accepted but
  changed nothing where it had to (a ``no`` line or a delete whose target does not exist), or it
  was not run (its mode could not be entered, the session ended, the call was cancelled).

FRR lines run through :mod:`servers.a1_wrapper.vtysh` (FRR's own per-line answer; no terminal).
Where FRR's answer does not say whether anything changed, the daemons' running configurations
are read back through their vty sockets before and after: a ``no`` line that is not itself a
line of the running configuration runs alone between two read-backs, so "accepted, but there was
nothing to remove" is told apart from a removal; a line already present in the running
configuration (same mode, same text) is ``unchanged``; a batch that left the configuration as it
was is ``unchanged`` throughout. Kernel commands: :mod:`servers.a1_wrapper.kernel`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from servers.a1_wrapper import kernel as k
from servers.a1_wrapper.grammar import Command
from servers.a1_wrapper.vtysh import Answer, run_lines
from substrate.devstate import DeviceState, capture

Outcome = str  # applied | unchanged | rejected


class Rejection(BaseModel):
    command: str
    message: str


class DeviceApply(BaseModel):
    """What apply_config did on one device."""

    snapshot_id: str | None = Field(description="Snapshot of the device taken just before; give it to rollback to undo.")
    echo: str = Field(description="The device's command-by-command echo (prompt, command, the device's answer).")
    applied: list[str] = Field(description="Commands that changed the device.")
    unchanged: list[str] = Field(description="Commands the device accepted that changed nothing: it already had them "
                                             "(e.g. lines of its own running configuration sent again).")  # fmt: skip
    rejected: list[Rejection] = Field(description="Commands that did not take effect, with why: refused by the device, "
                                                  "changed nothing where they had to (a 'no' line or delete whose target "
                                                  "does not exist), or not run.")  # fmt: skip
    error: str | None = Field(default=None, description="Set when the device could not be configured at all.")


def config_lines(text: str | None) -> set[tuple[tuple[str, ...], str]]:
    """The lines of an FRR running configuration, each with the block heads it sits in:
    ``(("router isis CORE",), "net 49.0001...")``. Separators (``!``, ``exit``, ``end``) are left out."""
    out: set[tuple[tuple[str, ...], str]] = set()
    stack: list[tuple[int, str]] = []
    for raw in (text or "").splitlines():
        line = " ".join(raw.split())
        if not line or line in ("!", "exit", "exit-address-family", "end"):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        out.add((tuple(h for _, h in stack), line))
        stack.append((indent, line))
    return out


def _lines_of(daemons: dict[str, str] | None) -> set[tuple[tuple[str, ...], str]]:
    out: set[tuple[tuple[str, ...], str]] = set()
    for text in (daemons or {}).values():
        out |= config_lines(text)
    return out


@dataclass
class Result:
    cmd: Command
    outcome: Outcome
    message: str = ""


class DeviceRun:
    """Applies one device's accepted plan (runs in a worker thread; never raises).

    Args:
        lab: the lab. device: node name. state: the snapshot taken just before (FRR daemons'
        configurations and kernel state). opts: the A1 options. cancel: the call's cancel event.
    """

    def __init__(self, lab: Any, device: str, state: DeviceState, opts: Any, cancel: threading.Event | None):
        self.lab, self.device, self.opts, self.cancel = lab, device, opts, cancel
        self.frr = dict(state.frr_daemons or {})
        self.kernel_state = state
        self.kernel_dirty = False
        self.results: list[Result] = []
        self.echo: list[str] = []

    # -- the plan ----------------------------------------------------------------------------

    def run(self, plan: list[Command]) -> DeviceApply:
        try:
            group: list[Command] = []
            for c in [*plan, None]:
                if c is not None and c.family in ("frr", "comment"):
                    if c.family == "frr":  # comments (FRR's '!' separators) do not end a stretch of FRR lines
                        group.append(c)
                    continue
                if group:
                    self._frr_group(group)
                    group = []
                if c is None or c.family == "comment":
                    continue
                if self.cancel is not None and self.cancel.is_set():
                    self._add(c, "rejected", "not run: the call was cancelled", f"{self.device}# {c.text}")
                elif c.family in ("structure", "restate"):
                    self._add(c, "unchanged" if c.family == "restate" else "structure",
                              "restates the device's current line (not sent)" if c.family == "restate" else "")
                    self.echo.append(f"{self.device}(config)# {c.text}\n% (anibench) "
                                     + ("unchanged: restates the device's current line; not sent" if c.family == "restate"
                                        else "not sent: apply_config enters and leaves configuration mode itself"))  # fmt: skip
                else:
                    self._kernel(c)
        except Exception as e:  # noqa: BLE001 - a device failure is data in this device's result
            done = {id(r.cmd) for r in self.results}
            for c in plan:
                if c.family not in ("comment",) and id(c) not in done:
                    self._add(c, "rejected", f"not run: the device failed ({e})")
            return self._result(error=f"the device could not be configured: {e}")
        return self._result()

    def _add(self, c: Command, outcome: str, message: str = "", echo: str | None = None) -> None:
        self.results.append(Result(c, outcome, message))
        if echo is not None:
            self.echo.append(echo)

    def _result(self, error: str | None = None) -> DeviceApply:
        shown = [r for r in self.results if r.outcome != "structure" and not (r.cmd.navigation and r.outcome == "unchanged")]
        return DeviceApply(
            snapshot_id=None, echo="\n".join(self.echo) + ("\n" if self.echo else ""),
            applied=[r.cmd.text for r in shown if r.outcome == "applied"],
            unchanged=[r.cmd.text for r in shown if r.outcome == "unchanged"],
            rejected=[Rejection(command=r.cmd.text, message=r.message[:600]) for r in shown if r.outcome == "rejected"],
            error=error,
        )  # fmt: skip

    # -- FRR ---------------------------------------------------------------------------------

    def _read_frr(self) -> dict[str, str]:
        return self.lab.frr_daemon_configs(self.device)

    def _frr_group(self, cmds: list[Command]) -> None:
        """One stretch of FRR lines: segments between read-backs, a `no` line that is not a line
        of the running configuration alone in its segment."""
        present = _lines_of(self.frr)
        segments: list[list[Command]] = []
        after_alone = True
        for c in cmds:
            alone = c.negated and (c.ctx, c.text) not in present
            if alone or after_alone:
                segments.append([c])
            else:
                segments[-1].append(c)
            after_alone = alone
        status: dict[int, Answer] = {}  # plan index -> answer, across segments
        self.echo.append(f"{self.device}# configure terminal")
        for seg in segments:
            self._frr_segment(seg, status)

    def _frr_segment(self, seg: list[Command], status: dict[int, Answer]) -> None:
        before = self.frr
        by_index = {c.index: c for c in seg}

        def preamble(i: int, answers: list[Answer | None]) -> list[str] | str:
            c = seg[i]
            for idx, line in zip(c.ctx_index, c.ctx, strict=True):
                a = status.get(idx)
                if a is None and idx in by_index:
                    a = answers[seg.index(by_index[idx])]
                if a is not None and a.status != "accepted":
                    return f"not run: the line that enters its mode ({line!r}) did not take effect"
            return ["configure terminal", *c.ctx]

        answers = run_lines(
            lambda argv: self.lab.exec(self.device, argv, timeout_s=self.opts.vtysh_timeout_s,
                                       max_output=self.opts.max_output_bytes, cancel=self.cancel),
            [c.text for c in seg], preamble=preamble, cancel=self.cancel,
        )  # fmt: skip
        after = self._read_frr()
        self.frr = after
        changed = after != before
        was, now = _lines_of(before), _lines_of(after)
        # changes no line of the segment accounts for word for word (FRR stores a line in another
        # form, or a line replaced a value): a line whose mode they are in may have made them
        explained = {(c.ctx, c.text[3:] if c.negated else c.text) for c in seg}
        unexplained = {e for e in (now ^ was) if e not in explained}
        # daemons this router runs that did not answer the read-back: vtysh skips a daemon that is
        # down without a word when the line also belongs to other daemons
        down = sorted(set(self.lab.state(self.device).daemons) - set(after))
        for c, a in zip(seg, answers, strict=True):
            status[c.index] = a
            key = (c.ctx, c.text)
            said = a.output if a.status != "not_run" else f"% {a.output}"
            shown = f"{a.prompt or self.device + '(config)# '}{c.text}" + (f"\n{said}" if said else "")
            touched = any(ctx == c.ctx or ctx[: len(c.ctx) + 1] == (*c.ctx, c.text) for ctx, _ in unexplained)
            outcome, why = self._frr_outcome(c, a, changed=changed, was=key in was, now=key in now, down=down,
                                             touched=touched)  # fmt: skip
            if outcome == "rejected" and a.status == "accepted":
                shown += f"\n% (anibench) {why}"
            self._add(c, outcome, why, shown)

    @staticmethod
    def _frr_outcome(c: Command, a: Answer, *, changed: bool, was: bool, now: bool,  # noqa: PLR0911
                     down: list[str] | tuple[str, ...] = (), touched: bool = False) -> tuple[Outcome, str]:  # fmt: skip
        """A line's outcome from FRR's answer and the read-back around its segment: ``changed``
        (the daemons' configurations differ), ``was``/``now`` (the line, in its mode, is in the
        running configuration before/after), ``touched`` (the segment changed something in the
        line's mode that no line accounts for word for word), ``down`` (daemons not answering)."""
        if a.status == "refused":
            return "rejected", a.message or "FRR refused it without a message (vtysh exit status 1)"
        if a.status == "not_run":
            return "rejected", a.output
        if a.status == "unknown":
            return "rejected", a.message + (" The running configuration changed." if changed else
                                            " The running configuration did not change.")  # fmt: skip
        if c.navigation:
            return "unchanged", ""
        warning = a.warning
        if was:
            return "unchanged", "already in the running configuration" + (f" (FRR: {warning})" if warning else "")
        if c.negated:  # alone in its segment (a `no` line of the running configuration is `was`)
            if changed:
                return "applied", warning
            return "rejected", ("changed nothing: FRR accepted it, but the running configuration did not change -- "
                                "there was nothing to remove" + (f" (FRR: {warning})" if warning else "")
                                + (f"; {', '.join(down)} not running on this router" if down else ""))  # fmt: skip
        if warning:
            if changed and now:
                return "applied", f"FRR: {warning}"
            return "rejected", f"FRR answered '{warning}' and the line is not in the running configuration"
        if now or (changed and touched):
            return "applied", ""
        if down:
            return "rejected", (f"changed nothing: FRR accepted it, but the running configuration did not change, and "
                                f"{', '.join(down)} {'is' if len(down) == 1 else 'are'} not running on this router")  # fmt: skip
        return "unchanged", "accepted; it changed nothing (a default value, or already so)"

    # -- kernel ------------------------------------------------------------------------------

    def _live(self) -> DeviceState:
        if self.kernel_dirty:
            self.kernel_state = capture(self.lab, self.device, frr=False)
            self.kernel_dirty = False
        return self.kernel_state

    def _kernel(self, c: Command) -> None:
        argv = c.argv or c.text.split()
        kind, verb = k.kind_of(argv), k.verb_of(argv)
        head = f"{self.device}(kernel)# {c.text}"
        args = argv[argv.index(verb) + 1 :] if verb in argv else []
        if kind == "route" and verb in ("add", "append") and " ".join(args) in k.routes_of(self._live(), k.family_of(argv)):
            self._add(c, "unchanged", "the identical route is already there (not added again)",
                      f"{head}\n% (anibench) unchanged: the identical route is already there; not added again")  # fmt: skip
            return
        if kind == "rule" and verb == "add" and k.canonical_rule(args) in k.rules_of(self._live(), k.family_of(argv)):
            self._add(c, "unchanged", "an identical rule is already there (not added again)",
                      f"{head}\n% (anibench) unchanged: an identical rule is already there; not added again")  # fmt: skip
            return
        target = k.rule_target(argv) if kind == "nft" else None
        if target is not None and target[1] in k.chain_rules(self._live().nft).get(target[0], []):
            self._add(c, "unchanged", f"chain {' '.join(target[0])} already has this rule (not added again)",
                      f"{head}\n% (anibench) unchanged: the chain already has this rule; not added again")  # fmt: skip
            return
        if k.exit_status_tells(argv):  # one object added or removed on success: no read-back needed
            r = self.lab.exec(self.device, argv, timeout_s=self.opts.exec_timeout_s, max_output=self.opts.max_output_bytes,
                              cancel=self.cancel)  # fmt: skip
            err, state = r.stderr, "changed"
        else:
            r = self.lab.exec(self.device, ["bash", "-c", k.KERNEL_SCRIPT, "anibench", kind, *argv],
                              timeout_s=self.opts.exec_timeout_s, max_output=self.opts.max_output_bytes, cancel=self.cancel)  # fmt: skip
            err, state = k.split_marker(r.stderr)
        text = (r.stdout + err).strip("\n")
        shown = head + (f"\n{text}" if text else "")
        if r.timed_out or r.cancelled:
            self.kernel_dirty = True
            why = f"{'timed out after ' + format(self.opts.exec_timeout_s, 'g') + ' s' if r.timed_out else 'cancelled'}: " \
                  "the command was killed; it may or may not have taken effect"  # fmt: skip
            self._add(c, "rejected", why, f"{shown}\n% {why}")
            return
        if r.returncode != 0:
            said = " ".join((err.strip() or r.stdout.strip() or f"exit status {r.returncode}").split())[:500]
            if kind == "route" and verb in ("add", "append") and "File exists" in said \
                    and " ".join(args) in k.routes_of(self._live(), k.family_of(argv)):  # fmt: skip
                self._add(c, "unchanged", "the identical route is already there", f"{shown}\n% (anibench) unchanged: "
                          "the identical route is already there")  # fmt: skip
                return
            self._add(c, "rejected", said, f"{shown}\n% exit status {r.returncode}")
            return
        if state == "changed":
            self.kernel_dirty = True
            self._add(c, "applied", "", shown)
        elif state is None:
            self.kernel_dirty = True
            self._add(c, "applied", "exit status 0 (the state could not be read back)", shown)
        elif verb in k.DELETE_VERBS:
            why = "changed nothing: the command succeeded but the state did not change -- there was nothing to remove"
            self._add(c, "rejected", why, f"{shown}\n% (anibench) {why}")
        else:
            self._add(c, "unchanged", "succeeded; the state already was so", shown)
