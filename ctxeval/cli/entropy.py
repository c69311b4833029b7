"""`ctxeval entropy`: mean attention entropy per layer as the context grows, per method."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Optional

import typer

from ..data import corpora
from ..errors import CtxevalError
from ..models.load import DEFAULT_MODEL
from ..specs import expand_specs
from .console import print_outputs, user_errors
from .options import (
    DOCS,
    Check,
    DeviceMapOpt,
    DeviceOpt,
    DtypeOpt,
    FactorOpt,
    MaxMemoryOpt,
    OutOpt,
    OverwriteOpt,
    PlainModelOpt,
    RemoteOpt,
    TemperatureOpt,
    TextFieldOpt,
    parse_factors,
    parse_indices,
    parse_lengths,
    parse_temperatures,
)
from .run import default_lengths, default_out, load_for, measure, settle_factors

# torch, transformers, pandas and matplotlib load only when a command needs them (`ctxeval --help` starts in
# well under a second): the evaluation and report modules are imported inside the command functions.


@user_errors
def entropy_cmd(
    model: PlainModelOpt = None,
    data: Annotated[
        str, typer.Option(help="pydoc (default) | austen | mobydick | files | hf:NAME (any --data spec).")
    ] = "pydoc",
    text_field: TextFieldOpt = "text",
    docs: Annotated[int, typer.Option(help="Number of documents (each at least max(lengths) tokens)."), DOCS] = 1,
    lengths: Annotated[
        Optional[str],
        typer.Option(
            help="Context lengths: 1k,2k,4k | 1k:16k:x2 (default: 0.5x, 1x, 2x, 4x, 8x the model's original length)."
        ),
    ] = None,
    method: Annotated[
        Optional[list[str]],
        typer.Option("--method", "-m", help="NAME or NAME:key=value,...; repeatable (default none)."),
    ] = None,
    factor: FactorOpt = None,
    attention_temperature: TemperatureOpt = None,
    layers: Annotated[Optional[str], typer.Option(help="Layers to measure: all (default) | 0,5,11.")] = None,
    heads: Annotated[Optional[str], typer.Option(help="Query heads averaged per layer: all (default) | 0,1.")] = None,
    query_chunk: Annotated[
        int,
        typer.Option(help="Queries per chunk (memory: chunk x length per head)."),
        Check("--query-chunk", minimum=1),
    ] = 512,
    bos: Annotated[bool, typer.Option("--bos/--no-bos", help="Start each sequence with the tokenizer's BOS.")] = True,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    trust_remote_code: RemoteOpt = False,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
) -> None:
    """Attention entropy vs. context length per method (what YaRN's temperature corrects): table, plot, run dir."""
    from ..evals.entropy import EntropyConfig, check_layers, sweep
    from ..report.single import render_entropy

    model_name = model or DEFAULT_MODEL
    specs = expand_specs(method or ["none"], parse_factors(factor), parse_temperatures(attention_temperature))
    given = tuple(parse_lengths(lengths)) if lengths is not None else None
    cfg = EntropyConfig(
        given or (2,), parse_indices(layers, "--layers"), parse_indices(heads, "--heads"), query_chunk, bos
    )
    with_attention = [s.label for s in specs if s.attention]
    if with_attention:
        raise CtxevalError(
            f"entropy reads the q.k scores of plain attention; {with_attention[0]} computes other scores "
            "(drop its attention method here)"
        )
    corpora.check_data_spec(data, "--data", text_field)  # a missing corpus fails now, not after the model loads
    lm = load_for(model_name, specs, dtype, device, "sdpa", trust_remote_code, device_map, max_memory)
    if lm.attn_implementation != "sdpa":
        raise CtxevalError(
            f"entropy reads q and k through transformers' sdpa attention, which transformers does not "
            f"provide for {type(lm.model).__name__}; this model cannot be measured"
        )
    check_layers(lm.model.config.get_text_config().num_hidden_layers, cfg.layers)
    if given is None:
        cfg = replace(cfg, lengths=tuple(default_lengths(lm, (0.5, 1, 2, 4, 8))))
    specs = settle_factors(specs, list(cfg.lengths), lm)
    if cfg.bos and getattr(lm.tokenizer, "bos_token_id", None) is None:
        cfg = replace(cfg, bos=False)
    need = max(cfg.lengths) - (1 if cfg.bos else 0)
    documents = corpora.select_long_documents(data, lm.tokenizer, docs, need, text_field)
    original = lm.trained_length or max(cfg.lengths)
    spec_record = {
        "task": "entropy",
        "model": model_name,
        "data": data,
        "text_field": text_field,
        "docs": docs,
        "lengths": list(cfg.lengths),
        "methods": [s.label for s in specs],
        "layers": cfg.layers or "all",
        "heads": cfg.heads or "all",
        "bos": cfg.bos,
        "dtype": lm.dtype,
    }
    provenance = {
        "model": lm.record(),
        "data": {"spec": data, "documents": [{"doc": d.doc_id, "tokens": int(len(d.ids))} for d in documents]},
        "protocol": {
            "name": "truncate",
            "bos": cfg.bos,
            "attention": "sdpa, entropies recomputed per query chunk",
            "query_chunk": cfg.query_chunk,
        },
    }
    run_dir = default_out("entropy", model_name, out)
    title = f"{model_name} on {data}: attention entropy"
    measure(
        run_dir,
        spec_record,
        overwrite,
        provenance,
        f"run directory: {run_dir}  ({len(documents)} document(s))",
        work=lambda store, progress: sweep(lm, specs, documents, cfg, store, progress),
        render=lambda store: print_outputs(render_entropy(store, specs, original, title)),
    )
