"""Any external MCP-capable agent process (a CLI coding agent, a custom client), plugged in with no
code changes: the harness writes the request and an MCP configuration, starts the process from a
template, and learns what it did from the server-side trajectory recorder.

Options: ``template`` (required), a command line with placeholders -- ``{prompt}`` (the HAI
prompt text), ``{prompt_file}``, ``{mcp_config}`` (path of an MCP configuration in the common
``{"mcpServers": {...}}`` form, which starts the level's server over stdio), ``{workdir}`` (the
directory holding the attached files) -- split like a shell would but never run through one,
e.g. ``claude -p {prompt} --mcp-config {mcp_config} --strict-mcp-config``. A literal brace is
written twice (``{{``, ``}}``); the template is checked when the agent is made, before any lab is
deployed (:func:`check_template`). The process runs in
``workdir`` until it exits or the run's deadline passes (then its process group is killed).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import string
import subprocess

from harness.agents.base import AgentContext, AgentOutcome
from harness.errors import AnibenchError

SERVER_NAME = "anibench"
#: The placeholders a command template may use (see the module docstring).
PLACEHOLDERS: tuple[str, ...] = ("prompt", "prompt_file", "mcp_config", "workdir")
#: How an outcome says the process never ran (the harness then fails the run: not an agent result).
START_FAILED = "could not start the agent"
CAPPED = "capped"


def mcp_config(serve_argv: list[str]) -> dict:
    """The MCP configuration block that starts the run's server over stdio."""
    return {"mcpServers": {SERVER_NAME: {"type": "stdio", "command": serve_argv[0], "args": serve_argv[1:],
                                         "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}}}}


def check_template(template: str) -> list[str]:
    """Split a command template into its words and check every placeholder, before anything runs.

    A word is split like a shell would (``shlex``; never run through one); ``{name}`` is replaced
    by a value of :data:`PLACEHOLDERS` (Python's ``str.format`` syntax, nothing more: no
    attribute, index, conversion or format spec); a literal brace is written twice (``{{`` and
    ``}}``), e.g. inline JSON ``'{{"a": 1}}'``.

    Returns:
        The template's words (placeholders not yet filled in).

    Raises:
        AnibenchError: in one line -- unbalanced quotes, an empty template, a lone brace, an
            unknown or malformed placeholder -- naming the word and saying how to write a brace.
    """
    brace = "write a literal brace as {{ or }}"
    known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
    try:
        words = shlex.split(template)
    except ValueError as e:
        raise AnibenchError(f"cannot parse the command template: {e} (it is split like a shell line)") from None
    if not words:
        raise AnibenchError("the command template is empty: give the agent's command line")
    for w in words:
        try:
            fields = list(string.Formatter().parse(w))
        except ValueError as e:
            raise AnibenchError(f"command template word {w!r}: {str(e).replace(' in format string', '')}; {brace}") from None
        for _literal, name, spec, conversion in fields:
            if name is None:
                continue
            if name not in PLACEHOLDERS or spec or conversion:
                shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                raise AnibenchError(f"command template word {w!r}: unknown placeholder {shown}; placeholders: {known}; "
                                    f"{brace}")
    return words


class CommandAgent:
    """External agent process (see module docstring)."""

    name = "command"

    def __init__(self, template: str | None = None, **options: str):
        if not template:
            raise AnibenchError("the command agent needs --agent-opt template='CMD ... {prompt} ... {mcp_config}'")
        unknown = set(options) - {"model"}
        if unknown:
            raise AnibenchError(f"unknown command agent option(s) {sorted(unknown)}; known: template, model")
        self.words = check_template(template)
        self.template = template
        self.model = options.get("model")

    def preflight(self) -> None:
        """Fail fast when the template's program cannot be found.

        Raises:
            AnibenchError: naming the program.
        """
        import shutil

        program = self.words[0]
        if not program or (shutil.which(program) is None and not os.access(program, os.X_OK)):
            raise AnibenchError(f"the command agent's program {program!r} is not found or not executable")

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        import anyio

        return await anyio.to_thread.run_sync(self._run, ctx)

    def _run(self, ctx: AgentContext) -> AgentOutcome:
        # every path handed to the process is absolute: it runs in ``files/``, not in our cwd
        root = ctx.workdir.resolve()
        work = root / "files"
        work.mkdir(parents=True, exist_ok=True)
        for name, text in ctx.files.items():
            (work / name).write_text(text)
        prompt_file = root / "prompt.txt"
        prompt_file.write_text(ctx.prompt)
        cfg = root / "mcp.json"
        cfg.write_text(json.dumps(mcp_config(ctx.serve_argv), indent=1))
        values = {"prompt": ctx.prompt, "prompt_file": str(prompt_file), "mcp_config": str(cfg), "workdir": str(work)}
        argv = [w.format(**values) for w in self.words]  # checked in __init__: nothing else to fill in
        log = (root / "agent.log").open("w")
        try:
            p = subprocess.Popen(argv, cwd=work, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        except OSError as e:
            log.close()
            return AgentOutcome(error=f"{START_FAILED}: {e}", model=self.model, run_failed=True)
        rc: int | None = None
        try:
            p.wait(timeout=max(1.0, ctx.time_left()))
            rc = p.returncode
            err = (None if rc == 0 else f"agent process exited with status {rc}" if rc > 0
                   else f"agent process killed by signal {-rc} ({_signal_name(-rc)})")
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            err = f"agent process killed at the wall-clock cap ({CAPPED})"
        finally:
            log.close()
        return AgentOutcome(error=err, model=self.model, exit_status=rc, log=str(root / "agent.log"))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
