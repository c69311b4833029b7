"""Typer app: one thin function per command (parse -> call the library -> render). Data to stdout, messages to
stderr; user errors are one red line with exit code 2 (--debug shows the traceback)."""

from __future__ import annotations

import csv
import functools
import io
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from . import methods as M
from .errors import CtxevalError
from .tasks import load_task

app = typer.Typer(
    help="Measure how well RoPE context-extension methods work: perplexity vs. length, needle in a haystack.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
out = Console(highlight=False, soft_wrap=True)
if not out.is_terminal:  # logs and files: print tables at their full width instead of the 80-column default
    out = Console(highlight=False, soft_wrap=True, width=240)
err = Console(stderr=True, highlight=False, soft_wrap=True)
_state = {"debug": False}


def user_errors(fn: Callable) -> Callable:
    """Turn CtxevalError into one red line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        finished = False
        try:
            result = fn(*args, **kwargs)
            finished = True
            return result
        except CtxevalError as exc:
            if _state["debug"]:
                raise
            if str(exc):  # empty: a torchrun rank whose error rank 0 already reported
                err.print(f"[red]error:[/red] {exc}", markup=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("[yellow]interrupted:[/yellow] finished points are kept; rerun the same command to resume",
                      markup=True)
            raise typer.Exit(130) from None
        finally:
            from .distributed import shutdown

            shutdown(together=finished)  # leave torch.distributed's process group (no-op without torchrun)

    return wrapper


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for user errors.")] = False) -> None:
    _state["debug"] = debug


class Fmt(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


# shared option types
MethodOpt = Annotated[
    list[str],
    typer.Option("--method", "-m", help="NAME or NAME:key=value,... (e.g. yarn:factor=4,beta_fast=32); repeatable."),
]
FactorOpt = Annotated[
    Optional[str], typer.Option("--factor", help="Scale s for every method that takes one; a list sweeps: 2,4,8.")
]


def _parse_numbers(text: str | None, flag: str, example: str) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CtxevalError(f"{flag} takes numbers separated by commas (e.g. {example}), got '{text}'") from None
    if not values:
        raise CtxevalError(f"{flag} is empty")
    return values


def parse_factors(text: str | None) -> list[float] | None:
    return _parse_numbers(text, "--factor", "2,4,8")


def parse_temperatures(text: str | None) -> list[float] | None:
    """--attention-temperature 1,1.1,1.2 -> [1.0, 1.1, 1.2] (each > 0)."""
    from .temperature import check_temperature

    values = _parse_numbers(text, "--attention-temperature", "1,1.2")
    return None if values is None else [check_temperature(v) for v in values]


TemperatureOpt = Annotated[
    Optional[str],
    typer.Option("--attention-temperature", help="Multiply every attention logit by LAMBDA (any model, RoPE or not; "
                                                 "1 = unchanged); a list sweeps: 1,1.1,1.2."),
]


# ---------------------------------------------------------------------------------------------------------------
@app.command("methods")
@user_errors
def methods_cmd(
    fmt: Annotated[Fmt, typer.Option("--format", help="table or json")] = Fmt.table,
) -> None:
    """List the RoPE methods, their parameters and defaults."""
    data = [
        {
            "name": m.name,
            "aliases": list(m.aliases),
            "length_dependent": m.length_dependent,
            "summary": m.summary,
            "params": [
                {"name": p.name, "default": p.default, "choices": list(p.choices) if p.choices else None, "help": p.help}
                for p in m.params
            ],
            "param_aliases": m.param_aliases,
        }
        for m in M.METHODS.values()
    ]
    if fmt == Fmt.json:
        print(json.dumps(data, indent=2))
        return
    if fmt == Fmt.csv:
        raise CtxevalError("methods supports --format table or json")
    table = Table(title="RoPE methods (ctxeval plan --method NAME shows one in detail)")
    for col in ("method", "depends on length", "parameters (default)", "what it does"):
        table.add_column(col, overflow="fold")
    for d in data:
        params = ", ".join(f"{p['name']}={p['default']}" for p in d["params"]) or "-"
        if d["param_aliases"]:
            params += "  [dim](" + ", ".join(f"{a}={b}" for a, b in d["param_aliases"].items()) + ")[/dim]"
        name = d["name"] + (f" ({', '.join(d['aliases'])})" if d["aliases"] else "")
        table.add_row(name, "yes" if d["length_dependent"] else "no", params, d["summary"])
    out.print(table)


# ---------------------------------------------------------------------------------------------------------------
@app.command("plan")
@user_errors
def plan_cmd(
    method: MethodOpt = ["yarn"],
    factor: FactorOpt = None,
    head_dim: Annotated[Optional[int], typer.Option(help="Head dim (rotary dim = head_dim * partial_rotary_factor).")] = None,
    partial_rotary_factor: Annotated[float, typer.Option(help="Fraction of the head dim that rotates.")] = 1.0,
    base: Annotated[Optional[float], typer.Option(help="RoPE base (rope_theta).")] = None,
    original_length: Annotated[Optional[int], typer.Option(help="Original trained context length L.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Read the geometry from this model's config instead.")] = None,
    length: Annotated[Optional[int], typer.Option(help="Sequence length (length-dependent methods).")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the model's own config code.")] = False,
    fmt: Annotated[Fmt, typer.Option("--format", help="table, json (every pair's inv_freq) or csv")] = Fmt.table,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG of the per-pair scale.")] = None,
) -> None:
    """Show the per-pair frequency plan of a method: wavelength, r = L/lambda, scale, group, attention factor."""
    geom, where = _plan_geometry(head_dim, partial_rotary_factor, base, original_length, model, trust_remote_code)
    specs = M.expand_specs(method, parse_factors(factor))
    if len(specs) != 1:
        raise CtxevalError(f"plan shows one method at a time; got {len(specs)}: {', '.join(s.label for s in specs)}")
    spec = specs[0]
    m = M.get_method(spec.name)
    if length is not None and not m.length_dependent:
        err.print(f"note: {m.name} does not depend on the sequence length; --length is ignored")
    freqs, rows = M.plan(m, geom, spec.params, length)
    full = M.resolve_params(m, spec.params)
    header = {
        "method": m.name,
        "params": full,
        "geometry": {"rotary_dim": geom.rotary_dim, "base": geom.base, "original_length": geom.original_length,
                     "source": where},
        "length": length if m.length_dependent else None,
        "attention_factor": freqs.attention_factor,
        "logit_scale": freqs.attention_factor**2,
    }
    if fmt == Fmt.json:
        print(json.dumps({**header, "pairs": [r.__dict__ for r in rows]}, indent=2))
    elif fmt == Fmt.csv:
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["pair", "wavelength", "ratio", "inv_freq", "scale", "group"])
        for r in rows:
            writer.writerow([r.pair, repr(r.wavelength), repr(r.ratio), repr(r.inv_freq), repr(r.scale), r.group])
        sys.stdout.write(buf.getvalue())
    else:
        title = (
            f"{spec.label} on d={geom.rotary_dim}, b={geom.base:g}, L={geom.original_length} ({where})"
            + (f", length {length}" if m.length_dependent and length else "")
        )
        table = Table(title=title)
        for col in ("pair", "wavelength", "r = L/λ", "inv_freq", "scale", "group"):
            table.add_column(col, justify="right" if col != "group" else "left")
        style = {"extrapolated": "green", "blended": "yellow", "interpolated": "red"}
        for r in rows:
            table.add_row(str(r.pair), f"{r.wavelength:,.1f}", f"{r.ratio:.4g}", f"{r.inv_freq:.6e}",
                          f"{r.scale:.4f}", f"[{style[r.group]}]{r.group}[/]")
        out.print(table)
        counts = {g: sum(r.group == g for r in rows) for g in style}
        out.print(
            f"attention factor {freqs.attention_factor:.6f} on q and k (logits x {freqs.attention_factor**2:.6f}); "
            + ", ".join(f"{n} {g}" for g, n in counts.items())
        )
    if plot is not None:
        from .plots import plot_plan

        plot_plan(rows, f"{spec.label}: d={geom.rotary_dim}, b={geom.base:g}", geom.original_length, plot)
        err.print(f"wrote {plot}")


def _plan_geometry(head_dim: int | None, partial: float, base: float | None, original_length: int | None,
                   model: str | None, trust_remote_code: bool) -> tuple[M.Geometry, str]:
    if model is not None:
        if head_dim or base or original_length:
            raise CtxevalError("give either --model or --head-dim/--base/--original-length, not both")
        from .models import load_config

        info = load_config(model, trust_remote_code=trust_remote_code)
        if info.geometry is None:
            raise CtxevalError(f"model '{model}' has no RoPE ({info.reason}); there is nothing to plan")
        return info.geometry, model
    missing = [n for n, v in (("--head-dim", head_dim), ("--base", base), ("--original-length", original_length)) if v is None]
    if missing:
        raise CtxevalError(f"plan needs {', '.join(missing)} (or --model to read them from a config)")
    if not 0 < partial <= 1:
        raise CtxevalError(f"--partial-rotary-factor must be in (0, 1], got {partial}")
    return M.Geometry(int(head_dim * partial), float(base), int(original_length)), "flags"


def main() -> None:
    app()


# ---------------------------------------------------------------------------------------------------------------
# shared evaluation options

def parse_lengths(text: str) -> list[int]:
    """'2k,4k,8k' | '1024:8192:1024' (linear) | '1k:16k:x2' (geometric); k = 1024."""

    def one(tok: str) -> int:
        tok = tok.strip().lower()
        try:
            value = float(tok[:-1]) * 1024 if tok.endswith("k") else float(tok)
        except ValueError:
            raise CtxevalError(f"bad length '{tok}' in --lengths '{text}'; write e.g. 2k,4k,8k or 1k:16k:x2") from None
        if value != int(value) or value < 2:
            raise CtxevalError(f"length '{tok}' must be a whole number of tokens >= 2")
        return int(value)

    values: list[int] = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        if ":" in part:
            pieces = part.split(":")
            if len(pieces) != 3:
                raise CtxevalError(f"a length range is START:STOP:STEP or START:STOP:xFACTOR, got '{part}'")
            start, stop, step = one(pieces[0]), one(pieces[1]), pieces[2].strip().lower()
            if step.startswith("x"):
                factor = float(step[1:]) if step[1:] else 0
                if factor <= 1:
                    raise CtxevalError(f"geometric step must be > 1, got '{step}'")
                v = float(start)
                while v <= stop + 1e-9:
                    values.append(int(round(v)))
                    v *= factor
            else:
                inc = one(step) if step not in ("0", "1") else int(step)
                if inc < 1:
                    raise CtxevalError(f"length step must be >= 1, got '{step}'")
                values.extend(range(start, stop + 1, inc))
        else:
            values.append(one(part))
    if not values:
        raise CtxevalError("--lengths is empty; write e.g. 2k,4k,8k")
    return sorted(set(values))


def safe_name(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(text).name if Path(text).exists() else text).strip("-")[:60] or "model"


class RichProgress:
    """The Progress interface drawn with rich: bar, ETA, current point, running ppl."""

    def __init__(self) -> None:
        import time as _time

        self.t0 = _time.perf_counter()
        self.live = err.is_terminal  # redirected stderr (logs, CI) gets one plain line per point instead
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

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
        text = description
        self.bar.update(self.task, advance=amount, description=text)
        if not self.live:
            import time as _time

            task = self.bar.tasks[0]
            err.print(f"[{_time.perf_counter() - self.t0:7.1f}s {task.completed / task.total:4.0%}] {text}")

    def note(self, message: str) -> None:
        self.bar.console.print(f"[yellow]{message}[/yellow]")


def _load_for(model: str, specs: list[M.MethodSpec], dtype: str, device: str, attn: str, trust_remote_code: bool,
              device_map: str | None = None, max_memory: str | None = None) -> Any:
    """Join torchrun's process group if there is one, then load the model once for a sweep (on this rank's device,
    or spread by --device-map); a model without RoPE accepts only method none."""
    from .distributed import init_from_env
    from .models import load_model, parse_max_memory

    memory = parse_max_memory(max_memory)
    if memory and not device_map:
        raise CtxevalError("--max-memory needs --device-map (e.g. --device-map auto)")
    dist, device = init_from_env(device)
    if dist.active and device_map:
        raise CtxevalError("--device-map spreads one model over several GPUs; under torchrun every rank loads its own "
                           "copy on its GPU. Use one or the other")
    if dist.active and not dist.is_main:
        dist.barrier()  # rank 0 loads first: it alone fills caches (the SmolLM2 conversion, hub downloads)
    lm = load_model(model, dtype=dtype, device=device, attn_implementation=attn, trust_remote_code=trust_remote_code,
                    device_map=device_map, max_memory=memory)
    if dist.active and dist.is_main:
        dist.barrier()
    if lm.rope.geometry is None and any(s.name not in ("none", "native") for s in specs):
        raise CtxevalError(f"model '{model}' has no RoPE ({lm.rope.reason}); only --method none applies")
    if any(s.temperature != 1.0 for s in specs):
        from .temperature import supports_temperature

        if not supports_temperature(lm.model, lm.device):
            raise CtxevalError(f"--attention-temperature: the attention of '{model}' exposes no logit scale that "
                               "ctxeval can change and that its forward reads ('scaling', or BLOOM's "
                               "inv_norm_factor/beta); drop the option")
    shipped = lm.rope.shipped.get("rope_type", "default")
    if shipped != "default" and any(s.name == "none" for s in specs):
        err.print(f"note: this checkpoint ships rope_type={shipped}; method none replaces it with plain RoPE at the "
                  "original length; add --method native to measure the RoPE it ships")
    return lm


class QuietProgress:
    """Progress of a rank other than 0 under torchrun: notes only, prefixed with the rank."""

    def __enter__(self) -> "QuietProgress":
        return self

    def __exit__(self, *exc: Any) -> None: ...
    def start(self, total: int) -> None: ...
    def advance(self, amount: int, description: str) -> None: ...

    def note(self, message: str) -> None:
        from .distributed import current

        err.print(f"[yellow]rank {current().rank}: {message}[/yellow]")


def _measure(run_dir: Path, spec_record: dict[str, Any], overwrite: bool, provenance: dict[str, Any], message: str,
             work: Callable[[Any, Any], None]) -> Any:
    """Open the run directory (rank 0 creates or resumes it), run `work(store, progress)` with run.json finalised
    whatever happens, merge the ranks' rows; returns the store on rank 0 and None on the others."""
    from .distributed import conclude, current, open_store
    from .store import RunStore, run_status

    dist = current()
    run_dir = dist.agree(run_dir)  # the default name comes from rank 0's clock
    store = open_store(RunStore, run_dir, spec_record, overwrite, provenance)
    if dist.is_main:
        err.print(message + (f"; {dist.world} ranks (torchrun)" if dist.active else ""))
    with run_status(store), (RichProgress() if dist.is_main else QuietProgress()) as progress:
        failed = None
        try:
            work(store, progress)
        except BaseException as exc:  # noqa: BLE001 - every rank must reach conclude(), failed or not
            failed = exc
        conclude(store, failed)
    return store if dist.is_main else None


def default_lengths(lm: Any, multiples: tuple[float, ...]) -> list[int]:
    """Lengths as multiples of the model's original length (its max_position_embeddings without RoPE)."""
    L = lm.rope.geometry.original_length if lm.rope.geometry else getattr(lm.model.config.get_text_config(), "max_position_embeddings", None)
    if not L:
        raise CtxevalError(f"'{lm.name}' declares no trained length (max_position_embeddings); give --lengths")
    return sorted({max(2, int(L * m)) for m in multiples})


def _default_out(task: str, model: str, out: Path | None) -> Path:
    import time

    return out or Path("results") / f"{task}-{safe_name(model)}-{time.strftime('%Y%m%d-%H%M%S')}"


MODEL_HELP = ("Hub id (owner/name), local dir, .gguf file, or bundled name: tiny (default; omitting --model also applies "
              "the quickstart settings of ctxeval/tiny/__init__.py) or smollm2.")
ModelOpt = Annotated[Optional[str], typer.Option("--model", help=MODEL_HELP)]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="auto|bfloat16|float16|float32 (auto: bf16 on GPU, fp32 on CPU).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto|cpu|cuda|cuda:N")]
AttnOpt = Annotated[str, typer.Option("--attn", help="Attention implementation: sdpa|eager|flash_attention_2.")]
RemoteOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Run the model repository's own code.")]
DeviceMapOpt = Annotated[Optional[str], typer.Option(
    "--device-map", help="auto|balanced|sequential: spread a model too large for one GPU over all visible GPUs (accelerate).")]
MaxMemoryOpt = Annotated[Optional[str], typer.Option(
    "--max-memory", help="With --device-map: memory per device, e.g. 0=70GiB,1=70GiB,cpu=200GiB.")]

PPL_DEFAULTS: dict[str, Any] = {
    "model": "tiny", "data": "pydoc", "text_field": "text", "lengths": None, "method": ["none"],
    "protocol": "truncate", "docs": 1, "stride": None, "aggregate": "token", "bos": True,
}


@app.command("ppl")
@user_errors
def ppl_cmd(
    model: ModelOpt = None,
    data: Annotated[Optional[str], typer.Option(help="pydoc (default) | austen | mobydick | files/dirs/globs | hf:NAME[:CONFIG][@SPLIT]")] = None,
    text_field: Annotated[Optional[str], typer.Option(help="Record field holding the text (.jsonl/.parquet/.csv/hf).")] = None,
    lengths: Annotated[Optional[str], typer.Option(help="Evaluation lengths: 2k,4k,8k | 1k:16k:x2 | 1024:8192:1024 "
                                                      "(default: 0.5x, 1x and 2x the model's original length).")] = None,
    method: Annotated[Optional[list[str]], typer.Option("--method", "-m", help="NAME or NAME:key=value,...; repeatable.")] = None,
    factor: FactorOpt = None,
    attention_temperature: TemperatureOpt = None,
    protocol: Annotated[Optional[str], typer.Option(help="truncate (YaRN paper) | sliding.")] = None,
    docs: Annotated[Optional[int], typer.Option(help="Number of documents.")] = None,
    stride: Annotated[Optional[int], typer.Option(help="Sliding-window stride S (protocol sliding).")] = None,
    aggregate: Annotated[Optional[str], typer.Option(help="token (token-weighted) | window (mean of window means).")] = None,
    bos: Annotated[Optional[bool], typer.Option("--bos/--no-bos", help="Start each sequence with the tokenizer's BOS.")] = None,
    chunk_size: Annotated[int, typer.Option(help="Positions per LM-head chunk (memory vs. speed).")] = 1024,
    valid_tolerance: Annotated[float, typer.Option(help="Valid-length table: allowed ppl rise over the original length.")] = 0.10,
    task: Annotated[Optional[str], typer.Option(help="Preset name (ppl-austen, ppl-pg19, ppl-yarn-proofpile) or .toml path.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Run directory (default results/ppl-<model>-<time>).")] = None,
    overwrite: OverwriteOpt = False,
    seed: Annotated[int, typer.Option(help="Seed recorded in the run (the protocols draw nothing at random).")] = 0,
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    attn: AttnOpt = "sdpa",
    trust_remote_code: RemoteOpt = False,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the memory each length needs (from the config "
                                                          "alone) and exit without loading weights.")] = False,
) -> None:
    """Perplexity vs. context length for each method: the YaRN paper's table, a plot, a resumable run directory."""
    from . import corpora
    from .evals.perplexity import AGGREGATES, PplConfig, sweep
    given = {"model": model, "data": data, "text_field": text_field, "lengths": lengths, "method": method,
             "protocol": protocol, "docs": docs, "stride": stride, "aggregate": aggregate, "bos": bos}
    quickstart = model is None and task is None
    preset = load_task(task, "ppl") if task else (_quickstart("ppl", factor is not None and method is None) if quickstart else {})
    unknown = set(preset) - set(PPL_DEFAULTS)
    if unknown:
        raise CtxevalError(f"task '{task}' sets unknown keys: {', '.join(sorted(unknown))}")
    opt = {k: given[k] if given[k] is not None else preset.get(k, PPL_DEFAULTS[k]) for k in PPL_DEFAULTS}
    if opt["aggregate"] not in AGGREGATES:
        raise CtxevalError(f"--aggregate must be one of {', '.join(AGGREGATES)}, got '{opt['aggregate']}'")
    if opt["docs"] < 1:
        raise CtxevalError(f"--docs must be >= 1, got {opt['docs']}")
    methods_list = opt["method"] if isinstance(opt["method"], list) else [opt["method"]]
    specs = M.expand_specs(methods_list, parse_factors(factor), parse_temperatures(attention_temperature))
    lengths_given = parse_lengths(opt["lengths"]) if opt["lengths"] is not None else None
    if lengths_given:
        PplConfig(tuple(lengths_given), opt["protocol"], opt["stride"], opt["bos"], chunk_size)  # fail before loading

    if dry_run:
        from .memory import print_estimate

        print_estimate(opt["model"], tuple(lengths_given or ()), dtype, device, attn, chunk_size, trust_remote_code)
        return
    lm = _load_for(opt["model"], specs, dtype, device, attn, trust_remote_code, device_map, max_memory)
    cfg = PplConfig(tuple(lengths_given or default_lengths(lm, (0.5, 1, 2))), opt["protocol"], opt["stride"],
                    opt["bos"], chunk_size)
    if cfg.bos and getattr(lm.tokenizer, "bos_token_id", None) is None:
        err.print("note: the tokenizer has no BOS token; sequences start with document text (as --no-bos)")
        cfg = PplConfig(cfg.lengths, cfg.protocol, cfg.stride, False, cfg.chunk_size)
    from .evals.perplexity import check_chunked_head

    check_chunked_head(lm.model, lm.device, lm.model.config.get_text_config().vocab_size)
    top = max(cfg.lengths)
    if cfg.protocol == "truncate":
        documents = corpora.select_long_documents(opt["data"], lm.tokenizer, opt["docs"], cfg.doc_tokens_needed(top), opt["text_field"])
    else:
        documents = corpora.first_documents(opt["data"], lm.tokenizer, opt["docs"], opt["text_field"])
    original = lm.rope.geometry.original_length if lm.rope.geometry else getattr(lm.model.config.get_text_config(), "max_position_embeddings", top)

    spec_record = {
        "task": "ppl", "model": opt["model"], "data": opt["data"], "text_field": opt["text_field"],
        "protocol": cfg.protocol, "stride": cfg.stride, "bos": cfg.bos, "docs": opt["docs"],
        "lengths": list(cfg.lengths), "methods": [s.label for s in specs], "dtype": lm.dtype, "seed": seed,
        "preset": task,
        **({"settings": "quickstart (ctxeval/tiny/__init__.py)"} if quickstart else {}),
    }
    run_dir = _default_out("ppl", opt["model"], out)
    provenance = {
        "model": lm.record(),
        "data": {"spec": opt["data"], "documents": [{"doc": d.doc_id, "tokens": int(len(d.ids))} for d in documents]},
        "protocol": {"name": cfg.protocol, "stride": cfg.stride, "bos": cfg.bos,
                     "bos_token": getattr(lm.tokenizer, "bos_token", None) if cfg.bos else None,
                     "aggregate": opt["aggregate"], "chunk_size": cfg.chunk_size,
                     "one_forward_per_document": cfg.protocol == "truncate"},
        "seed": seed,
    }
    message = (f"run directory: {run_dir}  ({len(documents)} document(s): "
               + ", ".join(f"{d.doc_id} {len(d.ids):,} tokens" for d in documents) + ")")
    store = _measure(run_dir, spec_record, overwrite, provenance, message,
                     lambda store, progress: sweep(lm, specs, documents, cfg, store, progress))
    if store is not None:
        render_ppl(store, specs, original, opt["aggregate"], valid_tolerance, title=f"{opt['model']} on {opt['data']} ({cfg.protocol})")


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


def render_ppl(store: Any, specs: list[M.MethodSpec], original_length: int, aggregate: str, tolerance: float,
               title: str) -> None:
    """table.md / table.csv / valid.csv / ppl.png in the run directory, and the rich table on stdout."""
    from . import report
    from .plots import plot_ppl

    long = report.ppl_long(store.rows(), aggregate)
    wide = report.ppl_wide(long, [s.label for s in specs])
    status = report.status_wide(long, wide)
    valid = report.valid_lengths(wide, original_length, tolerance)
    headers, rows = report.ppl_cells(wide, status)
    vheaders, vrows = report.valid_cells(valid)
    n_docs = int(long["n_docs"].max()) if len(long) else 0
    caption = f"Perplexity ({aggregate}-weighted over {n_docs} document(s)); original length {original_length}."
    (store.dir / "table.md").write_text(
        f"# {title}\n\n{caption}\n\n" + report.markdown(headers, rows)
        + f"\n## Valid length (ppl within {tolerance:.0%} of the reference)\n\n" + report.markdown(vheaders, vrows)
    )
    export = wide.copy()
    export.index.name = "method"
    export.to_csv(store.dir / "table.csv", float_format="%.6g")
    valid.to_csv(store.dir / "valid.csv", index=False, float_format="%.6g")
    plot_ppl(wide, original_length, title, store.dir / "ppl.png")
    print_table(title, caption, headers, rows)
    print_table(f"valid length (ppl within {tolerance:.0%})", None, vheaders, [[str(c) for c in r] for r in vrows])
    err.print(f"wrote {store.dir}/table.md, table.csv, valid.csv, ppl.png")


# ---------------------------------------------------------------------------------------------------------------
# needle / passkey

def parse_depths(text: str, spacing: str) -> list[float]:
    """'0,50,100' | '0:100:11' (start:stop:count); --depth-spacing sigmoid packs count depths towards the ends."""
    if spacing not in ("linear", "sigmoid"):
        raise CtxevalError(f"--depth-spacing must be linear or sigmoid, got '{spacing}'")
    try:
        if ":" in text:
            start, stop, count = text.split(":")
            start, stop, n = float(start), float(stop), int(count)
            if n < 1:
                raise ValueError
            if spacing == "sigmoid":
                from .evals.needle import sigmoid_depths

                values = [start + (stop - start) * d / 100 for d in sigmoid_depths(n)]
            else:
                values = [start + (stop - start) * i / max(n - 1, 1) for i in range(n)] if n > 1 else [start]
        else:
            values = [float(v) for v in text.split(",") if v.strip()]
            if spacing == "sigmoid":
                raise CtxevalError("--depth-spacing sigmoid needs a START:STOP:COUNT range in --depths")
    except ValueError:
        raise CtxevalError(f"bad --depths '{text}'; write 0,50,100 or 0:100:11") from None
    values = sorted({round(v, 2) for v in values})
    bad = [v for v in values if not 0 <= v <= 100]
    if bad:
        raise CtxevalError(f"depths are percentages in 0..100, got {bad[0]:g}")
    if not values:
        raise CtxevalError("--depths is empty")
    return values


def _load_preset(name: str, needle_text: str | None, question: str | None, answer_prefix: str | None,
                 answer: str | None) -> Any:
    from .evals.needle import NeedlePreset

    if name.endswith(".toml"):
        data = load_task(name, "needle")
    else:
        from .tasks import preset_names

        choices = [n.removeprefix("needle-") for n in preset_names("needle")]
        if name not in choices:
            raise CtxevalError(f"unknown needle preset '{name}'; choose one of {', '.join(choices)}, or a .toml file")
        data = load_task(f"needle-{name}", "needle")
    overrides = {"needle": needle_text, "question": question, "answer_prefix": answer_prefix}
    data.update({k: v for k, v in overrides.items() if v is not None})
    if answer is not None:
        data.update(value=f"fixed:{answer}", match="all", keys=1, values_per_key=1)
    return NeedlePreset.from_dict(Path(name).stem if name.endswith(".toml") else name, data)


def _quickstart(task: str, factor_given: bool = False) -> dict[str, Any]:
    """The quickstart settings of `task`; with --factor (and no --method) its methods drop their own factor so that
    the user's factor sweeps them."""
    from .tiny import QUICKSTART

    settings = dict(QUICKSTART[task])
    if factor_given:
        def strip(spec: str) -> str:
            name, _, rest = spec.partition(":")
            kept = [kv for kv in rest.split(",") if kv and not kv.strip().startswith("factor=")]
            return name + (":" + ",".join(kept) if kept else "")

        settings["method"] = [strip(m) for m in settings["method"]]
    return settings


def _retrieval(task: str, *, model: str | None, lengths: str | None, depths: str | None, depth_spacing: str,
               samples: int | None,
               needle: str, needle_text: str | None, question: str | None, answer_prefix: str | None,
               answer: str | None, haystack: str, text_field: str, snap: bool, chat_template: str, scoring: str,
               max_new_tokens: int | None, batch_size: int, threshold: float, method: list[str] | None,
               factor: str | None, attention_temperature: str | None, seed: int, out: Path | None, overwrite: bool,
               dtype: str, device: str, attn: str, trust_remote_code: bool, device_map: str | None,
               max_memory: str | None) -> None:
    from .evals.needle import NeedleConfig, NeedleRunner, PromptBuilder, haystack_tokens, make_sample, sweep

    quickstart = model is None
    if quickstart:  # the bundled model with its quickstart settings, each overridden by what the user gave
        from .models import DEFAULT_MODEL

        qs = _quickstart(task, factor is not None and method is None)
        model = DEFAULT_MODEL
        lengths = lengths if lengths is not None else qs.get("lengths")
        samples = samples if samples is not None else qs.get("samples")
        method = method if method is not None else list(qs.get("method", ["none"]))
    samples = samples if samples is not None else (10 if task == "passkey" else 1)
    method = method if method is not None else ["none"]

    import numpy as np

    preset = _load_preset(needle, needle_text, question, answer_prefix, answer)
    specs = M.expand_specs(method, parse_factors(factor), parse_temperatures(attention_temperature))
    random_depth = task == "passkey"
    lengths_given = parse_lengths(lengths) if lengths is not None else None
    depth_list = tuple(parse_depths(depths, depth_spacing)) if not random_depth else ()
    cfg = NeedleConfig(tuple(lengths_given or (1,)), depth_list, samples, scoring, max_new_tokens, seed, random_depth,
                       batch_size)  # validates the flags before the model loads; lengths may come from the model
    if chat_template not in ("auto", "on", "off"):
        raise CtxevalError(f"--chat-template must be auto, on or off, got '{chat_template}'")
    if not 0 < threshold <= 1:
        raise CtxevalError(f"--threshold must be in (0, 1], got {threshold}")

    lm = _load_for(model, specs, dtype, device, attn, trust_remote_code, device_map, max_memory)
    if lengths_given is None:
        from dataclasses import replace

        cfg = replace(cfg, lengths=tuple(default_lengths(lm, (0.25, 0.5, 1, 2))))
    has_template = bool(getattr(lm.tokenizer, "chat_template", None))
    if chat_template == "on" and not has_template:
        raise CtxevalError(f"--chat-template on, but the tokenizer of '{model}' has no chat template; use auto or off")
    use_template = has_template if chat_template == "auto" else chat_template == "on"
    hay_ids, hay_info = haystack_tokens(lm.tokenizer, haystack, max(cfg.lengths), text_field)
    builder = PromptBuilder(lm.tokenizer, preset, hay_ids, chat_template=use_template, snap=snap)
    probe = make_sample(preset, np.random.default_rng(seed))
    runner = NeedleRunner(lm.model, lm.tokenizer, lm.device, builder, cfg, lm.name, task)
    need = builder.minimum_length(probe, runner.budget(probe))
    if lengths_given is None and min(cfg.lengths) < need and max(cfg.lengths) >= need:
        from dataclasses import replace

        dropped = [L for L in cfg.lengths if L < need]
        err.print(f"note: default lengths {', '.join(map(str, dropped))} are shorter than the prompt ({need} tokens); "
                  "left out")
        cfg = replace(cfg, lengths=tuple(L for L in cfg.lengths if L >= need))
        runner = NeedleRunner(lm.model, lm.tokenizer, lm.device, builder, cfg, lm.name, task)
    if min(cfg.lengths) < need:
        raise CtxevalError(f"length {min(cfg.lengths)} is shorter than the instruction, needle and question "
                           f"({need} tokens with this tokenizer); use --lengths of at least {need}")
    if len(hay_ids) < max(cfg.lengths):
        raise CtxevalError(f"the haystack '{haystack}' has {len(hay_ids):,} tokens, fewer than --lengths {max(cfg.lengths)}; "
                           "use a longer corpus or shorter lengths")
    original = lm.rope.geometry.original_length if lm.rope.geometry else None
    spec_record = {
        "task": task, "model": model, "preset": preset.__dict__, "haystack": haystack, "text_field": text_field,
        "lengths": list(cfg.lengths), "depths": list(cfg.depths), "random_depth": random_depth, "samples": samples,
        "scoring": scoring, "max_new_tokens": max_new_tokens, "snap": snap, "chat_template": use_template,
        "methods": [s.label for s in specs], "dtype": lm.dtype, "seed": seed,
        **({"settings": "quickstart (ctxeval/tiny/__init__.py)"} if quickstart else {}),
    }
    run_dir = _default_out(task, model, out)
    provenance = {"model": lm.record(), "haystack": hay_info, "seed": seed,
                  "scoring": {"name": scoring, "rule": preset.match, "llm_judge": False}}
    message = (f"run directory: {run_dir}  ({len(cfg.cells())} samples per method; chat template "
               f"{'on' if use_template else 'off'}; scoring {scoring})")

    def work(store: Any, progress: Any) -> None:
        runner.progress = progress
        sweep(lm, specs, runner, store)

    store = _measure(run_dir, spec_record, overwrite, provenance, message, work)
    if store is not None:
        render_retrieval(store, task, specs, original, threshold, f"{model}: {preset.name} in {haystack}")


def render_retrieval(store: Any, task: str, specs: list[M.MethodSpec], original: int | None, threshold: float,
                     title: str) -> None:
    """Per method heatmap + accuracy table (depth x length); summary (method x length) with effective length."""
    from . import report
    from .plots import plot_heatmap

    df = report.needle_long(store.rows())
    order = [s.label for s in specs]
    summary = report.needle_summary(df, order, threshold)
    lengths = [c for c in summary.columns if c != "effective length"]
    headers = ["method"] + [report.fmt_length(c) for c in lengths] + [f"effective length (>= {threshold:.0%})"]
    rows = [[label] + [report.fmt_acc(summary.loc[label, c]) for c in lengths]
            + [report.fmt_length(int(summary.loc[label, "effective length"])) if not pd_isna(summary.loc[label, "effective length"]) else "none"]
            for label in summary.index]
    md = [f"# {title}\n\n", f"Mean accuracy over depths and samples; scoring without an LLM judge. Original length {original}.\n\n",
          report.markdown(headers, rows)]
    if task == "passkey":
        pk = report.passkey_summary(df, order, threshold)
        prow = [[r["method"], report.fmt_length(int(r["passkey context"])) if not pd_isna(r["passkey context"]) else "none",
                 report.fmt_acc(r["mean accuracy up to it"])] for _, r in pk.iterrows()]
        md += [f"\n## Passkey context (accuracy >= {threshold:.0%})\n\n", report.markdown(["method", "passkey context", "mean accuracy up to it"], prow)]
        pk.to_csv(store.dir / "passkey.csv", index=False)
    for label in summary.index:
        grid, status = report.accuracy_grid(df, label)
        if task != "passkey":
            gh = ["depth"] + [report.fmt_length(c) for c in grid.columns]
            gr = [[f"{d:g}%"] + [report.fmt_acc(grid.loc[d, c], status.loc[d, c]) for c in grid.columns] for d in grid.index]
            md += [f"\n## {label}: accuracy by depth and length\n\n", report.markdown(gh, gr)]
            plot_heatmap(grid, status, f"{label}: {title}", original, store.dir / f"heatmap-{safe_name(label)}.png")
    (store.dir / "table.md").write_text("".join(md))
    export = summary.copy()
    export.index.name = "method"
    export.to_csv(store.dir / "summary.csv")
    print_table(title, f"mean accuracy; effective length = longest length with every shorter length >= {threshold:.0%}",
                headers, rows)
    err.print(f"wrote {store.dir}/table.md, summary.csv" + (", heatmap-*.png" if task != "passkey" else ", passkey.csv"))


def pd_isna(value: Any) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value))


_NEEDLE_HELP = "Preset: ruler, ruler-multikey, ruler-multivalue, ruler-multiquery, passkey, gkamradt, or a .toml file."
TextFieldOpt = Annotated[str, typer.Option(help="Record field holding the text.")]
ScoringOpt = Annotated[str, typer.Option(help="generate (greedy + string match) | forced (one teacher-forced pass).")]
MaxNewOpt = Annotated[Optional[int], typer.Option(help="Generation budget (default: answer tokens + 8).")]
BatchOpt = Annotated[int, typer.Option(help="Forced scoring: prompts of one length per forward.")]
SeedOpt = Annotated[int, typer.Option(help="Seed of every random choice (values, keys, depths, offsets).")]
OutOpt = Annotated[Optional[Path], typer.Option(help="Run directory (default results/<command>-<model>-<time>).")]
OverwriteOpt = Annotated[bool, typer.Option(help="Replace a run directory that holds a different spec.")]


@app.command("needle")
@user_errors
def needle_cmd(
    model: ModelOpt = None,
    lengths: Annotated[Optional[str], typer.Option(help="Context lengths in tokens: 1k,2k,4k | 1k:16k:x2 "
                                                   "(default: 0.25x, 0.5x, 1x, 2x the model's original length).")] = None,
    depths: Annotated[str, typer.Option(help="Needle depths in percent: 0,50,100 | 0:100:11 (start:stop:count).")] = "0:100:5",
    depth_spacing: Annotated[str, typer.Option(help="linear | sigmoid (packed towards the ends, as the original test).")] = "linear",
    samples: Annotated[Optional[int], typer.Option(help="Samples per cell, each with its own seeded needle and offset "
                                                   "(default 1).")] = None,
    needle: Annotated[str, typer.Option(help=_NEEDLE_HELP)] = "ruler",
    needle_text: Annotated[Optional[str], typer.Option(help="Override the needle sentence ({key}, {value}).")] = None,
    question: Annotated[Optional[str], typer.Option(help="Override the question ({keys}).")] = None,
    answer_prefix: Annotated[Optional[str], typer.Option(help="Override the answer prefix.")] = None,
    answer: Annotated[Optional[str], typer.Option(help="A fixed expected answer (with --needle-text).")] = None,
    haystack: Annotated[str, typer.Option(help="pydoc | filler | austen | mobydick | files | hf:NAME (any --data spec).")] = "pydoc",
    text_field: TextFieldOpt = "text",
    snap: Annotated[bool, typer.Option(help="Move each needle back to the previous sentence end.")] = False,
    chat_template: Annotated[str, typer.Option(help="auto | on | off: wrap as a user turn, prefill the answer prefix.")] = "auto",
    scoring: ScoringOpt = "generate",
    max_new_tokens: MaxNewOpt = None,
    batch_size: BatchOpt = 4,
    threshold: Annotated[float, typer.Option(help="Accuracy that counts for the effective length.")] = 0.8,
    method: Annotated[Optional[list[str]], typer.Option("--method", "-m", help="NAME or NAME:key=value,...; repeatable "
                                                        "(default none).")] = None,
    factor: FactorOpt = None,
    attention_temperature: TemperatureOpt = None,
    seed: SeedOpt = 0,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    attn: AttnOpt = "sdpa",
    trust_remote_code: RemoteOpt = False,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
) -> None:
    """Needle in a haystack: accuracy over a depth x length grid per method, heatmaps, effective length."""
    _retrieval("needle", **{k: v for k, v in locals().items()})


@app.command("passkey")
@user_errors
def passkey_cmd(
    model: ModelOpt = None,
    lengths: Annotated[Optional[str], typer.Option(help="Context lengths in tokens: 1k,2k,4k | 1k:16k:x2 "
                                                   "(default: 0.25x, 0.5x, 1x, 2x the model's original length).")] = None,
    samples: Annotated[Optional[int], typer.Option(help="Samples per length, each at a seeded uniform random depth "
                                                   "(default 10).")] = None,
    haystack: Annotated[str, typer.Option(help="filler (the original test's) or any --data spec.")] = "filler",
    text_field: TextFieldOpt = "text",
    chat_template: Annotated[str, typer.Option(help="auto | on | off")] = "off",
    scoring: ScoringOpt = "generate",
    max_new_tokens: MaxNewOpt = None,
    batch_size: BatchOpt = 4,
    threshold: Annotated[float, typer.Option(help="Accuracy that counts for the passkey context.")] = 0.8,
    method: Annotated[Optional[list[str]], typer.Option("--method", "-m", help="NAME or NAME:key=value,...; repeatable "
                                                        "(default none).")] = None,
    factor: FactorOpt = None,
    attention_temperature: TemperatureOpt = None,
    seed: SeedOpt = 0,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    attn: AttnOpt = "sdpa",
    trust_remote_code: RemoteOpt = False,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
) -> None:
    """Passkey retrieval (YaRN's): per length accuracy, passkey context and mean accuracy up to it."""
    _retrieval("passkey", depths=None, depth_spacing="linear", needle="passkey", needle_text=None, question=None,
               answer_prefix=None, answer=None, snap=False, **{k: v for k, v in locals().items()})


# commands that live in their own modules
from .cli_report import register as _register_report  # noqa: E402

_register_report(app)
from .cli_entropy import register as _register_entropy  # noqa: E402

_register_entropy(app)
from .cli_bound import register as _register_bound  # noqa: E402

_register_bound(app)
