"""anibench harness: task classes, agents, runs, campaigns, results and statistics, and the
``harness`` command line. Depends on :mod:`servers` and :mod:`substrate`, never the reverse."""
