"""Shared pieces of the command line: error handling, console, logging set-up."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from harness.errors import AnibenchError

F = TypeVar("F", bound=Callable[..., Any])

#: Tables and results go to stdout; progress and errors to stderr. Piped into a file or a CI
#: log, rich would wrap tables to 80 columns and cut their headers: give them room instead.
out = Console() if Console().is_terminal else Console(width=200)
err = Console(stderr=True) if Console(stderr=True).is_terminal else Console(stderr=True, width=200)


def fail(message: str, code: int = 1) -> None:
    """Print ``error: message`` on stderr (one line) and exit with ``code``."""
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def friendly_errors(fn: F) -> F:
    """Turn the project's errors into one clear line and a non-zero exit; Ctrl-C exits 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from pydantic import ValidationError

        from substrate.errors import SubstrateError
        from substrate.signals import Terminated

        try:
            return fn(*args, **kwargs)
        except SubstrateError as e:
            fail(str(e))
        except (KeyboardInterrupt, Terminated):
            err.print("interrupted: cleaned up", highlight=False)
            raise typer.Exit(130) from None
        except AnibenchError as e:
            fail(str(e))
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or e.title
            more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
            fail(f"invalid {e.title}: {where}: {first['msg']}{more}")
        except OSError as e:
            fail(f"{e.strerror or e}: {e.filename}" if getattr(e, "filename", None) else str(e))

    return wrapper  # type: ignore[return-value]


def check_writable(option: str, path: Path) -> None:
    """Exit with one line unless ``path`` can be written (its directory is created if missing),
    so that a bad output path fails before the report is printed rather than after."""
    import os

    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory; give a file name")
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with path.open("a"):
                pass
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            path.unlink()
    except OSError as e:
        fail(f"cannot write {option} {path}: {e.strerror or e}")


def configure_logging(verbose: bool = False) -> None:
    """Configure structlog to write to stderr (never stdout: MCP stdio servers use it)."""
    import logging

    import structlog

    level = logging.DEBUG if verbose else logging.WARNING
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )


#: ``--dataplane``, shared by the commands that deploy labs (substrate.dataplane).
DataplaneOption = Annotated[str | None, typer.Option(
    "--dataplane", envvar="ANIBENCH_DATAPLANE", show_envvar=True,
    help="SRv6 data plane of the labs: auto (the kernel's seg6 where it has it, else eBPF), kernel, or ebpf.")]  # fmt: skip


def use_dataplane(value: str | None) -> None:
    """Check ``--dataplane`` and make it the process's choice (``$ANIBENCH_DATAPLANE``, which the
    labs it deploys and the processes it starts read). Exits with code 2 on an unknown value."""
    import os

    from substrate.dataplane import ENV, mode_from
    from substrate.errors import EnvironmentProblem

    try:
        os.environ[ENV] = mode_from(value)
    except EnvironmentProblem as e:
        fail(str(e), code=2)
