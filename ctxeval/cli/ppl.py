"""`ctxeval ppl`: perplexity vs. context length per method (YaRN's table), and its --dry-run memory estimate."""

from __future__ import annotations

import gc
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from ..data import corpora
from ..data.presets import load_task
from ..errors import CtxevalError
from ..models.memory import GIB, dry_run
from ..runs.rows import AGGREGATES
from ..specs import MethodSpec, expand_specs
from .console import err, print_outputs, print_table, user_errors
from .options import (
    DOCS,
    VALID_TOLERANCE,
    AttnOpt,
    Check,
    DeviceMapOpt,
    DeviceOpt,
    DtypeOpt,
    FactorOpt,
    MaxMemoryOpt,
    ModelOpt,
    OverwriteOpt,
    RemoteOpt,
    TemperatureOpt,
    parse_factors,
    parse_lengths,
    parse_temperatures,
)
from .run import (
    QUICKSTART_SETTINGS,
    default_lengths,
    default_out,
    load_for,
    measure,
    note_attention_noops,
    quickstart,
    settle_factors,
)

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
    min_doc_tokens: Optional[int] = None  # documents shorter than this are passed over (YaRN's --dataset-min-tokens)

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
    data: Annotated[
        Optional[str],
        typer.Option(help="pydoc (default) | austen | mobydick | files/dirs/globs | hf:NAME[:CONFIG][@SPLIT]"),
    ] = None,
    text_field: Annotated[
        Optional[str], typer.Option(help="Record field holding the text (.jsonl/.parquet/.csv/hf).")
    ] = None,
    lengths: Annotated[
        Optional[str],
        typer.Option(
            help="Evaluation lengths: 2k,4k,8k | 1k:16k:x2 | 1024:8192:1024 "
            "(default: 0.5x, 1x and 2x the model's original length)."
        ),
    ] = None,
    method: Annotated[
        Optional[list[str]], typer.Option("--method", "-m", help="NAME or NAME:key=value,...; repeatable.")
    ] = None,
    factor: FactorOpt = None,
    attention_temperature: TemperatureOpt = None,
    protocol: Annotated[Optional[str], typer.Option(help="truncate (YaRN paper) | sliding.")] = None,
    docs: Annotated[Optional[int], typer.Option(help="Number of documents."), DOCS] = None,
    stride: Annotated[Optional[int], typer.Option(help="Sliding-window stride S (protocol sliding).")] = None,
    aggregate: Annotated[
        Optional[str], typer.Option(help="token (token-weighted) | window (mean of window means).")
    ] = None,
    bos: Annotated[
        Optional[bool],
        typer.Option(
            "--bos/--no-bos",
            help="Start each sequence with the tokenizer's BOS (default on; off under --key-tokens, as LongPPL).",
        ),
    ] = None,
    min_doc_tokens: Annotated[
        Optional[int],
        typer.Option(help="Use only documents of at least N tokens (the YaRN repo's --dataset-min-tokens)."),
        Check("--min-doc-tokens", minimum=1),
    ] = None,
    position_buckets: Annotated[
        Optional[str],
        typer.Option(
            help="Loss-by-position buckets: N (log-spaced) or edges "
            "1,1k,4k,8k,16k (default: 1-31, then one per octave, "
            "plus the trained length)."
        ),
    ] = None,
    key_tokens: Annotated[
        Optional[str],
        typer.Option(
            help="LongPPL: the evaluator MODEL that finds the key tokens (may be the evaluated model; same tokenizer)."
        ),
    ] = None,
    key_tokens_method: Annotated[
        str, typer.Option(help="The evaluator's method (a static one), e.g. yarn:factor=2.")
    ] = "none",
    key_tokens_context: Annotated[
        Optional[int],
        typer.Option(
            help="LongPPL's short context (default 4096; half the "
            "trained length when no length exceeds 4096); stride "
            "a quarter of it."
        ),
        Check("--key-tokens-context", minimum=4),
    ] = None,
    chunk_size: Annotated[
        int, typer.Option(help="Positions per LM-head chunk (memory vs. speed)."), Check("--chunk-size", minimum=1)
    ] = 1024,
    batch_size: Annotated[
        int,
        typer.Option(
            help="Sequences per forward: sliding windows, or documents under truncate (halved on out of memory)."
        ),
        Check("--batch-size", minimum=1),
    ] = 1,
    valid_tolerance: Annotated[
        float, typer.Option(help="Valid-length table: allowed ppl rise over the original length."), VALID_TOLERANCE
    ] = 0.10,
    task: Annotated[
        Optional[str],
        typer.Option(
            help="Preset name (ppl-austen, ppl-yarn-proofpile, ppl-yarn-govreport, ppl-yarn-pg19, ppl-pg19) or .toml path."
        ),
    ] = None,
    out: Annotated[Optional[Path], typer.Option(help="Run directory (default runs/ppl-<model>-<time>).")] = None,
    overwrite: OverwriteOpt = False,
    seed: Annotated[
        int,
        typer.Option(help="Seed recorded in the run (the protocols draw nothing at random)."),
        Check("--seed", minimum=0),
    ] = 0,
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    attn: AttnOpt = "sdpa",
    trust_remote_code: RemoteOpt = False,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the memory each length needs (from the config alone) and exit without loading weights.",
        ),
    ] = False,
) -> None:
    """Perplexity vs. context length for each method: the YaRN paper's table, a plot, a resumable run directory."""
    from ..evals.key_tokens import (
        KeyTokenSettings,
        check_settings,
        default_context,
        default_window,
        find_key_tokens,
        special_prefix,
    )
    from ..evals.perplexity import PplConfig, check_chunked_head, sweep
    from ..evals.positions import parse_position_buckets
    from ..evals.sweep import length_dependent
    from ..report.single import render_ppl

    given = {
        "model": model,
        "data": data,
        "text_field": text_field,
        "lengths": lengths,
        "method": method,
        "protocol": protocol,
        "docs": docs,
        "stride": stride,
        "aggregate": aggregate,
        "bos": bos,
        "min_doc_tokens": min_doc_tokens,
    }
    is_quickstart = model is None and task is None
    preset = (
        load_task(task, "ppl")
        if task
        else quickstart("ppl", factor is not None and method is None)
        if is_quickstart
        else {}
    )
    if key_tokens and bos is None and "bos" not in preset:
        given["bos"] = False  # LongPPL's compute_longppl reads the text without special tokens
    settings = PplSettings.resolve(given, preset, task)
    specs = expand_specs(list(settings.method), parse_factors(factor), parse_temperatures(attention_temperature))
    lengths_given = tuple(parse_lengths(settings.lengths)) if settings.lengths is not None else None
    cfg = (
        PplConfig(
            lengths_given,
            settings.protocol,
            settings.stride,
            settings.bos,
            chunk_size,  # fails before loading
            batch_size=batch_size,
        )
        if lengths_given
        else None
    )
    if lengths_given:
        parse_position_buckets(position_buckets, max(lengths_given), None)  # bad edges fail before loading
    key_method = expand_specs([key_tokens_method])[0] if key_tokens else None
    if dry_run:
        print_dry_run(
            settings.model,
            lengths_given or (),
            dtype,
            device,
            attn,
            chunk_size,
            trust_remote_code,
            tuple(s.attention for s in specs),
        )
        return
    corpora.check_data_spec(settings.data, "--data", settings.text_field)  # fails now, not after the model loads
    lm = load_for(settings.model, specs, dtype, device, attn, trust_remote_code, device_map, max_memory)
    if cfg is None:
        cfg = PplConfig(
            tuple(default_lengths(lm, (0.5, 1, 2))),
            settings.protocol,
            settings.stride,
            settings.bos,
            chunk_size,
            batch_size=batch_size,
        )
    if cfg.bos and getattr(lm.tokenizer, "bos_token_id", None) is None:
        err.print("note: the tokenizer has no BOS token; sequences start with document text (as --no-bos)")
        cfg = replace(cfg, bos=False)
    cfg = replace(cfg, position_edges=parse_position_buckets(position_buckets, max(cfg.lengths), lm.trained_length))
    keys = None
    if key_tokens:
        context = key_tokens_context or default_context(lm.trained_length or max(cfg.lengths), max(cfg.lengths))
        keys = KeyTokenSettings(
            key_tokens,
            key_method.label,
            context,
            default_window(context),
            special_prefix(lm.tokenizer),
            bos_id(lm, cfg) is not None,
        )
        check_settings(keys, cfg.lengths, cfg.protocol)
        if length_dependent(key_method, lm):
            raise CtxevalError(
                f"--key-tokens-method {key_method.label} depends on the sequence length; key tokens "
                "are found once per document: give a static method (e.g. yarn:factor=2)"
            )
        if not cfg.bos and bos is None:
            err.print(
                "note: --key-tokens: the evaluated model reads the documents without BOS and the evaluator with "
                "its tokenizer's defaults, as LongPPL (--bos gives the evaluated model BOS)"
            )
    specs = settle_factors(specs, list(cfg.lengths), lm)
    note_attention_noops(specs, list(cfg.lengths), lm.trained_length)
    check_chunked_head(lm.model, lm.device, lm.model.config.get_text_config().vocab_size)
    if settings.min_doc_tokens and task and str(task).startswith("ppl-yarn"):
        err.print(
            f"note: documents of >= {settings.min_doc_tokens:,} tokens are counted in {settings.model}'s own "
            "tokens (the YaRN repo counts Llama-2's; the same rule when the model uses Llama-2's tokenizer)"
        )
    documents = select_documents(settings, cfg, lm.tokenizer)
    spec_record, provenance = run_records(settings, cfg, specs, lm, documents, seed, task, is_quickstart)
    if position_buckets is not None:
        spec_record["position_buckets"] = list(cfg.position_edges)
    if keys is not None:
        spec_record["key_tokens"] = keys.record()
        load_evaluator = evaluator_loader(
            lm, key_tokens, dtype, device, attn, trust_remote_code, device_map, max_memory
        )
    run_dir = default_out("ppl", settings.model, out)
    message = (
        f"run directory: {run_dir}  ({len(documents)} document(s): "
        + ", ".join(f"{d.doc_id} {len(d.ids):,} tokens" for d in documents)
        + ")"
    )
    title = f"{settings.model} on {settings.data} ({cfg.protocol})"
    original = lm.trained_length or max(cfg.lengths)
    measure(
        run_dir,
        spec_record,
        overwrite,
        provenance,
        message,
        work=lambda store, progress: sweep(
            lm,
            specs,
            documents,
            cfg,
            store,
            progress,
            None
            if keys is None
            else find_key_tokens(
                store,
                keys,
                load_evaluator,
                key_method,
                documents,
                max(cfg.lengths),
                bos_id(lm, cfg),
                cfg.chunk_size,
                progress,
            ),
        ),
        render=lambda store: print_outputs(
            render_ppl(store, specs, original, settings.aggregate, valid_tolerance, title)
        ),
    )


def select_documents(settings: PplSettings, cfg: PplConfig, tokenizer: Any) -> list[corpora.TokenDoc]:
    """The protocol's documents in corpus order: the first `docs` with the document tokens max(lengths) needs
    (truncate: max(lengths) - 1 behind BOS, max(lengths) without; and at least
    --min-doc-tokens when given, counting the whole document without special tokens, as the YaRN repo's
    `tokenized_len`), or the first `docs` (sliding; with at least --min-doc-tokens)."""
    floor = settings.min_doc_tokens
    if cfg.protocol == "truncate":
        needed = max(cfg.doc_tokens_needed(max(cfg.lengths)), floor or 0)
        return corpora.select_long_documents(
            settings.data, tokenizer, settings.docs, needed, settings.text_field, max_scan=None if floor else 10_000
        )
    return corpora.first_documents(settings.data, tokenizer, settings.docs, settings.text_field, min_tokens=floor or 2)


def bos_id(lm: Any, cfg: PplConfig) -> int | None:
    """The BOS id the sequences start with, or None (--no-bos, or a tokenizer without one)."""
    return getattr(lm.tokenizer, "bos_token_id", None) if cfg.bos else None


def evaluator_loader(
    lm: Any,
    name: str,
    dtype: str,
    device: str,
    attn: str,
    trust_remote_code: bool,
    device_map: str | None,
    max_memory: str | None,
) -> Callable[[], tuple[Any, Callable[[], None]]]:
    """How find_key_tokens gets the LongPPL evaluator (only when key-tokens.json cannot be reused): the loaded model
    itself when it is the evaluator, else the named model loaded beside it (same options) and freed after."""
    from ..evals.key_tokens import same_tokenizer
    from ..models.load import load_model, parse_max_memory

    def load() -> tuple[Any, Callable[[], None]]:
        if name == lm.name:
            return lm, lambda: None
        other = load_model(
            name,
            dtype=dtype,
            device=lm.device if device_map is None else device,
            attn_implementation=attn,
            trust_remote_code=trust_remote_code,
            device_map=device_map,
            max_memory=parse_max_memory(max_memory),
        )
        if not same_tokenizer(other.tokenizer, lm.tokenizer):
            raise CtxevalError(
                f"--key-tokens {name} has another tokenizer than {lm.name}: LongPPL compares the two "
                "models token by token; give an evaluator with the same tokenizer"
            )

        def release() -> None:
            nonlocal other
            other = None
            gc.collect()
            if str(lm.device).startswith("cuda"):
                import torch

                torch.cuda.empty_cache()

        return other, release

    return load


def run_records(
    settings: PplSettings,
    cfg: PplConfig,
    specs: list[MethodSpec],
    lm: Any,
    documents: list[corpora.TokenDoc],
    seed: int,
    task: str | None,
    is_quickstart: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """run.json's `spec` (what a resume must match) and provenance (model, documents, protocol)."""
    spec_record = {
        "task": "ppl",
        "model": settings.model,
        "data": settings.data,
        "text_field": settings.text_field,
        "protocol": cfg.protocol,
        "stride": cfg.stride,
        "bos": cfg.bos,
        "docs": settings.docs,
        "lengths": list(cfg.lengths),
        "methods": [s.label for s in specs],
        "dtype": lm.dtype,
        "seed": seed,
        "preset": task,
        **({"settings": QUICKSTART_SETTINGS} if is_quickstart else {}),
        **({"min_doc_tokens": settings.min_doc_tokens} if settings.min_doc_tokens else {}),
    }
    provenance = {
        "model": lm.record(),
        "data": {"spec": settings.data, "documents": [{"doc": d.doc_id, "tokens": int(len(d.ids))} for d in documents]},
        "protocol": {
            "name": cfg.protocol,
            "stride": cfg.stride,
            "bos": cfg.bos,
            "bos_token": getattr(lm.tokenizer, "bos_token", None) if cfg.bos else None,
            "aggregate": settings.aggregate,
            "chunk_size": cfg.chunk_size,
            "batch_size": cfg.batch_size,
            "one_forward_per_document": cfg.protocol == "truncate",
            "min_doc_tokens": settings.min_doc_tokens,
        },
        "positions": {
            "edges": list(cfg.position_edges),
            "definition": "bucket i: tokens predicted from p tokens of context, edges[i] <= p < edges[i+1] "
            "(p = the token's index in the sequence read, BOS = 0; sliding: in its window)",
        },
        "seed": seed,
    }
    return spec_record, provenance


def print_dry_run(
    model: str,
    lengths: tuple[int, ...],
    dtype: str,
    device: str,
    attn: str,
    chunk: int,
    trust_remote_code: bool,
    attention_specs: tuple[tuple[Any, ...], ...] = (),
) -> None:
    """`ctxeval ppl --dry-run`: the memory table, from the config alone (no weights are loaded)."""
    estimate = dry_run(model, lengths, dtype, device, attn, chunk, trust_remote_code, attention_specs)
    print_table(
        f"{model}: memory per evaluation length, estimated from the config ({estimate.parameters / 1e6:,.1f}M parameters)",
        f"{estimate.dtype_note}; attention {attn}"
        f"{' (with the attention methods asked: their workspace, and their far keys in the KV cache)' if any(attention_specs) else ''}"
        f"; logits chunk {chunk}. ppl total = weights + activations + attention + "
        "logits; needle --scoring generate adds the KV cache. CUDA context and fragmentation not included.",
        ["length", "weights", "activations", "attention", "logits", "ppl total", "KV cache"],
        [
            [
                f"{r.length:,}",
                fmt_bytes(r.weights),
                fmt_bytes(r.activations),
                fmt_bytes(r.attention),
                fmt_bytes(r.logits),
                fmt_bytes(r.ppl_total),
                fmt_bytes(r.kv_cache),
            ]
            for r in estimate.rows
        ],
    )


def fmt_bytes(x: float) -> str:
    return f"{x / GIB:.2f} GiB" if x >= GIB else f"{x / 2**20:.0f} MiB"
