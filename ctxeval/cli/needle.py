"""`ctxeval needle` and `ctxeval passkey`: retrieval accuracy over a length (x depth) grid per method."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import numpy as np
import typer

from ..data import corpora
from ..data.presets import load_task, preset_names
from ..errors import CtxevalError
from ..models.load import DEFAULT_MODEL, model_title
from ..runs.store import RunStore
from ..specs import MethodSpec
from .console import err, print_outputs, user_errors
from .options import (
    NEEDLE_HELP,
    SAMPLES,
    BatchOpt,
    BosOpt,
    ChatTemplateOpt,
    DepthsOpt,
    Engine,
    FactorOpt,
    HaystackOpt,
    LengthsOpt,
    Load,
    MaxNewOpt,
    MethodOpt,
    ModelsOpt,
    OutOpt,
    OverwriteOpt,
    ProtocolOpt,
    SamplesOpt,
    ScoringOpt,
    SeedOpt,
    TemperatureOpt,
    TextFieldOpt,
    ThresholdOpt,
    parse_depths,
    parse_lengths,
    reworded,
    with_blocks,
)
from .run import QUICKSTART_SETTINGS, Measurement, method_specs, quickstart, run_models

if TYPE_CHECKING:
    from ..evals.common import Progress
    from ..evals.haystack import NeedlePreset
    from ..evals.needle import NeedleRunner

# torch, transformers, pandas and matplotlib load only when a command needs them (`ctxeval --help` starts in
# well under a second): the evaluation and report modules are imported inside the command functions.

PASSKEY_PROTOCOLS = ("yarn", "ctxeval")


@dataclass(frozen=True)
class HaystackOptions:
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
    load: Load
    engine: Engine = Engine()
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

    @classmethod
    def of(cls, options: Any) -> "HaystackOptions":
        """From needle's or passkey's options."""
        return cls(**{f.name: getattr(options, f.name) for f in fields(options)})


def check_yarn_options(opt: HaystackOptions) -> None:
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
    from ..evals.haystack import NeedlePreset

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


class Haystack(Measurement):
    """needle or passkey: prompts at every (length, depth, sample), replies scored; passkey --protocol yarn builds
    YaRN's eval/passkey.py prompts instead of a haystack's."""

    default_multiples = (0.25, 0.5, 1, 2)

    def __init__(self, task: str, opt: HaystackOptions) -> None:
        super().__init__(opt.out, opt.overwrite, opt.load, opt.engine)
        self.task, self.opt = task, opt

    def settle(self) -> None:
        """The quickstart settings under the flags (no --model), the protocol's defaults, the needle preset."""
        opt, task = self.opt, self.task
        if task == "passkey" and opt.protocol not in PASSKEY_PROTOCOLS:
            raise CtxevalError(f"--protocol must be {' or '.join(PASSKEY_PROTOCOLS)}, got '{opt.protocol}'")
        self.yarn = task == "passkey" and opt.protocol == "yarn"
        self.fixed_lengths = not self.yarn  # yarn's prompts stay under their lengths
        self.is_quickstart = opt.model is None
        if self.is_quickstart:  # the bundled model with its quickstart settings, each overridden by what the user gave
            qs = quickstart(task, opt.factor is not None and opt.method is None)
            opt = replace(
                opt,
                model=DEFAULT_MODEL,
                lengths=opt.lengths if opt.lengths is not None else qs.get("lengths"),
                samples=opt.samples if opt.samples is not None else qs.get("samples"),
                method=opt.method if opt.method is not None else list(qs.get("method", ["none"])),
            )
        self.opt = opt = replace(opt, method=opt.method if opt.method is not None else ["none"])
        if opt.samples is not None:
            SAMPLES(opt.samples)
        self.model = opt.model
        self.preset = load_needle_preset(opt.needle, opt.needle_text, opt.question, opt.answer_prefix, opt.answer)

    def method_specs(self) -> list[MethodSpec]:
        return method_specs(self.opt.method, self.opt.factor, self.opt.attention_temperature)

    def check(self) -> None:
        from ..evals.needle import NeedleConfig
        from ..evals.passkey import YARN_MAX_NEW_TOKENS, YARN_SAMPLES

        if self.opt.samples is None:  # the protocol's default (after the run directory's check: this imports torch)
            default_samples = YARN_SAMPLES if self.yarn else 10 if self.task == "passkey" else 1
            self.opt = replace(self.opt, samples=default_samples)
        opt, yarn = self.opt, self.yarn
        random_depth = self.task == "passkey"
        self.lengths = parse_lengths(opt.lengths) if opt.lengths is not None else None
        self.given = self.lengths is not None
        depth_list = tuple(parse_depths(opt.depths, opt.depth_spacing)) if not random_depth else ()
        max_new = (opt.max_new_tokens or YARN_MAX_NEW_TOKENS) if yarn else opt.max_new_tokens
        self.cfg = NeedleConfig(
            tuple(self.lengths or (1,)),
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
        self.bos = opt.bos if opt.bos is not None else not yarn

    def check_data(self) -> None:
        if not self.yarn and self.opt.haystack != "filler":  # a missing corpus fails now, not after the model loads
            corpora.check_data_spec(self.opt.haystack, "--haystack", self.opt.text_field)

    def check_engine(self) -> None:
        if self.engine.backend == "vllm" and self.opt.scoring == "forced":
            raise CtxevalError(
                "--scoring forced reads the model's logits in one forward; vLLM generates: use --scoring "
                "generate, or --backend hf"
            )

    def configure(self) -> None:
        self.cfg = replace(self.cfg, lengths=tuple(self.lengths))

    def prepare(self) -> None:
        need, what = self.yarn_builder() if self.yarn else self.haystack_builder()
        if not self.given and min(self.cfg.lengths) < need <= max(self.cfg.lengths):
            dropped = [L for L in self.cfg.lengths if L < need]
            err.print(
                f"note: default lengths {', '.join(map(str, dropped))} are shorter than the prompt ({need} tokens); "
                "left out"
            )
            self.cfg = replace(self.cfg, lengths=tuple(L for L in self.cfg.lengths if L >= need))
            self.lengths = list(self.cfg.lengths)
        if min(self.cfg.lengths) < need:
            raise CtxevalError(
                f"length {min(self.cfg.lengths)} is shorter than {what} "
                f"({need} tokens with this tokenizer); use --lengths of at least {need}"
            )
        self.runner = self.yarn_runner() if self.yarn else self.haystack_runner()

    def haystack_builder(self) -> tuple[int, str]:
        """The prompt builder over the haystack's tokens; returns the shortest length a prompt fits in."""
        from ..evals.haystack import PromptBuilder, haystack_tokens, make_sample
        from ..evals.needle import NeedleRunner

        opt, lm, cfg = self.opt, self.lm, self.cfg
        has_template = bool(getattr(lm.tokenizer, "chat_template", None))
        if opt.chat_template == "on" and not has_template:
            raise CtxevalError(
                f"--chat-template on, but the tokenizer of '{opt.model}' has no chat template; use auto or off"
            )
        self.use_template = has_template if opt.chat_template == "auto" else opt.chat_template == "on"
        self.hay_ids, self.hay_info = haystack_tokens(lm.tokenizer, opt.haystack, max(cfg.lengths), opt.text_field)
        self.builder = PromptBuilder(
            lm.tokenizer, self.preset, self.hay_ids, chat_template=self.use_template, bos=self.bos, snap=opt.snap
        )
        probe = make_sample(self.preset, np.random.default_rng(opt.seed))
        runner = NeedleRunner(lm.model, lm.tokenizer, lm.device, self.builder, cfg, lm.name, self.task)
        return self.builder.minimum_length(probe, runner.budget(probe)), "the instruction, needle and question"

    def haystack_runner(self) -> NeedleRunner:
        from ..evals.needle import NeedleRunner

        lm, cfg = self.lm, self.cfg
        if len(self.hay_ids) < max(cfg.lengths):
            raise CtxevalError(
                f"the haystack '{self.opt.haystack}' has {len(self.hay_ids):,} tokens, fewer than --lengths "
                f"{max(cfg.lengths)}; use a longer corpus or shorter lengths"
            )
        return NeedleRunner(lm.model, lm.tokenizer, lm.device, self.builder, cfg, lm.name, self.task)

    def yarn_builder(self) -> tuple[int, str]:
        """passkey --protocol yarn: YaRN's prompt builder (its filler, no chat template)."""
        from ..evals.passkey import YarnPasskeyBuilder

        self.builder = YarnPasskeyBuilder(self.lm.tokenizer, self.preset, seed=self.opt.seed, bos=self.bos)
        self.use_template = False
        return self.builder.minimum_length(), "the passkey prompt without filler"

    def yarn_runner(self) -> NeedleRunner:
        """YaRN's runner, after the repo's length search for every length (before the run)."""
        from ..evals.haystack import FILLER
        from ..evals.passkey import YarnPasskeyRunner

        lm, cfg = self.lm, self.cfg
        self.garbage = {L: self.builder.garbage_chars(L) for L in cfg.lengths}
        self.hay_info = {"haystack": "filler", "text": FILLER}
        return YarnPasskeyRunner(lm.model, lm.tokenizer, lm.device, self.builder, cfg, lm.name, self.task)

    def longest(self) -> int:
        """Under ctxeval's layout a prompt and its reply's budget fill the length together; under yarn the prompt
        stays under the length and the generated tokens come after it."""
        return max(self.cfg.lengths) + (self.cfg.max_new_tokens + 1 if self.yarn else 0)

    def records(self, backend_spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        from ..evals.passkey import YARN_LENGTH_STEP

        opt, cfg, yarn, task = self.opt, self.cfg, self.yarn, self.task
        self.backend_spec = backend_spec
        spec_record = {
            "task": task,
            "model": opt.model,
            "preset": self.preset.__dict__,
            "haystack": opt.haystack,
            "text_field": opt.text_field,
            "lengths": list(cfg.lengths),
            "depths": list(cfg.depths),
            "random_depth": cfg.random_depth,
            "samples": opt.samples,
            "scoring": opt.scoring,
            "max_new_tokens": cfg.max_new_tokens if yarn else opt.max_new_tokens,
            "snap": opt.snap,
            "chat_template": self.use_template,
            "methods": [s.label for s in self.specs],
            "dtype": self.lm.dtype,
            "seed": opt.seed,
            **({"protocol": opt.protocol, "bos": self.bos} if task == "passkey" else {}),
            **({"length_step": YARN_LENGTH_STEP} if yarn else {}),
            **({"settings": QUICKSTART_SETTINGS} if self.is_quickstart else {}),
            **backend_spec,
        }
        provenance = {
            "model": self.lm.record(),
            "haystack": self.hay_info,
            "seed": opt.seed,
            "scoring": {
                "name": opt.scoring,
                "rule": "yarn: int(first \\d+) == key" if yarn else self.preset.match,
                "llm_judge": False,
            },
        }
        if yarn:
            provenance["protocol"] = self.yarn_protocol()
        return spec_record, provenance

    def yarn_protocol(self) -> dict[str, Any]:
        """provenance.json's protocol under --protocol yarn: where it comes from, BOS, the length search's results."""
        from ..evals.passkey import YARN_LENGTH_STEP

        builder = self.builder
        return {
            "name": "yarn",
            "source": "jquesnelle/yarn eval/passkey.py (from epfml/landmark-attention llama/run_test.py)",
            "length_step": YARN_LENGTH_STEP,
            "bos": bool(builder.bos),
            "bos_token": self.lm.tokenizer.bos_token if builder.bos else None,
            "garbage_chars": {str(L): n for L, n in self.garbage.items()},
            "search_tokens": {str(L): builder.search_tokens(n) for L, n in self.garbage.items()},
        }

    def message(self, run_dir: Path) -> str:
        cells = len(self.cfg.cells())
        if self.yarn:
            return (
                f"run directory: {run_dir}  ({cells} samples per method; protocol yarn: YaRN's "
                f"eval/passkey.py prompts, BOS {'on' if self.builder.bos else 'off'}, at most "
                f"{self.cfg.max_new_tokens} new tokens)"
            )
        return (
            f"run directory: {run_dir}  ({cells} samples per method; chat template "
            f"{'on' if self.use_template else 'off'}; scoring {self.opt.scoring})"
        )

    def work(self, store: RunStore, progress: Progress) -> None:
        from ..evals.needle import sweep

        self.runner.progress = progress
        sweep(self.lm, self.specs, self.runner, store)

    def render(self, store: RunStore) -> None:
        from ..report.kinds.needle import render_retrieval

        opt = self.opt
        title = (
            f"{model_title(opt.model)}: {self.preset.name} in {opt.haystack}"
            + (" (protocol yarn)" if self.yarn else "")
            + (" on vLLM" if self.backend_spec else "")
        )
        print_outputs(render_retrieval(store, self.task, self.specs, self.lm.trained_length, opt.threshold, title))


@dataclass(frozen=True)
class NeedleOptions:
    model: ModelsOpt = None
    lengths: LengthsOpt = None
    depths: DepthsOpt = "0:100:5"
    depth_spacing: Annotated[
        str, typer.Option(help="linear | sigmoid (packed towards the ends, as the original test).")
    ] = "linear"
    samples: SamplesOpt = None
    needle: Annotated[str, typer.Option(help=NEEDLE_HELP)] = "magic-number"
    needle_text: Annotated[Optional[str], typer.Option(help="Override the needle sentence ({key}, {value}).")] = None
    question: Annotated[Optional[str], typer.Option(help="Override the question ({keys}).")] = None
    answer_prefix: Annotated[Optional[str], typer.Option(help="Override the answer prefix.")] = None
    answer: Annotated[Optional[str], typer.Option(help="A fixed expected answer (with --needle-text).")] = None
    haystack: HaystackOpt = "pydoc"
    text_field: TextFieldOpt = "text"
    snap: Annotated[bool, typer.Option(help="Move each needle back to the previous sentence end.")] = False
    chat_template: ChatTemplateOpt = "auto"
    scoring: ScoringOpt = "generate"
    max_new_tokens: MaxNewOpt = None
    batch_size: BatchOpt = 4
    threshold: ThresholdOpt = 0.8
    method: MethodOpt = None
    factor: FactorOpt = None
    attention_temperature: TemperatureOpt = None
    seed: SeedOpt = 0
    out: OutOpt = None
    overwrite: OverwriteOpt = False
    load: Load = Load()
    engine: Engine = Engine()


@dataclass(frozen=True)
class PasskeyOptions:
    model: ModelsOpt = None
    lengths: LengthsOpt = None
    samples: reworded(
        SamplesOpt,
        "Samples per length, each at a seeded uniform random depth "
        "(default 20 under yarn, the repo's --iterations; 10 under ctxeval).",
    ) = None
    protocol: reworded(
        ProtocolOpt,
        "yarn: YaRN's eval/passkey.py point by point (its text, length search, "
        "no BOS, 10 new tokens, scoring) | ctxeval: exact lengths in token "
        "space.",
        str,
    ) = "yarn"
    bos: reworded(
        BosOpt,
        "Start the prompt with the tokenizer's BOS (default off under yarn, on under ctxeval).",
        Optional[bool],
    ) = None
    haystack: reworded(HaystackOpt, "filler (the original test's) or any --data spec (--protocol ctxeval).") = "filler"
    text_field: TextFieldOpt = "text"
    chat_template: reworded(ChatTemplateOpt, "auto | on | off (on and auto: --protocol ctxeval)") = "off"
    scoring: ScoringOpt = "generate"
    max_new_tokens: reworded(
        MaxNewOpt, "Generation budget (default: 10 under yarn; the answer tokens + 8 under ctxeval)."
    ) = None
    batch_size: BatchOpt = 4
    threshold: reworded(ThresholdOpt, "Accuracy that counts for the passkey context and the effective length.") = 0.8
    method: MethodOpt = None
    factor: FactorOpt = None
    attention_temperature: TemperatureOpt = None
    seed: SeedOpt = 0
    out: OutOpt = None
    overwrite: OverwriteOpt = False
    load: Load = Load()
    engine: Engine = Engine()


@user_errors
@with_blocks
def needle_cmd(opt: NeedleOptions) -> None:
    """Needle in a haystack: accuracy over a depth x length grid per method, heatmaps, effective length."""
    run_models("needle", opt, lambda one: Haystack("needle", HaystackOptions.of(one)))


@user_errors
@with_blocks
def passkey_cmd(opt: PasskeyOptions) -> None:
    """Passkey retrieval: accuracy per length (--protocol yarn: YaRN's eval/passkey.py test), the YaRN paper's passkey
    context (the longest length with accuracy >= --threshold) and passkey accuracy (the mean up to it), and the
    effective length (every length up to it passes)."""
    run_models("passkey", opt, lambda one: Haystack("passkey", HaystackOptions.of(one)))
