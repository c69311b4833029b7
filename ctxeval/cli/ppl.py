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
from ..models.load import model_title
from ..models.memory import GIB, dry_run
from ..models.protocol import LanguageModel
from ..runs.rows import AGGREGATES
from ..runs.store import RunStore
from ..specs import MethodSpec, expand_specs
from .console import err, print_outputs, print_table, user_errors
from .options import (
    DOCS,
    AggregateOpt,
    BatchOpt,
    BosOpt,
    Check,
    ChunkOpt,
    DataOpt,
    DocsOpt,
    FactorOpt,
    LengthsOpt,
    Load,
    MethodOpt,
    ModelsOpt,
    OutOpt,
    OverwriteOpt,
    ProtocolOpt,
    SeedOpt,
    TemperatureOpt,
    TextFieldOpt,
    ValidToleranceOpt,
    parse_factors,
    parse_lengths,
    parse_temperatures,
    reworded,
    with_blocks,
)
from .run import QUICKSTART_SETTINGS, Measurement, quickstart, run_models

if TYPE_CHECKING:
    from ..evals.common import Progress
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


@dataclass(frozen=True)
class PplOptions:
    model: ModelsOpt = None
    data: DataOpt = None
    text_field: reworded(TextFieldOpt, "Record field holding the text (.jsonl/.parquet/.csv/hf).", Optional[str]) = None
    lengths: reworded(
        LengthsOpt,
        "Evaluation lengths: 2k,4k,8k | 1k:16k:x2 | 1024:8192:1024 "
        "(default: 0.5x, 1x and 2x the model's original length).",
    ) = None
    method: reworded(MethodOpt, "NAME or NAME:key=value,...; repeatable.") = None
    factor: FactorOpt = None
    attention_temperature: TemperatureOpt = None
    protocol: ProtocolOpt = None
    docs: DocsOpt = None
    stride: Annotated[Optional[int], typer.Option(help="Sliding-window stride S (protocol sliding).")] = None
    aggregate: AggregateOpt = None
    bos: reworded(
        BosOpt,
        "Start each sequence with the tokenizer's BOS (default on; off under --key-tokens, as LongPPL).",
        Optional[bool],
    ) = None
    min_doc_tokens: Annotated[
        Optional[int],
        typer.Option(help="Use only documents of at least N tokens (the YaRN repo's --dataset-min-tokens)."),
        Check("--min-doc-tokens", minimum=1),
    ] = None
    position_buckets: Annotated[
        Optional[str],
        typer.Option(
            help="Loss-by-position buckets: N (log-spaced) or edges "
            "1,1k,4k,8k,16k (default: 1-31, then one per octave, "
            "plus the trained length)."
        ),
    ] = None
    key_tokens: Annotated[
        Optional[str],
        typer.Option(
            help="LongPPL: the evaluator MODEL that finds the key tokens (may be the evaluated model; same tokenizer)."
        ),
    ] = None
    key_tokens_method: Annotated[
        str, typer.Option(help="The evaluator's method (a static one), e.g. yarn:factor=2.")
    ] = "none"
    key_tokens_context: Annotated[
        Optional[int],
        typer.Option(
            help="LongPPL's short context (default 4096; half the "
            "trained length when no length exceeds 4096); stride "
            "a quarter of it."
        ),
        Check("--key-tokens-context", minimum=4),
    ] = None
    chunk_size: ChunkOpt = 1024
    batch_size: reworded(
        BatchOpt, "Sequences per forward: sliding windows, or documents under truncate (halved on out of memory)."
    ) = 1
    valid_tolerance: ValidToleranceOpt = 0.10
    task: Annotated[
        Optional[str],
        typer.Option(
            help="Preset name (ppl-austen, ppl-yarn-proofpile, ppl-yarn-govreport, ppl-yarn-pg19, ppl-pg19) or .toml path."
        ),
    ] = None
    out: reworded(OutOpt, "Run directory (default runs/ppl-<model>-<key>: the same command again resumes it).") = None
    overwrite: OverwriteOpt = False
    seed: reworded(SeedOpt, "Seed recorded in the run (the protocols draw nothing at random).") = 0
    load: Load = Load()
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the memory each length needs (from the config alone) and exit without loading weights.",
        ),
    ] = False


class Ppl(Measurement):
    task = "ppl"

    def __init__(self, opt: PplOptions) -> None:
        super().__init__(opt.out, opt.overwrite, opt.load)
        self.opt = opt

    def settle(self) -> None:
        """flags > preset (--task) or quickstart (no --model, no --task) > defaults."""
        opt = self.opt
        given = {f.name: getattr(opt, f.name) for f in fields(PplSettings)}
        self.is_quickstart = opt.model is None and opt.task is None
        preset = (
            load_task(opt.task, "ppl")
            if opt.task
            else quickstart("ppl", opt.factor is not None and opt.method is None)
            if self.is_quickstart
            else {}
        )
        if opt.key_tokens and opt.bos is None and "bos" not in preset:
            given["bos"] = False  # LongPPL's compute_longppl reads the text without special tokens
        self.settings = PplSettings.resolve(given, preset, opt.task)
        self.model = self.settings.model

    def method_specs(self) -> list[MethodSpec]:
        opt = self.opt
        return expand_specs(
            list(self.settings.method), parse_factors(opt.factor), parse_temperatures(opt.attention_temperature)
        )

    def check(self) -> None:
        from ..evals.positions import parse_position_buckets

        settings = self.settings
        self.lengths = parse_lengths(settings.lengths) if settings.lengths is not None else None
        if self.lengths:
            self.config(self.lengths)  # fails before loading
            parse_position_buckets(self.opt.position_buckets, max(self.lengths), None)  # bad edges too
        self.key_method = expand_specs([self.opt.key_tokens_method])[0] if self.opt.key_tokens else None

    def planning_only(self) -> bool:
        return self.opt.dry_run

    def dry_run(self) -> bool:
        opt = self.opt
        if opt.dry_run:
            load = opt.load
            attention = tuple(s.attention for s in self.specs)
            print_dry_run(
                self.model,
                tuple(self.lengths or ()),
                load.dtype,
                load.device,
                load.attn,
                opt.chunk_size,
                load.trust_remote_code,
                attention,
            )
        return opt.dry_run

    def check_data(self) -> None:
        corpora.check_data_spec(self.settings.data, "--data", self.settings.text_field)

    def config(self, lengths: list[int]) -> PplConfig:
        from ..evals.perplexity import PplConfig

        s = self.settings
        return PplConfig(
            tuple(lengths), s.protocol, s.stride, s.bos, self.opt.chunk_size, batch_size=self.opt.batch_size
        )

    def configure(self) -> None:
        """The config at the lengths: BOS as the tokenizer allows, the position buckets, LongPPL's key tokens."""
        from ..evals.positions import parse_position_buckets

        lm, cfg = self.lm, self.config(self.lengths)
        if cfg.bos and getattr(lm.tokenizer, "bos_token_id", None) is None:
            err.print("note: the tokenizer has no BOS token; sequences start with document text (as --no-bos)")
            cfg = replace(cfg, bos=False)
        edges = parse_position_buckets(self.opt.position_buckets, max(cfg.lengths), lm.trained_length)
        self.cfg = replace(cfg, position_edges=edges)
        self.keys = self.key_token_settings() if self.opt.key_tokens else None

    def key_token_settings(self) -> Any:
        """LongPPL's settings (--key-tokens), checked against the protocol: the evaluator's method must be static."""
        from ..evals.key_tokens import KeyTokenSettings, check_settings, default_context, default_window, special_prefix
        from ..evals.sweep import length_dependent

        opt, lm, cfg, key_method = self.opt, self.lm, self.cfg, self.key_method
        context = opt.key_tokens_context or default_context(lm.trained_length or max(cfg.lengths), max(cfg.lengths))
        keys = KeyTokenSettings(
            opt.key_tokens,
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
        if not cfg.bos and opt.bos is None:
            err.print(
                "note: --key-tokens: the evaluated model reads the documents without BOS and the evaluator with "
                "its tokenizer's defaults, as LongPPL (--bos gives the evaluated model BOS)"
            )
        return keys

    def prepare(self) -> None:
        from ..evals.perplexity import check_chunked_head

        lm, settings, task = self.lm, self.settings, self.opt.task
        check_chunked_head(lm.model, lm.device, lm.model.config.get_text_config().vocab_size)
        if settings.min_doc_tokens and task and str(task).startswith("ppl-yarn"):
            err.print(
                f"note: documents of >= {settings.min_doc_tokens:,} tokens are counted in {settings.model}'s own "
                "tokens (the YaRN repo counts Llama-2's; the same rule when the model uses Llama-2's tokenizer)"
            )
        self.documents = select_documents(settings, self.cfg, lm.tokenizer)

    def records(self, backend_spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        opt, cfg = self.opt, self.cfg
        spec_record, provenance = run_records(
            self.settings, cfg, self.specs, self.lm, self.documents, opt.seed, opt.task, self.is_quickstart
        )
        if opt.position_buckets is not None:
            spec_record["position_buckets"] = list(cfg.position_edges)
        if self.keys is not None:
            spec_record["key_tokens"] = self.keys.record()
        return spec_record, provenance

    def message(self, run_dir: Path) -> str:
        return (
            f"run directory: {run_dir}  ({len(self.documents)} document(s): "
            + ", ".join(f"{d.doc_id} {len(d.ids):,} tokens" for d in self.documents)
            + ")"
        )

    def work(self, store: RunStore, progress: Progress) -> None:
        from ..evals.key_tokens import find_key_tokens
        from ..evals.perplexity import sweep

        lm, cfg, keys = self.lm, self.cfg, self.keys
        key_tokens = None
        if keys is not None:
            load_evaluator = evaluator_loader(lm, self.opt.key_tokens, self.opt.load)
            key_tokens = find_key_tokens(
                store,
                keys,
                load_evaluator,
                self.key_method,
                self.documents,
                max(cfg.lengths),
                bos_id(lm, cfg),
                cfg.chunk_size,
                progress,
            )
        sweep(lm, self.specs, self.documents, cfg, store, progress, key_tokens)

    def render(self, store: RunStore) -> None:
        from ..report.kinds.ppl_run import render_ppl

        settings, cfg = self.settings, self.cfg
        title = f"{model_title(settings.model)} on {settings.data} ({cfg.protocol})"
        original = self.lm.trained_length or max(cfg.lengths)
        print_outputs(render_ppl(store, self.specs, original, settings.aggregate, self.opt.valid_tolerance, title))


@user_errors
@with_blocks
def ppl_cmd(opt: PplOptions) -> None:
    """Perplexity vs. context length for each method: the YaRN paper's table, a plot, a resumable run directory."""
    run_models("ppl", opt, Ppl)


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


def bos_id(lm: LanguageModel, cfg: PplConfig) -> int | None:
    """The BOS id the sequences start with, or None (--no-bos, or a tokenizer without one)."""
    return getattr(lm.tokenizer, "bos_token_id", None) if cfg.bos else None


def evaluator_loader(lm: LanguageModel, name: str, load: Load) -> Callable[[], tuple[Any, Callable[[], None]]]:
    """How find_key_tokens gets the LongPPL evaluator (only when key-tokens.json cannot be reused): the loaded model
    itself when it is the evaluator, else the named model loaded beside it (same options) and freed after."""
    from ..evals.key_tokens import same_tokenizer
    from ..models.load import load_model, parse_max_memory

    def load_evaluator() -> tuple[Any, Callable[[], None]]:
        if name == lm.name:
            return lm, lambda: None
        other = load_model(
            name,
            dtype=load.dtype,
            device=lm.device if load.device_map is None else load.device,
            attn_implementation=load.attn,
            trust_remote_code=load.trust_remote_code,
            device_map=load.device_map,
            max_memory=parse_max_memory(load.max_memory),
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

    return load_evaluator


def run_records(
    settings: PplSettings,
    cfg: PplConfig,
    specs: list[MethodSpec],
    lm: LanguageModel,
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
