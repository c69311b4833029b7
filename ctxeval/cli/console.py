"""What the user sees: data to stdout, messages to stderr, user errors as one red line with exit code 2 (--debug
shows the traceback), Ctrl-C as exit 130, progress drawn with rich, tables that fit the terminal and never cut a
number or a method's name mid-word, and --help that names each value by what it is (--lengths LENGTHS)."""

from __future__ import annotations

import functools
import os
import re
import time
import typing
from dataclasses import dataclass
from typing import Any, Callable

import typer
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleDimensions
from rich.markup import escape as rich_escape
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand

from ..errors import CtxevalError
from ..runs.distributed import current, shutdown
from .options import check_options

PIPED_WIDTH = 240  # stdout that is not a terminal and no COLUMNS: tables at their full width (logs, files)


class DataConsole(Console):
    """stdout: the terminal's width; not a terminal (a pipe, a file, a log), COLUMNS when it is set, else PIPED_WIDTH
    (tables at their full width instead of rich's 80-column default). Decided at each print: a test or a wrapper
    that sets COLUMNS after the import is heard."""

    def _size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        columns = os.environ.get("COLUMNS", "").strip()
        if self._width is None and not self.is_terminal and not (columns.isdigit() and int(columns) > 0):
            return ConsoleDimensions(PIPED_WIDTH, size.height)
        return size

    size = property(_size, Console.size.fset)


# emoji=False: text such as '0:100:11' is printed as it is, not with rich's ':100:' emoji
out = DataConsole(highlight=False, soft_wrap=True, emoji=False)
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


LABEL_HEADERS = ("method", "task", "model")  # text columns that name a row: left-aligned, repeated in every part
# a cell of a number column: a number with its unit or ± its error, a length (1k), or a mark for no value
NUMBER = re.compile(
    r"^(?:[-+]?[\d.,]+(?:e[-+]?\d+)?(?: ?(?:%|x|k|[KMGT]i?B|B|s))?(?: ± [\d.,]+(?:e[-+]?\d+)?%?)?"
    r"|—|-|none|OOM|skip|no keys|n/a|)$"
)


def cell_pieces(text: str) -> list[tuple[str, bool]]:
    """The pieces a cell may break between, each with whether it starts a word: its words, and inside a word the
    entries of a parameter list, after each comma that a letter follows ('yarn(beta_fast=4,' 'factor=8)'; a number
    such as '1,024' stays whole)."""
    return [(piece, i == 0) for word in text.split() for i, piece in enumerate(re.split(r"(?<=,)(?=[^\d\s])", word))]


def wrap_cell(text: str, width: int) -> str:
    """`text` in lines of at most `width` cells, broken between pieces (cell_pieces); a piece wider than the column
    (only in a column narrower than its widest piece) is folded."""
    if cell_len(text) <= width:
        return text
    lines: list[str] = []
    for piece, new_word in cell_pieces(text):
        joined = lines[-1] + (" " if new_word else "") + piece if lines else piece
        if lines and cell_len(joined) <= width:
            lines[-1] = joined
        else:
            lines.append(piece)
    return "\n".join(line[i : i + width] for line in lines for i in range(0, max(len(line), 1), width))


@dataclass
class Column:
    """One column of a printed table: a text column (a row's name, a parameter list) breaks between pieces, any
    other column keeps every cell whole on one line."""

    header: str
    cells: list[str]
    text: bool

    @property
    def natural(self) -> int:
        return max([cell_len(self.header)] + [cell_len(c) for c in self.cells])

    @property
    def least(self) -> int:
        """The narrowest the column gets: its longest header word, and its longest piece (text) or cell."""
        units = [p for c in self.cells for p, _ in cell_pieces(c)] if self.text else self.cells
        return max([1] + [cell_len(w) for w in self.header.split()] + [cell_len(u) for u in units])


def fit_widths(cols: list[Column], room: int, keys: int = 1) -> list[int]:
    """Each column's width within `room` (the table's width less its frame): the natural widths when they fit; else
    each column's least, and the room left to the cells that would break (the row's name first, then the other
    columns, each in proportion to what it lacks), then to the headers. When even the least widths do not fit, the
    first column (the row's name) is folded down to what is left."""
    if sum(c.natural for c in cols) <= room:
        return [c.natural for c in cols]
    widths = [c.least for c in cols]
    extra = room - sum(widths)
    if extra < 0:
        widths[0] = max(4, widths[0] + extra)
        return widths
    cells = [max([0] + [cell_len(x) for x in c.cells]) for c in cols]
    for wanted, among in (
        (cells, range(min(keys, len(cols)))),
        (cells, range(len(cols))),
        ([cell_len(c.header) for c in cols], range(len(cols))),
    ):
        gaps = {i: wanted[i] - widths[i] for i in among if wanted[i] > widths[i]}
        total, budget = sum(gaps.values()), extra
        for i, gap in sorted(gaps.items(), key=lambda item: -item[1]):  # the largest gap first takes the rounding
            share = min(gap, extra, -(-budget * gap // total))
            widths[i] += share
            extra -= share
    return widths


@dataclass(frozen=True)
class Frame:
    """How a table is drawn, and what it costs beside its cells: `per_column` x columns + `fixed` characters."""

    options: dict[str, Any]
    per_column: int
    fixed: int

    def room(self, columns: int, width: int) -> int:
        return width - self.per_column * columns - self.fixed


BOXED = Frame({}, 3, 1)  # rich's box: '│ ' + cell + ' ' per column, and the closing '│'
# no vertical lines, two spaces between columns: for a table the box would not leave room for
COMPACT = Frame({"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False, "collapse_padding": True}, 2, -2)


def split_columns(cols: list[Column], keys: int, width: int, frame: Frame) -> list[list[int]]:
    """The columns of each table a wide table is printed as: the first `keys` (the row's name) in every one, the
    others in order, as few tables as fit `width` at the columns' least widths, as even in width as they can be."""
    rest = list(range(keys, len(cols)))
    room = frame.room(keys, width) - sum(cols[i].least for i in range(keys))
    size = [cols[i].least + frame.per_column for i in rest]

    def pack(cap: int) -> list[list[int]]:
        parts: list[list[int]] = []
        used = cap + 1
        for i, s in zip(rest, size):
            if used + s > cap:
                parts.append([])
                used = 0
            parts[-1].append(i)
            used += s
        return parts

    fewest = len(pack(max([room] + size)))
    low, high = max(size, default=1), max([room] + size)
    while low < high:  # the narrowest cap that still needs no more tables than the room does
        mid = (low + high) // 2
        low, high = (low, mid) if len(pack(mid)) <= fewest else (mid + 1, high)
    return [list(range(keys)) + part for part in pack(low)] or [list(range(keys))]


def print_table(title: str, caption: str | None, headers: list[str], rows: list[list[str]]) -> None:
    """A rich table on stdout at the console's width: numbers right-aligned and whole, the row's name (method, task)
    and parameter lists broken only between words or parameters, headers between words. A table the box leaves no
    room for is drawn without vertical lines; one that does not fit even so is printed as several, each with the
    name columns, the later ones titled '(continued)'."""
    texts = [[str(r[i]) if i < len(r) else "" for r in rows] for i in range(len(headers))]
    keys = 1
    while keys < len(headers) and headers[keys] in LABEL_HEADERS:
        keys += 1
    cols = [
        Column(h, cells, h in LABEL_HEADERS or not all(NUMBER.match(c) for c in cells))
        for h, cells in zip(headers, texts)
    ]
    width, least = out.width, sum(c.least for c in cols)
    frame = BOXED if least <= BOXED.room(len(cols), width) else COMPACT
    parts = (
        [list(range(len(cols)))] if least <= frame.room(len(cols), width) else split_columns(cols, keys, width, frame)
    )
    for n, part in enumerate(parts):
        chosen = [cols[i] for i in part]
        widths = fit_widths(chosen, frame.room(len(chosen), width), keys)
        table = Table(title=title if n == 0 else f"{title} (continued)", **frame.options)
        for c, w in zip(chosen, widths):
            table.add_column(Text(c.header), justify="left" if c.text else "right", width=w, overflow="fold")
        for r in range(len(rows)):
            table.add_row(*[Text(wrap_cell(c.cells[r], w) if c.text else c.cells[r]) for c, w in zip(chosen, widths)])
        out.print(table, soft_wrap=False)
    if caption:
        print_caption(caption)


def print_caption(caption: str) -> None:
    """A table's caption under it, wrapped at the console's width (rich's own caption takes the table's)."""
    out.print(Text(caption, style="table.caption"), soft_wrap=False)


def print_outputs(outputs: Any) -> None:
    """A run's rendered outputs (report.single.RunOutputs): its tables on stdout, notes and the 'wrote' line on
    stderr."""
    for note in outputs.notes:
        err.print(note)
    for table in outputs.tables if not state.get("merging") else []:  # run_models prints the merged table instead
        print_table(table.title, table.caption, table.headers, table.rows)
    if outputs.wrote:
        err.print(outputs.wrote)


# -- what --help calls each value (typer would print its Python type: <str>, <int>, <list[str]>) ---------------------
# ReadableCommand names the value of every option and argument that has no metavar of its own and no choices (those
# show their choices: <table|json|csv>) as METAVARS says, else by its type or the last word of its name.
METAVARS = {
    "--aggregate": "MODE",
    "--answer": "TEXT",
    "--answer-prefix": "TEXT",
    "--attention-temperature": "LAMBDA",
    "--attn": "IMPL",
    "--backend": "BACKEND",
    "--base": "BASE",
    "--chat-template": "MODE",
    "--compare": "METHOD",
    "--cwe-words": "FILE",
    "--data": "DATA",
    "--depth-spacing": "SPACING",
    "--depths": "DEPTHS",
    "--device": "DEVICE",
    "--device-map": "MAP",
    "--dtype": "DTYPE",
    "--essay-substitute": "DATA",
    "--essays": "FILE",
    "--export": "DIR",
    "--factor": "FACTORS",
    "--format": "FORMAT",
    "--gpu-memory-utilization": "FRACTION",
    "--haystack": "DATA",
    "--head-dim": "D",
    "--heads": "HEADS",
    "--html": "FILE",
    "--include-path": "DIR",
    "--key-tokens": "MODEL",
    "--key-tokens-method": "METHOD",
    "--layers": "LAYERS",
    "--lengths": "LENGTHS",
    "--limit": "N",
    "--max-memory": "MEMORY",
    "--metadata": "JSON",
    "--method": "METHOD",
    "--model": "MODEL",
    "--needle": "PRESET",
    "--needle-text": "TEXT",
    "--original-length": "L",
    "--out": "DIR",
    "--partial-rotary-factor": "FRACTION",
    "--plot": "FILE",
    "--position-buckets": "BUCKETS",
    "--protocol": "PROTOCOL",
    "--qa-data": "DIR",
    "--question": "TEXT",
    "--sampler": "SAMPLER",
    "--samples-from": "DIR",
    "--scoring": "SCORING",
    "--short-tolerance": "FRACTION",
    "--space": "NAME=LOW:HIGH",
    "--storage": "URL",
    "--stride": "S",
    "--target-length": "LENGTH",
    "--task": "PRESET",
    "--tasks": "TASKS",
    "--template": "TEMPLATE",
    "--text-field": "FIELD",
    "--threshold": "THRESHOLD",
    "--valid-tolerance": "FRACTION",
    "--vllm-arg": "KEY=VALUE",
    "runs": "RUN_DIR",
}


def metavar_of(names: list[str], kind: str) -> str:
    """What --help calls the value of the option or argument with these names and value type (click's name of it:
    'integer', 'float', 'path', 'text', 'choice', ...): METAVARS, else N for a count, NUMBER, PATH, or the last word of
    the longest name ('--text-field' -> FIELD)."""
    for name in names:
        if name in METAVARS:
            return METAVARS[name]
    by_kind = {"integer": "N", "float": "NUMBER", "path": "PATH"}
    if kind in by_kind:
        return by_kind[kind]
    return max(names, key=len).lstrip("-").replace("_", "-").split("-")[-1].upper()


def value_kind(param: Any) -> str:
    """click's name of a parameter's value type: 'integer', 'float', 'path', 'choice', 'text', ... (typer 0.29 and
    later keep the annotation in `type_descriptor`; earlier versions build a click type)."""
    desc = getattr(param, "type_descriptor", None)
    if desc is None:
        return str(getattr(getattr(param, "type", None), "name", "text"))
    if desc.is_choice:
        return "choice"
    if desc.is_path:
        return "path"
    annotation = typing.get_args(desc.annotation)[0] if desc.is_list else desc.annotation
    return {int: "integer", float: "float"}.get(annotation, "text")


class ReadableCommand(TyperCommand):
    """A command whose --help names each value by what it is (--lengths LENGTHS, --out DIR, RUN_DIR...), not by the
    Python type typer would print (<str>, <list[str]>); METAVARS holds the names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            kind = value_kind(param)
            if param.metavar is None and not getattr(param, "is_flag", False) and kind != "choice":
                param.metavar = metavar_of([*param.opts, param.name or ""], kind)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """click's Arguments and Options sections; an argument by its metavar alone (typer adds its type)."""
        records: dict[str, list[tuple[str, str]]] = {"argument": [], "option": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and param.param_type_name in records:
                if param.param_type_name == "argument" and param.metavar:
                    record = (param.metavar + ("..." if param.nargs != 1 else ""), record[1])
                records[param.param_type_name].append(record)
        for title, kind in (("Arguments", "argument"), ("Options", "option")):
            if records[kind]:
                with formatter.section(title):
                    formatter.write_dl(records[kind])
