"""Run directories written through the CLI on the tiny random model, for the report's tests."""

import json
import math

from typer.testing import CliRunner

from ctxeval.cli import app

runner = CliRunner()


def cli(*args):
    return runner.invoke(app, ["report", *map(str, args)])


def write_run(path, record, rows):
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps(record, indent=2))
    (path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _record(task, spec, model, started, status, original, dtype, **extra):
    return {
        "status": status,
        "started": started,
        "finished": started,
        "spec": {"task": task, "model": model, "dtype": dtype, **spec},
        "model": {"name": model, "dtype": dtype, "max_position_embeddings": original},
        "methods": {
            "none": {
                "method": "none",
                "params": {},
                "geometry": {"rotary_dim": 16, "base": 10000.0, "original_length": original},
            }
        },
        "seed": 0,
        "environment": {},
        "history": [],
        "error": None,
        **extra,
    }


def ppl_run(
    root,
    name,
    *,
    model="m1",
    ppl=None,
    docs=("d1",),
    bos=True,
    aggregate="token",
    data="austen",
    started="2026-01-01T00:00:00+00:00",
    status="success",
    original=128,
    dtype="float32",
    failed=(),
):
    """ppl: {label: {length: ppl}}; failed: (label, length, status) points recorded as failures."""
    ppl = ppl or {"none": {64: 10.0, 128: 12.0}, "yarn(factor=2)": {64: 11.0, 128: 11.5}}
    lengths = sorted({L for v in ppl.values() for L in v} | {f[1] for f in failed})
    spec = {
        "data": data,
        "text_field": "text",
        "protocol": "truncate",
        "stride": None,
        "bos": bos,
        "docs": len(docs),
        "lengths": lengths,
        "methods": list(ppl),
        "seed": 0,
        "preset": None,
    }
    record = _record(
        "ppl",
        spec,
        model,
        started,
        status,
        original,
        dtype,
        data={"spec": data, "documents": [{"doc": d, "tokens": 1000} for d in docs]},
        protocol={
            "name": "truncate",
            "stride": None,
            "bos": bos,
            "bos_token": "<s>" if bos else None,
            "aggregate": aggregate,
            "chunk_size": 1024,
            "one_forward_per_document": True,
        },
    )
    rows = []
    for label, values in ppl.items():
        for length, value in values.items():
            for doc in docs:
                n = length - 1
                rows.append(
                    {
                        "model": model,
                        "method": label.split("(")[0],
                        "label": label,
                        "params": {},
                        "task": "ppl",
                        "protocol": "truncate",
                        "length": length,
                        "doc": doc,
                        "status": "ok",
                        "metric": "nll",
                        "value": math.log(value),
                        "ppl": value,
                        "nll_sum": math.log(value) * n,
                        "n_tokens": n,
                        "window_nll_sum": math.log(value),
                        "n_windows": 1,
                        "seconds": 0.1,
                    }
                )
    for label, length, st in failed:
        for doc in docs:
            rows.append(
                {
                    "model": model,
                    "method": label,
                    "label": label,
                    "params": {},
                    "task": "ppl",
                    "protocol": "truncate",
                    "length": length,
                    "doc": doc,
                    "status": st,
                    "seconds": 0.0,
                }
            )
    return write_run(root / name, record, rows)


def needle_run(
    root,
    name,
    *,
    task="needle",
    model="m1",
    acc=None,
    depths=(0.0, 50.0, 100.0),
    samples=1,
    haystack="austen",
    scoring="generate",
    started="2026-01-01T00:00:00+00:00",
    original=128,
    dtype="float32",
    extra_spec=None,
):
    """acc: {label: {length: correct (0/1) for every depth and sample, or a list per sample}}."""
    acc = acc or {"none": {64: 1, 128: 1}}
    lengths = sorted({L for v in acc.values() for L in v})
    preset = {
        "name": "passkey" if task == "passkey" else "ruler",
        "needle": "The magic number is {value}.",
        "value": "digits:7",
        "keys": 1,
        "match": "all",
    }
    spec = {
        "preset": preset,
        "haystack": haystack,
        "text_field": "text",
        "lengths": lengths,
        "depths": [] if task == "passkey" else list(depths),
        "random_depth": task == "passkey",
        "samples": samples,
        "scoring": scoring,
        "max_new_tokens": None,
        "snap": False,
        "chat_template": False,
        "methods": list(acc),
        "seed": 0,
        **(extra_spec or {}),
    }
    record = _record(
        task,
        spec,
        model,
        started,
        "success",
        original,
        dtype,
        haystack={"haystack": haystack},
        scoring={"name": scoring, "rule": "all", "llm_judge": False},
    )
    rows = []
    for label, values in acc.items():
        for length, correct in values.items():
            per_sample = correct if isinstance(correct, list) else [correct] * samples
            for _d_i, depth in enumerate([None] if task == "passkey" else depths):
                for s, c in enumerate(per_sample):
                    rows.append(
                        {
                            "model": model,
                            "method": label,
                            "label": label,
                            "params": {},
                            "task": task,
                            "preset": preset["name"],
                            "scoring": scoring,
                            "length": length,
                            "depth": float(depth if depth is not None else 10.0 * s),
                            "sample": s,
                            "answer": "1234567",
                            "prompt_tokens": length - 8,
                            "status": "ok",
                            "seconds": 0.1,
                            "correct": int(c),
                            "response": "1234567" if c else "no",
                        }
                    )
    return write_run(root / name, record, rows)


def entropy_run(
    root,
    name,
    *,
    model="m1",
    ent=None,
    docs=("d1", "d2"),
    layers="all",
    heads="all",
    bos=True,
    data="pydoc",
    started="2026-01-01T00:00:00+00:00",
    status="success",
    original=128,
    dtype="float32",
    failed=(),
    skip_docs=(),
):
    """ent: {label: {length: entropy (every document: that value + 0.1 x document index)}}; failed: (label, length,
    status) points recorded as failures for every document; skip_docs: (label, length, doc) points not written."""
    ent = ent or {"none": {64: 2.0, 128: 2.5}, "yarn(factor=2)": {64: 1.9, 128: 2.2}}
    lengths = sorted({L for v in ent.values() for L in v} | {f[1] for f in failed})
    spec = {
        "data": data,
        "text_field": "text",
        "docs": len(docs),
        "lengths": lengths,
        "methods": list(ent),
        "layers": layers,
        "heads": heads,
        "bos": bos,
    }
    record = _record(
        "entropy",
        spec,
        model,
        started,
        status,
        original,
        dtype,
        data={"spec": data, "documents": [{"doc": d, "tokens": 1000} for d in docs]},
        protocol={"name": "truncate", "bos": bos, "attention": "sdpa", "query_chunk": 512},
    )
    n_layers = [0, 1] if layers == "all" else list(layers)
    rows = []
    for label, values in ent.items():
        for length, value in values.items():
            for i, doc in enumerate(docs):
                if (label, length, doc) in skip_docs:
                    continue
                e = value + 0.1 * i
                rows.append(
                    {
                        "model": model,
                        "method": label.split("(")[0],
                        "label": label,
                        "params": {},
                        "task": "entropy",
                        "length": length,
                        "doc": doc,
                        "layers": n_layers,
                        "entropy_per_layer": [e] * len(n_layers),
                        "entropy": e,
                        "uniform_entropy": math.lgamma(length + 1) / length,
                        "heads": heads,
                        "seconds": 0.1,
                        "status": "ok",
                    }
                )
    for label, length, st in failed:
        for doc in docs:
            rows.append(
                {
                    "model": model,
                    "method": label.split("(")[0],
                    "label": label,
                    "params": {},
                    "task": "entropy",
                    "length": length,
                    "doc": doc,
                    "status": st,
                    "error": "out of memory",
                }
            )
    return write_run(root / name, record, rows)
