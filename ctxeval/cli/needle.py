"""`ctxeval needle` and `ctxeval passkey`: retrieval accuracy over a length (x depth) grid per method."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import numpy as np
import typer

from ..data import corpora
from ..data.presets import load_task, preset_names
from ..errors import CtxevalError
from ..models.load import DEFAULT_MODEL
from ..specs import expand_specs
from .console import err, print_outputs, user_errors
from .options import (
    NEEDLE_HELP,
    SAMPLES,
    THRESHOLD,
    AttnOpt,
    BackendOpt,
    BatchOpt,
    Check,
    DeviceMapOpt,
    DeviceOpt,
    DtypeOpt,
    FactorOpt,
    GpuMemoryOpt,
    MaxMemoryOpt,
    MaxModelLenOpt,
    MaxNewOpt,
    ModelOpt,
    OutOpt,
    OverwriteOpt,
    PipelineParallelOpt,
    RemoteOpt,
    ScoringOpt,
    SeedOpt,
    TemperatureOpt,
    TensorParallelOpt,
    TextFieldOpt,
    VllmArgOpt,
    parse_depths,
    parse_factors,
    parse_lengths,
    parse_temperatures,
)
from .run import (
    QUICKSTART_SETTINGS,
    Backend,
    default_lengths,
    default_out,
    load_for,
    measure,
    note_attention_noops,
    prepare_backend,
    quickstart,
    settle_factors,
)

if TYPE_CHECKING:
    from ..evals.needle import NeedlePreset

# torch, transformers, pandas and matplotlib load only when a command needs them (`ctxeval --help` starts in
# well under a second): the evaluation and report modules are imported inside the command functions.

LengthsOpt = Annotated[
    Optional[str],
    typer.Option(
        help="Context lengths in tokens: 1k,2k,4k | 1k:16k:x2 "
        "(default: 0.25x, 0.5x, 1x, 2x the model's original length)."
    ),
]
RetrievalMethodOpt = Annotated[
    Optional[list[str]], typer.Option("--method", "-m", help="NAME or NAME:key=value,...; repeatable (default none).")
]
PASSKEY_PROTOCOLS = ("yarn", "ctxeval")


@dataclass(frozen=True)
class Retrieval:
    """Every option of `needle` and `passkey` (passkey fixes the needle and draws a random depth per sample;
    `protocol` and `bos` are passkey's)."""

    model: str | None
    lengths: str | None
    samples: int | None
    haystack: str
    text_field: str
    chat_template: str
    scoring: str
    max_new_tokens: int | None
    batch_size: int
    threshold: float
    method: list[str] | None
    factor: str | None
    attention_temperature: str | None
    seed: int
    out: Path | None
    overwrite: bool
    dtype: str
    device: str
    attn: str
    trust_remote_code: bool
    device_map: str | None
    max_memory: str | None
    depths: str | None = None
    depth_spacing: str = "linear"
    needle: str = "passkey"
    needle_text: str | None = None
    question: str | None = None
    answer_prefix: str | None = None
    answer: str | None = None
    snap: bool = False
    protocol: str = "ctxeval"
    bos: bool | None = None  # None: the protocol's default (yarn: off, as the repo's pipeline; ctxeval: on)
    backend: Backend = Backend()


def check_yarn_options(opt: Retrieval) -> None:
    """What --protocol yarn cannot take (the repo has no such setting), refused in one line before the model loads."""
    given = [
        ("--haystack " + opt.haystack, opt.haystack != "filler"),
        ("--chat-template " + opt.chat_template, opt.chat_template != "off"),
        ("--scoring " + opt.scoring, opt.scoring != "generate"),
    ]
    for flag, refused in given:
        if refused:
            raise CtxevalError(
                f"{flag} is not part of --protocol yarn (YaRN's eval/passkey.py: its filler, the raw text, "
                "generated replies); use --protocol ctxeval for it"
            )


def load_needle_preset(
    name: str, needle_text: str | None, question: str | None, answer_prefix: str | None, answer: str | None
) -> NeedlePreset:
    """A needle preset by name (tasks/needle-NAME.toml) or .toml path, with the pieces the flags override."""
    from ..evals.needle import NeedlePreset

    if name.endswith(".toml"):
        data = load_task(name, "needle")
    else:
        choices = [n.removeprefix("needle-") for n in preset_names("needle")]
        if name.startswith("ruler"):  # renamed: these presets never were RULER's protocol
            raise CtxevalError(
                f"the '{name}' preset is now '{name.replace('ruler', 'magic-number', 1)}' (it follows "
                "RULER's wording, not its protocol); for RULER itself run ctxeval ruler"
            )
        if name not in choices:
            raise CtxevalError(f"unknown needle preset '{name}'; choose one of {', '.join(choices)}, or a .toml file")
        data = load_task(f"needle-{name}", "needle")
    overrides = {"needle": needle_text, "question": question, "answer_prefix": answer_prefix}
    data.update({k: v for k, v in overrides.items() if v is not None})
    if answer is not None:
        data.update(value=f"fixed:{answer}", match="all", keys=1, values_per_key=1)
    return NeedlePreset.from_dict(Path(name).stem if name.endswith(".toml") else name, data)


def run_retrieval(task: str, opt: Retrieval) -> None:
    """Load the model, build the prompts, measure every (method, length, depth, sample), render the run."""
    from ..evals.needle import FILLER, NeedleConfig, NeedleRunner, PromptBuilder, haystack_tokens, make_sample, sweep
    from ..evals.passkey import (
        YARN_LENGTH_STEP,
        YARN_MAX_NEW_TOKENS,
        YARN_SAMPLES,
        YarnPasskeyBuilder,
        YarnPasskeyRunner,
    )
    from ..report.single import render_retrieval

    if task == "passkey" and opt.protocol not in PASSKEY_PROTOCOLS:
        raise CtxevalError(f"--protocol must be {' or '.join(PASSKEY_PROTOCOLS)}, got '{opt.protocol}'")
    yarn = task == "passkey" and opt.protocol == "yarn"

    is_quickstart = opt.model is None
    if is_quickstart:  # the bundled model with its quickstart settings, each overridden by what the user gave
        qs = quickstart(task, opt.factor is not None and opt.method is None)
        opt = replace(
            opt,
            model=DEFAULT_MODEL,
            lengths=opt.lengths if opt.lengths is not None else qs.get("lengths"),
            samples=opt.samples if opt.samples is not None else qs.get("samples"),
            method=opt.method if opt.method is not None else list(qs.get("method", ["none"])),
        )
    default_samples = YARN_SAMPLES if yarn else 10 if task == "passkey" else 1
    opt = replace(
        opt,
        samples=opt.samples if opt.samples is not None else default_samples,
        method=opt.method if opt.method is not None else ["none"],
    )
    SAMPLES(opt.samples)

    preset = load_needle_preset(opt.needle, opt.needle_text, opt.question, opt.answer_prefix, opt.answer)
    specs = expand_specs(opt.method, parse_factors(opt.factor), parse_temperatures(opt.attention_temperature))
    random_depth = task == "passkey"
    lengths_given = parse_lengths(opt.lengths) if opt.lengths is not None else None
    depth_list = tuple(parse_depths(opt.depths, opt.depth_spacing)) if not random_depth else ()
    max_new = (opt.max_new_tokens or YARN_MAX_NEW_TOKENS) if yarn else opt.max_new_tokens
    cfg = NeedleConfig(
        tuple(lengths_given or (1,)),
        depth_list,
        opt.samples,
        opt.scoring,
        max_new,
        opt.seed,
        random_depth,
        opt.batch_size,
    )  # validates the flags before the model loads
    if opt.chat_template not in ("auto", "on", "off"):
        raise CtxevalError(f"--chat-template must be auto, on or off, got '{opt.chat_template}'")
    if yarn:
        check_yarn_options(opt)
    bos = opt.bos if opt.bos is not None else not yarn
    if not yarn and opt.haystack != "filler":  # a missing corpus fails now, not after the model loads
        corpora.check_data_spec(opt.haystack, "--haystack", opt.text_field)

    if opt.backend.name == "vllm" and opt.scoring == "forced":
        raise CtxevalError(
            "--scoring forced reads the model's logits in one forward; vLLM generates: use --scoring "
            "generate, or --backend hf"
        )
    lm = load_for(
        opt.model,
        specs,
        opt.dtype,
        opt.device,
        opt.attn,
        opt.trust_remote_code,
        opt.device_map,
        opt.max_memory,
        opt.backend,
    )
    if lengths_given is None:
        cfg = replace(cfg, lengths=tuple(default_lengths(lm, (0.25, 0.5, 1, 2))))
    specs = settle_factors(specs, list(cfg.lengths), lm)
    note_attention_noops(specs, list(cfg.lengths), lm.trained_length)
    if yarn:
        yarn_builder = YarnPasskeyBuilder(lm.tokenizer, preset, seed=opt.seed, bos=bos)
        need = yarn_builder.minimum_length()
        use_template, what = False, "the passkey prompt without filler"
    else:
        has_template = bool(getattr(lm.tokenizer, "chat_template", None))
        if opt.chat_template == "on" and not has_template:
            raise CtxevalError(
                f"--chat-template on, but the tokenizer of '{opt.model}' has no chat template; use auto or off"
            )
        use_template = has_template if opt.chat_template == "auto" else opt.chat_template == "on"
        hay_ids, hay_info = haystack_tokens(lm.tokenizer, opt.haystack, max(cfg.lengths), opt.text_field)
        builder = PromptBuilder(lm.tokenizer, preset, hay_ids, chat_template=use_template, bos=bos, snap=opt.snap)
        probe = make_sample(preset, np.random.default_rng(opt.seed))
        need = builder.minimum_length(
            probe, NeedleRunner(lm.model, lm.tokenizer, lm.device, builder, cfg, lm.name, task).budget(probe)
        )
        what = "the instruction, needle and question"
    if lengths_given is None and min(cfg.lengths) < need <= max(cfg.lengths):
        dropped = [L for L in cfg.lengths if L < need]
        err.print(
            f"note: default lengths {', '.join(map(str, dropped))} are shorter than the prompt ({need} tokens); "
            "left out"
        )
        cfg = replace(cfg, lengths=tuple(L for L in cfg.lengths if L >= need))
    if min(cfg.lengths) < need:
        raise CtxevalError(
            f"length {min(cfg.lengths)} is shorter than {what} "
            f"({need} tokens with this tokenizer); use --lengths of at least {need}"
        )
    if yarn:
        garbage = {L: yarn_builder.garbage_chars(L) for L in cfg.lengths}  # the repo's length search, before the run
        hay_info = {"haystack": "filler", "text": FILLER}
        runner: NeedleRunner = YarnPasskeyRunner(lm.model, lm.tokenizer, lm.device, yarn_builder, cfg, lm.name, task)
    else:
        if len(hay_ids) < max(cfg.lengths):
            raise CtxevalError(
                f"the haystack '{opt.haystack}' has {len(hay_ids):,} tokens, fewer than --lengths "
                f"{max(cfg.lengths)}; use a longer corpus or shorter lengths"
            )
        runner = NeedleRunner(lm.model, lm.tokenizer, lm.device, builder, cfg, lm.name, task)
    # the longest sequence: prompt + budget is the length itself, except under yarn (prompts under the target)
    longest = max(cfg.lengths) + (cfg.max_new_tokens + 1 if yarn else 0)
    backend_spec = prepare_backend(lm, specs, list(cfg.lengths), longest, fixed_lengths=not yarn)
    spec_record = {
        "task": task,
        "model": opt.model,
        "preset": preset.__dict__,
        "haystack": opt.haystack,
        "text_field": opt.text_field,
        "lengths": list(cfg.lengths),
        "depths": list(cfg.depths),
        "random_depth": random_depth,
        "samples": opt.samples,
        "scoring": opt.scoring,
        "max_new_tokens": cfg.max_new_tokens if yarn else opt.max_new_tokens,
        "snap": opt.snap,
        "chat_template": use_template,
        "methods": [s.label for s in specs],
        "dtype": lm.dtype,
        "seed": opt.seed,
        **({"protocol": opt.protocol, "bos": bos} if task == "passkey" else {}),
        **({"length_step": YARN_LENGTH_STEP} if yarn else {}),
        **({"settings": QUICKSTART_SETTINGS} if is_quickstart else {}),
        **backend_spec,
    }
    provenance = {
        "model": lm.record(),
        "haystack": hay_info,
        "seed": opt.seed,
        "scoring": {
            "name": opt.scoring,
            "rule": "yarn: int(first \\d+) == key" if yarn else preset.match,
            "llm_judge": False,
        },
    }
    if yarn:
        provenance["protocol"] = {
            "name": "yarn",
            "source": "jquesnelle/yarn eval/passkey.py (from epfml/landmark-attention llama/run_test.py)",
            "length_step": YARN_LENGTH_STEP,
            "bos": bool(yarn_builder.bos),
            "bos_token": lm.tokenizer.bos_token if yarn_builder.bos else None,
            "garbage_chars": {str(L): n for L, n in garbage.items()},
            "search_tokens": {str(L): yarn_builder.search_tokens(n) for L, n in garbage.items()},
        }
    run_dir = default_out(task, opt.model, opt.out)
    message = (
        f"run directory: {run_dir}  ({len(cfg.cells())} samples per method; chat template "
        f"{'on' if use_template else 'off'}; scoring {opt.scoring})"
    )
    if yarn:
        message = (
            f"run directory: {run_dir}  ({len(cfg.cells())} samples per method; protocol yarn: YaRN's "
            f"eval/passkey.py prompts, BOS {'on' if yarn_builder.bos else 'off'}, at most {cfg.max_new_tokens} new "
            "tokens)"
        )

    def work(store: Any, progress: Any) -> None:
        runner.progress = progress
        sweep(lm, specs, runner, store)

    title = (
        f"{opt.model}: {preset.name} in {opt.haystack}"
        + (" (protocol yarn)" if yarn else "")
        + (" on vLLM" if backend_spec else "")
    )
    measure(
        run_dir,
        spec_record,
        opt.overwrite,
        provenance,
        message,
        work,
        render=lambda store: print_outputs(
            render_retrieval(store, task, specs, lm.trained_length, opt.threshold, title)
        ),
    )


@user_errors
def needle_cmd(
    model: ModelOpt = None,
    lengths: LengthsOpt = None,
    depths: Annotated[
        str, typer.Option(help="Needle depths in percent: 0,50,100 | 0:100:11 (start:stop:count).")
    ] = "0:100:5",
    depth_spacing: Annotated[
        str, typer.Option(help="linear | sigmoid (packed towards the ends, as the original test).")
    ] = "linear",
    samples: Annotated[
        Optional[int],
        typer.Option(help="Samples per cell, each with its own seeded needle and offset (default 1)."),
        SAMPLES,
    ] = None,
    needle: Annotated[str, typer.Option(help=NEEDLE_HELP)] = "magic-number",
    needle_text: Annotated[Optional[str], typer.Option(help="Override the needle sentence ({key}, {value}).")] = None,
    question: Annotated[Optional[str], typer.Option(help="Override the question ({keys}).")] = None,
    answer_prefix: Annotated[Optional[str], typer.Option(help="Override the answer prefix.")] = None,
    answer: Annotated[Optional[str], typer.Option(help="A fixed expected answer (with --needle-text).")] = None,
    haystack: Annotated[
        str, typer.Option(help="pydoc | filler | austen | mobydick | files | hf:NAME (any --data spec).")
    ] = "pydoc",
    text_field: TextFieldOpt = "text",
    snap: Annotated[bool, typer.Option(help="Move each needle back to the previous sentence end.")] = False,
    chat_template: Annotated[
        str, typer.Option(help="auto | on | off: wrap as a user turn, prefill the answer prefix.")
    ] = "auto",
    scoring: ScoringOpt = "generate",
    max_new_tokens: MaxNewOpt = None,
    batch_size: BatchOpt = 4,
    threshold: Annotated[float, typer.Option(help="Accuracy that counts for the effective length."), THRESHOLD] = 0.8,
    method: RetrievalMethodOpt = None,
    factor: FactorOpt = None,
    attention_temperature: TemperatureOpt = None,
    seed: SeedOpt = 0,
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
    """Needle in a haystack: accuracy over a depth x length grid per method, heatmaps, effective length."""
    run_retrieval(
        "needle",
        Retrieval(
            model,
            lengths,
            samples,
            haystack,
            text_field,
            chat_template,
            scoring,
            max_new_tokens,
            batch_size,
            threshold,
            method,
            factor,
            attention_temperature,
            seed,
            out,
            overwrite,
            dtype,
            device,
            attn,
            trust_remote_code,
            device_map,
            max_memory,
            depths=depths,
            depth_spacing=depth_spacing,
            needle=needle,
            needle_text=needle_text,
            question=question,
            answer_prefix=answer_prefix,
            answer=answer,
            snap=snap,
            backend=Backend(
                backend,
                tensor_parallel_size,
                pipeline_parallel_size,
                gpu_memory_utilization,
                max_model_len,
                tuple(vllm_arg or ()),
            ),
        ),
    )


@user_errors
def passkey_cmd(
    model: ModelOpt = None,
    lengths: LengthsOpt = None,
    samples: Annotated[
        Optional[int],
        typer.Option(
            help="Samples per length, each at a seeded uniform random depth "
            "(default 20 under yarn, the repo's --iterations; 10 under ctxeval)."
        ),
        SAMPLES,
    ] = None,
    protocol: Annotated[
        str,
        typer.Option(
            help="yarn: YaRN's eval/passkey.py point by point (its text, length search, "
            "no BOS, 10 new tokens, scoring) | ctxeval: exact lengths in token "
            "space."
        ),
    ] = "yarn",
    bos: Annotated[
        Optional[bool],
        typer.Option(
            "--bos/--no-bos",
            help="Start the prompt with the tokenizer's BOS (default off under yarn, on under ctxeval).",
        ),
    ] = None,
    haystack: Annotated[
        str, typer.Option(help="filler (the original test's) or any --data spec (--protocol ctxeval).")
    ] = "filler",
    text_field: TextFieldOpt = "text",
    chat_template: Annotated[str, typer.Option(help="auto | on | off (on and auto: --protocol ctxeval)")] = "off",
    scoring: ScoringOpt = "generate",
    max_new_tokens: Annotated[
        Optional[int],
        typer.Option(help="Generation budget (default: 10 under yarn; the answer tokens + 8 under ctxeval)."),
        Check("--max-new-tokens", minimum=1),
    ] = None,
    batch_size: BatchOpt = 4,
    threshold: Annotated[
        float, typer.Option(help="Accuracy that counts for the passkey context and the effective length."), THRESHOLD
    ] = 0.8,
    method: RetrievalMethodOpt = None,
    factor: FactorOpt = None,
    attention_temperature: TemperatureOpt = None,
    seed: SeedOpt = 0,
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
    """Passkey retrieval: accuracy per length (--protocol yarn: YaRN's eval/passkey.py test), the YaRN paper's passkey
    context (the longest length with accuracy >= --threshold) and passkey accuracy (the mean up to it), and the
    effective length (every length up to it passes)."""
    run_retrieval(
        "passkey",
        Retrieval(
            model,
            lengths,
            samples,
            haystack,
            text_field,
            chat_template,
            scoring,
            max_new_tokens,
            batch_size,
            threshold,
            method,
            factor,
            attention_temperature,
            seed,
            out,
            overwrite,
            dtype,
            device,
            attn,
            trust_remote_code,
            device_map,
            max_memory,
            protocol=protocol,
            bos=bos,
            backend=Backend(
                backend,
                tensor_parallel_size,
                pipeline_parallel_size,
                gpu_memory_utilization,
                max_model_len,
                tuple(vllm_arg or ()),
            ),
        ),
    )
