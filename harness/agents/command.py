"""Any external MCP-capable agent process (a CLI coding agent, a custom client), plugged in with no
code changes: the harness writes the request and an MCP configuration, starts the process from a
template, and learns what it did from the server-side trajectory recorder.

Options: ``template`` (required), a command line with placeholders -- ``{prompt}`` (the HAI
prompt text), ``{prompt_file}``, ``{mcp_config}`` (path of an MCP configuration in the common
``{"mcpServers": {...}}`` form, which starts the level's server over stdio), ``{serve_command}``
(that server's command line, shell-quoted, for agents that take a command: ``--stdio CMD``),
``{serve_url}`` and ``{serve_token}`` (the level served by the harness over streamable HTTP on
127.0.0.1 for this run only, with a bearer token of its own, for agents that take a URL),
``{workdir}`` (the directory holding the attached files) -- split like a shell would but never run
through one, e.g. ``claude -p {prompt} --mcp-config {mcp_config} --strict-mcp-config``. A template
uses the stdio server (``{mcp_config}``, ``{serve_command}``: the agent starts it) or the HTTP one
(``{serve_url}``, ``{serve_token}``), not both: two servers would record one episode twice. The
agent's environment also holds ``ANIBENCH_MCP_URL`` and ``ANIBENCH_MCP_TOKEN`` when it is served
over HTTP. A literal brace is written twice (``{{``, ``}}``); the template is checked when the
agent is made, before any lab is deployed (:func:`check_template`). The process runs in
``workdir`` until it exits or the run's deadline passes (then its process group is killed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import string
import subprocess
from pathlib import Path

from harness.agents.base import AgentContext, AgentOutcome
from harness.errors import AnibenchError

SERVER_NAME = "anibench"
#: The placeholders a command template may use (see the module docstring).
PLACEHOLDERS: tuple[str, ...] = ("prompt", "prompt_file", "mcp_config", "serve_command", "serve_url", "serve_token",
                                  "workdir")
#: Placeholders of the stdio server the agent starts, and of the HTTP server the harness starts.
STDIO_PLACEHOLDERS = frozenset({"mcp_config", "serve_command"})
HTTP_PLACEHOLDERS = frozenset({"serve_url", "serve_token"})
#: How long the harness waits for the run's HTTP server to listen (it attaches the lab first).
HTTP_START_S = 60.0
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
    used: set[str] = set()
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
            used.add(name)
    if used & STDIO_PLACEHOLDERS and used & HTTP_PLACEHOLDERS:
        raise AnibenchError("the command template names both the stdio server ({mcp_config}, {serve_command}) and the "
                            "HTTP server ({serve_url}, {serve_token}): use one (two servers would record one episode)")
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
        named = {name for w in self.words for _text, name, _spec, _conv in string.Formatter().parse(w) if name}
        self.http = bool(named & HTTP_PLACEHOLDERS)
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
        values = {"prompt": ctx.prompt, "prompt_file": str(prompt_file), "mcp_config": str(cfg), "workdir": str(work),
                  "serve_command": shlex.join(ctx.serve_argv), "serve_url": "", "serve_token": ""}
        env = dict(os.environ)
        server = None
        if self.http:
            try:
                server, values["serve_url"], values["serve_token"] = _serve_http(ctx, root / "server.log")
            except AnibenchError as e:
                return AgentOutcome(error=f"{START_FAILED}: {e}", model=self.model, run_failed=True)
            env.update(ANIBENCH_MCP_URL=values["serve_url"], ANIBENCH_MCP_TOKEN=values["serve_token"])
        try:
            outcome = self._agent(ctx, [w.format(**values) for w in self.words], work, root, env)
            if server is not None and server.poll() is not None:
                # the harness's own server died under the agent: the run was not conducted as
                # specified, and whatever the agent did after it is not the agent's result
                return dataclasses.replace(outcome, run_failed=True, error=(
                    f"the run's HTTP server exited with status {server.returncode} during the run "
                    f"(log {root / 'server.log'}); agent: {outcome.error or 'exited 0'}"))
            return outcome
        finally:
            if server is not None:
                _stop(server)

    def _agent(self, ctx: AgentContext, argv: list[str], work: Path, root: Path, env: dict[str, str]) -> AgentOutcome:
        log = (root / "agent.log").open("w")
        try:
            p = subprocess.Popen(argv, cwd=work, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=env)
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
            _end_group(p.pid)  # what the agent left running (a background child, its stdio server) ends with it
            log.close()
        return AgentOutcome(error=err, model=self.model, exit_status=rc, log=str(root / "agent.log"))


def _serve_http(ctx: AgentContext, log_path: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """Start the run's server over streamable HTTP on 127.0.0.1 (a free port) with a fresh bearer
    token (passed in the environment, never on a command line), and wait until it listens.

    Returns:
        The server process, its URL and its token.

    Raises:
        AnibenchError: it exited or did not listen within :data:`HTTP_START_S` (its log says why).
    """
    import secrets
    import time

    # hex, not token_urlsafe: a token that starts with '-' is read as an option by an agent's
    # argument parser when substituted as '--token {token}' (a CI run failed so, 1 in 64)
    token = secrets.token_hex(24)
    argv = [*ctx.serve_argv, "--transport", "http", "--host", "127.0.0.1", "--port", "0"]
    with log_path.open("w") as log:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, env={**os.environ, "ANIBENCH_MCP_TOKEN": token})
    deadline = time.monotonic() + min(HTTP_START_S, max(1.0, ctx.time_left()))
    while True:
        text = log_path.read_text(errors="replace")
        for line in text.splitlines():
            if line.startswith("listening on http://127.0.0.1:"):
                return p, line.split(" ", 2)[2].strip(), token
        if p.poll() is not None or time.monotonic() > deadline:
            _stop(p)
            last = text.strip().splitlines()[-1:] or ["no output"]
            raise AnibenchError(f"the run's HTTP server did not start ({last[0][:300]}; log {log_path})")
        time.sleep(0.05)


def _stop(p: subprocess.Popen[bytes]) -> None:
    """Stop a server process group: SIGTERM, then SIGKILL if it is still there after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def _end_group(pgid: int, grace_s: float = 10.0) -> None:
    """End every process left in an agent's process group after its leader exited: SIGTERM (a stdio
    server the agent started finishes its trajectory line), then SIGKILL after ``grace_s`` seconds.

    A process the agent left behind would otherwise outlive the run and could act on the next
    run's lab (PREAMBLE: every process created is destroyed on exit).
    """
    import time

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
