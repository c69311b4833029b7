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

from .console import ReadableCommand, state
from .entropy import entropy_cmd
from .lm_eval import lm_eval_cmd
from .methods import bound_cmd, methods_cmd, plan_cmd
from .needle import needle_cmd, passkey_cmd
from .ppl import ppl_cmd
from .report import report_cmd
from .ruler import ruler_cmd
from .tune import tune_cmd

EXAMPLES = """Examples:

\b
  ctxeval ppl && ctxeval needle        the quickstart: the bundled tiny model
  ctxeval methods                      every method, its parameters, defaults
  ctxeval ppl --model M --lengths 4k,8k,16k -m none -m yarn
  ctxeval report runs/* --html report.html

Docs: README.md and docs/ in the repository; each command's --help."""

app = typer.Typer(
    help="Measure how well RoPE context-extension methods work: perplexity vs. length, needle in a haystack.",
    epilog=EXAMPLES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    # click's own help layout: rich's option table cuts long option names to fit 80 columns and reads '[@SPLIT]' in
    # a help text as markup; click's writes every name in full and wraps only the help text
    rich_markup_mode=None,
)
# each command's line in `ctxeval --help`: short enough for 80 columns (the docstring's first sentence is its --help)
SUMMARIES = {
    "methods": "List every method, its kind, parameters and defaults.",
    "plan": "Show what a method does to each rotary pair.",
    "ppl": "Perplexity vs. context length for each method.",
    "needle": "Needle-in-a-haystack accuracy over depth x length.",
    "passkey": "Passkey retrieval accuracy by length (the YaRN repo's test).",
    "report": "Merge run directories into tables and one HTML page.",
    "entropy": "Attention entropy vs. context length for each method.",
    "bound": "The smallest RoPE base a context length needs (Men et al.).",
    "ruler": "RULER's synthetic tasks and the effective length.",
    "lm-eval": "Any lm-evaluation-harness task under each method.",
    "tune": "Search a method's parameters for a target length; export them.",
}


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
    app.command(name, short_help=SUMMARIES[name], cls=ReadableCommand)(command)


def main() -> None:
    # before torch touches CUDA: long-context forwards allocate blocks of very different sizes, and expandable
    # segments keep fragmentation from turning into out-of-memory (the user's own setting wins)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    app()
