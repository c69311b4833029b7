"""`ctxeval ruler`: RULER's synthetic tasks, prompts as RULER generates them, scored as RULER scores them."""

from __future__ import annotations

import glob
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ..data import corpora
from ..errors import CtxevalError
from ..models.load import DEFAULT_MODEL, model_title
from ..runs.rows import RULER_THRESHOLD
from ..runs.store import RunStore
from ..specs import MethodSpec
from ..util.paths import cache_dir, shown_path
from ..util.textfiles import MAX_TEXT_BYTES, read_bytes, read_json, read_text
from .console import err, print_outputs, user_errors
from .options import (
    BatchOpt,
    Check,
    DepthsOpt,
    Engine,
    FactorOpt,
    LengthsOpt,
    Load,
    MethodOpt,
    OutOpt,
    OverwriteOpt,
    PlainModelOpt,
    SamplesOpt,
    SeedOpt,
    TasksOpt,
    TemperatureOpt,
    ThresholdOpt,
    parse_depths,
    parse_lengths,
    reworded,
    with_blocks,
)
from .run import Measurement, method_specs

if TYPE_CHECKING:
    from ..evals.common import Progress

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
SUITE = (  # evals.retrieval.suite's, named here so that --help does not import it
    "litm:kv",
    "helmet:json_kv",
    "infbench:kv_retrieval",
    "infbench:passkey",
    "infbench:number_string",
    "infbench:math_find",
    "facts:qa1",
    "facts:qa2",
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


@dataclass(frozen=True)
class RulerOptions:
    model: PlainModelOpt = None
    tasks: reworded(
        TasksOpt,
        "Comma-separated RULER tasks (default: all 13 once the QA files "
        "are there, else the 11 that run offline: "
        + ", ".join(OFFLINE)
        + ") and retrieval tasks: "
        + ", ".join(SUITE)
        + ".",
        Optional[str],
    ) = None
    lengths: reworded(
        LengthsOpt, "Context lengths in tokens: 4k,8k | 4k:32k:x2 (default: 1x, 2x, 4x the model's original length)."
    ) = None
    samples: reworded(SamplesOpt, "Samples per task and length (RULER uses 500).", int) = 10
    essays: Annotated[
        Optional[Path], typer.Option(help="RULER's PaulGrahamEssays.json or .txt essays for the essay haystack.")
    ] = None
    essay_substitute: Annotated[
        str,
        typer.Option(
            help="Corpus used as the essay haystack without --essays (any --data spec; named in every table)."
        ),
    ] = "pydoc"
    qa_data: Annotated[
        Optional[Path],
        typer.Option(
            help="Folder with RULER's QA files: squad.json (SQuAD 2.0 dev) and "
            "hotpotqa.json (HotpotQA dev, distractor). Without it qa_1/qa_2 "
            "download them from RULER's URLs into the cache."
        ),
    ] = None
    samples_from: Annotated[
        Optional[Path],
        typer.Option(
            help="Run the prompts of RULER-generated files DIR/<length>/<task>/validation.jsonl instead; for "
            "litm:kv, helmet:json_kv and infbench:* the originals' released files in DIR: LITM's one "
            "kv-retrieval-*_keys.jsonl.gz, HELMET's test_k<N>_dep6.jsonl, InfiniteBench's <task>.jsonl."
        ),
    ] = None
    template: Annotated[
        str,
        typer.Option(
            help="How prompts are wrapped: auto (chat when the tokenizer has a chat template, else base), base "
            "(bare), chat (the tokenizer's chat template) or RULER's template.py: meta-chat, vicuna-chat, "
            "lwm-chat, command-r-chat, chatglm-chat, RWKV, Phi3, meta-llama3, jamba, nemotron5-instruct. "
            "RULER's tasks, litm:kv and facts:* take it; helmet:json_kv and infbench:* stay bare, as their "
            "originals run instruct models."
        ),
    ] = "auto"
    cwe_words: Annotated[
        Optional[Path],
        typer.Option(
            help="cwe's word list past wonderwords' 8,169 words (lengths "
            "over ~64k): RULER's english_words.json or a word-per-line file "
            "(default /usr/share/dict/american-english, Debian wamerican)."
        ),
    ] = None
    depths: reworded(
        DepthsOpt,
        "Answer depths in percent for the retrieval tasks that have one (litm:kv, helmet:json_kv, "
        "infbench:kv_retrieval, infbench:passkey, infbench:number_string): 0,50,100 | 0:100:5; --samples "
        "prompts at each.",
    ) = "0,25,50,75,100"
    kv_pairs: Annotated[
        Optional[int],
        typer.Option(
            help="Key-value pairs in every litm:kv, helmet:json_kv and infbench:kv_retrieval prompt (default: "
            "as many as fill each length; helmet:json_kv at 4k-128k: HELMET's 50-1,800). Refused where they "
            "cannot fit."
        ),
    ] = None
    threshold: reworded(
        ThresholdOpt,
        "Mean score a length must exceed for the effective length.",
        check=Check("--threshold", above=0, maximum=100),
    ) = RULER_THRESHOLD
    seed: reworded(SeedOpt, "RULER's random seed (its default 42).") = 42
    batch_size: reworded(
        BatchOpt,
        "Prompts per generate call (left-padded; 1 = one at a time; --backend "
        "vllm submits every prompt of a task and length at once).",
    ) = 1
    method: MethodOpt = None
    factor: FactorOpt = None
    attention_temperature: TemperatureOpt = None
    out: OutOpt = None
    overwrite: OverwriteOpt = False
    load: Load = Load()
    engine: Engine = Engine()


class Ruler(Measurement):
    task = "ruler"
    default_multiples = (1, 2, 4)

    def __init__(self, opt: RulerOptions) -> None:
        super().__init__(opt.out, opt.overwrite, opt.load, opt.engine)
        self.opt = opt
        self.template: str | None = None  # --template resolved with the tokenizer (loaded())
        self.formats: dict[str, str] = {}  # per task: the template its prompts get (records())

    def settle(self) -> None:
        """The tasks: --tasks, or the 11 offline ones and the QA pair once its files are in the cache."""
        from ..evals.ruler.qa import QA_URLS

        opt = self.opt
        self.model = opt.model or DEFAULT_MODEL
        self.qa_cache = cache_dir() / "ruler-qa"
        qa_ready = opt.qa_data is not None or all((self.qa_cache / name).is_file() for name in QA_URLS)
        self.chosen = (
            tuple(t.strip() for t in opt.tasks.split(",") if t.strip())
            if opt.tasks
            else (OFFLINE + (("qa_1", "qa_2") if qa_ready else ()))
        )
        self.left_out = (
            []
            if opt.tasks or qa_ready
            else [
                f"qa_1, qa_2 left out: RULER's SQuAD / HotpotQA files are not in {shown_path(self.qa_cache)} (--tasks "
                "qa_1,qa_2 downloads them from RULER's URLs; --qa-data DIR reads them from a folder)"
            ]
        )

    def method_specs(self) -> list[MethodSpec]:
        return method_specs(self.opt.method, self.opt.factor, self.opt.attention_temperature)

    def check(self) -> None:
        opt = self.opt
        self.lengths = parse_lengths(opt.lengths) if opt.lengths is not None else None
        self.depths = tuple(parse_depths(opt.depths, "linear"))
        if opt.kv_pairs is not None and opt.kv_pairs < 1:
            raise CtxevalError(f"--kv-pairs must be at least 1, got {opt.kv_pairs}")
        # checks tasks, template, depths and --kv-pairs before the model loads
        self.cfg = self.config(tuple(self.lengths or (1,)))

    def config(self, lengths: tuple[int, ...]) -> Any:
        from ..evals.ruler.run import RulerConfig

        opt = self.opt
        template = self.template or opt.template  # resolved once the tokenizer is loaded
        return RulerConfig(self.chosen, lengths, opt.samples, opt.seed, template, self.depths, opt.kv_pairs)

    def check_data(self) -> None:
        """The word list, the prompts' folder, the QA files and the essays, read before the model loads: a missing
        file or corpus fails in a second, not after the load."""
        from ..evals.retrieval.suite import SUITE_TASKS
        from ..evals.ruler.qa import qa_folder
        from ..evals.ruler.sources import Sources, english_words
        from ..evals.ruler.tasks import TASKS

        opt, cfg = self.opt, self.cfg
        ruler_tasks = [t for t in cfg.tasks if t in TASKS]
        suite_tasks = [t for t in cfg.tasks if t in SUITE_TASKS]
        word_list = english_words(opt.cwe_words) if "cwe" in self.chosen and opt.samples_from is None else None
        if opt.samples_from is not None and not Path(opt.samples_from).is_dir():
            raise CtxevalError(
                f"--samples-from {opt.samples_from}: not a directory of RULER's <length>/<task>/validation.jsonl"
            )
        qa_tasks = [t for t in ruler_tasks if TASKS[t].family == "qa"]
        self.qa_dir = qa_folder(qa_tasks, opt.qa_data, self.qa_cache) if qa_tasks and opt.samples_from is None else None
        self.sources = Sources(qa_dir=self.qa_dir)
        if word_list is not None:
            self.sources.extra_words, self.sources.extra_words_source = word_list
        self.essay_digest = None
        essay_haystack = any(TASKS[t].args.get("type_haystack") == "essay" for t in ruler_tasks)
        if opt.samples_from is None and (essay_haystack or any(SUITE_TASKS[t].needs_background for t in suite_tasks)):
            text, self.sources.essay_source = essay_text(opt.essays, opt.essay_substitute)
            self.sources.essay_words = re.sub(r"\s+", " ", text).split(" ")
            self.essay_digest = hashlib.sha256(text.encode()).hexdigest()[:16]

    def loaded(self) -> None:
        from ..evals.prompts.wrapping import resolve_template

        self.template = resolve_template(self.opt.template, self.lm.tokenizer)  # auto: by the model's kind
        if self.model == "tiny":
            err.print(
                "note: tiny (the bundled 2-layer model, trained at 128 tokens on CPython's docs) cannot answer "
                "RULER's tasks: expect 0.0 everywhere; this run checks the pipeline. For numbers use --model smollm2 "
                "or your model",
                markup=False,
            )

    def prompts(self) -> Any:
        from ..evals.ruler.fit import Prompts

        opt = self.opt
        return Prompts(self.lm.tokenizer, self.sources, opt.samples, opt.seed, self.template, self.depths, opt.kv_pairs)

    def default_lengths(self) -> list[int]:
        """Multiples of the trained length that every task's prompts fit (from RULER's files: all of them); none
        fitting, the smallest power of two that fits."""
        from ..evals.ruler.fit import fitting_length

        lengths = super().default_lengths()
        if self.opt.samples_from is not None:
            return lengths
        prompts = self.prompts()
        fitting = [length for length in lengths if all(prompts.fits(task, length) for task in self.chosen)]
        if fitting != lengths:
            fitting = fitting or [fitting_length(self.chosen, prompts)]
            err.print(
                f"note: default lengths {', '.join(f'{n:,}' for n in fitting)} (not "
                f"{', '.join(f'{n:,}' for n in lengths)}, multiples of the trained length): RULER's smallest prompts "
                "need more tokens with this tokenizer",
                markup=False,
            )
        return fitting

    def configure(self) -> None:
        from ..evals.retrieval.suite import SUITE_TASKS, fixed_size
        from ..evals.ruler.fit import check_lengths

        opt = self.opt
        self.cfg = self.config(tuple(self.lengths))
        if opt.samples_from is None:  # before the run directory exists
            prompts = self.prompts()
            check_lengths(self.chosen, self.lengths, prompts)
            for task in (t for t in self.chosen if t in SUITE_TASKS):  # a fixed key count too long for a length
                for length in self.lengths:
                    if fixed_size(SUITE_TASKS[task], length, opt.kv_pairs) is not None:
                        prompts.generate(task, length)

    def records(self, backend_spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        from ..evals.prompts.wrapping import has_chat_template
        from ..evals.ruler.qa import QA
        from ..evals.ruler.run import prompt_formats

        opt, cfg, sources, qa_dir = self.opt, self.cfg, self.sources, self.qa_dir
        self.formats = prompt_formats(cfg.tasks, self.template, opt.samples_from is not None)
        self.backend_spec = backend_spec
        spec_record = {
            "task": "ruler",
            "model": self.model,
            "tasks": list(cfg.tasks),
            "lengths": list(cfg.lengths),
            "samples": cfg.samples,
            "seed": cfg.seed,
            "essays": sources.essay_source or None,
            "essay_sha256": self.essay_digest,
            "samples_from": str(opt.samples_from) if opt.samples_from else None,
            "template": self.template,  # resolved: what the prompts were wrapped in
            **self.suite_record(),
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
            **({"cwe_words": sources.extra_words_source} if opt.cwe_words else {}),
            "methods": [s.label for s in self.specs],
            "dtype": self.lm.dtype,
            **backend_spec,
        }
        provenance = {
            "model": self.lm.record(),
            "protocol": {
                "name": "RULER (NVIDIA/RULER scripts/synthetic.yaml)",
                "template": self.template,
                "template_option": opt.template,
                "chat_template_in_tokenizer": has_chat_template(self.lm.tokenizer),
                "prompt_format": self.formats,  # per task: the template its prompts got, or base (bare)
                "decoding": "greedy",
                "scoring": "string_match_all",
                "threshold": opt.threshold,
                "word_lists": "wonderwords 2.2.0"
                + (f"; cwe past it: {sources.extra_words_source}" if sources.extra_words_source else ""),
                "essays": sources.essay_source or None,
            },
        }
        return spec_record, provenance

    def suite_record(self) -> dict[str, Any]:
        """The retrieval tasks' settings, where a task uses them."""
        from ..evals.retrieval.suite import SUITE_TASKS

        suite = [SUITE_TASKS[t] for t in self.cfg.tasks if t in SUITE_TASKS]
        return {
            **({"depths": list(self.cfg.depths)} if any(t.has_depth for t in suite) else {}),
            **({"kv_pairs": self.cfg.kv_pairs} if any(t.is_kv for t in suite) else {}),
        }

    def before_measure(self, run_dir: Path) -> None:
        opt = self.opt
        self.notes = (
            self.left_out
            + ([f"essay haystack: {self.sources.essay_source}"] if self.sources.essay_source else [])
            + self.template_notes()
            + ([f"prompts read from {opt.samples_from}"] if opt.samples_from else [])
        )
        for note in self.notes:
            err.print(f"note: {note}")

    def template_notes(self) -> list[str]:
        """The model template, where prompts are wrapped, and the tasks it leaves bare."""
        if self.template == "base" or not any(f not in ("base", "file") for f in self.formats.values()):
            return []
        bare = [task for task, f in self.formats.items() if f == "base"]
        return [
            f"model template: {self.template}"
            + (f" ({', '.join(bare)}: bare, as their originals run instruct models)" if bare else "")
        ]

    def message(self, run_dir: Path) -> str:
        cfg = self.cfg
        return (
            f"run directory: {run_dir}  ({len(cfg.tasks)} task(s) x {len(cfg.lengths)} length(s) x {cfg.samples} "
            "sample(s) per method)"
        )

    def work(self, store: RunStore, progress: Progress) -> None:
        from ..evals.ruler.run import RulerRunner, prepare, sweep

        lm = self.lm
        runner = RulerRunner(lm.model, lm.tokenizer, lm.device, lm.name, self.opt.batch_size, formats=self.formats)
        runner.progress = progress
        prompts = prepare(self.cfg, lm.tokenizer, self.sources, store.dir, self.opt.samples_from, progress.note)
        sweep(lm, self.specs, prompts, self.cfg, runner, store)

    def render(self, store: RunStore) -> None:
        from ..report.kinds.ruler import render_ruler

        opt, cfg = self.opt, self.cfg
        from ..report.tables import suite_name

        title = f"{model_title(self.model)}: {suite_name(list(cfg.tasks))}" + (" on vLLM" if self.backend_spec else "")
        print_outputs(
            render_ruler(
                store,
                self.specs,
                list(cfg.tasks),
                self.lm.trained_length,
                opt.threshold,
                cfg.samples,
                title,
                self.notes,
            )
        )


@user_errors
@with_blocks
def ruler_cmd(opt: RulerOptions) -> None:
    """RULER's synthetic tasks (NIAH x8, variable tracking, common/frequent words): mean score per length, effective length."""
    Ruler(opt).run()
