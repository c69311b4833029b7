"""`ctxeval tune`: search a method's parameters for the lowest perplexity at a target length (optuna, resumable),
re-measure the winner on held-out documents against the other methods, and export it as a rope_parameters entry."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..data import corpora
from ..errors import CtxevalError
from ..specs import expand_specs
from .console import err, print_outputs, user_errors
from .options import AttnOpt, Check, DeviceOpt, DtypeOpt, ModelOpt, OverwriteOpt, RemoteOpt, parse_lengths
from .run import default_out, load_for, measure, settle_factors

QUICKSTART_TUNE = {"model": "tiny", "method": "yarn", "target_length": "1k", "data": "pydoc", "trials": 60}


@user_errors
def tune_cmd(
    model: ModelOpt = None,
    method: Annotated[
        Optional[str],
        typer.Option(
            "--method",
            "-m",
            help="The method to tune: NAME or "
            "NAME:key=value (given parameters stay fixed), e.g. yarn, "
            "longrope, ntk, llama3, yarn+self-extend (default yarn).",
        ),
    ] = None,
    target_length: Annotated[
        Optional[str],
        typer.Option(help="The length to extend to, e.g. 32k (default: 1k for the quickstart, else required)."),
    ] = None,
    data: Annotated[
        Optional[str],
        typer.Option(help="pydoc (default) | austen | mobydick | files/dirs/globs | hf:NAME[:CONFIG][@SPLIT]"),
    ] = None,
    text_field: Annotated[str, typer.Option(help="Record field holding the text.")] = "text",
    tune_docs: Annotated[
        int,
        typer.Option(help="Documents the search measures (the first in corpus order)."),
        Check("--tune-docs", minimum=1),
    ] = 2,
    heldout_docs: Annotated[
        int,
        typer.Option(help="Documents after those, for re-measuring the winner."),
        Check("--heldout-docs", minimum=1),
    ] = 2,
    trials: Annotated[
        Optional[int],
        typer.Option(
            help="Measured trials the study should hold (all processes "
            "together; points the method's checks refuse do not count; "
            "a rerun with more continues). Default 100 (60 "
            "in the quickstart)."
        ),
        Check("--trials", minimum=1),
    ] = None,
    sampler: Annotated[
        str, typer.Option(help="auto (nsga2 for longrope, tpe otherwise) | tpe | cmaes | nsga2 | random.")
    ] = "auto",
    population: Annotated[int, typer.Option(help="nsga2's population size."), Check("--population", minimum=2)] = 32,
    short_tolerance: Annotated[
        float,
        typer.Option(help="Guard: allowed rise of the perplexity at the trained length over plain RoPE's (0.05 = 5%)."),
        Check("--short-tolerance", minimum=0.0),
    ] = 0.05,
    search_factor: Annotated[
        bool,
        typer.Option(
            "--search-factor", help="Search the factor too (from s/2 to 2s); default: fixed at target / trained length."
        ),
    ] = False,
    space: Annotated[
        Optional[list[str]],
        typer.Option(
            "--space", help="Override a searched range: NAME=LOW:HIGH[:log], e.g. beta_fast=1:64:log; repeatable."
        ),
    ] = None,
    compare: Annotated[
        Optional[list[str]],
        typer.Option(
            "--compare",
            help="Also re-measure this method on the "
            "held-out documents (e.g. a hand-tuned "
            "yarn:factor=8,beta_fast=4,beta_slow=0.25); "
            "repeatable.",
        ),
    ] = None,
    export: Annotated[
        Optional[Path],
        typer.Option(
            help="Write the winner as a model directory (config.json with "
            "its rope_parameters, weights linked) and verify it by "
            "loading it fresh."
        ),
    ] = None,
    storage: Annotated[
        Optional[str],
        typer.Option(
            help="optuna storage URL shared by several processes or machines (default sqlite:///RUN_DIR/study.db)."
        ),
    ] = None,
    out: Annotated[Optional[Path], typer.Option(help="Run directory (default runs/tune-<model>-<time>).")] = None,
    overwrite: OverwriteOpt = False,
    seed: Annotated[
        int,
        typer.Option(help="The sampler's seed (an uninterrupted search is reproducible from it)."),
        Check("--seed", minimum=0),
    ] = 0,
    chunk_size: Annotated[
        int, typer.Option(help="Positions per LM-head chunk."), Check("--chunk-size", minimum=1)
    ] = 1024,
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    attn: AttnOpt = "sdpa",
    trust_remote_code: RemoteOpt = False,
) -> None:
    """Find the best parameters of a method for a target length (optuna; resumable, shareable) and export them."""
    from ..evals.tune.job import TuneJob, long_documents
    from ..evals.tune.search import TuneConfig, open_study, require_optuna, split_documents, storage_url
    from ..evals.tune.space import build_space, describe, parse_overrides

    if os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1"):
        raise CtxevalError(
            "ctxeval tune does not run under torchrun: start one `ctxeval tune` per GPU "
            "(CUDA_VISIBLE_DEVICES=i, its own --out) with one shared --storage; they share the study"
        )
    quick = model is None and method is None and target_length is None
    settings = {
        **(QUICKSTART_TUNE if quick else {"model": "tiny", "method": "yarn", "data": "pydoc", "trials": 100}),
        **{
            k: v
            for k, v in {
                "model": model,
                "method": method,
                "target_length": target_length,
                "data": data,
                "trials": trials,
            }.items()
            if v is not None
        },
    }
    if settings.get("target_length") is None:
        raise CtxevalError(
            "give --target-length (e.g. --target-length 32k): the length the search extends the model to"
        )
    target = parse_lengths(str(settings["target_length"]))
    if len(target) != 1:
        raise CtxevalError(f"--target-length takes one length, got {settings['target_length']}")
    target_len = target[0]
    specs = expand_specs([str(settings["method"])])
    compare_specs = expand_specs(list(compare or []))
    overrides = parse_overrides(list(space or []))
    require_optuna()
    corpora.check_data_spec(str(settings["data"]), "--data", text_field)
    lm = load_for(str(settings["model"]), specs + compare_specs, dtype, device, attn, trust_remote_code)
    geometry = lm.rope.geometry
    if geometry is None:
        raise CtxevalError(f"model '{settings['model']}' has no RoPE: there is nothing to tune")
    search_space = build_space(specs[0], geometry, target_len, search_factor, overrides)
    short = int(specs[0].params.get("original_max_position_embeddings") or geometry.original_length)
    cfg = TuneConfig(
        target_len,
        short,
        int(settings["trials"]),
        short_tolerance,
        sampler,
        seed,
        population,
        bos=getattr(lm.tokenizer, "bos_token_id", None) is not None,
        chunk_size=chunk_size,
    )
    compare_specs = settle_factors(compare_specs, [target_len], lm)  # `--compare yarn`: the factor of every command
    needed = target_len - 1 if cfg.bos else target_len
    tuning, heldout = split_documents(
        long_documents(str(settings["data"]), lm.tokenizer, tune_docs + heldout_docs, needed, text_field),
        tune_docs,
        heldout_docs,
    )
    docs = tuning + heldout
    run_dir = default_out("tune", str(settings["model"]), out)
    url = storage_url(storage, run_dir)
    protocol = {
        "model": str(settings["model"]),
        "method": specs[0].label,
        "space": describe(search_space),
        "target": target_len,
        "short": short,
        "short_tolerance": short_tolerance,
        "data": str(settings["data"]),
        "tuning_docs": [d.doc_id for d in tuning],
        "bos": cfg.bos,
        "dtype": lm.dtype,
    }
    spec_record = {
        "task": "tune",
        **protocol,
        "heldout_docs": [d.doc_id for d in heldout],
        "sampler": sampler,
        "seed": seed,
        "population": population,
        "methods": [specs[0].label],
        "compare": [c.label for c in compare_specs],
    }
    provenance = {
        "model": lm.record(),
        "data": {
            "spec": str(settings["data"]),
            "documents": [
                {"doc": d.doc_id, "tokens": int(len(d.ids)), "role": "tuning" if i < len(tuning) else "heldout"}
                for i, d in enumerate(docs)
            ],
        },
        "protocol": {
            "name": "truncate",
            "bos": cfg.bos,
            "aggregate": "token",
            "chunk_size": chunk_size,
            "objective": f"perplexity at {target_len:,} on the tuning documents",
            "guard": f"perplexity at {short:,} at most {short_tolerance:.0%} above plain RoPE's",
        },
        "search": {
            "space": describe(search_space),
            "dims": len(search_space.dims),
            "storage": storage or "study.db",
            "sampler": sampler,
            "seed": seed,
        },
        "seed": seed,
    }
    message = (
        f"run directory: {run_dir}  ({describe(search_space)}; tuning {', '.join(d.doc_id for d in tuning)}; "
        f"held out {', '.join(d.doc_id for d in heldout)})"
    )

    if export is not None:  # an export that cannot be written fails now, not after the search
        from ..evals.tune.export import check_export

        corner = search_space.snap({d.key: d.low for d in search_space.dims})
        check_export(str(settings["model"]), search_space.spec(corner), geometry, target_len, export, trust_remote_code)
    # a shared storage is checked before the run directory exists (another search's study: one line, nothing left)
    job = TuneJob(
        str(settings["model"]),
        str(settings["data"]),
        text_field,
        search_space,
        cfg,
        tuning,
        heldout,
        url,
        protocol,
        compare_specs,
        export,
        trust_remote_code,
        open_study(url, protocol, cfg, search_space, geometry, explicit=True) if storage is not None else None,
    )

    def work(store: Any, progress: Any) -> None:
        from ..evals.tune.job import run_tune

        run_tune(lm, job, store, progress, lambda text: err.print(f"note: {text}", markup=False))

    def render(store: Any) -> None:
        from ..report.tune import render_tune

        print_outputs(render_tune(store.dir))

    measure(run_dir, spec_record, overwrite, provenance, message, work, render)
