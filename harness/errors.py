"""Errors of the harness package: one root, specific subclasses where callers need them."""


class AnibenchError(Exception):
    """Root of errors raised by the harness (bad option values, unknown task, store problems, ...).

    The command line turns it into one ``error: ...`` line and a non-zero exit.
    """
