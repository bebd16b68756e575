"""Any external MCP-capable agent process (a CLI coding agent, a custom client), plugged in with no
code changes: the harness writes the request and an MCP configuration, starts the process from a
template, and learns what it did from the server-side trajectory recorder.

Options: ``template`` (required), a command line with placeholders -- ``{prompt}`` (the HAI
prompt text), ``{prompt_file}``, ``{mcp_config}`` (path of an MCP configuration in the common
``{"mcpServers": {...}}`` form, which starts the level's server over stdio), ``{workdir}`` (the
directory holding the attached files) -- split like a shell would but never run through one,
e.g. ``claude -p {prompt} --mcp-config {mcp_config} --strict-mcp-config``. The process runs in
``workdir`` until it exits or the run's deadline passes (then its process group is killed).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess

from harness.agents.base import AgentContext, AgentOutcome
from harness.errors import AnibenchError

SERVER_NAME = "anibench"
#: How an outcome says the process never ran (the harness then fails the run: not an agent result).
START_FAILED = "could not start the agent"
CAPPED = "capped"


def mcp_config(serve_argv: list[str]) -> dict:
    """The MCP configuration block that starts the run's server over stdio."""
    return {"mcpServers": {SERVER_NAME: {"type": "stdio", "command": serve_argv[0], "args": serve_argv[1:],
                                         "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}}}}


class CommandAgent:
    """External agent process (see module docstring)."""

    name = "command"

    def __init__(self, template: str | None = None, **options: str):
        if not template:
            raise AnibenchError("the command agent needs --agent-opt template='CMD ... {prompt} ... {mcp_config}'")
        unknown = set(options) - {"model"}
        if unknown:
            raise AnibenchError(f"unknown command agent option(s) {sorted(unknown)}; known: template, model")
        try:
            shlex.split(template)
        except ValueError as e:
            raise AnibenchError(f"cannot parse the command template: {e}") from None
        self.template = template
        self.model = options.get("model")

    def preflight(self) -> None:
        """Fail fast when the template's program cannot be found.

        Raises:
            AnibenchError: naming the program.
        """
        import shutil

        program = shlex.split(self.template)[0] if self.template.strip() else ""
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
        try:
            argv = [w.format(**values) for w in shlex.split(self.template)]
        except (KeyError, IndexError) as e:
            return AgentOutcome(error=f"unknown placeholder {e} in the command template", model=self.model)
        log = (root / "agent.log").open("w")
        try:
            p = subprocess.Popen(argv, cwd=work, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        except OSError as e:
            log.close()
            return AgentOutcome(error=f"{START_FAILED}: {e}", model=self.model, run_failed=True)
        try:
            p.wait(timeout=max(1.0, ctx.time_left()))
            rc = p.returncode
            err = None if rc == 0 else f"agent process exited with status {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            err = f"agent process killed at the wall-clock cap ({CAPPED})"
        finally:
            log.close()
        return AgentOutcome(error=err, model=self.model)
