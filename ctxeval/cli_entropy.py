"""`ctxeval entropy`: mean attention entropy per layer as the context grows, per method (registered by cli.py)."""

from pathlib import Path
from typing import Annotated, Any, Optional

import typer


def _int_list(text: str | None, flag: str) -> tuple[int, ...] | None:
    from .errors import CtxevalError

    if text is None or text.strip().lower() == "all":
        return None
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        raise CtxevalError(f"{flag} takes 'all' or indices separated by commas (e.g. 0,3,7), got '{text}'") from None
    if not values or min(values) < 0:
        raise CtxevalError(f"{flag} takes 'all' or indices >= 0, got '{text}'")
    return values


def register(app: typer.Typer) -> None:
    from . import cli as C
    from . import methods as M

    @app.command("entropy")
    @C.user_errors
    def entropy_cmd(
        model: C.ModelOpt = None,
        data: Annotated[str, typer.Option(help="pydoc (default) | austen | mobydick | files | hf:NAME (any --data spec).")] = "pydoc",
        text_field: C.TextFieldOpt = "text",
        docs: Annotated[int, typer.Option(help="Number of documents (each at least max(lengths) tokens).")] = 1,
        lengths: Annotated[Optional[str], typer.Option(help="Context lengths: 1k,2k,4k | 1k:16k:x2 (default: 0.5x, 1x, 2x, "
                                                       "4x, 8x the model's original length).")] = None,
        method: Annotated[Optional[list[str]], typer.Option("--method", "-m", help="NAME or NAME:key=value,...; "
                                                            "repeatable (default none).")] = None,
        factor: C.FactorOpt = None,
        attention_temperature: C.TemperatureOpt = None,
        layers: Annotated[Optional[str], typer.Option(help="Layers to measure: all (default) | 0,5,11.")] = None,
        heads: Annotated[Optional[str], typer.Option(help="Query heads averaged per layer: all (default) | 0,1.")] = None,
        query_chunk: Annotated[int, typer.Option(help="Queries per chunk (memory: chunk x length per head).")] = 512,
        bos: Annotated[bool, typer.Option("--bos/--no-bos", help="Start each sequence with the tokenizer's BOS.")] = True,
        out: C.OutOpt = None,
        overwrite: C.OverwriteOpt = False,
        dtype: C.DtypeOpt = "auto",
        device: C.DeviceOpt = "auto",
        trust_remote_code: C.RemoteOpt = False,
        device_map: C.DeviceMapOpt = None,
        max_memory: C.MaxMemoryOpt = None,
    ) -> None:
        """Attention entropy vs. context length per method (what YaRN's temperature corrects): table, plot, run dir."""
        from dataclasses import replace

        from . import corpora
        from .errors import CtxevalError
        from .evals.entropy import EntropyConfig, check_layers, sweep
        from .models import DEFAULT_MODEL

        model_name = model or DEFAULT_MODEL
        if docs < 1:
            raise CtxevalError(f"--docs must be >= 1, got {docs}")
        specs = M.expand_specs(method or ["none"], C.parse_factors(factor), C.parse_temperatures(attention_temperature))
        given = tuple(C.parse_lengths(lengths)) if lengths is not None else None
        cfg = EntropyConfig(given or (2,), _int_list(layers, "--layers"), _int_list(heads, "--heads"), query_chunk, bos)
        lm = C._load_for(model_name, specs, dtype, device, "sdpa", trust_remote_code, device_map, max_memory)
        if lm.attn_implementation != "sdpa":
            raise CtxevalError(f"entropy reads q and k through transformers' sdpa attention, which transformers does not "
                               f"provide for {type(lm.model).__name__}; this model cannot be measured")
        text_cfg = lm.model.config.get_text_config()
        check_layers(text_cfg.num_hidden_layers, cfg.layers)
        if given is None:
            cfg = replace(cfg, lengths=tuple(C.default_lengths(lm, (0.5, 1, 2, 4, 8))))
        if cfg.bos and getattr(lm.tokenizer, "bos_token_id", None) is None:
            cfg = replace(cfg, bos=False)
        need = max(cfg.lengths) - (1 if cfg.bos else 0)
        documents = corpora.select_long_documents(data, lm.tokenizer, docs, need, text_field)
        original = (lm.rope.geometry.original_length if lm.rope.geometry
                    else getattr(text_cfg, "max_position_embeddings", None) or max(cfg.lengths))
        spec_record = {
            "task": "entropy", "model": model_name, "data": data, "text_field": text_field, "docs": docs,
            "lengths": list(cfg.lengths), "methods": [s.label for s in specs], "layers": cfg.layers or "all",
            "heads": cfg.heads or "all", "bos": cfg.bos, "dtype": lm.dtype,
        }
        provenance = {
            "model": lm.record(),
            "data": {"spec": data, "documents": [{"doc": d.doc_id, "tokens": int(len(d.ids))} for d in documents]},
            "protocol": {"name": "truncate", "bos": cfg.bos, "attention": "sdpa, entropies recomputed per query chunk",
                         "query_chunk": cfg.query_chunk},
        }
        run_dir = C._default_out("entropy", model_name, out)
        store = C._measure(run_dir, spec_record, overwrite, provenance, f"run directory: {run_dir}  ({len(documents)} document(s))",
                           lambda store, progress: sweep(lm, specs, documents, cfg, store, progress))
        if store is not None:
            render_entropy(store, specs, original, f"{model_name} on {data}: attention entropy")


def render_entropy(store: Any, specs: list, original_length: int, title: str) -> None:
    """table.md / entropy.csv / entropy-layers.csv / entropy.png in the run directory; the table on stdout."""
    from . import cli as C
    from . import report
    from .evals.entropy import entropy_tables
    from .plots import plot_entropy

    wide, layers = entropy_tables(store.rows(), [s.label for s in specs])
    if wide.empty:
        C.err.print("no entropy was measured (every point failed); see rows.jsonl")
        return
    headers = ["method", *[report.fmt_length(int(c)) for c in wide.columns]]
    rows = [[str(label), *[("—" if v != v else f"{v:.3f}") for v in series]] for label, series in wide.iterrows()]
    lheaders = ["method", "layer", *[report.fmt_length(int(c)) for c in layers.columns]]
    lrows = [[str(i[0]), str(i[1]), *[("—" if v != v else f"{v:.3f}") for v in series]] for i, series in layers.iterrows()]
    caption = (f"Mean attention entropy in nats (over layers, heads, query positions and documents); original length "
               f"{original_length}. 'uniform' = mean ln(i+1), the entropy if every query attended evenly.")
    (store.dir / "table.md").write_text(
        f"# {title}\n\n{caption}\n\n" + report.markdown(headers, rows)
        + "\n## Per layer\n\n" + report.markdown(lheaders, lrows))
    wide.rename_axis("method").to_csv(store.dir / "entropy.csv", float_format="%.6g")
    layers.to_csv(store.dir / "entropy-layers.csv", float_format="%.6g")
    plot_entropy(wide, original_length, title, store.dir / "entropy.png")
    C.print_table(title, caption, headers, rows)
    C.err.print(f"wrote {store.dir}/table.md, entropy.csv, entropy-layers.csv, entropy.png")
