"""A small mutation check: apply one plausible one-line bug at a time to a scratch copy of the checkout, run the tests
that should catch it, and report which were killed (a test failed) and which survived.

    python benchmarks/mutants.py [--only NAME] [--start K]

Each mutant is (name, file, the exact text, its replacement, the test files to run). The copy lives in a temporary
folder (the working tree is never touched); the tests run there with `python -m pytest -x -q`. A mutant whose text
is not found is reported as stale (the code moved on: update the list). Each distinct test list first runs on the
unmutated copy (--no-baseline skips it): a list that fails there kills nothing, and its mutants are reported as
such. A mutant counts as killed when pytest reports a failed test (exit 1) or a test crashes the interpreter (a
signal), not on a collection error or an empty selection (ERROR). Exit 1 unless every mutant was killed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESUME = "tests/test_resume_and_rollback.py"
JOB = "tests/evals/tune/test_job.py"
SPACE = "tests/evals/tune/test_space.py"
ROPE_CONFIG = "tests/models/test_rope_config.py"
VLLM_ROPE = "tests/models/test_vllm_rope.py"
ENGINE = "tests/models/test_vllm_engine.py"
KERNELS = "tests/attention/test_kernels.py"
SHIFTED = ["tests/attention/test_shifted.py", "tests/conformance/test_dca_string.py"]
TEMPERATURE = ["tests/attention/test_temperature.py"]
BUDGET = "tests/evals/tune/test_time_budget.py"
IDENTICAL = "tests/cli/test_identical_methods.py"
# the synthetic merge (the scratch copy has no results/, which the property tests over the committed runs read)
MERGED = "tests/report/test_merged_equals_runs.py::test_merged_runs_of_different_models_methods_and_grids_print_each_runs_own_valid_length"
MUTANTS = [
    (
        "needle resume key without depth",
        "ctxeval/runs/rows.py",
        '"needle": ("model", "label", "length", "depth", "sample")',
        '"needle": ("model", "label", "length", "sample")',
        [RESUME],
    ),
    (
        "needle resume key without sample",
        "ctxeval/runs/rows.py",
        '"needle": ("model", "label", "length", "depth", "sample")',
        '"needle": ("model", "label", "length", "depth")',
        [RESUME],
    ),
    (
        "ppl resume key without doc",
        "ctxeval/runs/rows.py",
        '"ppl": ("model", "label", "length", "doc")',
        '"ppl": ("model", "label", "length")',
        [RESUME],
    ),
    (
        "entropy resume key without doc",
        "ctxeval/runs/rows.py",
        '"entropy": ("model", "label", "length", "doc")',
        '"entropy": ("model", "label", "length")',
        [RESUME],
    ),
    (
        "failed points count as done",
        "ctxeval/runs/store.py",
        'for r in self.rows() if r.get("status") == "ok"}',
        "for r in self.rows()}",
        [RESUME],
    ),
    ("read-back tolerance 1e-1", "ctxeval/rope/patching.py", "READBACK_RTOL = 1e-5", "READBACK_RTOL = 1e-1", [RESUME]),
    (
        # verify's own restore before its error is redundant since apply() restores on any exception (4c8b822):
        # dropping it is an equivalent mutant, so the mutant drops apply's, which the undecodable layout needs
        "failed read-back leaves the model patched",
        "ctxeval/rope/patching.py",
        "leaves the model as it was, too\n            self.restore()\n            raise",
        "leaves the model as it was, too\n            raise",
        [RESUME, "tests/rope/test_patching.py"],
    ),
    (
        "dynamic-yarn ignores original_max_position_embeddings",
        "ctxeval/rope/methods.py",
        '    L = _length(geom, params)\n    s = max(params["finetuned_factor"], (L if length is None else length) / L)',
        '    L = geom.original_length\n    s = max(params["finetuned_factor"], (L if length is None else length) / L)',
        [RESUME],
    ),
    (
        "DeepSeek mscale ratio inverted",
        "ctxeval/rope/methods.py",
        'return mscale(s, params["mscale"]) / mscale(s, params["mscale_all_dim"])',
        'return mscale(s, params["mscale_all_dim"]) / mscale(s, params["mscale"])',
        [RESUME, "tests/rope/test_methods.py"],
    ),
    (
        "self-extend query shift W instead of W - W//G",
        "ctxeval/attention/methods.py",
        "return q_pos // g + w - w // g, k_pos // g",
        "return q_pos // g + w, k_pos // g",
        ["tests/attention/test_methods.py"],
    ),
    (
        "rerope window inclusive",
        "ctxeval/attention/methods.py",
        "near = (q_pos[:, rows, None] - k_pos[:, None, band]) < window",
        "near = (q_pos[:, rows, None] - k_pos[:, None, band]) <= window",
        ["tests/attention/test_methods.py"],
    ),
    (
        "logn never below 1 dropped",
        "ctxeval/attention/methods.py",
        ".clamp(min=1.0)",
        ".clamp(min=0.0)",
        ["tests/attention/test_methods.py"],
    ),
    (
        "longrope long factors at L itself",
        "ctxeval/rope/methods.py",
        "long = length is not None and length > L",
        "long = length is not None and length >= L",
        ["tests/rope/test_methods.py"],
    ),
    (
        "truncate window aggregate: the sum, not the mean",
        "ctxeval/evals/perplexity.py",
        "                    total,\n                    n,\n                    total / n,\n                    1,\n",
        "                    total,\n                    n,\n                    total,\n                    1,\n",
        [RESUME],
    ),
    (
        "sliding window aggregate sums window sums",
        "ctxeval/evals/perplexity.py",
        "window_sum += float(new.mean())",
        "window_sum += float(new.sum())",
        [RESUME],
    ),
    (
        "needle generation under a dynamic method not frozen",
        "ctxeval/models/generation.py",
        "        handle.freeze_length(frozen_length)",
        "        pass",
        [RESUME],
    ),
    (
        "needle answers matched case-sensitively",
        "ctxeval/evals/haystack.py",
        "return all(answer.lower() in response.lower() for answer in sample.answers)",
        "return all(answer in response for answer in sample.answers)",
        [RESUME],
    ),
    (
        "needle terms matched case-sensitively",
        "ctxeval/evals/haystack.py",
        "return all(term.lower() in response.lower() for term in preset.match_terms)",
        "return all(term in response for term in preset.match_terms)",
        [RESUME],
    ),
    (
        "RULER scoring all-or-nothing",
        "ctxeval/evals/ruler/generate.py",
        'return sum(found) / len(found) if metric == "string_match_all" else max(found)',
        'return min(found) if metric == "string_match_all" else max(found)',
        ["tests/evals/ruler/test_generate.py"],
    ),
    # issue 43: tune, export, rope_config, the vLLM read-back and engine, file limits, fused-kernel masks
    (
        "longrope short key without the attention factor",
        "ctxeval/evals/tune/scoring.py",
        "            freqs.attention_factor,\n            int(spec.resolved.get(START_TOKENS) or 0),\n",
        "            int(spec.resolved.get(START_TOKENS) or 0),\n",
        [
            # the end-to-end test searches the short factors too since 2e0c79e (no two trials share a short RoPE, so
            # no trial reuses another's forward there): the key's own test decides
            f"{JOB}::test_the_short_forward_is_reused_only_for_the_same_rope_up_to_the_trained_length",
            f"{JOB}::test_every_longrope_trial_measures_the_trained_length_with_its_own_short_rope",
        ],
    ),
    (
        "held-out sweep on the tuning documents",
        "ctxeval/evals/tune/job.py",
        "lm, specs, job.heldout, PplConfig",
        "lm, specs, job.tuning, PplConfig",
        [f"{JOB}::test_the_heldout_rows_are_measured_on_the_heldout_documents_alone"],
    ),
    (
        "held-out split overlaps the tuning documents by one",
        "ctxeval/evals/tune/search.py",
        "return docs[:n_tune], docs[n_tune : n_tune + n_heldout]",
        "return docs[:n_tune], docs[n_tune - 1 : n_tune - 1 + n_heldout]",
        [f"{JOB}::test_the_heldout_rows_are_measured_on_the_heldout_documents_alone"],
    ),
    (
        "an attention method's fixed parameter searched",
        "ctxeval/evals/tune/space.py",
        "            if name not in a.given:\n",
        "            if True:\n",
        [SPACE],
    ),
    (
        "a trial's attention method starts from no parameters",
        "ctxeval/evals/tune/space.py",
        "attention = {a.name: dict(a.given) for a in self.base.attention}",
        "attention = {a.name: {} for a in self.base.attention}",
        [SPACE],
    ),
    (
        "export tolerance 1e-6 -> 1e-2",
        "ctxeval/evals/tune/export.py",
        "EXPORT_RTOL = 1e-6",
        "EXPORT_RTOL = 1e-2",
        ["tests/evals/tune/test_export.py"],
    ),
    (
        "vLLM read-back tolerance 1e-5 -> 1e-4",
        "ctxeval/models/vllm_rope.py",
        "READBACK_RTOL = 1e-5",
        "READBACK_RTOL = 1e-4",
        [VLLM_ROPE],
    ),
    (
        "the winner taken without the guard",
        "ctxeval/evals/tune/search.py",
        'ok = [r for r in rows if r.get("status") == "ok" and r.get("feasible")]',
        'ok = [r for r in rows if r.get("status") == "ok"]',
        [f"{JOB}::test_an_infeasible_trial_that_beats_every_feasible_one_does_not_win"],
    ),
    (
        "llama3 entry: frequency factors swapped",
        "ctxeval/models/rope_config.py",
        '"low_freq_factor": p["low_freq_factor"],\n            "high_freq_factor": p["high_freq_factor"],',
        '"low_freq_factor": p["high_freq_factor"],\n            "high_freq_factor": p["low_freq_factor"],',
        [ROPE_CONFIG],
    ),
    (
        "yarn entry: truncate forced true",
        "ctxeval/models/rope_config.py",
        '"truncate": p["truncate"],',
        '"truncate": True,',
        [ROPE_CONFIG],
    ),
    (
        "pi entry: 1/factor",
        "ctxeval/models/rope_config.py",
        '{"rope_type": "linear", "factor": p["factor"], **base}',
        '{"rope_type": "linear", "factor": 1 / p["factor"], **base}',
        [ROPE_CONFIG],
    ),
    (
        "longrope entry: short and long lists swapped",
        "ctxeval/models/rope_config.py",
        '"short_factor": list(p["short_factor"]),\n            "long_factor": list(p["long_factor"]),',
        '"short_factor": list(p["long_factor"]),\n            "long_factor": list(p["short_factor"]),',
        [ROPE_CONFIG],
    ),
    (
        "Phi-3 LongRoPE probe rows swapped",
        "ctxeval/models/vllm_engine.py",
        "rows = table.shape[0] - original if module.use_long_rope else original",
        "rows = original if module.use_long_rope else table.shape[0] - original",
        [ENGINE],
    ),
    (
        "vLLM memory fraction: CPU and GPU swapped",
        "ctxeval/models/vllm_engine.py",
        '0.9 if self.device != "cpu" else CPU_MEMORY_FRACTION',
        'CPU_MEMORY_FRACTION if self.device != "cpu" else 0.9',
        [ENGINE],
    ),
    (
        "vLLM enforce_eager on a GPU",
        "ctxeval/models/vllm_engine.py",
        '"enforce_eager": self.device == "cpu",',
        '"enforce_eager": True,',
        [ENGINE],
    ),
    (
        "an oversize file cut silently",
        "ctxeval/util/textfiles.py",
        "raw = fh.read(max_bytes + 1)",
        "raw = fh.read(max_bytes)",
        ["tests/util/test_textfiles.py"],
    ),
    (
        "a file at its limit refused",
        "ctxeval/util/textfiles.py",
        "if len(raw) > max_bytes:",
        "if len(raw) >= max_bytes:",
        ["tests/util/test_textfiles.py"],
    ),
    (
        "fused kernels: a finite bias on a masked key taken as a mask",
        "ctxeval/attention/kernels.py",
        "if mask.dtype != torch.bool and not bool(((mask == 0) | (mask <= torch.finfo(mask.dtype).min / 2)).all()):",
        "if False:",
        [KERNELS],
    ),
    (
        "fused kernels: a mask changed in place keeps its old verdict",
        "ctxeval/attention/kernels.py",
        "if mask is not self.mask or version != self.version:",
        "if mask is not self.mask:",
        [KERNELS],
    ),
    # issue 43's own check over the code issue 40 added (DCA, STRING, query temperatures, DeepSeek's softmax scale,
    # NTK-mixed, their search spaces and presets)
    (
        "dca: successive query clamped one short",
        "ctxeval/attention/shifted.py",
        "(q_pos % c + c).clamp(max=chunk)",
        "(q_pos % c + c).clamp(max=chunk - 1)",
        SHIFTED,
    ),
    (
        "dca: inter query at chunk_size",
        "ctxeval/attention/shifted.py",
        "torch.full_like(q_pos, min(2 * c - 1, chunk))",
        "torch.full_like(q_pos, chunk)",
        SHIFTED,
    ),
    (
        "dca: inter rule drops the chunk two back",
        "ctxeval/attention/shifted.py",
        "lambda qi, kj: kj // c <= qi // c - 2",
        "lambda qi, kj: kj // c < qi // c - 2",
        SHIFTED,
    ),
    (
        "dca: intra rule takes earlier chunks too",
        "ctxeval/attention/shifted.py",
        "lambda qi, kj: qi // c == kj // c",
        "lambda qi, kj: qi // c >= kj // c",
        SHIFTED,
    ),
    (
        "dca: keys modulo chunk_size, not chunk_size - local",
        "ctxeval/attention/shifted.py",
        "k_new = k_pos % c\n",
        "k_new = k_pos % chunk\n",
        SHIFTED,
    ),
    (
        "string: prefill's key at S in the near part dropped",
        "ctxeval/attention/shifted.py",
        "(lambda qi, kj: qi - kj <= shift) if prefill",
        "(lambda qi, kj: qi - kj < shift) if prefill",
        SHIFTED,
    ),
    (
        "string: decoding's key at S counted twice",
        "ctxeval/attention/shifted.py",
        "else (lambda qi, kj: qi - kj < shift)",
        "else (lambda qi, kj: qi - kj <= shift)",
        SHIFTED,
    ),
    (
        "string: shifted query without + local",
        "ctxeval/attention/shifted.py",
        "(q_pos - shift + local, k_pos,",
        "(q_pos - shift, k_pos,",
        SHIFTED,
    ),
    (
        "dca chunkllama temperature 0.05 -> 0.1",
        "ctxeval/attention/shifted.py",
        "0.05 * torch.log(n / scale_from) + 1",
        "0.1 * torch.log(n / scale_from) + 1",
        SHIFTED,
    ),
    (
        "dca vllm temperature not squared",
        "ctxeval/attention/shifted.py",
        "return one, factor * factor",
        "return one, factor",
        SHIFTED,
    ),
    (
        "dca vllm temperature allowed below 1",
        "ctxeval/attention/shifted.py",
        "(0.1 * torch.log(n / scale_from) + 1).clamp(min=1.0)",
        "(0.1 * torch.log(n / scale_from) + 1)",
        SHIFTED,
    ),
    (
        "string: attention factor dropped",
        "ctxeval/attention/shifted.py",
        'return one * spec.params["attention_factor"], one',
        "return one, one",
        SHIFTED,
    ),
    (
        "fused: sequence length off by one",
        "ctxeval/attention/shifted.py",
        "rotary, logit = gains(spec, k_pos[:, -1] + 1, original_length)\n    q = scale_rotary",
        "rotary, logit = gains(spec, k_pos[:, -1], original_length)\n    q = scale_rotary",
        SHIFTED,
    ),
    (
        "fused: q's rotary gain not squared",
        "ctxeval/attention/shifted.py",
        "q = scale_rotary(q, rotary * rotary, 2 * inv_freq.numel())",
        "q = scale_rotary(q, rotary, 2 * inv_freq.numel())",
        SHIFTED,
    ),
    (
        "fused dca: previous chunk's query clamp one short",
        "ctxeval/attention/shifted.py",
        "positions.clamp(max=n * c + local)",
        "positions.clamp(max=n * c + local - 1)",
        SHIFTED,
    ),
    (
        "fused dca: earliest chunks stop one chunk early",
        "ctxeval/attention/shifted.py",
        "early = slice(0, (n - 1) * c)",
        "early = slice(0, (n - 2) * c)",
        SHIFTED,
    ),
    (
        "fused string: band not one key wider in a prefill",
        "ctxeval/attention/shifted.py",
        "near = shift + 1 if tq == tk else shift",
        "near = shift",
        SHIFTED,
    ),
    (
        "fused string: far query moved the wrong way",
        "ctxeval/attention/shifted.py",
        "torch.full_like(q_pos[b, first:], local - shift)",
        "torch.full_like(q_pos[b, first:], shift - local)",
        SHIFTED,
    ),
    (
        "fused dca: far keys modulo chunk_size",
        "ctxeval/attention/shifted.py",
        "delta = k_pos % c - k_pos",
        "delta = k_pos % sizes[0] - k_pos",
        SHIFTED,
    ),
    (
        "dca probe stops before the inter rule",
        "ctxeval/attention/shifted.py",
        "needed = 2 * (chunk - local) + 48 if",
        "needed = (chunk - local) + 48 if",
        SHIFTED,
    ),
    (
        "dca default chunk L/2",
        "ctxeval/attention/methods.py",
        "original_length * 3 // 4",
        "original_length // 2",
        SHIFTED,
    ),
    (
        "dca default local L/16",
        "ctxeval/attention/methods.py",
        'local = spec.params.get("local_size") or original_length // 8',
        'local = spec.params.get("local_size") or original_length // 16',
        SHIFTED,
    ),
    (
        "dca: chunk equal to local accepted",
        "ctxeval/attention/methods.py",
        "if local < 1 or chunk <= local:",
        "if local < 1 or chunk < local:",
        SHIFTED,
    ),
    (
        "string default shift 0.25 L",
        "ctxeval/attention/methods.py",
        "int(0.33 * original_length)",
        "int(0.25 * original_length)",
        SHIFTED,
    ),
    (
        "string: shift past the trained length accepted",
        "ctxeval/attention/methods.py",
        "if shift < 1 or shift > original_length:",
        "if shift < 1 or shift > 2 * original_length:",
        SHIFTED,
    ),
    (
        "dca no-op claimed up to chunk_size",
        "ctxeval/attention/methods.py",
        "if longest > chunk - local or",
        "if longest > chunk or",
        SHIFTED,
    ),
    (
        "dca vllm temperature from the trained length, not original",
        "ctxeval/attention/methods.py",
        '(spec.params.get("original") or original_length) if scale == "vllm" else original_length',
        "original_length",
        SHIFTED,
    ),
    (
        "llama4 q scale: p instead of p + 1",
        "ctxeval/attention/temperature.py",
        "torch.floor((p + 1.0) / floor_scale) + 1.0",
        "torch.floor(p / floor_scale) + 1.0",
        TEMPERATURE,
    ),
    (
        "mistral q scale: p + 1 instead of p",
        "ctxeval/attention/temperature.py",
        "torch.log(1.0 + torch.floor(p / original))",
        "torch.log(1.0 + torch.floor((p + 1.0) / original))",
        TEMPERATURE,
    ),
    (
        "layers=nope scales every layer",
        "ctxeval/attention/temperature.py",
        'return spec.params.get("layers", "all") == "all" or module is None or not uses_rope(module)',
        "return True",
        TEMPERATURE,
    ),
    (
        "llama4 first scaled position one late",
        "ctxeval/attention/temperature.py",
        'return int(spec.params["floor_scale"]) - 1',
        'return int(spec.params["floor_scale"])',
        TEMPERATURE,
    ),
    (
        "shipped llama4 temperature on every layer",
        "ctxeval/attention/temperature.py",
        '"floor_scale": int(text.floor_scale), "layers": "nope"}',
        '"floor_scale": int(text.floor_scale), "layers": "all"}',
        TEMPERATURE,
    ),
    (
        "deepseek softmax factor not squared",
        "ctxeval/rope/softmax_scale.py",
        'return _m(float(params["factor"]), float(params["mscale_all_dim"])) ** 2',
        'return _m(float(params["factor"]), float(params["mscale_all_dim"]))',
        ["tests/rope/test_softmax_scale.py"],
    ),
    (
        "deepseek m(s, x) without x",
        "ctxeval/rope/softmax_scale.py",
        "0.1 * x * math.log(scale) + 1.0",
        "0.1 * math.log(scale) + 1.0",
        ["tests/rope/test_softmax_scale.py"],
    ),
    (
        "ntk-mixed exponents from pair 0",
        "ctxeval/rope/methods.py",
        "exponents = (np.arange(1, half + 1, dtype=np.float64) / half) ** b",
        "exponents = (np.arange(0, half, dtype=np.float64) / half) ** b",
        ["tests/rope/test_ntk_mixed.py"],
    ),
    (
        "tune: dca chunk range per factor",
        "ctxeval/evals/tune/space.py",
        '"chunk_size": Range(0.5, 1.0, per="length")',
        '"chunk_size": Range(0.5, 1.0, per="factor")',
        ["tests/evals/tune/test_space.py"],
    ),
    (
        "qwen2.5-1m-dca preset local 4096",
        "ctxeval/specs.py",
        '{"chunk_size": "262144", "local_size": "8192", "scale": "vllm", "original": "262144"},\n            \'Qwen2.5-7B',
        '{"chunk_size": "262144", "local_size": "4096", "scale": "vllm", "original": "262144"},\n            \'Qwen2.5-7B',
        SHIFTED,
    ),
    # issue 53, part 2: one-line bugs the suite of its day did not notice
    (
        "json_kv demos drawn from every pair",
        "ctxeval/evals/retrieval/helmet_json_kv.py",
        "rng.sample([i for i in range(num_kvs) if i != gold_index], shots)",
        "rng.sample(list(range(num_kvs)), shots)",
        ["tests/evals/retrieval/test_json_kv_demos.py"],
    ),
    (
        "retrieval sizer takes the shortest depth's prompt",
        "ctxeval/evals/retrieval/suite.py",
        "longest = max(self.count(self.build(seed, size, d).text) for d in depths)",
        "longest = min(self.count(self.build(seed, size, d).text) for d in depths)",
        ["tests/evals/retrieval/test_sizer_depths.py"],
    ),
    (
        "tune budget: a method's first trial not guaranteed",
        "ctxeval/evals/tune/search.py",
        "if deadline is None or not counted(finished(study)):",
        "if deadline is None:",
        [BUDGET],
    ),
    (
        "tune budget: the expected trial time taken as 0",
        "ctxeval/evals/tune/search.py",
        "expected = statistics.median(durations) if durations else 0.0",
        "expected = 0.0",
        [BUDGET],
    ),
    (
        "tune budget: each method's share of the whole, not of what is left",
        "ctxeval/evals/tune/job.py",
        "(end - time.monotonic()) / (len(families) - index)",
        "(end - time.monotonic()) / len(families)",
        [BUDGET],
    ),
    (
        "naming: --trials names another default directory",
        "ctxeval/runs/naming.py",
        '        "trials",\n',
        "",
        ["tests/runs/test_naming.py"],
    ),
    (
        "naming: --time-budget names another default directory",
        "ctxeval/runs/naming.py",
        '        "time_budget",\n',
        "",
        ["tests/runs/test_naming.py", f"{BUDGET}::test_a_larger_budget_continues_the_study_in_the_default_directory"],
    ),
    (
        "naming: --chunk-size names another default directory",
        "ctxeval/runs/naming.py",
        '        "chunk_size",  # ppl, tune: positions per LM-head chunk (memory)\n',
        "",
        ["tests/runs/test_naming.py"],
    ),
    (
        "identical methods: inv_freq tolerance 1e-12 -> 1e-3",
        "ctxeval/specs.py",
        "np.allclose(a.inv_freq, b.inv_freq, rtol=1e-12, atol=0)",
        "np.allclose(a.inv_freq, b.inv_freq, rtol=1e-3, atol=0)",
        [IDENTICAL],
    ),
    (
        "identical methods: attention factor tolerance 1e-12 -> 1e-3",
        "ctxeval/specs.py",
        "math.isclose(a.attention_factor, b.attention_factor, rel_tol=1e-12)",
        "math.isclose(a.attention_factor, b.attention_factor, rel_tol=1e-3)",
        [IDENTICAL],
    ),
    (
        "ruler length fit without its safety margin",
        "ctxeval/evals/ruler/fit.py",
        "SURE_MARGIN = 1.25",
        "SURE_MARGIN = 1.0",
        ["tests/evals/ruler/test_fit.py"],
    ),
    # issue 53, part 1: the merged report's valid lengths and the figures' colours
    (
        "encodings table reads valid lengths by row position",
        "ctxeval/report/kinds/ppl.py",
        "        mine = valid[(model, row[1])]\n",
        "        mine = list(valid.values())[len(raw)]\n",
        [MERGED],
    ),
    (
        "a walk stopped at a length never measured counts as failed",
        "ctxeval/report/tables.py",
        "return valid, None if unmeasured(label, length) else int(length)",
        "return valid, int(length)",
        [MERGED],
    ),
    (
        "a learned table's lengths past it left out of the merged table",
        "ctxeval/report/kinds/ppl.py",
        "cells.update({(model, label, int(n)): (None, BEYOND_POSITIONS) for n in beyond})",
        "cells.update({(model, label, int(n)): (None, BEYOND_POSITIONS) for n in beyond if (model, label, n) in cells})",
        [MERGED],
    ),
    (
        "a run's own table without the lengths past its learned table",
        "ctxeval/report/kinds/ppl_run.py",
        'for length in store.record.get("beyond_positions") or []:',
        "for length in []:",
        [MERGED],
    ),
    (
        "spare colours run out (the old finite list)",
        "ctxeval/report/plots.py",
        "spare = spare_colors(set(map(mcolors.to_hex, colors.values())))",
        "spare = iter([c for c in SPARE_COLORS if c not in colors.values()] * 4)",
        ["tests/report/test_plots.py"],
    ),
]


def ignored(folder: str, names: list[str]) -> set[str]:
    """What the scratch copy leaves out: the checkout's .git, virtual environments, committed results and run
    directories at its top only (ctxeval/runs and tests/runs are code: a pattern matched at every level once left
    them out, so every test that imports them failed at collection and each mutant counted as killed), and caches
    anywhere."""
    skipped = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    if Path(folder).resolve() == ROOT:
        skipped |= {n for n in names if n in (".git", "results", "runs") or n.startswith(".venv")}
    return skipped


def pytest(scratch: Path, tests: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
        cwd=scratch,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(scratch)},
    )


def first_failure(output: str) -> str:
    """The first `FAILED test id` of pytest's summary (what killed the mutant), or the last line of its output."""
    failed = [
        line.split(" - ")[0].removeprefix("FAILED ") for line in output.splitlines() if line.startswith("FAILED ")
    ]
    return failed[0] if failed else (output.strip().splitlines() or [""])[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="run the mutants whose name contains this")
    parser.add_argument("--start", type=int, default=1, help="run the mutants from this one on (1-based)")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip running each mutant's tests on the unmutated copy first"
    )
    args = parser.parse_args()
    chosen = [m for m in MUTANTS[args.start - 1 :] if args.only is None or args.only in m[0]]
    counts = {"killed": 0, "SURVIVED": 0, "STALE": 0, "ERROR": 0, "BASELINE": 0}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "tree"
        shutil.copytree(ROOT, scratch, ignore=ignored)
        broken: set[tuple[str, ...]] = set()
        if not args.no_baseline:  # a test that fails unmutated kills nothing: its mutants are not counted as killed
            for tests in dict.fromkeys(tuple(m[4]) for m in chosen):
                start = time.perf_counter()
                result = pytest(scratch, list(tests))
                ok = result.returncode == 0
                print(f"{'baseline' if ok else 'BASELINE':<9} {' '.join(tests)}  ({time.perf_counter() - start:.0f} s)")
                if not ok:
                    broken.add(tests)
                    print(f"          {first_failure(result.stdout + result.stderr)}", flush=True)
        for name, rel, old, new, tests in chosen:
            path = scratch / rel
            original = path.read_text()
            if original.count(old) != 1:
                print(f"STALE     {name}: the text is not in {rel} exactly once", flush=True)
                counts["STALE"] += 1
                continue
            if tuple(tests) in broken:
                print(f"BASELINE  {name}: its tests fail on the unmutated copy", flush=True)
                counts["BASELINE"] += 1
                continue
            path.write_text(original.replace(old, new))
            start = time.perf_counter()
            result = pytest(scratch, tests)
            path.write_text(original)
            # pytest exits 1 when a test failed; a test that crashes the interpreter (a signal: negative) fails the
            # suite too; 2-5 (a collection error, no tests collected, a usage error) kill nothing
            rc = result.returncode
            verdict = "SURVIVED" if rc == 0 else "killed" if rc == 1 or rc < 0 else "ERROR"
            counts[verdict] += 1
            print(f"{verdict:<9} {name}  ({time.perf_counter() - start:.0f} s)", flush=True)
            if rc < 0:
                crashed = [line for line in result.stderr.splitlines() if line.startswith("Fatal Python error")]
                where = [line for line in result.stderr.splitlines() if "/tests/" in line and "line" in line]
                print(f"          crashed (signal {-rc}): {' '.join(crashed[:1] + where[:1])}", flush=True)
            elif verdict != "SURVIVED":
                print(f"          exit {rc}: {first_failure(result.stdout + result.stderr)}", flush=True)
    print(
        f"{counts['killed']} of {len(chosen)} killed; {counts['SURVIVED']} survived, {counts['STALE']} stale, "
        f"{counts['ERROR']} errors, {counts['BASELINE']} with failing baselines ({time.perf_counter() - began:.0f} s)"
    )
    return 0 if counts["killed"] == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
