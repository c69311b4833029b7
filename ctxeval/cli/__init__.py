"""The command line: one module per measuring command (its options, and its own steps of the recipe in run.py that
every measuring command follows), methods.py for the commands that inspect methods without measuring (methods, plan,
bound), report.py; every option declared once in options.py, what the user sees in console.py. Data to stdout,
messages to stderr; user errors are one red line with exit code 2 (--debug shows the traceback). Nothing in the
library imports this package. The command modules import the evaluation and report modules inside the commands, so
that importing the CLI loads no torch, transformers, pandas or matplotlib."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from .console import state
from .entropy import entropy_cmd
from .lm_eval import lm_eval_cmd
from .methods import bound_cmd, methods_cmd, plan_cmd
from .needle import needle_cmd, passkey_cmd
from .ppl import ppl_cmd
from .report import report_cmd
from .ruler import ruler_cmd
from .tune import tune_cmd

app = typer.Typer(
    help="Measure how well RoPE context-extension methods work: perplexity vs. length, needle in a haystack.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    # click's own help layout: rich's option table cuts long option names to fit 80 columns and reads '[@SPLIT]' in
    # a help text as markup; click's writes every name in full and wraps only the help text
    rich_markup_mode=None,
)


def print_version(value: bool) -> None:
    """--version: 'ctxeval <version>' (the installed distribution's, from its metadata) and exit 0."""
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("ctxeval")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = "unknown (not installed: pip install -e .)"
    typer.echo(f"ctxeval {installed}")
    raise typer.Exit(0)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for user errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", help="Print ctxeval's version and exit.", callback=print_version, is_eager=True)
    ] = False,
) -> None:
    state["debug"] = debug


def short_help(doc: str | None, limit: int = 66) -> str:
    """A command's line in `ctxeval --help`: the first sentence of its docstring (only a period before a capital
    ends one: 'vs. length', 'et al. 2024' do not), cut at a word to `limit` characters (80 columns with the names)."""
    words = (doc or "").split("\n\n")[0].split()
    for i, word in enumerate(words):
        if word.endswith(".") and (i == len(words) - 1 or words[i + 1][0].isupper()):
            words = words[: i + 1]
            break
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + "..."


for name, command in (
    ("methods", methods_cmd),
    ("plan", plan_cmd),
    ("ppl", ppl_cmd),
    ("needle", needle_cmd),
    ("passkey", passkey_cmd),
    ("report", report_cmd),
    ("entropy", entropy_cmd),
    ("bound", bound_cmd),
    ("ruler", ruler_cmd),
    ("lm-eval", lm_eval_cmd),
    ("tune", tune_cmd),
):
    app.command(name, short_help=short_help(command.__doc__))(command)


def main() -> None:
    # before torch touches CUDA: long-context forwards allocate blocks of very different sizes, and expandable
    # segments keep fragmentation from turning into out-of-memory (the user's own setting wins)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    app()
