"""One `ctxeval tune` job from search to export: the search (tune.py), its summary in run.json, the winner's held-out
re-measure as an ordinary ppl run nested in the tune run, and the export with its verification (export.py)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ...data.corpora import TokenDoc, iter_documents, select_long_documents, tokenize
from ...errors import CtxevalError
from ...models.load import LoadedModel
from ...runs.store import RunStore
from ...specs import MethodSpec, expand_specs, format_param, unique_by_label
from ..common import Progress
from ..perplexity import PplConfig, sweep
from .export import export_record, verify_export, write_export
from .generation import measure_passkey, passkey_dir
from .search import (
    DEFAULT_STORAGE,
    INVALID,
    STUDY_NAME,
    OpenedStudy,
    TuneConfig,
    best_trial_row,
    comparison_specs,
    open_study,
    sampler_name,
    search,
)
from .space import SearchSpace


@dataclass
class TuneJob:
    """What one tune command measures (everything but the loaded model)."""

    model: str
    data: str
    text_field: str
    space: SearchSpace
    cfg: TuneConfig
    tuning: list[TokenDoc]
    heldout: list[TokenDoc]
    url: str  # the study's storage
    protocol: dict[str, Any]  # what the study must have been made for
    compare: list[MethodSpec] = field(default_factory=list)
    export: Path | None = None
    trust_remote_code: bool = False
    opened: OpenedStudy | None = None  # a shared --storage, opened (and checked) before the run directory
    study_name: str = STUDY_NAME
    remeasure: bool = True  # re-measure the winner on the held-out documents (and export it) after its search
    passkey: int = 0  # --passkey: samples of the held-out check by generation at the target (0: none)
    time_budget: float | None = None  # --time-budget: seconds of search for this process (all methods together)

    @property
    def storage_record(self) -> str:
        """What run.json says of the storage: the URL of a shared one; the run directory's own file by its name (the
        run stays valid when the directory moves)."""
        return self.url if self.opened is not None else DEFAULT_STORAGE


def long_documents(data: str, tokenizer: Any, wanted: int, needed: int, text_field: str) -> list[TokenDoc]:
    """The first `wanted` documents of `data` with `needed` tokens, or as many as there are (tune.split_documents
    says what to do when they are too few, in tune's own options)."""
    try:
        return select_long_documents(data, tokenizer, wanted, needed, text_field)
    except CtxevalError:
        return [
            TokenDoc(d.doc_id, ids)
            for d in iter_documents(data, text_field)
            if len(ids := tokenize(tokenizer, d)) >= needed
        ][:wanted]


def family_dir(label: str) -> str:
    """The sub-directory of one method's search in a search across several: `search-yarn`, `search-yarn-beta_fast=4`."""
    return "search-" + re.sub(r"[^A-Za-z0-9._=+-]+", "-", label).strip("-")


def heldout_dir(run_dir: Path, trial: int) -> Path:
    """The held-out ppl run of the winner found at `trial` (a later winner gets its own: nothing measured is lost)."""
    return Path(run_dir) / f"heldout-trial-{trial}"


def plain(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as JSON writes them (per-pair factor tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}


def measure_heldout(lm: LoadedModel, job: TuneJob, specs: list[MethodSpec], run_dir: Path, progress: Progress) -> None:
    """The comparison on the held-out documents at the trained and the target length, as a ppl run in `run_dir`
    (resumed like any ppl run; run.json finalised whatever happens)."""
    cfg = job.cfg
    spec = {
        "task": "ppl",
        "model": job.model,
        "data": job.data,
        "text_field": job.text_field,
        "protocol": "truncate",
        "stride": None,
        "bos": cfg.bos,
        "docs": len(job.heldout),
        "lengths": list(cfg.lengths),
        "methods": [s.label for s in specs],
        "dtype": lm.dtype,
        "seed": cfg.seed,
        "preset": None,
        "heldout_docs": [d.doc_id for d in job.heldout],
    }
    provenance = {
        "model": lm.record(),
        "data": {"spec": job.data, "documents": [{"doc": d.doc_id, "tokens": int(len(d.ids))} for d in job.heldout]},
        "protocol": {
            "name": "truncate",
            "stride": None,
            "bos": cfg.bos,
            "aggregate": "token",
            "chunk_size": cfg.chunk_size,
            "batch_size": 1,
            "one_forward_per_document": True,
        },
        "seed": cfg.seed,
        "heldout_of": run_dir.parent.name,
    }
    with RunStore(run_dir, spec) as held:
        held.start({**provenance, "methods": held.record.get("methods", {})})
        try:
            sweep(
                lm, specs, job.heldout, PplConfig(cfg.lengths, bos=cfg.bos, chunk_size=cfg.chunk_size), held, progress
            )
        except BaseException as exc:
            held.finish("interrupted" if isinstance(exc, KeyboardInterrupt) else "error", str(exc)[:300])
            raise
        held.finish("success")


def run_tune(
    lm: LoadedModel,
    job: TuneJob,
    store: RunStore,
    progress: Progress,
    note: Callable[[str], None],
    mirror: Callable[[list[dict[str, Any]]], None] | None = None,
    deadline: float | None = None,
    baseline: float | None = None,
) -> MethodSpec | None:
    """Search until the study holds the asked trials, then (job.remeasure) re-measure the winner on the held-out
    documents and export it when asked; run.json's `tune` records each step as it is done. Returns the winner.
    `mirror` gets every trial row after `store` (a search across methods copies them into the parent run)."""
    cfg, space = job.cfg, job.space
    opened = job.opened or open_study(job.url, job.protocol, cfg, space, lm.rope.geometry, study_name=job.study_name)
    have = {int(r["trial"]) for r in store.rows() if r.get("trial") is not None}

    def emit(rows: list[dict[str, Any]]) -> None:
        store.append(rows)
        if mirror is not None:
            mirror(rows)

    if deadline is None and job.time_budget is not None:
        deadline = time.monotonic() + job.time_budget
    result = search(lm, space, job.tuning, cfg, opened, emit, have, progress, deadline, baseline)
    if result.out_of_time:
        note(
            f"{space.base.label}: --time-budget reached after {len(result.rows)} of {cfg.trials} trials; the winner "
            "is the best of those (the same command with a larger budget continues the study)"
        )
    refused = sum(1 for r in result.rows if r.get("status") == INVALID)
    summary: dict[str, Any] = {
        "storage": job.storage_record,
        "trials": len(result.rows) - refused,
        "refused": refused,
        "measured_now": result.measured_now,
        "search_seconds_now": round(result.seconds, 1),
        "baseline_short": result.baseline_short,
        "sampler": sampler_name(cfg, space),
        "forwards": sum(int(r.get("forwards") or 0) for r in result.rows),
        "winner": None,
        **({"out_of_time": True} if result.out_of_time else {}),
    }
    store.update(tune=summary)
    best = best_trial_row(result.rows)
    if best is None:
        note(
            f"{space.base.label}: no trial kept the perplexity at {cfg.short:,} within {cfg.short_tolerance:.0%} of "
            "plain RoPE's; nothing to re-measure or export (raise --short-tolerance or --trials)"
        )
        return None
    winner = space.spec(best["params"])
    summary.update(winner=winner_record(winner, best))
    store.update(tune=summary)
    if not job.remeasure:
        return winner
    held_dir = heldout_dir(store.dir, best["trial"])
    summary.update(heldout_dir=held_dir.name)
    store.update(tune=summary)
    measure_heldout(lm, job, comparison_specs(space, winner, job.compare), held_dir, progress)
    check_by_generation(lm, job, [winner], summary, store, held_dir.name, progress)
    if job.export is not None:
        written = write_export(job.model, winner, lm.rope.geometry, cfg.target, job.export, job.trust_remote_code)
        check = verify_export(lm, winner, job.export, job.tuning[0], cfg.lengths, cfg.bos, cfg.chunk_size)
        summary["export"] = export_record(written, check, store.dir)
        store.update(tune=summary)
    return winner


def check_by_generation(
    lm: LoadedModel,
    job: TuneJob,
    winners: list[MethodSpec],
    summary: dict[str, Any],
    store: RunStore,
    heldout_name: str,
    progress: Progress,
) -> None:
    """--passkey N: the winners, plain RoPE, YaRN at the same factor and --compare on N passkey prompts at the target
    (generation.py), as a passkey run beside the held-out one; run.json's `tune` names it."""
    if not job.passkey:
        return
    where = passkey_dir(store.dir, heldout_name)
    summary.update(passkey_dir=where.name)
    store.update(tune=summary)
    f = format_param(job.space.factor)
    specs = unique_by_label([*winners, *expand_specs(["none", f"yarn:factor={f}"]), *job.compare])
    cfg = job.cfg
    measure_passkey(lm, job.model, specs, cfg.target, job.passkey, cfg.seed, where, progress)


def winner_record(winner: MethodSpec, best: dict[str, Any]) -> dict[str, Any]:
    """run.json's record of a search's winner: its trial, method, parameters and tuning perplexities."""
    return {
        "trial": best["trial"],
        "label": winner.label,
        "params": plain(winner.params),
        "attention": [{"name": a.name, "params": a.params} for a in winner.attention],
        "value": best["value"],  # the objective's value (the target ppl unless --objective needle / both)
        "ppl_target": best.get("ppl_target", best["value"]),
        "ppl_short": best["ppl_short"],
        **({"answer_ppl": best["answer_ppl"]} if "answer_ppl" in best else {}),
    }


@dataclass
class FamilySearch:
    """One method's search in a search across several (`ctxeval tune -m yarn -m ntk ...`): an ordinary tune run of
    its own in the sub-directory `name` (its study, rows and tune.md), without its own held-out re-measure."""

    name: str
    job: TuneJob
    spec: dict[str, Any]  # its run.json spec
    provenance: dict[str, Any]


def run_families(
    lm: LoadedModel,
    families: list[FamilySearch],
    store: RunStore,
    progress: Progress,
    note: Callable[[str], None],
) -> None:
    """Each method's search in turn (its share of --trials), then one held-out re-measure of every method's winner
    side by side with plain RoPE, each method's defaults, PI, NTK, YaRN and --compare, and the export of the
    winner of them all (the lowest tuning perplexity: the held-out documents judge, they do not choose)."""
    summary: dict[str, Any] = {"families": [], "winner": None}
    found: list[tuple[FamilySearch, MethodSpec, dict[str, Any]]] = []
    budget = families[0].job.time_budget
    end = None if budget is None else time.monotonic() + budget
    baseline = None  # plain RoPE at L on the tuning documents: measured by the first search, given to the others
    for index, family in enumerate(families):
        # each method gets an equal share of the time left (a method that finishes early leaves its time to the rest)
        deadline = None if end is None else time.monotonic() + (end - time.monotonic()) / (len(families) - index)
        with RunStore(store.dir / family.name, family.spec) as sub:
            sub.start({**family.provenance, "methods": sub.record.get("methods", {}), "family_of": store.dir.name})
            try:
                # the parent's rows mirror every trial (its resume count, and a run directory that holds trials is
                # never removed as empty); the sub-directory's rows and study are the record
                winner = run_tune(
                    lm,
                    family.job,
                    sub,
                    progress,
                    note,
                    lambda rows, name=family.name: store.append([{**r, "family": name} for r in rows]),
                    deadline,
                    baseline,
                )
            except BaseException as exc:
                sub.finish("interrupted" if isinstance(exc, KeyboardInterrupt) else "error", str(exc)[:300])
                raise
            sub.finish("success")
            record = dict(sub.record.get("tune") or {})
            baseline = record.get("baseline_short", baseline)
        summary["families"].append({"dir": family.name, "method": family.job.space.base.label, **record})
        store.update(tune=summary)
        if winner is not None:
            found.append((family, winner, record["winner"]))
    if not found:
        note("no method's search kept the guard: nothing to re-measure or export")
        return
    best_family, best, best_record = min(found, key=lambda f: (f[2]["value"], families.index(f[0])))
    # named by every winner's trial: a later, better winner of any method gets its own (nothing measured is lost)
    held_dir = store.dir / (
        "heldout-" + "-".join(f"{f.name.removeprefix('search-')}-{r['trial']}" for f, _, r in found)
    )
    summary.update(winner={**best_record, "family": best_family.name}, heldout_dir=held_dir.name)
    store.update(tune=summary)
    first = best_family.job
    others = [(f.job.space, w) for f, w, _ in found if f is not best_family]
    measure_heldout(lm, first, comparison_specs(first.space, best, first.compare, others), held_dir, progress)
    check_by_generation(lm, first, [best, *(w for _, w in others)], summary, store, held_dir.name, progress)
    if first.export is not None:
        cfg = first.cfg
        written = write_export(first.model, best, lm.rope.geometry, cfg.target, first.export, first.trust_remote_code)
        check = verify_export(lm, best, first.export, first.tuning[0], cfg.lengths, cfg.bos, cfg.chunk_size)
        summary["export"] = export_record(written, check, store.dir)
        store.update(tune=summary)
