"""`ctxeval tune`: search a method's parameters for the lowest perplexity at a target length, then re-measure the winner
on held-out documents.

A trial applies the method at one point of its search space (space.py) in place, with the read-back check
every measurement has, and measures truncate perplexity on the *tuning* documents: one forward per document at the
target length serves the trained length too (a static method; a length-dependent one, LongRoPE, takes one forward per
length). The objective is the token-weighted perplexity at the target; the guard is the rise of the perplexity at the
trained length over plain RoPE's, at most `short_tolerance` (an optuna constraint: samplers that honour constraints
steer away from violations, and the winner is the best trial that satisfies it).

The optimiser is optuna's, its study in an RDB storage (a SQLite file in the run directory by default, or any
PostgreSQL/MySQL URL): a search resumes after a crash, Ctrl-C or SIGKILL, and several processes or machines can work on
one study. The storage is the truth; rows.jsonl holds one row per finished trial, rebuilt from the storage for any
trial a crash left without its row. A trial killed while running is marked failed and its point measured again (once).
"""

from __future__ import annotations

import datetime
import math
import os
import socket
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from ...attention.methods import resolve_attention
from ...data.corpora import TokenDoc
from ...errors import CtxevalError
from ...models.load import LoadedModel
from ...rope.methods import Geometry
from ...specs import MethodSpec, expand_specs, format_param, unique_by_label
from ..common import Progress, SilentProgress
from .needles import objective_value
from .scoring import SAMPLERS, Score, TrialScorer, TuneConfig
from .space import BETA_SLOW_RATIO, SearchSpace, longrope_seeds, point_of, scaled_betas

__all__ = ["SAMPLERS", "Score", "TrialScorer", "TuneConfig"]  # the trial's settings and scorer, kept importable here

STUDY_NAME = "ctxeval-tune"
SEARCH, HELDOUT = "search", "heldout"
INVALID = "invalid"  # a point whose parameters fail the method's checks (e.g. beta_slow >= beta_fast): no forward
RETRY_OF = "retry_of"
CREATE_TRIES = 8
ORPHAN_SECONDS = 60
MAX_REFUSED = 10  # refused points per counted trial before the search gives up (ranges that mostly break checks)


def split_documents(docs: list[TokenDoc], n_tune: int, n_heldout: int) -> tuple[list[TokenDoc], list[TokenDoc]]:
    """Tuning documents first, held-out ones after: disjoint by construction (the corpus order decides)."""
    if len(docs) < n_tune + n_heldout:
        raise CtxevalError(
            f"tune needs {n_tune} tuning + {n_heldout} held-out documents of at least the target's "
            f"tokens, and the data has {len(docs)}; lower --tune-docs/--heldout-docs or "
            "--target-length, or give more --data"
        )
    return docs[:n_tune], docs[n_tune : n_tune + n_heldout]


# ---------------------------------------------------------------------------------------------------------------
# the study


DEFAULT_STORAGE = "study.db"  # in the run directory


def storage_url(url: str | None, run_dir: Any) -> str:
    """--storage, or sqlite:///<run dir>/study.db."""
    return url or f"sqlite:///{os.path.abspath(os.path.join(str(run_dir), DEFAULT_STORAGE))}"


def require_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise CtxevalError("ctxeval tune needs optuna: pip install 'ctxeval[tune]' (optuna 5 and cmaes)") from None
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial is a row and a note, not a log line
    return optuna


def gp_startup(space: SearchSpace) -> int:
    """Trials measured before the Gaussian process proposes (the seed points count): two per searched dimension, at
    least 4."""
    return max(4, 2 * len(space.dims))


def make_sampler(cfg: TuneConfig, space: SearchSpace, seed: int | None = None) -> Any:
    """auto: NSGA-II (an elitist genetic algorithm, LongRoPE's kind of search) for LongRoPE's per-pair factors, a
    Gaussian process (optuna's GPSampler: expected improvement under the guard's constraint) for the other methods'
    few continuous parameters, where each trial is a forward of the whole model and a few dozen must do. `seed`
    defaults to cfg.seed."""
    optuna = require_optuna()
    seed = cfg.seed if seed is None else seed
    name = sampler_name(cfg, space)
    if name == "gp":
        with warnings.catch_warnings():  # deterministic_objective is called experimental; a CPU forward is
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.GPSampler(
                seed=seed,
                n_startup_trials=gp_startup(space),
                deterministic_objective=True,
                warn_independent_sampling=False,
            )
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=min(10, cfg.trials))
    if name == "cmaes":
        try:
            import cmaes  # noqa: F401 - optuna's CmaEsSampler needs it
        except ImportError:
            raise CtxevalError("--sampler cmaes needs the cmaes package: pip install 'ctxeval[tune]'") from None
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(population_size=cfg.population, seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def sampler_name(cfg: TuneConfig, space: SearchSpace) -> str:
    return cfg.sampler if cfg.sampler != "auto" else ("nsga2" if space.vector else "gp")


WORKER = {"host": socket.gethostname(), "pid": os.getpid()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class OpenedStudy:
    study: Any  # optuna.Study
    storage: Any  # optuna.storages.RDBStorage
    created: bool  # this process made the study (it alone enqueues the seed points)


def open_study(
    url: str,
    protocol: dict[str, Any],
    cfg: TuneConfig,
    space: SearchSpace,
    geometry: Geometry,
    heartbeat: int = 60,
    explicit: bool = False,
    study_name: str = STUDY_NAME,
) -> OpenedStudy:
    """Create or load the study; a study made for another protocol (model, method, lengths, documents) is refused.
    The process that creates the study samples with --seed itself (an uninterrupted search is reproducible); one that
    joins or resumes it mixes in the trials already there and its process id, so that it does not propose the points
    the first process's random start proposed again. `explicit`: the URL was given (--storage), which decides the
    advice when the study was made for another search."""
    optuna = require_optuna()
    storage = None
    for attempt in range(CREATE_TRIES):
        try:
            with warnings.catch_warnings():  # optuna calls heartbeats experimental; they are what makes resume safe
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(
                    url,
                    heartbeat_interval=heartbeat,
                    grace_period=3 * heartbeat,
                    heartbeat_stale_trial_callback=retry_stale,
                )
            break
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy's errors for a bad URL or an unreachable server vary
            # two processes creating one new storage: one creates the tables, the other sees them half made
            racing = "already exists" in str(exc) or "UNIQUE constraint failed" in str(exc)
            if racing and attempt + 1 < CREATE_TRIES:
                time.sleep(0.2 * (attempt + 1))
                continue
            raise CtxevalError(
                f"--storage {url}: cannot open it ({str(exc).splitlines()[0][:200]}); give a "
                "sqlite:///PATH or a reachable postgresql:// / mysql:// URL"
            ) from None
    try:
        study = optuna.create_study(study_name=study_name, storage=storage, direction="minimize")
        study.set_user_attr("protocol", protocol)
        # the seed points go in with the study, so that no interruption can leave a study without them; only its
        # creator adds them (a process joining would queue them again)
        for name, point in seed_points(space, geometry):
            study.enqueue_trial(point, user_attrs={"seed": name})
        seed, created = cfg.seed, True
    except optuna.exceptions.DuplicatedStudyError:
        created = False
        study = optuna.load_study(study_name=study_name, storage=storage)
        held = study.user_attrs.get("protocol")
        if held is None:  # its creator has not recorded it yet (two processes starting together)
            study.set_user_attr("protocol", protocol)
        elif held != protocol:
            changed = sorted(k for k in set(held) | set(protocol) if held.get(k) != protocol.get(k))
            where = (
                "use another --storage (or leave it out)"
                if explicit
                else "use another --out, or --overwrite to replace this run"
            )
            raise CtxevalError(
                f"the study in {url} was made for another search (differs in: {', '.join(changed)}); {where}"
            ) from None
        seed = (cfg.seed + 7919 * len(study.get_trials(deepcopy=False)) + os.getpid()) % 2**31
    study.sampler = make_sampler(cfg, space, seed)
    return OpenedStudy(study, storage, created)


def retry_stale(study: Any, trial: Any) -> None:
    """A trial whose process stopped sending heartbeats (another machine's crash) is failed by optuna; measure its
    point again, once."""
    enqueue_retry(study, trial)


def enqueue_retry(study: Any, trial: Any) -> bool:
    """Queue the point a failed trial had drawn (or had been given: an enqueued seed) to be measured again, unless the
    trial was itself a retry: a point that kills its process twice (out of memory, say) stays failed instead of
    stopping every resume at it. Returns whether it was queued."""
    point = trial.params or trial.system_attrs.get("fixed_params") or {}
    if not point or RETRY_OF in trial.user_attrs:
        return False
    study.enqueue_trial(
        point,
        user_attrs={RETRY_OF: trial.number, **{k: v for k, v in trial.user_attrs.items() if k == "seed"}},
        skip_if_exists=False,
    )
    return True


def recover(study: Any, storage: Any) -> list[int]:
    """Before a process works on the study: a RUNNING trial of a dead process on this machine is failed (SIGKILL,
    out of memory), and every failed trial without a retry gets one (the parameters it had drawn, enqueued: a trial
    killed while drawing them gets the drawn ones, the rest drawn anew). Returns the trial numbers given a retry.
    A trial killed before it recorded its process stays RUNNING until it is a minute old (it has no point, so nothing
    is lost); on another machine, optuna's heartbeat fails a dead process's trial after 3 minutes."""
    optuna = require_optuna()
    State = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    now = datetime.datetime.now()
    for t in trials:
        worker = t.user_attrs.get("worker") or {}
        dead_here = (
            worker.get("host") == WORKER["host"]
            and worker.get("pid") != WORKER["pid"]
            and not _alive(int(worker.get("pid", 0)))
        )
        # killed between optuna creating the trial and its first line: no point drawn, nothing to measure again; a live
        # process records its worker within milliseconds, so one still without it after a minute is gone
        orphan = (
            not worker
            and not t.params
            and t.datetime_start is not None
            and (now - t.datetime_start).total_seconds() > ORPHAN_SECONDS
        )
        if t.state == State.RUNNING and (dead_here or orphan):
            storage.set_trial_state_values(t._trial_id, State.FAIL)  # noqa: SLF001 - optuna exposes no public id
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_OF) for t in trials}
    out = []
    for t in trials:
        if t.state == State.FAIL and t.number not in retried and enqueue_retry(study, t):
            out.append(t.number)
    return out


def finished(study: Any) -> list[Any]:
    """The trials that have a result: measured (COMPLETE), or PRUNED (a failed measurement, or a point the method's
    checks refused)."""
    optuna = require_optuna()
    State = optuna.trial.TrialState
    return [t for t in study.get_trials(deepcopy=False) if t.state in (State.COMPLETE, State.PRUNED)]


def counted(trials: list[Any]) -> int:
    """The finished trials --trials counts: those that measured a point (a refused point costs no forward, and YaRN's
    overlapping beta ranges would otherwise eat half a budget)."""
    return sum(1 for t in trials if (t.user_attrs.get("row") or {}).get("status") != INVALID)


def trial_row(
    lm: LoadedModel,
    spec: MethodSpec | None,
    space: SearchSpace,
    cfg: TuneConfig,
    number: int,
    point: dict[str, Any],
    score: Score | None,
    baseline_short: float,
    problem: str | None = None,
) -> dict[str, Any]:
    """One row per trial (task `tune`, phase `search`): what was tried, what it measured, and whether it kept the
    guard."""
    label = spec.label if spec is not None else f"{space.base.name}(invalid point)"
    row: dict[str, Any] = {
        "model": lm.name,
        "method": space.base.method_name,
        "label": label,
        "task": "tune",
        "phase": SEARCH,
        "trial": number,
        "doc": "tuning",
        "length": cfg.target,
        "params": point,
        "metric": {"ppl": "ppl", "needle": "answer_ppl", "both": "ppl_answer_geomean"}[cfg.objective],
    }
    if spec is not None:  # what was measured: a searched ratio (beta_slow / beta_fast) as the method's own parameter
        row["method_params"] = {k: list(v) if isinstance(v, tuple) else v for k, v in spec.params.items()}
    if score is None or score.target_ppl is None:
        row.update(
            status=INVALID if score is None else "error",
            value=None,
            note=(problem or (score.problem if score else ""))[:300],
        )
        if score is not None:
            row.update(seconds=round(score.seconds, 3), forwards=score.forwards, tokens=score.tokens)
        return row
    rise = score.short_ppl / baseline_short - 1
    row.update(
        status="ok",
        value=objective_value(cfg.objective, score.target_ppl, score.answer_ppl),
        ppl_target=score.target_ppl,
        ppl_short=score.short_ppl,
        short_length=cfg.short,
        short_rise=rise,
        feasible=bool(rise <= cfg.short_tolerance),
        seconds=round(score.seconds, 3),
        forwards=score.forwards,
        tokens=score.tokens,
        readback_max_rel_diff=score.readback_max_rel_diff,
    )
    if score.answer_ppl is not None:
        row["answer_ppl"] = score.answer_ppl
    return row


@dataclass
class SearchResult:
    baseline_short: float  # plain RoPE's ppl at the trained length on the tuning documents
    rows: list[dict[str, Any]]  # every finished trial's row, by trial number
    seconds: float  # this process's search time
    measured_now: int
    out_of_time: bool = False  # stopped by --time-budget before the study held cfg.trials


def seed_points(space: SearchSpace, geometry: Geometry) -> list[tuple[str, dict[str, Any]]]:
    """Points every search tries first: the method at its own defaults, and for YaRN's ramp its betas moved to the
    model's geometry (`scaled_betas`: 0.563 / 0.0091 on the tiny model, 32 / 0.45 on SmolLM2); for LongRoPE, PI's, NTK's and YaRN's factors
    (LongRoPE's own start is YaRN's) at LongRoPE's default attention factor."""
    defaults = {**{p.name: p.default for p in space.base.method.params}, **space.base.params}
    attention = tuple(resolve_attention(a.name, a.given) for a in space.base.attention)
    if space.vector:
        out = []
        for name, factors in longrope_seeds(space, geometry).items():
            plain = defaults.get("short_factor") or tuple([1.0] * space.pairs)  # plain RoPE up to L
            point = point_of(space, geometry, {**defaults, "long_factor": factors, "short_factor": plain}, attention)
            if point:
                out.append((name, space.snap(point)))
        return out
    out = []
    point = point_of(space, geometry, defaults, attention)
    if point:
        out.append(("defaults", space.snap(point)))
    if {"beta_fast", BETA_SLOW_RATIO, "beta_slow"} & {d.key for d in space.dims}:
        trained = int(space.base.params.get("original_max_position_embeddings") or geometry.original_length)
        fast, slow = scaled_betas(geometry, trained)
        given = {k: v for k, v in space.base.params.items() if k in ("beta_fast", "beta_slow")}
        scaled = point_of(space, geometry, {**defaults, "beta_fast": fast, "beta_slow": slow, **given}, attention)
        if scaled and space.snap(scaled) != (out[0][1] if out else None):
            out.append(("geometry", space.snap(scaled)))
    return out


def search(
    lm: LoadedModel,
    space: SearchSpace,
    docs: list[TokenDoc],
    cfg: TuneConfig,
    opened: OpenedStudy,
    emit: Callable[[list[dict[str, Any]]], None],
    have_rows: set[int],
    progress: Progress | None = None,
    deadline: float | None = None,
    baseline: float | None = None,
) -> SearchResult:
    """Run trials until the study holds cfg.trials finished ones (every process together); each trial's row goes to
    `emit` as it finishes, and finished trials whose numbers are not in `have_rows` (a crash between the study's
    record and the row) get their rows from the storage. `deadline` (time.monotonic()): no trial starts that would
    end after it, by the median time of this process's trials so far. `baseline`: plain RoPE's perplexity at the
    trained length on these documents, when another search has measured it (a study without one then skips that
    forward)."""
    optuna = require_optuna()
    State = optuna.trial.TrialState
    progress = progress or SilentProgress()
    study, storage = opened.study, opened.storage
    scorer = TrialScorer(lm, docs, cfg)
    if study.user_attrs.get("baseline_short") is None and baseline is not None:
        study.set_user_attr("baseline_short", baseline)
    baseline = study.user_attrs.get("baseline_short")
    if baseline is None:
        plain = scorer.score(MethodSpec("none", {}))
        if plain.short_ppl is None:
            raise CtxevalError(
                f"plain RoPE has no perplexity at {cfg.short:,} on the tuning documents ({plain.problem})"
            )
        baseline = plain.short_ppl
        study.set_user_attr("baseline_short", baseline)
    recover(study, storage)
    measured = 0
    durations: list[float] = []  # this process's trials, for the deadline
    out_of_time = False

    def no_time() -> bool:
        """Whether the next trial would end past the deadline (a study without a measured trial gets its first one
        all the same: a method in the budget is tried at least at its first seed)."""
        if deadline is None or not counted(finished(study)):
            return False
        expected = statistics.median(durations) if durations else 0.0
        return time.monotonic() + expected > deadline

    def objective(trial: Any) -> float:
        nonlocal measured
        began = time.monotonic()  # the sampler's proposal included: what the deadline must budget for
        trial.set_user_attr("worker", WORKER)
        point = {}
        for dim in space.dims:
            if dim.kind is int:
                point[dim.key] = trial.suggest_int(dim.key, math.ceil(dim.low), math.floor(dim.high), log=dim.log)
            else:
                point[dim.key] = trial.suggest_float(dim.key, dim.low, dim.high, log=dim.log)
        point = space.snap(point)
        try:
            spec = space.spec(point)
        except CtxevalError as exc:
            trial.set_user_attr("row", trial_row(lm, None, space, cfg, trial.number, point, None, baseline, str(exc)))
            raise optuna.TrialPruned(str(exc)) from None
        score = scorer.score(spec)
        measured += 1
        durations.append(time.monotonic() - began)
        row = trial_row(lm, spec, space, cfg, trial.number, point, score, baseline)
        trial.set_user_attr("row", row)
        if score.target_ppl is None:
            raise optuna.TrialPruned(score.problem)
        trial.set_constraint("short_rise", row["short_rise"] - cfg.short_tolerance)
        # the study holds log perplexity: a bad point's ppl in the thousands beside good ones near 100 would swamp a
        # Gaussian process's fit; the ranking samplers (TPE, NSGA-II, CMA-ES) see the same order
        return math.log(row["value"])

    def after(study: Any, trial: Any) -> None:
        row = trial.user_attrs.get("row")
        if trial.state in (State.COMPLETE, State.PRUNED) and row is not None:
            emit([{**row, **({RETRY_OF: trial.user_attrs[RETRY_OF]} if RETRY_OF in trial.user_attrs else {})}])
            have_rows.add(trial.number)
        done = finished(study)
        best = best_trial_row([t.user_attrs.get("row") or {} for t in done])
        if (trial.user_attrs.get("row") or {}).get("status") != INVALID:
            progress.advance(1, f"trial {counted(done)}/{cfg.trials}" + (f" best {best['value']:.3f}" if best else ""))
        if counted(done) >= cfg.trials or len(done) - counted(done) > MAX_REFUSED * cfg.trials or no_time():
            study.stop()

    start = time.perf_counter()
    progress.start(max(0, cfg.trials - counted(finished(study))))
    while counted(done := finished(study)) < cfg.trials:
        if no_time():
            out_of_time = True
            break
        if len(done) - counted(done) > MAX_REFUSED * cfg.trials:
            raise CtxevalError(
                f"the method's checks refused {len(done) - counted(done)} of the points the sampler "
                "proposed; narrow the ranges with --space so that fewer points break them"
            )
        with warnings.catch_warnings():
            # optuna's GP divides by a zero sum while no trial has kept the constraint (then it proposes a random
            # point, as it should): the numpy warning says nothing to a user
            warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning, r"optuna\._gp")
            study.optimize(objective, callbacks=[after], gc_after_trial=False)
    for t in finished(study):  # rows measured elsewhere: another process on the study, or a session that crashed
        if t.number not in have_rows and t.user_attrs.get("row") is not None:
            emit([{**t.user_attrs["row"], "synced": True}])
            have_rows.add(t.number)
    rows = sorted((t.user_attrs["row"] for t in finished(study) if t.user_attrs.get("row")), key=lambda r: r["trial"])
    return SearchResult(baseline, rows, time.perf_counter() - start, measured, out_of_time)


def best_trial_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The winner: the lowest target perplexity among trials that kept the guard (earliest on a tie)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("feasible")]
    return min(ok, key=lambda r: (r["value"], r["trial"])) if ok else None


def comparison_specs(
    space: SearchSpace, winner: MethodSpec, extra: list[MethodSpec], others: list[tuple[SearchSpace, MethodSpec]] = ()
) -> list[MethodSpec]:
    """What the winner is re-measured against on held-out documents: the other families' winners (`others`, a
    search across several methods), plain RoPE, each searched method at its defaults, PI, NTK and YaRN at the same
    factor, and the user's --compare specs; duplicates dropped."""
    s = space.factor
    f = format_param(s)
    names = ["none", f"pi:factor={f}", f"ntk:factor={f}", f"yarn:factor={f}"]
    defaults = []
    for searched in [space, *(o for o, _ in others)]:
        base = searched.base
        kept = {
            k: v for k, v in base.params.items() if k in ("factor", "short_factor", "original_max_position_embeddings")
        }
        if base.method.takes_factor:
            kept.setdefault("factor", s)  # ntk, whose searched alpha replaces the factor, at its default alpha = s
        if not searched.vector:  # LongRoPE has no defaults: its PI, NTK and YaRN starting points are trials
            defaults.append(MethodSpec(base.name, kept, base.temperature, tuple(a for a in base.attention)))
    winners = [winner, *(w for _, w in others)]
    return unique_by_label(winners + expand_specs(names) + defaults + list(extra))
