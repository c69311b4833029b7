"""`ctxeval tune --export DIR`: the winner as the RoPE configuration transformers (and vLLM) load natively, verified by
loading it fresh.

DIR becomes a model directory: config.json with the winner in `rope_parameters` (transformers 5) and
max_position_embeddings = the target length, the tokenizer files copied, the weight files linked to the source model's
(no copy); rope_scaling.json holds the same entry in the older `rope_scaling` form (transformers 4, vLLM's
`--hf-overrides`), and longrope-factors.json LongRoPE's per-pair factors. Verification loads DIR as a new model, with
nothing but its config deciding the RoPE (`native`), and compares the RoPE read back from it (inverse frequencies
and attention factor, at the trained and the target length) and the perplexity of a tuning document at both
lengths with the tuned run's: both to 1e-6 (relative).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ...data.corpora import TokenDoc
from ...errors import CtxevalError
from ...models.load import LoadedModel, load_hf_config, load_model, model_directory
from ...models.rope_config import legacy_rope_scaling, rope_parameters
from ...rope.methods import Geometry, compute
from ...specs import MethodSpec
from ..perplexity import PplConfig, PplRunner
from ..sweep import applying

EXPORT_RTOL = 1e-6
EXPORT_RECORD = "ctxeval-export.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# files a model directory needs besides config.json and its weights
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "added_tokens.json",
    "chat_template.jinja",
)


def check_export(
    model: str, spec: MethodSpec, geometry: Geometry, target: int, out: Path, trust_remote_code: bool = False
) -> Path:
    """Everything --export needs, checked before the search starts (one line each): a rope_parameters entry for the
    method, a model directory to link the weights from, and an export directory that is new, empty or an earlier export
    (never the model's own directory). Returns the model's directory."""
    rope_parameters(spec, geometry, target)
    source = model_directory(model)
    if source is None:
        raise CtxevalError(
            f"--export: {model} has no local model directory to link the weights from (a .gguf file "
            "is dequantised at load); export from a model directory or hub id"
        )
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CtxevalError(f"--export {out} is a file; give a new or empty directory")
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_RECORD).is_file():
        raise CtxevalError(f"--export {out} exists and is not an earlier export; give a new or empty directory")
    if out.exists() and out.resolve() == source.resolve():
        raise CtxevalError(f"--export {out} is the model's own directory; give a new one (its weights are linked)")
    shipped = getattr(load_hf_config(model, trust_remote_code=trust_remote_code), "rope_parameters", None) or {}
    if shipped and not all(isinstance(v, (int, float, str, bool, list, type(None))) for v in shipped.values()):
        raise CtxevalError(
            f"--export: {model} has a RoPE per layer type (nested rope_parameters); ctxeval exports one "
            "entry for every layer and cannot write this config"
        )
    return source


def write_export(
    model: str, spec: MethodSpec, geometry: Geometry, target: int, out: Path, trust_remote_code: bool = False
) -> dict[str, Any]:
    """Write the model directory `out` (see the module docstring); returns what was written."""
    source = check_export(model, spec, geometry, target, out, trust_remote_code)
    entry = rope_parameters(spec, geometry, target)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    earlier = out / EXPORT_RECORD
    if earlier.is_file():  # an earlier export's files: its weights may have other names, its LongRoPE file may go
        try:
            old = json.loads(earlier.read_text())
        except (OSError, ValueError):
            old = {}
        for name in list(old.get("files") or []) + list(old.get("weights") or []):
            path = out / Path(str(name)).name
            if path.is_symlink() or path.is_file():
                path.unlink()
    config = load_hf_config(model, trust_remote_code=trust_remote_code)
    shipped = getattr(config, "rope_parameters", None) or {}
    if shipped.get("partial_rotary_factor") is not None:  # transformers 5 keeps it inside rope_parameters
        entry = {**entry, "partial_rotary_factor": shipped["partial_rotary_factor"]}
    config.rope_parameters = entry
    config.max_position_embeddings = target
    config.save_pretrained(out)
    linked, copied = [], []
    for path in sorted(source.iterdir()):
        if path.name == "config.json" or path.is_dir():
            continue
        dest = out / path.name
        if path.suffix in WEIGHT_SUFFIXES or path.name.endswith(".index.json"):
            if dest.exists() or dest.is_symlink():
                dest.unlink()
            os.symlink(path.resolve(), dest)
            linked.append(path.name)
        elif path.name in TOKENIZER_FILES:
            shutil.copyfile(path, dest)
            copied.append(path.name)
    (out / "rope_scaling.json").write_text(
        json.dumps({**legacy_rope_scaling(entry), "max_position_embeddings": target}, indent=2) + "\n"
    )
    files = ["config.json", "rope_scaling.json", *copied]
    if entry["rope_type"] == "longrope":
        (out / "longrope-factors.json").write_text(
            json.dumps(
                {
                    "short_factor": entry["short_factor"],
                    "long_factor": entry["long_factor"],
                    "original_max_position_embeddings": entry["original_max_position_embeddings"],
                },
                indent=2,
            )
            + "\n"
        )
        files.append("longrope-factors.json")
    record = {
        "model": model,
        "method": spec.label,
        "rope_parameters": entry,
        "max_position_embeddings": target,
        "weights_linked_from": str(source),
        "weights": linked,
        "files": files,
    }
    (out / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def portable_path(path: str | Path, run_dir: Path) -> str:
    """How run.json names a path of this machine: relative to the run directory when it lies inside it, else by its
    last part; a run directory that moves or is committed names no absolute temporary path ('/tmp/export-tiny')."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path(run_dir).resolve()))
    except ValueError:
        return path.name


def export_record(written: dict[str, Any], check: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """run.json's `tune.export`: what write_export wrote and the verification, with the export directory named by
    portable_path and the weights' source by the model's name (its own directory's last part for a local path);
    the export directory's ctxeval-export.json keeps the absolute source its links point at."""
    model = str(written["model"])
    return {
        **written,
        "weights_linked_from": Path(model).name if os.path.isabs(model) else model,
        "verification": {**check, "directory": portable_path(check["directory"], run_dir)},
    }


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def verify_export(
    lm: LoadedModel, spec: MethodSpec, out: Path, doc: TokenDoc, lengths: tuple[int, int], bos: bool, chunk_size: int
) -> dict[str, Any]:
    """Load `out` fresh (its config alone decides the RoPE) and compare its read-back RoPE and its perplexity of `doc`
    at `lengths` with `spec` applied to the loaded model `lm`. A difference above EXPORT_RTOL is an error."""
    fresh = load_model(str(out), dtype=lm.dtype, device=lm.device, attn_implementation=lm.attn_implementation)
    cfg = PplConfig(tuple(lengths), bos=bos, chunk_size=chunk_size)
    bos_id = getattr(lm.tokenizer, "bos_token_id", None)

    def ppl(model: LoadedModel, name: str, applied: MethodSpec) -> tuple[dict[int, float], dict[int, Any]]:
        runner = PplRunner(model.model, model.device, cfg, bos_id, name)
        runner.dynamic = {applied.label}  # one forward per length: the same forwards on both sides
        rows: list[dict[str, Any]] = []
        with applying(model, applied, tuple(lengths)) as (handle, _record):
            runner.measure(applied, doc, list(lengths), rows.extend)
            readback = {L: handle.readback(L)[0] for L in lengths}
        if any(r.get("status") != "ok" for r in rows):
            raise CtxevalError(f"--export: the perplexity of {name} could not be measured ({rows[0].get('note')})")
        return {r["length"]: r["ppl"] for r in rows}, readback

    tuned, tuned_rb = ppl(lm, lm.name, spec)
    loaded, loaded_rb = ppl(fresh, str(out), MethodSpec("native", {}))
    worst_rope = 0.0
    for length in lengths:
        expected = compute(spec.method, lm.rope.geometry, spec.params, length)
        rb = loaded_rb[length]
        worst_rope = max(
            worst_rope,
            float(np.max(np.abs(rb.inv_freq - expected.inv_freq) / expected.inv_freq)),
            _rel(rb.attention_factor, expected.attention_factor),
            float(np.max(np.abs(rb.inv_freq - tuned_rb[length].inv_freq) / tuned_rb[length].inv_freq)),
        )
    worst_ppl = max(_rel(loaded[L], tuned[L]) for L in lengths)
    result = {
        "directory": str(out),
        "lengths": list(lengths),
        "doc": doc.doc_id,
        "ppl_tuned": {str(k): v for k, v in tuned.items()},
        "ppl_exported": {str(k): v for k, v in loaded.items()},
        "max_rel_diff_rope": worst_rope,
        "max_rel_diff_ppl": worst_ppl,
        "tolerance": EXPORT_RTOL,
        "passed": bool(worst_rope <= EXPORT_RTOL and worst_ppl <= EXPORT_RTOL),
    }
    if not result["passed"] or not all(math.isfinite(v) for v in loaded.values()):
        raise CtxevalError(
            f"--export: the model loaded from {out} differs from the tuned run (RoPE by {worst_rope:.1e}, "
            f"perplexity by {worst_ppl:.1e}, relative; allowed {EXPORT_RTOL:g}); please report this"
        )
    return result
