"""`ctxeval tune`: search a method's parameters for the lowest perplexity at a target length (optuna, resumable),
re-measure the winner on held-out documents against the other methods, and export it as a rope_parameters entry."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ..data import corpora
from ..errors import CtxevalError
from ..runs.store import RunStore
from ..specs import MethodSpec, expand_specs
from .console import err, print_outputs, user_errors
from .options import (
    Check,
    ChunkOpt,
    DataOpt,
    Load,
    MethodOpt,
    ModelOpt,
    Omit,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    TextFieldOpt,
    parse_lengths,
    reworded,
    with_blocks,
)
from .run import Measurement

if TYPE_CHECKING:
    from ..evals.common import Progress

QUICKSTART_TUNE = {"model": "tiny", "method": ["yarn"], "target_length": "1k", "data": "pydoc", "trials": 60}


@dataclass(frozen=True)
class TuneOptions:
    model: ModelOpt = None
    method: reworded(
        MethodOpt,
        "The method to tune: NAME or "
        "NAME:key=value (given parameters stay fixed), e.g. yarn, "
        "longrope, ntk, llama3, yarn+self-extend (default yarn). "
        "Repeat it to ask which method: -m yarn -m ntk -m longrope "
        "splits --trials between them and ranks their winners.",
        Optional[list[str]],
    ) = None
    target_length: Annotated[
        Optional[str],
        typer.Option(help="The length to extend to, e.g. 32k (default: 1k for the quickstart, else required)."),
    ] = None
    data: DataOpt = None
    text_field: TextFieldOpt = "text"
    tune_docs: Annotated[
        int,
        typer.Option(help="Documents the search measures (the first in corpus order)."),
        Check("--tune-docs", minimum=1),
    ] = 2
    heldout_docs: Annotated[
        int,
        typer.Option(help="Documents after those, for re-measuring the winner."),
        Check("--heldout-docs", minimum=1),
    ] = 2
    trials: Annotated[
        Optional[int],
        typer.Option(
            help="Measured trials the study should hold (all processes "
            "together; points the method's checks refuse do not count; "
            "a rerun with more continues). Default 100 (60 "
            "in the quickstart)."
        ),
        Check("--trials", minimum=1),
    ] = None
    sampler: Annotated[
        str, typer.Option(help="auto (nsga2 for longrope, gp otherwise) | gp | tpe | cmaes | nsga2 | random.")
    ] = "auto"
    population: Annotated[int, typer.Option(help="nsga2's population size."), Check("--population", minimum=2)] = 32
    objective: Annotated[
        str,
        typer.Option(
            help="ppl (the tuning documents' perplexity at the target) | needle (the answer perplexity of 5 pass "
            "keys hidden in each document: retrieval) | both (their geometric mean; one forward per document)."
        ),
    ] = "ppl"
    short_tolerance: Annotated[
        float,
        typer.Option(help="Guard: allowed rise of the perplexity at the trained length over plain RoPE's (0.05 = 5%)."),
        Check("--short-tolerance", minimum=0.0),
    ] = 0.05
    search_factor: Annotated[
        bool,
        typer.Option(
            "--search-factor", help="Search the factor too (from s/2 to 2s); default: fixed at target / trained length."
        ),
    ] = False
    space: Annotated[
        Optional[list[str]],
        typer.Option(
            "--space",
            help="Override a searched range: NAME=LOW:HIGH[:log], e.g. beta_fast=1:64:log; repeatable. "
            "longrope: short_factor=1:1.5 also searches its short factors (default 1).",
        ),
    ] = None
    compare: Annotated[
        Optional[list[str]],
        typer.Option(
            "--compare",
            help="Also re-measure this method on the "
            "held-out documents (e.g. a hand-tuned "
            "yarn:factor=8,beta_fast=4,beta_slow=0.25); "
            "repeatable.",
        ),
    ] = None
    time_budget: Annotated[
        Optional[float],
        typer.Option(
            metavar="MINUTES",
            help="Wall time for the search (all methods together, an equal share each): no trial starts that would "
            "end after it, by the median of this run's trials (a method's first trial always runs); then the "
            "held-out re-measure runs. Default: none.",
        ),
        Check("--time-budget", minimum=0.0),
    ] = None
    passkey: Annotated[
        int,
        typer.Option(
            help="Check by generation: N passkey prompts (YaRN's eval/passkey.py) at the target length for the "
            "winner, plain RoPE, YaRN at the same factor and --compare, after the held-out perplexity (0: none)."
        ),
        Check("--passkey", minimum=0),
    ] = 0
    export: Annotated[
        Optional[Path],
        typer.Option(
            help="Write the winner as a model directory (config.json with "
            "its rope_parameters, weights linked) and verify it by "
            "loading it fresh."
        ),
    ] = None
    storage: Annotated[
        Optional[str],
        typer.Option(
            help="optuna storage URL shared by several processes or machines (default sqlite:///RUN_DIR/study.db)."
        ),
    ] = None
    out: reworded(OutOpt, "Run directory (default runs/tune-<model>-<key>: the same command again resumes it).") = None
    overwrite: OverwriteOpt = False
    seed: reworded(SeedOpt, "The sampler's seed (an uninterrupted search is reproducible from it).") = 0
    chunk_size: reworded(ChunkOpt, "Positions per LM-head chunk.") = 1024
    load: Annotated[Load, Omit("device_map", "max_memory")] = Load()


class Tune(Measurement):
    """The tuned method stays as asked; the recipe's specs are the --compare methods (their factors settled at the
    target length)."""

    task = "tune"
    twins_once = False  # the search measures its own points; every --compare method is measured as asked
    notes_noops = False

    def __init__(self, opt: TuneOptions) -> None:
        super().__init__(opt.out, opt.overwrite, opt.load)
        self.opt = opt

    def settle(self) -> None:
        opt = self.opt
        if os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1"):
            raise CtxevalError(
                "ctxeval tune does not run under torchrun: start one `ctxeval tune` per GPU "
                "(CUDA_VISIBLE_DEVICES=i, its own --out) with one shared --storage; they share the study"
            )
        quick = opt.model is None and opt.method is None and opt.target_length is None
        given = {"model": opt.model, "method": opt.method, "target_length": opt.target_length, "data": opt.data}
        self.settings = {
            **(QUICKSTART_TUNE if quick else {"model": "tiny", "method": ["yarn"], "data": "pydoc", "trials": 100}),
            **{k: v for k, v in {**given, "trials": opt.trials}.items() if v is not None},
        }
        if self.settings.get("target_length") is None:
            raise CtxevalError(
                "give --target-length (e.g. --target-length 32k): the length the search extends the model to"
            )
        target = parse_lengths(str(self.settings["target_length"]))
        if len(target) != 1:
            raise CtxevalError(f"--target-length takes one length, got {self.settings['target_length']}")
        self.target, self.model, self.data = target[0], str(self.settings["model"]), str(self.settings["data"])

    def method_specs(self) -> list[MethodSpec]:
        self.tuned = [spec for m in self.settings["method"] for spec in expand_specs([str(m)])]
        labels = [t.label for t in self.tuned]
        if len(set(labels)) < len(labels):
            raise CtxevalError(f"-m names a method twice ({', '.join(labels)}): give each method to tune once")
        if int(self.settings["trials"]) < len(self.tuned):
            raise CtxevalError(
                f"--trials {self.settings['trials']} cannot be split between {len(self.tuned)} methods: give at "
                f"least {len(self.tuned)} (one per method; a few dozen each answers)"
            )
        return expand_specs(list(self.opt.compare or []))

    def check(self) -> None:
        from ..evals.tune.needles import OBJECTIVES
        from ..evals.tune.search import require_optuna
        from ..evals.tune.space import parse_overrides

        if self.opt.objective not in OBJECTIVES:
            raise CtxevalError(f"--objective must be one of {', '.join(OBJECTIVES)}, got '{self.opt.objective}'")
        self.overrides = parse_overrides(list(self.opt.space or []))
        if len(self.tuned) > 1 and self.overrides:
            raise CtxevalError("--space applies to one method: tune one -m with it, or leave it out")
        require_optuna()
        self.lengths = [self.target]

    def check_data(self) -> None:
        corpora.check_data_spec(self.data, "--data", self.opt.text_field)

    def specs_to_load(self) -> list[MethodSpec]:
        return self.tuned + self.specs

    def loaded(self) -> None:
        """The search space and the search's settings, from the model's RoPE."""
        from ..evals.tune.search import TuneConfig
        from ..evals.tune.space import build_space

        opt, geometry = self.opt, self.lm.rope.geometry
        if geometry is None:
            raise CtxevalError(f"model '{self.model}' has no RoPE: there is nothing to tune")
        self.spaces = [  # LongRoPE's start tokens are not searched for --export: no config holds them
            build_space(t, geometry, self.target, opt.search_factor, self.overrides, opt.export is None)
            for t in self.tuned
        ]
        self.space = self.spaces[0]
        shorts = {int(t.params.get("original_max_position_embeddings") or geometry.original_length) for t in self.tuned}
        if len(shorts) > 1:
            raise CtxevalError("the methods to tune give different original_max_position_embeddings: give one")
        self.short = shorts.pop()
        total, n = int(self.settings["trials"]), len(self.tuned)
        self.cfgs = [
            TuneConfig(
                self.target,
                self.short,
                total // n + (i < total % n),  # one budget split between the methods
                opt.short_tolerance,
                opt.sampler,
                opt.seed,
                opt.population,
                bos=getattr(self.lm.tokenizer, "bos_token_id", None) is not None,
                chunk_size=opt.chunk_size,
                objective=opt.objective,
            )
            for i in range(n)
        ]
        self.cfg = self.cfgs[0]

    def prepare(self) -> None:
        from ..evals.tune.job import long_documents
        from ..evals.tune.search import split_documents

        opt = self.opt
        needed = self.target - 1 if self.cfg.bos else self.target
        documents = long_documents(
            self.data, self.lm.tokenizer, opt.tune_docs + opt.heldout_docs, needed, opt.text_field
        )
        self.tuning, self.heldout = split_documents(documents, opt.tune_docs, opt.heldout_docs)
        if opt.objective != "ppl":  # documents too short for the pass keys are refused before the run directory
            from ..evals.tune.needles import needle_docs

            bos = getattr(self.lm.tokenizer, "bos_token_id", None) if self.cfg.bos else None
            needle_docs(self.tuning, self.lm.tokenizer, self.target, bos, opt.seed)
        if opt.passkey:
            from ..evals.tune.generation import check_passkey_length

            check_passkey_length(self.lm, self.target, opt.seed)

    def protocol_of(self, tuned: MethodSpec, space: Any) -> dict[str, Any]:
        """What one method's study must have been made for (a study made for another is refused)."""
        from ..evals.tune.space import describe

        return {
            "model": self.model,
            "method": tuned.label,
            "space": describe(space),
            "target": self.target,
            "short": self.short,
            "short_tolerance": self.opt.short_tolerance,
            "data": self.data,
            "tuning_docs": [d.doc_id for d in self.tuning],
            "bos": self.cfg.bos,
            "dtype": self.lm.dtype,
            "objective": f"log {self.opt.objective}",  # the value the study holds (studies before it held ppl)
        }

    def family_record(self, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """run.json's spec and provenance of method i's search."""
        opt, cfg, docs = self.opt, self.cfgs[i], self.tuning + self.heldout
        protocol = self.protocols[i]
        spec_record = {
            "task": "tune",
            **protocol,
            "heldout_docs": [d.doc_id for d in self.heldout],
            "sampler": opt.sampler,
            "seed": opt.seed,
            "population": opt.population,
            "methods": [protocol["method"]],
            "compare": [c.label for c in self.specs],
        }
        provenance = {
            "model": self.lm.record(),
            "data": {
                "spec": self.data,
                "documents": [
                    {
                        "doc": d.doc_id,
                        "tokens": int(len(d.ids)),
                        "role": "tuning" if j < len(self.tuning) else "heldout",
                    }
                    for j, d in enumerate(docs)
                ],
            },
            "protocol": {
                "name": "truncate",
                "bos": cfg.bos,
                "aggregate": "token",
                "chunk_size": opt.chunk_size,
                "objective": f"{self.opt.objective} at {self.target:,} on the tuning documents",
                "guard": f"perplexity at {self.short:,} at most {opt.short_tolerance:.0%} above plain RoPE's",
            },
            "search": {
                "space": protocol["space"],
                "dims": len(self.spaces[i].dims),
                "trials": cfg.trials,  # the study's (a share of --trials across methods; a rerun may raise it)
                "storage": opt.storage or "study.db",
                "sampler": opt.sampler,
                "seed": opt.seed,
            },
            "seed": opt.seed,
        }
        return spec_record, provenance

    def records(self, backend_spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        self.protocols = [self.protocol_of(t, space) for t, space in zip(self.tuned, self.spaces)]
        self.protocol = self.protocols[0]
        spec_record, provenance = self.family_record(0)
        if len(self.tuned) == 1:
            return spec_record, provenance
        # several methods: this run holds each method's search (a run of its own in a sub-directory) and the one
        # held-out re-measure of their winners
        spec_record.update(
            method=[t.label for t in self.tuned],
            space=[p["space"] for p in self.protocols],
            methods=[t.label for t in self.tuned],
        )
        provenance["search"].update(
            space=spec_record["space"], dims=[len(s.dims) for s in self.spaces], trials=[c.trials for c in self.cfgs]
        )
        return spec_record, provenance

    def before_measure(self, run_dir: Path) -> None:
        """An export that cannot be written, or a shared storage that holds another search's study, fails now:
        before the run directory exists, after the search would be too late."""
        from ..evals.tune.job import FamilySearch, TuneJob, family_dir
        from ..evals.tune.search import STUDY_NAME, open_study, storage_url

        opt, geometry, several = self.opt, self.lm.rope.geometry, len(self.tuned) > 1
        self.jobs = []
        for i, space in enumerate(self.spaces):
            where = run_dir / family_dir(self.tuned[i].label) if several else run_dir
            url = storage_url(opt.storage, where)
            study = f"{STUDY_NAME}:{space.base.label}" if several else STUDY_NAME
            if opt.export is not None:
                from ..evals.tune.export import check_export

                corner = space.snap({d.key: d.low for d in space.dims})
                check_export(
                    self.model, space.spec(corner), geometry, self.target, opt.export, opt.load.trust_remote_code
                )
            self.jobs.append(
                TuneJob(
                    self.model,
                    self.data,
                    opt.text_field,
                    space,
                    self.cfgs[i],
                    self.tuning,
                    self.heldout,
                    url,
                    self.protocols[i],
                    self.specs,
                    opt.export,
                    opt.load.trust_remote_code,
                    open_study(url, self.protocols[i], self.cfgs[i], space, geometry, explicit=True, study_name=study)
                    if opt.storage is not None
                    else None,
                    study_name=study,
                    remeasure=not several,
                    passkey=opt.passkey,
                    time_budget=None if opt.time_budget is None else 60 * opt.time_budget,
                )
            )
        self.families = [
            FamilySearch(family_dir(self.tuned[i].label), job, *self.family_record(i))
            for i, job in enumerate(self.jobs)
        ]

    def message(self, run_dir: Path) -> str:
        from ..evals.tune.space import describe

        searched = "; ".join(describe(s) for s in self.spaces)
        shares = f" ({', '.join(str(c.trials) for c in self.cfgs)} trials)" if len(self.spaces) > 1 else ""
        return (
            f"run directory: {run_dir}  ({searched}{shares}; tuning {', '.join(d.doc_id for d in self.tuning)}; "
            f"held out {', '.join(d.doc_id for d in self.heldout)})"
        )

    def work(self, store: RunStore, progress: Progress) -> None:
        from ..evals.tune.job import run_families, run_tune

        def note(text: str) -> None:
            err.print(f"note: {text}", markup=False)

        if len(self.jobs) == 1:
            run_tune(self.lm, self.jobs[0], store, progress, note)
        else:
            run_families(self.lm, self.families, store, progress, note)

    def render(self, store: RunStore) -> None:
        from ..report.kinds.tune_outputs import render_tune

        print_outputs(render_tune(store.dir))


@user_errors
@with_blocks
def tune_cmd(opt: TuneOptions) -> None:
    """Find the best parameters of a method for a target length (optuna; resumable, shareable) and export them."""
    Tune(opt).run()
