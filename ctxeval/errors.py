"""User-facing errors: a message the user can act on, shown as one red line on stderr with exit code 2."""

from __future__ import annotations


class CtxevalError(Exception):
    """An error caused by the user's input or environment, with a message that says how to fix it.

    The CLI prints ``str(error)`` as one line and exits with code 2; ``--debug`` shows the traceback.
    """

    exit_code = 2

    def __init__(self, message: str) -> None:
        # one line: the CLI promises a single line on stderr
        super().__init__(" ".join(str(message).split()))


class NothingMeasured(CtxevalError):
    """A run directory without a measured row (a run refused or stopped before its first point): the error of
    reading it as a run, and `note`, what a report that skips it says."""

    def __init__(self, message: str, note: str) -> None:
        super().__init__(message)
        self.note = note
