"""What the user sees: data to stdout, messages to stderr, user errors as one red line with exit code 2 (--debug
shows the traceback), Ctrl-C as exit 130, progress drawn with rich, tables that never cut numbers."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import typer
from rich.console import Console
from rich.markup import escape as rich_escape
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..errors import CtxevalError
from ..runs.distributed import current, shutdown
from .options import check_options

# emoji=False: text such as '0:100:11' is printed as it is, not with rich's ':100:' emoji
out = Console(highlight=False, soft_wrap=True, emoji=False)
if not out.is_terminal:  # logs and files: print tables at their full width instead of the 80-column default
    out = Console(highlight=False, soft_wrap=True, width=240, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
state: dict[str, Any] = {"debug": False, "started": time.perf_counter()}  # --debug; when the command started


def user_errors(fn: Callable) -> Callable:
    """Turn CtxevalError into one red line on stderr and exit code 2; Ctrl-C into a note and exit code 130. Option
    values are checked first (options.check_options)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        finished = False
        state["started"] = time.perf_counter()
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
            err.print(
                "[yellow]interrupted:[/yellow] finished points are kept; rerun the same command to resume", markup=True
            )
            raise typer.Exit(130) from None
        finally:
            shutdown(together=finished)  # leave torch.distributed's process group (no-op without torchrun)

    return wrapper


def remaining_seconds(elapsed: float, done: float, total: float) -> float | None:
    """Seconds left at the rate so far (`done` of `total` units in `elapsed` seconds); None before any is done."""
    if done <= 0 or total <= 0:
        return None
    return elapsed * max(total - done, 0.0) / done


def fmt_duration(seconds: float) -> str:
    """'26.1 s' under two minutes, then '12m05s', '2h07m'."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt_eta(seconds: float | None) -> str:
    """'ETA ?' (nothing done yet), 'ETA 42s', 'ETA 3m05s', 'ETA 2h07m'."""
    if seconds is None:
        return "ETA ?"
    s = int(round(seconds))
    if s < 60:
        return f"ETA {s}s"
    if s < 3600:
        return f"ETA {s // 60}m{s % 60:02d}s"
    return f"ETA {s // 3600}h{s % 3600 // 60:02d}m"


class EtaColumn(ProgressColumn):
    """The live bar's ETA: the estimate at the last finished point, counted down since (the same number the plain
    lines print)."""

    def __init__(self, progress: "RichProgress") -> None:
        super().__init__()
        self.progress = progress

    def render(self, task: Task) -> Text:
        return Text(fmt_eta(self.progress.eta(since_last=True)))


class RichProgress:
    """The Progress interface drawn with rich: bar, ETA, current point, running ppl."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.live = err.is_terminal  # redirected stderr (logs, CI) gets one plain line per point instead
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            EtaColumn(self),
            console=err,
            transient=False,
        )
        self.task: Any = None
        # the rate counts from start(), when the total is known (prompts generated, key tokens found, ...)
        self.started = self.last = self.t0
        self.done, self.total = 0.0, 0.0

    def __enter__(self) -> "RichProgress":
        if self.live:
            self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self.bar.stop()

    def start(self, total: int) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.total, self.done = float(max(total, 1)), 0.0
        self.started = self.last = time.perf_counter()
        self.task = self.bar.add_task("starting", total=self.total)

    def eta(self, since_last: bool = False) -> float | None:
        """Seconds left at the rate so far; `since_last`: less the time since the last point finished."""
        left = remaining_seconds(self.last - self.started, self.done, self.total)
        if left is None or not since_last:
            return left
        return max(0.0, left - (time.perf_counter() - self.last))

    def advance(self, amount: int, description: str) -> None:
        self.done += amount
        self.last = time.perf_counter()
        self.bar.update(self.task, advance=amount, description=description)
        if not self.live:
            share = min(self.done / self.total, 1.0)
            err.print(
                f"[{self.last - self.t0:7.1f}s {share:4.0%} {fmt_eta(self.eta()):<10}] {description}", markup=False
            )

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


METHOD_WIDTH = 20  # the narrowest a folded method column gets: wide enough to read 'yarn(factor=4)' whole


def print_table(title: str, caption: str | None, headers: list[str], rows: list[list[str]]) -> None:
    """A rich table on stdout: cells never cut, numbers right-aligned. When the table is wider than the terminal, the
    other headers wrap to their longest word (or their widest cell) and the method column folds, down to
    METHOD_WIDTH."""
    cells = [max([len(str(r[i])) for r in rows if i < len(r)] + [1]) for i in range(len(headers))]
    natural = sum(max(len(h), c) + 3 for h, c in zip(headers, cells)) + 1  # + padding and borders
    narrow = natural > out.width
    fixed = [max([c] + [len(word) for word in h.split()]) for h, c in zip(headers, cells)]
    # what the other columns leave the method column (many columns: less than METHOD_WIDTH, never under 4)
    left = out.width - sum(f + 3 for h, f in zip(headers, fixed) if h != "method") - 4
    table = Table(title=title, caption=caption)
    for h, width, wrapped in zip(headers, cells, fixed):
        if h == "method":
            table.add_column(h, justify="left", overflow="fold", min_width=max(4, min(width, METHOD_WIDTH, left)))
        else:
            table.add_column(
                h,
                justify="left" if h == "task" else "right",
                overflow="fold",
                min_width=width,
                width=wrapped if narrow else None,
            )
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
