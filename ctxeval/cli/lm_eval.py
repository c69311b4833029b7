"""`ctxeval lm-eval`: lm-evaluation-harness tasks with each RoPE method applied in place and read back."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Annotated, Optional

import typer

from ..errors import CtxevalError
from ..models.load import DEFAULT_MODEL
from ..specs import MethodSpec, expand_specs
from .console import err, print_outputs, user_errors
from .options import (
    BackendOpt,
    Check,
    DeviceOpt,
    DtypeOpt,
    FactorOpt,
    GpuMemoryOpt,
    MaxModelLenOpt,
    OutOpt,
    OverwriteOpt,
    PipelineParallelOpt,
    PlainModelOpt,
    RemoteOpt,
    TensorParallelOpt,
    VllmArgOpt,
    parse_factors,
)
from .run import Backend, default_out, load_for, measure, prepare_backend, settle_factors


def extended_length(specs: list[MethodSpec], trained: int) -> int:
    """The longest context the methods extend to: trained length x the largest factor any of them sets."""
    factors = [float(s.params["factor"]) for s in specs if "factor" in s.params]
    return int(trained * max([1.0, *factors]))


@user_errors
def lm_eval_cmd(
    tasks: Annotated[
        str, typer.Option(help="lm-eval task, group or tag names, comma-separated (e.g. longbench_narrativeqa,ruler).")
    ],
    model: PlainModelOpt = None,
    method: Annotated[
        Optional[list[str]],
        typer.Option("--method", "-m", help="NAME or NAME:key=value,...; repeatable (default none)."),
    ] = None,
    factor: FactorOpt = None,
    include_path: Annotated[Optional[str], typer.Option(help="A folder of your own lm-eval task YAML files.")] = None,
    limit: Annotated[
        Optional[float],
        typer.Option(help="Documents per task (lm-eval's --limit; < 1: a fraction)."),
        Check("--limit", above=0),
    ] = None,
    num_fewshot: Annotated[
        Optional[int],
        typer.Option(help="Few-shot examples (lm-eval's --num_fewshot)."),
        Check("--num-fewshot", minimum=0),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="lm-eval's batch size."), Check("--batch-size", minimum=1)] = 1,
    max_length: Annotated[
        Optional[int],
        typer.Option(
            help="Tokens lm-eval keeps of each input (it cuts from the "
            "left; default: trained length x the largest --factor)."
        ),
        Check("--max-length", minimum=2),
    ] = None,
    log_samples: Annotated[bool, typer.Option(help="Keep lm-eval's per-sample records beside its results.")] = False,
    metadata: Annotated[
        Optional[str],
        typer.Option(
            help='lm-eval task metadata as JSON, e.g. \'{"max_seq_lengths": '
            "[4096, 8192]}' for its RULER port (the model's tokenizer is "
            'added as "tokenizer").'
        ),
    ] = None,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    trust_remote_code: RemoteOpt = False,
    backend: BackendOpt = "hf",
    tensor_parallel_size: TensorParallelOpt = 1,
    pipeline_parallel_size: PipelineParallelOpt = 1,
    gpu_memory_utilization: GpuMemoryOpt = None,
    max_model_len: MaxModelLenOpt = None,
    vllm_arg: VllmArgOpt = None,
) -> None:
    """Run lm-evaluation-harness tasks under each method (loaded once, applied in place, verified): rows, table,
    lm-eval's own JSON."""
    from ..evals.lm_eval_bridge import (
        TESTED_VERSION,
        LmEvalConfig,
        evaluate,
        parse_metadata,
        require_lm_eval,
        task_manager,
    )
    from ..report.single import render_lm_eval

    lm_eval = require_lm_eval()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise CtxevalError(
            "ctxeval lm-eval runs in one process (lm-eval shards a loaded model itself only through "
            "its own launcher); run it without torchrun"
        )
    names = tuple(t.strip() for t in tasks.split(",") if t.strip())
    model_name = model or DEFAULT_MODEL
    specs = expand_specs(method or ["none"], parse_factors(factor))
    cfg = LmEvalConfig(
        names,
        max_length or 2,
        include_path,
        limit,
        num_fewshot,
        batch_size,
        log_samples,
        parse_metadata(metadata, None),
    )
    task_manager(cfg)  # unknown tasks and bad metadata fail before the model loads
    engine = Backend(
        backend,
        tensor_parallel_size,
        pipeline_parallel_size,
        gpu_memory_utilization,
        max_model_len,
        tuple(vllm_arg or ()),
    )
    lm = load_for(model_name, specs, dtype, device, "sdpa", trust_remote_code, backend=engine)
    trained = lm.trained_length or 2048
    specs = settle_factors(specs, [max_length or extended_length(specs, trained)], lm)  # --max-length sets the factor
    cfg = replace(
        cfg,
        max_length=max_length or extended_length(specs, trained),
        metadata=parse_metadata(metadata, getattr(lm.tokenizer, "name_or_path", None)),
    )
    if lm_eval.__version__ != TESTED_VERSION:
        err.print(f"note: lm-eval {lm_eval.__version__} is installed; ctxeval is tested with {TESTED_VERSION}")
    err.print(f"note: lm-eval keeps the last {cfg.max_length:,} tokens of each input (trained length {trained:,})")
    backend_spec = prepare_backend(lm, specs, [cfg.max_length], cfg.max_length)
    spec_record = {
        "task": "lm-eval",
        "model": model_name,
        "tasks": list(names),
        "methods": [s.label for s in specs],
        "max_length": cfg.max_length,
        "limit": limit,
        "num_fewshot": num_fewshot,
        "include_path": include_path,
        "metadata": parse_metadata(metadata, None),
        "dtype": lm.dtype,
        **backend_spec,
    }
    provenance = {
        "model": lm.record(),
        "lm_eval": {
            "version": lm_eval.__version__,
            "batch_size": batch_size,
            "metadata": cfg.metadata,
            "log_samples": log_samples,
            "evaluator": "lm_eval.simple_evaluate on "
            + (
                "lm_eval.models.vllm_causallms.VLLM (one engine per method)"
                if backend_spec
                else "lm_eval.models.huggingface.HFLM(pretrained=<loaded model>)"
            ),
        },
    }
    run_dir = default_out("lm-eval", model_name, out)
    title = f"{model_name}: lm-eval {', '.join(names)}" + (" on vLLM" if backend_spec else "")
    measure(
        run_dir,
        spec_record,
        overwrite,
        provenance,
        f"run directory: {run_dir}",
        work=lambda store, progress: evaluate(lm, specs, cfg, store, progress),
        render=lambda store: print_outputs(render_lm_eval(store, title)),
    )
