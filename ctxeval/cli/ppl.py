"""`ctxeval ppl`: perplexity vs. context length per method (YaRN's table), and its --dry-run memory estimate."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from .. import corpora
from ..errors import CtxevalError
from ..memory import GIB, dry_run
from ..presets import load_task
from ..rows import AGGREGATES
from ..specs import MethodSpec, expand_specs
from .console import err, print_outputs, print_table, user_errors
from .options import (DOCS, VALID_TOLERANCE, AttnOpt, Check, DeviceMapOpt, DeviceOpt, DtypeOpt, FactorOpt,
                      MaxMemoryOpt, ModelOpt, OverwriteOpt, RemoteOpt, TemperatureOpt, parse_factors, parse_lengths,
                      parse_temperatures)
from .run import (QUICKSTART_SETTINGS, default_lengths, default_out, load_for, measure, note_attention_noops,
                  quickstart)

if TYPE_CHECKING:
    from ..evals.perplexity import PplConfig

# torch, transformers, pandas and matplotlib load only when a command needs them (`ctxeval --help` starts in
# well under a second): the evaluation and report modules are imported inside the command functions.


@dataclass(frozen=True)
class PplSettings:
    """The settings a preset (--task) or the quickstart may set; a flag the user gives overrides them."""

    model: str = "tiny"
    data: str = "pydoc"
    text_field: str = "text"
    lengths: Optional[str] = None  # None: 0.5x, 1x, 2x the trained length
    method: tuple[str, ...] = ("none",)
    protocol: str = "truncate"
    docs: int = 1
    stride: Optional[int] = None
    aggregate: str = "token"
    bos: bool = True

    @classmethod
    def resolve(cls, given: dict[str, Any], preset: dict[str, Any], task: str | None) -> "PplSettings":
        """flags > preset (or quickstart) > defaults; the preset's values pass the same checks as the flags."""
        names = {f.name for f in fields(cls)}
        unknown = set(preset) - names
        if unknown:
            raise CtxevalError(f"task '{task}' sets unknown keys: {', '.join(sorted(unknown))}")
        chosen = {k: v for k, v in preset.items()}
        chosen.update({k: v for k, v in given.items() if v is not None})
        if isinstance(chosen.get("method"), (list, tuple)):
            chosen["method"] = tuple(chosen["method"])
        elif "method" in chosen:
            chosen["method"] = (chosen["method"],)
        settings = cls(**chosen)
        if settings.aggregate not in AGGREGATES:
            raise CtxevalError(f"--aggregate must be one of {', '.join(AGGREGATES)}, got '{settings.aggregate}'")
        DOCS(settings.docs)
        return settings


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
    docs: Annotated[Optional[int], typer.Option(help="Number of documents."), DOCS] = None,
    stride: Annotated[Optional[int], typer.Option(help="Sliding-window stride S (protocol sliding).")] = None,
    aggregate: Annotated[Optional[str], typer.Option(help="token (token-weighted) | window (mean of window means).")] = None,
    bos: Annotated[Optional[bool], typer.Option("--bos/--no-bos", help="Start each sequence with the tokenizer's BOS.")] = None,
    chunk_size: Annotated[int, typer.Option(help="Positions per LM-head chunk (memory vs. speed)."),
                          Check("--chunk-size", minimum=1)] = 1024,
    valid_tolerance: Annotated[float, typer.Option(help="Valid-length table: allowed ppl rise over the original length."),
                               VALID_TOLERANCE] = 0.10,
    task: Annotated[Optional[str], typer.Option(help="Preset name (ppl-austen, ppl-pg19, ppl-yarn-proofpile) or .toml path.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Run directory (default results/ppl-<model>-<time>).")] = None,
    overwrite: OverwriteOpt = False,
    seed: Annotated[int, typer.Option(help="Seed recorded in the run (the protocols draw nothing at random)."),
                    Check("--seed", minimum=0)] = 0,
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
    from ..evals.perplexity import PplConfig, check_chunked_head, sweep
    from ..report.single import render_ppl

    given = {"model": model, "data": data, "text_field": text_field, "lengths": lengths, "method": method,
             "protocol": protocol, "docs": docs, "stride": stride, "aggregate": aggregate, "bos": bos}
    is_quickstart = model is None and task is None
    preset = (load_task(task, "ppl") if task else
              quickstart("ppl", factor is not None and method is None) if is_quickstart else {})
    settings = PplSettings.resolve(given, preset, task)
    specs = expand_specs(list(settings.method), parse_factors(factor), parse_temperatures(attention_temperature))
    lengths_given = tuple(parse_lengths(settings.lengths)) if settings.lengths is not None else None
    cfg = (PplConfig(lengths_given, settings.protocol, settings.stride, settings.bos, chunk_size)  # fails before loading
           if lengths_given else None)
    if dry_run:
        print_dry_run(settings.model, lengths_given or (), dtype, device, attn, chunk_size, trust_remote_code)
        return

    lm = load_for(settings.model, specs, dtype, device, attn, trust_remote_code, device_map, max_memory)
    if cfg is None:
        cfg = PplConfig(tuple(default_lengths(lm, (0.5, 1, 2))), settings.protocol, settings.stride, settings.bos,
                        chunk_size)
    if cfg.bos and getattr(lm.tokenizer, "bos_token_id", None) is None:
        err.print("note: the tokenizer has no BOS token; sequences start with document text (as --no-bos)")
        cfg = replace(cfg, bos=False)
    note_attention_noops(specs, list(cfg.lengths), lm.trained_length)
    check_chunked_head(lm.model, lm.device, lm.model.config.get_text_config().vocab_size)
    documents = select_documents(settings, cfg, lm.tokenizer)
    spec_record, provenance = run_records(settings, cfg, specs, lm, documents, seed, task, is_quickstart)
    run_dir = default_out("ppl", settings.model, out)
    message = (f"run directory: {run_dir}  ({len(documents)} document(s): "
               + ", ".join(f"{d.doc_id} {len(d.ids):,} tokens" for d in documents) + ")")
    title = f"{settings.model} on {settings.data} ({cfg.protocol})"
    original = lm.trained_length or max(cfg.lengths)
    measure(run_dir, spec_record, overwrite, provenance, message,
            work=lambda store, progress: sweep(lm, specs, documents, cfg, store, progress),
            render=lambda store: print_outputs(render_ppl(store, specs, original, settings.aggregate,
                                                          valid_tolerance, title)))


def select_documents(settings: PplSettings, cfg: PplConfig, tokenizer: Any) -> list[corpora.TokenDoc]:
    """The protocol's documents: the first `docs` with max(lengths) tokens (truncate), or the first `docs`
    (sliding)."""
    if cfg.protocol == "truncate":
        return corpora.select_long_documents(settings.data, tokenizer, settings.docs,
                                             cfg.doc_tokens_needed(max(cfg.lengths)), settings.text_field)
    return corpora.first_documents(settings.data, tokenizer, settings.docs, settings.text_field)


def run_records(settings: PplSettings, cfg: PplConfig, specs: list[MethodSpec], lm: Any,
                documents: list[corpora.TokenDoc], seed: int, task: str | None,
                is_quickstart: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """run.json's `spec` (what a resume must match) and provenance (model, documents, protocol)."""
    spec_record = {
        "task": "ppl", "model": settings.model, "data": settings.data, "text_field": settings.text_field,
        "protocol": cfg.protocol, "stride": cfg.stride, "bos": cfg.bos, "docs": settings.docs,
        "lengths": list(cfg.lengths), "methods": [s.label for s in specs], "dtype": lm.dtype, "seed": seed,
        "preset": task, **({"settings": QUICKSTART_SETTINGS} if is_quickstart else {}),
    }
    provenance = {
        "model": lm.record(),
        "data": {"spec": settings.data,
                 "documents": [{"doc": d.doc_id, "tokens": int(len(d.ids))} for d in documents]},
        "protocol": {"name": cfg.protocol, "stride": cfg.stride, "bos": cfg.bos,
                     "bos_token": getattr(lm.tokenizer, "bos_token", None) if cfg.bos else None,
                     "aggregate": settings.aggregate, "chunk_size": cfg.chunk_size,
                     "one_forward_per_document": cfg.protocol == "truncate"},
        "seed": seed,
    }
    return spec_record, provenance


def print_dry_run(model: str, lengths: tuple[int, ...], dtype: str, device: str, attn: str, chunk: int,
                  trust_remote_code: bool) -> None:
    """`ctxeval ppl --dry-run`: the memory table, from the config alone (no weights are loaded)."""
    estimate = dry_run(model, lengths, dtype, device, attn, chunk, trust_remote_code)
    print_table(
        f"{model}: memory per evaluation length, estimated from the config ({estimate.parameters / 1e6:,.1f}M parameters)",
        f"{estimate.dtype_note}; attention {attn}; logits chunk {chunk}. ppl total = weights + activations + attention + "
        "logits; needle --scoring generate adds the KV cache. CUDA context and fragmentation not included.",
        ["length", "weights", "activations", "attention", "logits", "ppl total", "KV cache"],
        [[f"{r.length:,}", fmt_bytes(r.weights), fmt_bytes(r.activations), fmt_bytes(r.attention), fmt_bytes(r.logits),
          fmt_bytes(r.ppl_total), fmt_bytes(r.kv_cache)] for r in estimate.rows],
    )


def fmt_bytes(x: float) -> str:
    return f"{x / GIB:.2f} GiB" if x >= GIB else f"{x / 2**20:.0f} MiB"
