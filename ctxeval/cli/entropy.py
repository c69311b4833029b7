"""`ctxeval entropy`: mean attention entropy per layer as the context grows, per method."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ..data import corpora
from ..errors import CtxevalError
from ..models.load import DEFAULT_MODEL
from ..runs.store import RunStore
from ..specs import MethodSpec
from .console import print_outputs, user_errors
from .options import (
    BosOpt,
    Check,
    DataOpt,
    DocsOpt,
    FactorOpt,
    LengthsOpt,
    Load,
    MethodOpt,
    Omit,
    OutOpt,
    OverwriteOpt,
    PlainModelOpt,
    TemperatureOpt,
    TextFieldOpt,
    parse_indices,
    parse_lengths,
    reworded,
    with_blocks,
)
from .run import Measurement, method_specs

if TYPE_CHECKING:
    from ..evals.common import Progress

# torch, transformers, pandas and matplotlib load only when a command needs them (`ctxeval --help` starts in
# well under a second): the evaluation and report modules are imported inside the command functions.


@dataclass(frozen=True)
class EntropyOptions:
    model: PlainModelOpt = None
    data: reworded(DataOpt, "pydoc (default) | austen | mobydick | files | hf:NAME (any --data spec).", str) = "pydoc"
    text_field: TextFieldOpt = "text"
    docs: reworded(DocsOpt, "Number of documents (each at least max(lengths) tokens).", int) = 1
    lengths: reworded(
        LengthsOpt,
        "Context lengths: 1k,2k,4k | 1k:16k:x2 (default: 0.5x, 1x, 2x, 4x, 8x the model's original length).",
    ) = None
    method: MethodOpt = None
    factor: FactorOpt = None
    attention_temperature: TemperatureOpt = None
    layers: Annotated[Optional[str], typer.Option(help="Layers to measure: all (default) | 0,5,11.")] = None
    heads: Annotated[Optional[str], typer.Option(help="Query heads averaged per layer: all (default) | 0,1.")] = None
    query_chunk: Annotated[
        int,
        typer.Option(help="Queries per chunk (memory: chunk x length per head)."),
        Check("--query-chunk", minimum=1),
    ] = 512
    bos: BosOpt = True
    out: OutOpt = None
    overwrite: OverwriteOpt = False
    load: Annotated[Load, Omit("attn")] = Load()  # q and k are read through sdpa


class Entropy(Measurement):
    task = "entropy"
    default_multiples = (0.5, 1, 2, 4, 8)

    def __init__(self, opt: EntropyOptions) -> None:
        super().__init__(opt.out, opt.overwrite, opt.load)
        self.opt = opt

    def settle(self) -> None:
        self.model = self.opt.model or DEFAULT_MODEL

    def method_specs(self) -> list[MethodSpec]:
        return method_specs(self.opt.method, self.opt.factor, self.opt.attention_temperature)

    def check(self) -> None:
        from ..evals.entropy import EntropyConfig

        opt = self.opt
        self.lengths = parse_lengths(opt.lengths) if opt.lengths is not None else None
        self.cfg = EntropyConfig(
            tuple(self.lengths or (2,)),
            parse_indices(opt.layers, "--layers"),
            parse_indices(opt.heads, "--heads"),
            opt.query_chunk,
            opt.bos,
        )
        with_attention = [s.label for s in self.specs if s.attention]
        if with_attention:
            raise CtxevalError(
                f"entropy reads the q.k scores of plain attention; {with_attention[0]} computes other scores "
                "(drop its attention method here)"
            )

    def check_data(self) -> None:
        corpora.check_data_spec(self.opt.data, "--data", self.opt.text_field)

    def loaded(self) -> None:
        from ..evals.entropy import check_layers

        lm = self.lm
        if lm.attn_implementation != "sdpa":
            raise CtxevalError(
                f"entropy reads q and k through transformers' sdpa attention, which transformers does not "
                f"provide for {type(lm.model).__name__}; this model cannot be measured"
            )
        check_layers(lm.model.config.get_text_config().num_hidden_layers, self.cfg.layers)

    def configure(self) -> None:
        self.cfg = replace(self.cfg, lengths=tuple(self.lengths))

    def prepare(self) -> None:
        lm = self.lm
        if self.cfg.bos and getattr(lm.tokenizer, "bos_token_id", None) is None:
            self.cfg = replace(self.cfg, bos=False)
        need = max(self.cfg.lengths) - (1 if self.cfg.bos else 0)
        self.documents = corpora.select_long_documents(
            self.opt.data, lm.tokenizer, self.opt.docs, need, self.opt.text_field
        )

    def records(self, backend_spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        opt, cfg, lm = self.opt, self.cfg, self.lm
        spec_record = {
            "task": "entropy",
            "model": self.model,
            "data": opt.data,
            "text_field": opt.text_field,
            "docs": opt.docs,
            "lengths": list(cfg.lengths),
            "methods": [s.label for s in self.specs],
            "layers": cfg.layers or "all",
            "heads": cfg.heads or "all",
            "bos": cfg.bos,
            "dtype": lm.dtype,
        }
        provenance = {
            "model": lm.record(),
            "data": {
                "spec": opt.data,
                "documents": [{"doc": d.doc_id, "tokens": int(len(d.ids))} for d in self.documents],
            },
            "protocol": {
                "name": "truncate",
                "bos": cfg.bos,
                "attention": "sdpa, entropies recomputed per query chunk",
                "query_chunk": cfg.query_chunk,
            },
        }
        return spec_record, provenance

    def message(self, run_dir: Any) -> str:
        return f"run directory: {run_dir}  ({len(self.documents)} document(s))"

    def work(self, store: RunStore, progress: Progress) -> None:
        from ..evals.entropy import sweep

        sweep(self.lm, self.specs, self.documents, self.cfg, store, progress)

    def render(self, store: RunStore) -> None:
        from ..report.kinds.entropy import render_entropy

        original = self.lm.trained_length or max(self.cfg.lengths)
        title = f"{self.model} on {self.opt.data}: attention entropy"
        print_outputs(render_entropy(store, self.specs, original, title))


@user_errors
@with_blocks
def entropy_cmd(opt: EntropyOptions) -> None:
    """Attention entropy vs. context length per method (what YaRN's temperature corrects): table, plot, run dir."""
    Entropy(opt).run()
