"""``python -m substrate.dataplane [auto|kernel|ebpf]``: print which data plane a lab would use
here and why (one line); exit status 0 when one can carry a lab, 1 when none can, 2 on a bad mode."""

from __future__ import annotations

import sys

from substrate.dataplane import select
from substrate.errors import EnvironmentProblem


def main(argv: list[str]) -> int:
    """Print :meth:`Choice.line` for the mode in ``argv`` (or ``$ANIBENCH_DATAPLANE``)."""
    try:
        choice = select(argv[0] if argv else None)
    except EnvironmentProblem as e:
        print(e, file=sys.stderr)
        return 2
    print(choice.line())
    return 0 if choice.dataplane else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
