"""anibench harness: task classes, agents, runs, campaigns, results and statistics, and the
``harness`` command line. Depends on :mod:`servers` and :mod:`substrate`, never the reverse."""


def harness_command() -> list[str]:
    """The shortest absolute command that runs ``harness`` of this installation: the ``harness``
    script beside the interpreter when it exists (a venv's ``bin/harness``), else
    ``python -m harness.cli``. Handed to MCP clients, which start it with their own working
    directory and environment."""
    import sys
    from pathlib import Path

    script = Path(sys.executable).parent / "harness"
    return [str(script)] if script.exists() else [str(Path(sys.executable).resolve()), "-m", "harness.cli"]
