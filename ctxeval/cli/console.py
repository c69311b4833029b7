"""What the user sees: data to stdout, messages to stderr, user errors as one red line with exit code 2 (--debug
shows the traceback), Ctrl-C as exit 130, progress drawn with rich, tables that never cut numbers."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import typer
from rich.console import Console
from rich.markup import escape as rich_escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..distributed import current, shutdown
from ..errors import CtxevalError
from .options import check_options

# emoji=False: text such as '0:100:11' is printed as it is, not with rich's ':100:' emoji
out = Console(highlight=False, soft_wrap=True, emoji=False)
if not out.is_terminal:  # logs and files: print tables at their full width instead of the 80-column default
    out = Console(highlight=False, soft_wrap=True, width=240, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
state = {"debug": False}  # set by the root --debug option


def user_errors(fn: Callable) -> Callable:
    """Turn CtxevalError into one red line on stderr and exit code 2; Ctrl-C into a note and exit code 130. Option
    values are checked first (options.check_options)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        finished = False
        try:
            check_options(fn, kwargs)
            result = fn(*args, **kwargs)
            finished = True
            return result
        except CtxevalError as exc:
            if state["debug"]:
                raise
            if str(exc):  # empty: a torchrun rank whose error rank 0 already reported
                err.print(f"[red]error:[/red] {rich_escape(str(exc))}", markup=True)  # '[lm-eval]' is text
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("[yellow]interrupted:[/yellow] finished points are kept; rerun the same command to resume",
                      markup=True)
            raise typer.Exit(130) from None
        finally:
            shutdown(together=finished)  # leave torch.distributed's process group (no-op without torchrun)

    return wrapper


class RichProgress:
    """The Progress interface drawn with rich: bar, ETA, current point, running ppl."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.live = err.is_terminal  # redirected stderr (logs, CI) gets one plain line per point instead
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err, transient=False)
        self.task = None

    def __enter__(self) -> "RichProgress":
        if self.live:
            self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self.bar.stop()

    def start(self, total: int) -> None:
        self.task = self.bar.add_task("starting", total=max(total, 1))

    def advance(self, amount: int, description: str) -> None:
        self.bar.update(self.task, advance=amount, description=description)
        if not self.live:
            task = self.bar.tasks[0]
            err.print(f"[{time.perf_counter() - self.t0:7.1f}s {task.completed / task.total:4.0%}] {description}")

    def note(self, message: str) -> None:
        self.bar.console.print(f"[yellow]{message}[/yellow]")


class QuietProgress:
    """Progress of a rank other than 0 under torchrun: notes only, prefixed with the rank."""

    def __enter__(self) -> "QuietProgress":
        return self

    def __exit__(self, *exc: Any) -> None: ...
    def start(self, total: int) -> None: ...
    def advance(self, amount: int, description: str) -> None: ...

    def note(self, message: str) -> None:
        err.print(f"[yellow]rank {current().rank}: {message}[/yellow]")


def print_table(title: str, caption: str | None, headers: list[str], rows: list[list[str]]) -> None:
    """A rich table on stdout: numbers right-aligned and never cut; a narrow terminal folds the method column."""
    table = Table(title=title, caption=caption)
    for i, h in enumerate(headers):
        if h == "method":
            table.add_column(h, justify="left", overflow="fold")
        else:
            width = max([len(str(r[i])) for r in rows if i < len(r)] + [1])
            table.add_column(h, justify="right", no_wrap=True, min_width=width)
    for r in rows:
        table.add_row(*[str(c) for c in r])
    out.print(table)


def print_outputs(outputs: Any) -> None:
    """A run's rendered outputs (report.single.RunOutputs): its tables on stdout, notes and the 'wrote' line on
    stderr."""
    for note in outputs.notes:
        err.print(note)
    for table in outputs.tables:
        print_table(table.title, table.caption, table.headers, table.rows)
    if outputs.wrote:
        err.print(outputs.wrote)
