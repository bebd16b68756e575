"""``python -m harness.cli``: same as the ``harness`` console script."""

from harness.cli import main

main()
