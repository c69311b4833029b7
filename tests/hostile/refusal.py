"""The CLI in-process under a wall-clock limit, and the shape of a refusal: exit 2, one `error:` line, no
traceback (hostile input, issue 25)."""

import signal

from typer.testing import CliRunner

from ctxeval.cli import app

runner = CliRunner()


class Hang(Exception):
    pass


def _alarm(*_):
    raise Hang("no answer within the time limit")


def invoke(args, limit=120):
    """The CLI in-process, with a wall-clock limit: a hang fails the test instead of stalling the suite."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
    try:
        return runner.invoke(app, [str(a) for a in args])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def refused(result, fragment):
    """Exit 2, exactly one `error:` line holding `fragment`, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, Hang)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert fragment in errors[0], errors[0]
    return errors[0]
