"""`ctxeval ruler`: RULER's synthetic tasks, prompts as RULER generates them, scored as RULER scores them."""

from __future__ import annotations

import glob
import hashlib
import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..data import corpora
from ..errors import CtxevalError
from ..models.load import DEFAULT_MODEL
from ..runs.rows import RULER_THRESHOLD
from ..specs import expand_specs
from ..util.paths import cache_dir
from ..util.textfiles import MAX_TEXT_BYTES, read_bytes, read_json, read_text
from .console import err, print_outputs, user_errors
from .options import (
    AttnOpt,
    BackendOpt,
    Check,
    DeviceMapOpt,
    DeviceOpt,
    DtypeOpt,
    FactorOpt,
    GpuMemoryOpt,
    MaxMemoryOpt,
    MaxModelLenOpt,
    OutOpt,
    OverwriteOpt,
    PipelineParallelOpt,
    PlainModelOpt,
    RemoteOpt,
    TemperatureOpt,
    TensorParallelOpt,
    VllmArgOpt,
    parse_factors,
    parse_lengths,
    parse_temperatures,
)
from .run import (
    Backend,
    default_lengths,
    default_out,
    load_for,
    measure,
    note_attention_noops,
    prepare_backend,
    settle_factors,
)

# torch, transformers, pandas and matplotlib load only when a command needs them: the evaluation and report modules
# are imported inside the command function.
OFFLINE = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
)


def essay_text(essays: Path | None, substitute: str) -> tuple[str, str]:
    """RULER's essay haystack: PaulGrahamEssays.json ({"text": ...}) or .txt files (concatenated in sorted order, as
    RULER's download script builds the JSON); without --essays, the documents of an offline corpus."""
    path = Path(essays).expanduser() if essays is not None else None
    if path is None:
        text = "\n\n".join(doc.text for doc in corpora.iter_documents(substitute))
        source = f"{substitute} (substitute for RULER's Paul Graham essays)"
    elif path.is_file() and path.suffix == ".json":
        data = read_json(path, "--essays", max_bytes=MAX_TEXT_BYTES, finite=False)
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise CtxevalError(f"--essays {essays}: not RULER's PaulGrahamEssays.json (a JSON object with 'text')")
        text, source = data["text"], path.name
    else:
        files = (
            sorted(Path(p) for p in glob.glob(str(path / "*.txt")))
            if path.is_dir()
            else ([path] if path.is_file() else [])
        )
        if not files:
            raise CtxevalError(
                f"--essays {essays}: give RULER's PaulGrahamEssays.json, a .txt file or a folder of .txt files"
            )
        text = "".join(read_text(f, "--essays", binary_ok=False) for f in files)
        source = f"{path.name} ({len(files)} .txt file(s))"
    if not text.strip():
        given = f"--essays {essays}" if essays is not None else f"--essay-substitute {substitute}"
        raise CtxevalError(f"{given} holds no text; the essay haystack needs words to fill the lengths")
    return text, source


def file_digest(path: Path) -> str:
    return hashlib.sha256(read_bytes(path, "--qa-data file", max_bytes=MAX_TEXT_BYTES)).hexdigest()[:16]


@user_errors
def ruler_cmd(
    model: PlainModelOpt = None,
    tasks: Annotated[
        Optional[str],
        typer.Option(
            help="Comma-separated RULER tasks (default: all 13 once the QA files "
            "are there, else the 11 that run offline: " + ", ".join(OFFLINE) + ")."
        ),
    ] = None,
    lengths: Annotated[
        Optional[str],
        typer.Option(
            help="Context lengths in tokens: 4k,8k | 4k:32k:x2 (default: 1x, 2x, 4x the model's original length)."
        ),
    ] = None,
    samples: Annotated[
        int, typer.Option(help="Samples per task and length (RULER uses 500)."), Check("--samples", minimum=1)
    ] = 10,
    essays: Annotated[
        Optional[Path], typer.Option(help="RULER's PaulGrahamEssays.json or .txt essays for the essay haystack.")
    ] = None,
    essay_substitute: Annotated[
        str,
        typer.Option(
            help="Corpus used as the essay haystack without --essays (any --data spec; named in every table)."
        ),
    ] = "pydoc",
    qa_data: Annotated[
        Optional[Path],
        typer.Option(
            help="Folder with RULER's QA files: squad.json (SQuAD 2.0 dev) and "
            "hotpotqa.json (HotpotQA dev, distractor). Without it qa_1/qa_2 "
            "download them from RULER's URLs into the cache."
        ),
    ] = None,
    samples_from: Annotated[
        Optional[Path],
        typer.Option(help="Run the prompts of RULER-generated files DIR/<length>/<task>/validation.jsonl instead."),
    ] = None,
    template: Annotated[
        str,
        typer.Option(
            help="RULER's model template (template.py): base (for base models), "
            "meta-chat, vicuna-chat, lwm-chat, command-r-chat, chatglm-chat, RWKV, Phi3, "
            "meta-llama3, jamba, nemotron5-instruct."
        ),
    ] = "base",
    cwe_words: Annotated[
        Optional[Path],
        typer.Option(
            help="cwe's word list past wonderwords' 8,169 words (lengths "
            "over ~64k): RULER's english_words.json or a word-per-line file "
            "(default /usr/share/dict/american-english, Debian wamerican)."
        ),
    ] = None,
    threshold: Annotated[
        float,
        typer.Option(help="Mean score a length must exceed for the effective length."),
        Check("--threshold", above=0, maximum=100),
    ] = RULER_THRESHOLD,
    seed: Annotated[int, typer.Option(help="RULER's random seed (its default 42)."), Check("--seed", minimum=0)] = 42,
    batch_size: Annotated[
        int,
        typer.Option(
            help="Prompts per generate call (left-padded; 1 = one at a time; --backend "
            "vllm submits every prompt of a task and length at once)."
        ),
        Check("--batch-size", minimum=1),
    ] = 1,
    method: Annotated[
        Optional[list[str]],
        typer.Option("--method", "-m", help="NAME or NAME:key=value,...; repeatable (default none)."),
    ] = None,
    factor: FactorOpt = None,
    attention_temperature: TemperatureOpt = None,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    attn: AttnOpt = "sdpa",
    trust_remote_code: RemoteOpt = False,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    backend: BackendOpt = "hf",
    tensor_parallel_size: TensorParallelOpt = 1,
    pipeline_parallel_size: PipelineParallelOpt = 1,
    gpu_memory_utilization: GpuMemoryOpt = None,
    max_model_len: MaxModelLenOpt = None,
    vllm_arg: VllmArgOpt = None,
) -> None:
    """RULER's synthetic tasks (NIAH x8, variable tracking, common/frequent words): mean score per length, effective length."""
    from ..evals.ruler.qa import QA, QA_URLS, qa_folder
    from ..evals.ruler.run import RulerConfig, RulerRunner, prepare, sweep
    from ..evals.ruler.sources import Sources, english_words
    from ..evals.ruler.tasks import TASKS
    from ..report.single import render_ruler

    model_name = model or DEFAULT_MODEL
    qa_cache = cache_dir() / "ruler-qa"
    qa_ready = qa_data is not None or all((qa_cache / name).is_file() for name in QA_URLS)
    chosen = (
        tuple(t.strip() for t in tasks.split(",") if t.strip())
        if tasks
        else (OFFLINE + (("qa_1", "qa_2") if qa_ready else ()))
    )
    left_out = (
        []
        if tasks or qa_ready
        else [
            f"qa_1, qa_2 left out: RULER's SQuAD / HotpotQA files are not in {qa_cache} (--tasks qa_1,qa_2 downloads them "
            "from RULER's URLs; --qa-data DIR reads them from a folder)"
        ]
    )
    specs = expand_specs(method or ["none"], parse_factors(factor), parse_temperatures(attention_temperature))
    given = tuple(parse_lengths(lengths)) if lengths is not None else None
    cfg = RulerConfig(
        chosen, given or (1,), samples, seed, template
    )  # checks tasks and template before the model loads
    word_list = english_words(cwe_words) if "cwe" in chosen and samples_from is None else None
    if samples_from is not None and not Path(samples_from).is_dir():
        raise CtxevalError(
            f"--samples-from {samples_from}: not a directory of RULER's <length>/<task>/validation.jsonl"
        )
    qa_tasks = [t for t in cfg.tasks if TASKS[t].family == "qa"]
    qa_dir = qa_folder(qa_tasks, qa_data, qa_cache) if qa_tasks and samples_from is None else None
    sources = Sources(qa_dir=qa_dir)
    if word_list is not None:
        sources.extra_words, sources.extra_words_source = word_list
    # the essays are read before the model loads: a missing file or corpus fails in a second, not after the load
    if samples_from is None and any(TASKS[t].args.get("type_haystack") == "essay" for t in cfg.tasks):
        text, sources.essay_source = essay_text(essays, essay_substitute)
        sources.essay_words = re.sub(r"\s+", " ", text).split(" ")
        essay_digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    else:
        essay_digest = None
    engine = Backend(
        backend,
        tensor_parallel_size,
        pipeline_parallel_size,
        gpu_memory_utilization,
        max_model_len,
        tuple(vllm_arg or ()),
    )
    lm = load_for(model_name, specs, dtype, device, attn, trust_remote_code, device_map, max_memory, engine)
    if given is None:
        cfg = RulerConfig(chosen, tuple(default_lengths(lm, (1, 2, 4))), samples, seed, template)
    specs = settle_factors(specs, list(cfg.lengths), lm)
    note_attention_noops(specs, list(cfg.lengths), lm.trained_length)
    backend_spec = prepare_backend(lm, specs, list(cfg.lengths), max(cfg.lengths))
    run_dir = default_out("ruler", model_name, out)
    spec_record = {
        "task": "ruler",
        "model": model_name,
        "tasks": list(cfg.tasks),
        "lengths": list(cfg.lengths),
        "samples": cfg.samples,
        "seed": cfg.seed,
        "essays": sources.essay_source or None,
        "essay_sha256": essay_digest,
        "samples_from": str(samples_from) if samples_from else None,
        "template": template,
        **(
            {
                "qa_data": str(qa_dir),
                "qa_sha256": {
                    name: file_digest(qa_dir / name) for name in QA.FILES.values() if (qa_dir / name).is_file()
                },
            }
            if qa_dir
            else {}
        ),
        # the default list is recorded in the protocol only: prompts, once generated, are read back from the run
        # directory, so installing wamerican later neither changes a run nor blocks re-rendering it
        **({"cwe_words": sources.extra_words_source} if cwe_words else {}),
        "methods": [s.label for s in specs],
        "dtype": lm.dtype,
        **backend_spec,
    }
    provenance = {
        "model": lm.record(),
        "protocol": {
            "name": "RULER (NVIDIA/RULER scripts/synthetic.yaml)",
            "template": template,
            "decoding": "greedy",
            "scoring": "string_match_all",
            "threshold": threshold,
            "word_lists": "wonderwords 2.2.0"
            + (f"; cwe past it: {sources.extra_words_source}" if sources.extra_words_source else ""),
            "essays": sources.essay_source or None,
        },
    }
    notes = (
        left_out
        + ([f"essay haystack: {sources.essay_source}"] if sources.essay_source else [])
        + ([f"model template: {template}"] if template != "base" and samples_from is None else [])
        + ([f"prompts read from {samples_from}"] if samples_from else [])
    )
    original = lm.trained_length
    title = f"{model_name}: RULER" + (" on vLLM" if backend_spec else "")
    runner = RulerRunner(lm.model, lm.tokenizer, lm.device, lm.name, batch_size)

    def work(store, progress) -> None:  # noqa: ANN001
        runner.progress = progress
        prompts = prepare(cfg, lm.tokenizer, sources, store.dir, samples_from, progress.note)
        sweep(lm, specs, prompts, cfg, runner, store)

    for note in notes:
        err.print(f"note: {note}")
    measure(
        run_dir,
        spec_record,
        overwrite,
        provenance,
        f"run directory: {run_dir}  ({len(cfg.tasks)} task(s) x {len(cfg.lengths)} length(s) x {cfg.samples} "
        "sample(s) per method)",
        work,
        render=lambda store: print_outputs(
            render_ruler(store, specs, list(cfg.tasks), original, threshold, cfg.samples, title, notes)
        ),
    )
