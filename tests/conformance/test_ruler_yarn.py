"""RULER's scoring and the YaRN repository's frequencies, transcribed from the originals and compared with ctxeval.

Neither original is installable (no package, no network in CI), so each path is transcribed here from input to the
printed number, and every step names the original file and line it comes from:

  NVIDIA/RULER c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a
    scripts/eval/evaluate.py            postprocess_pred (l. 50-58); get_pred_and_ref (l. 76-86);
                                        run_evaluation_per_task (l. 96-101): the task score is metric_fn over the
                                        task's list of predictions, which main() (l. 204-211) writes to summary.csv
    scripts/eval/synthetic/constants.py string_match_part (l. 24-26), string_match_all (l. 28-30), TASKS (l. 33-49)
    scripts/synthetic.yaml              each task's `task:` (l. 15-121), i.e. its metric_fn
  ctxeval side: evals/ruler/generate.py postprocess + score, one row per sample as evals/ruler/run.py RulerRunner.measure
  writes it (common.point_row), report/tables.py ruler_task_scores (the score written to ruler.csv and table.md).

  jquesnelle/yarn 995db5b575e75230b3384d658f8b944c9662f775
    scaled_rope/LlamaYaRNScaledRotaryEmbedding.py  find_correction_dim (l. 5-6), find_correction_range (l. 9-14),
        linear_ramp_mask (l. 16-22), get_mscale (l. 24-27), LlamaYaRNScaledRotaryEmbedding.__init__ (l. 30-43) and
        .yarn (l. 74-84): static YaRN, against compute("yarn")
    scaled_rope/modeling_llama_together_yarn.py    _yarn_* helpers (l. 92-114), FlashYaRNRotaryEmbedding.__init__
        (l. 132-176), _compute_inv_freq (l. 178-186), _compute_inv_freq_original (l. 188-191) and the frequency part
        of _update_cos_sin_cache (l. 193-213): dynamic YaRN (finetuned and not), against compute("dynamic-yarn")
  The YaRN transcriptions run in float64: the repo's `.float()` and `torch.float32` (l. 20, 75, 80; 107, 179, 184,
  190) become float64, nothing else changes (as written, float32 alone differs from ctxeval's float64 by ~4e-7).
"""

import math
import random
import re

import numpy as np
import pytest
import torch

from ctxeval.evals.common import point_row
from ctxeval.evals.ruler.generate import postprocess, score
from ctxeval.evals.ruler.tasks import FAMILIES, TASKS
from ctxeval.report.tables import ruler_task_scores
from ctxeval.rope.methods import Geometry, compute
from ctxeval.specs import expand_specs

# ===================================================================================================================
# RULER c3f5e3b: transcription


# scripts/eval/synthetic/constants.py l. 24-26
def string_match_part(preds, refs):
    score = (
        sum([max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) for pred, ref in zip(preds, refs)])
        / len(preds)
        * 100
    )
    return round(score, 2)


# scripts/eval/synthetic/constants.py l. 28-30
def string_match_all(preds, refs):
    score = (
        sum(
            [sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref) for pred, ref in zip(preds, refs)]
        )
        / len(preds)
        * 100
    )
    return round(score, 2)


# the per-sample summands of the two sums above (constants.py l. 25 and l. 29, the expressions inside `sum([...])`)
def part_summand(pred, ref):
    return max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref])


def all_summand(pred, ref):
    return sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref)


# scripts/eval/synthetic/constants.py l. 33-49
RULER_FAMILY_METRIC = {
    "niah": string_match_all,
    "variable_tracking": string_match_all,
    "common_words_extraction": string_match_all,
    "freq_words_extraction": string_match_all,
    "qa": string_match_part,
}

# scripts/synthetic.yaml: `<task>:` / `  task: <family>` (l. 15-16, 25-26, 35-36, 45-46, 55-56, 65-66, 75-76, 85-86,
# 95-96, 102-103, 109-110, 114-115, 119-120)
RULER_TASK_FAMILY = {
    "niah_single_1": "niah",
    "niah_single_2": "niah",
    "niah_single_3": "niah",
    "niah_multikey_1": "niah",
    "niah_multikey_2": "niah",
    "niah_multikey_3": "niah",
    "niah_multivalue": "niah",
    "niah_multiquery": "niah",
    "vt": "variable_tracking",
    "cwe": "common_words_extraction",
    "fwe": "freq_words_extraction",
    "qa_1": "qa",
    "qa_2": "qa",
}


# scripts/eval/evaluate.py l. 50-58
def postprocess_pred(predict_str: str, task_config: dict):

    predict_str = predict_str.strip()

    # Remove all non-printable characters
    np_pattern = re.compile(r"[\x00-\x1f]")
    predict_str = np_pattern.sub("\n", predict_str).strip()

    return predict_str


def ruler_task_score(lines, task_config):
    """scripts/eval/evaluate.py run_evaluation_per_task (l. 90-113) on the lines of one `<task>.jsonl`, without the
    file: get_pred_and_ref's loop (l. 76-86) and the score (l. 96-101). Returns (task_score, task_nulls, predicts)."""
    predicts, references = [], []
    for line in lines:  # l. 76
        predict = line["pred"]  # l. 78
        predict = postprocess_pred(predict, task_config)  # l. 79
        reference = line.get("outputs", [line.get("output", "")])  # l. 80
        predicts.append(predict)  # l. 84
        references.append(reference)  # l. 85
    task_nulls = f"{sum([len(x) == 0 for x in predicts])}/{len(predicts)}"  # l. 96
    if len(references) > 0 and references[0][0] is not None:  # l. 98
        task_score = task_config["metric_fn"](predicts, references)  # l. 99
    else:
        task_score = 0.0  # l. 101
    return task_score, task_nulls, predicts


# ===================================================================================================================
# RULER: seeded random predictions and references

CONTROL = "".join(chr(c) for c in range(0x20)) + "\x7f"
FILL = "abcXYZ0123456789 .,:;-_'\"()" + "ÉéßİıΣσ\u00a0\u2028" + CONTROL


def random_reference(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return str(rng.randint(10**6, 10**7 - 1))  # niah numbers
    if kind == 1:
        return "-".join("".join(rng.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12))  # uuid
    if kind == 2:
        return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))  # vt variable
    if kind == 3:
        return rng.choice(["apple", "Zebra", "wonderful", "Straße", "İstanbul", "ΣΟΦΙΑ"])  # words, odd case rules
    if kind == 4:
        return rng.choice(["New York City", "the 1990s", "John F. Kennedy", "a b"])  # qa answers with spaces
    return rng.choice(["", "a\tb", "x\ny"])  # degenerate: empty, control characters inside


def random_prediction(rng, refs):
    shape = rng.randrange(10)
    if shape == 0:
        return ""
    if shape == 1:
        return "".join(rng.choice(" \t\n\r\x00\x0b\x0c\x1f") for _ in range(rng.randint(1, 6)))  # empty after strip
    parts = ["".join(rng.choice(FILL) for _ in range(rng.randint(0, 8)))]
    for r in refs:
        if rng.random() < 0.6:
            case = rng.random()
            parts.append(r.upper() if case < 0.25 else r.lower() if case < 0.5 else r.swapcase() if case < 0.6 else r)
        parts.append("".join(rng.choice(FILL) for _ in range(rng.randint(0, 4))))
    return "".join(parts)


def random_task(rng, n):
    """n samples of one task: (raw prediction, references) with 1 to 10 references each."""
    out = []
    for _ in range(n):
        refs = [random_reference(rng) for _ in range(rng.randint(1, 10))]
        out.append((random_prediction(rng, refs), refs))
    return out


def ctxeval_rows(task, length, samples, spec):
    """One row per sample as RulerRunner.measure writes it (ctxeval/evals/ruler/run.py: postprocess, score,
    point_row with value = score = the sample's score)."""
    family = FAMILIES[TASKS[task].family]
    rows = []
    for index, (raw, refs) in enumerate(samples):
        prediction = postprocess(raw)
        value = score(family.metric, prediction, refs)
        rows.append(
            point_row(
                "m",
                spec,
                "ruler",
                value=value,
                ruler_task=task,
                length=length,
                sample=index,
                score=value,
                prediction=prediction,
                outputs=refs,
                metric_fn=family.metric,
                prompt_tokens=length,
                seconds=0.0,
                status="ok",
            )
        )
    return rows


# ===================================================================================================================
# RULER tests


def test_every_task_uses_rulers_metric():
    """synthetic.yaml's task -> family -> constants.py's metric_fn, the same as ctxeval's task table."""
    assert set(TASKS) == set(RULER_TASK_FAMILY)
    for task, family in RULER_TASK_FAMILY.items():
        assert TASKS[task].family == family
        assert FAMILIES[family].metric == RULER_FAMILY_METRIC[family].__name__


def test_postprocess_equals_rulers_postprocess_pred():
    rng = random.Random(20261202)
    raws = ["", " ", "\x00", "\x1f abc \x7f", "a\r\nb", " \u2028x\u2028 ", "\ta\x00b\x01c\x1fd\n", "x" * 3]
    for _ in range(3000):
        raws.append(random_prediction(rng, [random_reference(rng) for _ in range(rng.randint(1, 4))]))
    same = sum(postprocess(raw) == postprocess_pred(raw, {}) for raw in raws)
    assert same == len(raws)


@pytest.mark.parametrize("metric", ["string_match_all", "string_match_part"])
def test_sample_scores_equal_rulers_metric(metric):
    """ctxeval's per-sample score is the summand of RULER's metric_fn (exactly), and x100 rounded to 2 decimals it is
    metric_fn over that one sample."""
    rng = random.Random(7 if metric == "string_match_all" else 8)
    fn, summand = (string_match_all, all_summand) if metric == "string_match_all" else (string_match_part, part_summand)
    n = 0
    for raw, refs in random_task(rng, 4000):
        pred = postprocess_pred(raw, {})
        ours = score(metric, postprocess(raw), refs)
        assert ours == summand(pred, refs), (raw, refs)
        assert round(ours * 100, 2) == fn([pred], [refs]), (raw, refs)
        n += 1
    assert n == 4000


def test_task_scores_equal_rulers_evaluate():
    """The whole path: raw predictions of many tasks and lengths -> ctxeval's rows -> ruler_task_scores, against
    RULER's evaluate.py on the same predictions, exactly; ruler.csv's %.6g keeps the number as RULER prints it."""
    rng = random.Random(11)
    specs = expand_specs(["none", "yarn:factor=2"])  # two methods' rows in one store
    rows, expected = [], {}
    tasks = sorted(RULER_TASK_FAMILY)
    for trial in range(300):
        task, spec, length = rng.choice(tasks), rng.choice(specs), 1024 + trial
        n = rng.choice([1, 2, 3, 7, 8, 9, 16, 25, 50, 128, 150]) if trial % 10 == 0 else rng.randint(1, 25)
        samples = random_task(rng, n)
        lines = [
            {"index": i, "input": "...", "outputs": refs, "pred": raw, "others": {}}
            for i, (raw, refs) in enumerate(samples)
        ]
        config = {"task": RULER_TASK_FAMILY[task], "metric_fn": RULER_FAMILY_METRIC[RULER_TASK_FAMILY[task]]}
        expected[(spec.label, task, length)] = ruler_task_score(lines, config)[0]
        rows += ctxeval_rows(task, length, samples, spec)
    got = ruler_task_scores(rows)
    assert len(got) == len(expected)
    diffs = []
    for label, task, length, value, _n, status in zip(
        got["label"], got["ruler_task"], got["length"], got["score"], got["samples"], got["status"]
    ):
        want = expected[(label, task, int(length))]
        assert status == "ok"
        diffs.append(abs(float(value) - want))
        assert float(value) == want, (label, task, length, value, want)
        assert float(f"{float(value):.6g}") == want
    assert max(diffs) == 0.0
    # the transcription discriminates: a score of 2 decimals, not 1
    assert any(round(v, 1) != v for v in expected.values())


def test_empty_predictions_score_zero_and_count_as_rulers_nulls():
    lines = [
        {"index": 0, "outputs": ["123"], "pred": " \x00\n", "others": {}},
        {"index": 1, "outputs": ["ABC", "def"], "pred": "abc", "others": {}},
        {"index": 2, "outputs": ["x"], "pred": "", "others": {}},
    ]
    config = {"task": "niah", "metric_fn": string_match_all}
    ruler_score, nulls, predicts = ruler_task_score(lines, config)
    assert nulls == "2/3" and predicts == ["", "abc", ""]
    assert ruler_score == 16.67
    samples = [(line["pred"], line["outputs"]) for line in lines]
    got = ruler_task_scores(ctxeval_rows("niah_single_1", 4096, samples, expand_specs(["none"])[0]))
    assert float(got["score"].iloc[0]) == ruler_score
    assert sum(r == "" for r in (postprocess(raw) for raw, _ in samples)) == 2


# ===================================================================================================================
# YaRN 995db5b: transcription (float32 -> float64 only)


# scaled_rope/LlamaYaRNScaledRotaryEmbedding.py l. 4-6
# Inverse dim formula to find dim based on number of rotations
def find_correction_dim(num_rotations, dim, base=10000, max_position_embeddings=2048):
    return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


# l. 8-14
# Find dim range bounds based on rotations
def find_correction_range(low_rot, high_rot, dim, base=10000, max_position_embeddings=2048):
    low = math.floor(find_correction_dim(low_rot, dim, base, max_position_embeddings))
    high = math.ceil(find_correction_dim(high_rot, dim, base, max_position_embeddings))
    return max(low, 0), min(high, dim - 1)  # Clamp values just in case


# l. 16-22 (torch.float32 -> torch.float64 at l. 20)
def linear_ramp_mask(min, max, dim):
    if min == max:
        max += 0.001  # Prevent singularity

    linear_func = (torch.arange(dim, dtype=torch.float64) - min) / (max - min)
    ramp_func = torch.clamp(linear_func, 0, 1)
    return ramp_func


# l. 24-27
def get_mscale(scale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * math.log(scale) + 1.0


class StaticYaRN:
    """LlamaYaRNScaledRotaryEmbedding's frequencies: __init__ (l. 30-43, the attributes yarn() reads) and yarn()
    (l. 74-84; `.float()` -> `.double()` at l. 75 and 80, register_buffer -> attribute)."""

    def __init__(
        self,
        dim,
        max_position_embeddings=2048,
        base=10000,
        scale=1,
        original_max_position_embeddings=2048,
        extrapolation_factor=1,
        attn_factor=1,
        beta_fast=32,
        beta_slow=1,
        finetuned=False,
        device=None,
    ):
        self.dim = dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.scale = scale
        self.original_max_position_embeddings = original_max_position_embeddings
        self.extrapolation_factor = extrapolation_factor
        self.attn_factor = attn_factor
        self.beta_fast = beta_fast
        self.beta_slow = beta_slow

        self.yarn(device)

    def yarn(self, device):
        pos_freqs = self.base ** (torch.arange(0, self.dim, 2).double().to(device) / self.dim)
        inv_freq_extrapolation = 1.0 / pos_freqs
        inv_freq_interpolation = 1.0 / (self.scale * pos_freqs)

        low, high = find_correction_range(
            self.beta_fast, self.beta_slow, self.dim, self.base, self.original_max_position_embeddings
        )
        inv_freq_mask = (
            1 - linear_ramp_mask(low, high, self.dim // 2).double().to(device)
        ) * self.extrapolation_factor  # Get n-d rotational scaling corrected for extrapolation
        inv_freq = inv_freq_interpolation * (1 - inv_freq_mask) + inv_freq_extrapolation * inv_freq_mask

        self.inv_freq = inv_freq
        self.mscale = float(
            get_mscale(self.scale) * self.attn_factor
        )  # Get n-d magnitude scaling corrected for interpolation


# scaled_rope/modeling_llama_together_yarn.py l. 91-114: _yarn_find_correction_dim, _yarn_find_correction_range,
# _yarn_linear_ramp_mask, _yarn_get_mscale are character for character the four functions above (l. 107: float32)
_yarn_find_correction_range = find_correction_range
_yarn_linear_ramp_mask = linear_ramp_mask
_yarn_get_mscale = get_mscale


class FlashYaRN:
    """FlashYaRNRotaryEmbedding's frequencies and mscale: __init__ (l. 132-176, the attributes used), _compute_inv_freq
    (l. 178-186), _compute_inv_freq_original (l. 188-191) and _update_cos_sin_cache's rescaling (l. 193-213; the cos/sin
    tables of l. 215-235 are left out). `.float()` / torch.float32 -> float64 at l. 179, 184, 190."""

    def __init__(
        self,
        dim,
        base=10000.0,
        interleaved=False,
        scaling_factor=1.0,
        pos_idx_in_fp32=True,
        max_position_embeddings=2048,
        original_max_position_embeddings=2048,
        extrapolation_factor=1,
        attn_factor=1,
        beta_fast=32,
        beta_slow=1,
        dynamic=False,
        finetuned=False,
        device=None,
    ):
        self.dim = dim
        self.base = float(base)
        self.scaling_factor = scaling_factor
        self.max_position_embeddings = max_position_embeddings
        self.original_max_position_embeddings = (
            original_max_position_embeddings if original_max_position_embeddings else max_position_embeddings
        )
        self.extrapolation_factor = extrapolation_factor
        self.attn_factor = attn_factor
        self.beta_fast = beta_fast
        self.beta_slow = beta_slow
        self.mscale = float(
            _yarn_get_mscale(self.scaling_factor) * attn_factor
        )  # Get n-d magnitude scaling corrected for interpolation
        self.dynamic = dynamic
        self.finetuned = finetuned

        # Generate and save the inverse frequency buffer (non trainable)
        if not dynamic:
            self._compute_inv_freq(scaling_factor, device)

        self._seq_len_cached = 0

    def _compute_inv_freq(self, scaling_factor, device=None):
        pos_freqs = self.base ** (torch.arange(0, self.dim, 2).double().to(device) / self.dim)
        inv_freq_extrapolation = 1.0 / pos_freqs
        inv_freq_interpolation = 1.0 / (scaling_factor * pos_freqs)

        low, high = _yarn_find_correction_range(
            self.beta_fast, self.beta_slow, self.dim, self.base, self.original_max_position_embeddings
        )
        inv_freq_mask = (
            1 - _yarn_linear_ramp_mask(low, high, self.dim // 2).double().to(device)
        ) * self.extrapolation_factor  # Get n-d rotational scaling corrected for extrapolation
        inv_freq = inv_freq_interpolation * (1 - inv_freq_mask) + inv_freq_extrapolation * inv_freq_mask
        self.inv_freq = inv_freq

    def _compute_inv_freq_original(self, device=None):
        inv_freq = 1 / (self.base ** (torch.arange(0, self.dim, 2, device=device, dtype=torch.float64) / self.dim))
        self.inv_freq = inv_freq

    def _update_cos_sin_cache(self, seqlen, device=None, dtype=None):
        if seqlen > self._seq_len_cached:  # l. 197-199: the first call always rebuilds (cache empty)
            self._seq_len_cached = seqlen

            if self.dynamic:
                scaling_factor = None
                if seqlen <= self.max_position_embeddings:
                    if self.finetuned:
                        scaling_factor = self.scaling_factor
                else:
                    scaling_factor = seqlen / self.original_max_position_embeddings
                if scaling_factor:
                    self._compute_inv_freq(scaling_factor, device)
                    self.mscale = float(_yarn_get_mscale(scaling_factor) * self.attn_factor)
                else:
                    self._compute_inv_freq_original(device)


def rel_diff(got, want):
    return float(np.max(np.abs(np.asarray(got) - np.asarray(want)) / np.abs(np.asarray(want))))


# (rotary dim, base, L, s): Llama-2 / Llama-3 / Mistral-like, a small base, a tiny L where the correction range is
# clamped (L = 8: high < low), and (16, 100, 1e6) where low == high (linear_ramp_mask's +0.001)
GEOMETRIES = [
    (64, 1e4, 2048, 2.0),
    (128, 5e5, 8192, 16.0),
    (128, 1e4, 4096, 4.0),
    (64, 1e5, 8192, 8.0),
    (128, 5e5, 2048, 3.0),
    (64, 25.0, 4096, 4.0),
    (128, 1e4, 4096, 32.0),
    (64, 1e4, 128, 8.0),
    (64, 1e4, 8, 4.0),
    (32, 10.0, 4096, 2.5),
    (16, 100.0, 10**6, 8.0),
    (64, 1e4, 4096, 1.0),
]
BETAS = [(32, 1), (16, 2), (4, 0.25), (64, 0.5)]


def test_static_yarn_equals_the_yarn_repos_class():
    worst_f = worst_m = 0.0
    n = 0
    branches = set()
    for d, b, L, s in GEOMETRIES:
        for bf, bs in BETAS:
            rope = StaticYaRN(
                d,
                max_position_embeddings=16,
                base=b,
                scale=s,
                original_max_position_embeddings=L,
                beta_fast=bf,
                beta_slow=bs,
            )
            got = compute("yarn", Geometry(d, b, L), {"factor": s, "beta_fast": bf, "beta_slow": bs})
            want = rope.inv_freq.numpy()
            np.testing.assert_allclose(got.inv_freq, want, rtol=1e-12, atol=0, err_msg=f"{(d, b, L, s, bf, bs)}")
            assert got.attention_factor == pytest.approx(rope.mscale, rel=1e-12, abs=0)
            worst_f = max(worst_f, rel_diff(got.inv_freq, want))
            worst_m = max(worst_m, abs(got.attention_factor - rope.mscale) / rope.mscale)
            n += want.size
            low, high = find_correction_range(bf, bs, d, b, L)
            branches.add("equal" if low == high else "reversed" if high < low else "ramp")
    assert branches == {"equal", "reversed", "ramp"}  # every branch of linear_ramp_mask was exercised
    print(f"static yarn: inv_freq max rel diff {worst_f:.3g} over {n} values, mscale {worst_m:.3g}")


def dynamic_lengths(L, f):
    top = int(f * L)
    return sorted({1, 100, L - 1, L, L + 1, top - 1, top, top + 1, 3 * top, 10 * L})


@pytest.mark.parametrize("finetuned", [True, False], ids=["finetuned", "not-finetuned"])
def test_dynamic_yarn_equals_the_yarn_repos_flash_class(finetuned):
    """finetuned: the repo's config for a checkpoint fine-tuned with YaRN at f (max_position_embeddings = f L,
    rope_scaling factor f, finetuned true) against dynamic-yarn:finetuned_factor=f. Not finetuned: a plain model
    (max_position_embeddings = L, factor 1.0 as eval/model_loader.py l. 63 sets it without --factor) against
    finetuned_factor=1; each length on a fresh module, as a first forward of that length sees it."""
    worst_f = worst_m = 0.0
    n = 0
    seen = set()
    for d, b, L, s in GEOMETRIES:
        f = s if finetuned else 1.0
        for length in dynamic_lengths(L, f):
            if length < 1:
                continue
            rope = FlashYaRN(
                d,
                base=b,
                scaling_factor=f,
                max_position_embeddings=int(f * L),
                original_max_position_embeddings=L,
                dynamic=True,
                finetuned=finetuned,
            )
            rope._update_cos_sin_cache(length, device="cpu", dtype=torch.float64)
            got = compute("dynamic-yarn", Geometry(d, b, L), {"finetuned_factor": f}, length)
            want = rope.inv_freq.numpy()
            np.testing.assert_allclose(got.inv_freq, want, rtol=1e-12, atol=0, err_msg=f"{(d, b, L, f, length)}")
            assert got.attention_factor == pytest.approx(rope.mscale, rel=1e-12, abs=0), (d, b, L, f, length)
            worst_f = max(worst_f, rel_diff(got.inv_freq, want))
            worst_m = max(worst_m, abs(got.attention_factor - rope.mscale) / rope.mscale)
            n += want.size
            seen.add("below" if length < f * L else "at" if length == f * L else "above")
    assert seen == {"below", "at", "above"}
    print(
        f"dynamic yarn ({'finetuned' if finetuned else 'not finetuned'}): inv_freq max rel diff {worst_f:.3g} "
        f"over {n} values, mscale {worst_m:.3g}"
    )


def test_the_dynamic_transcription_discriminates():
    """Guard against a vacuous comparison: the repo's rule changes the frequencies across f L, and finetuned mode
    differs from plain dynamic YaRN below f L."""
    d, b, L, f = 64, 1e4, 2048, 4.0

    def inv(length, finetuned):
        rope = FlashYaRN(
            d,
            base=b,
            scaling_factor=f if finetuned else 1.0,
            max_position_embeddings=int(f * L) if finetuned else L,
            original_max_position_embeddings=L,
            dynamic=True,
            finetuned=finetuned,
        )
        rope._update_cos_sin_cache(length)
        return rope.inv_freq.numpy(), rope.mscale

    assert rel_diff(inv(3 * L, True)[0], inv(3 * L, False)[0]) > 0.1
    assert inv(3 * L, True)[1] > inv(3 * L, False)[1]
    assert rel_diff(inv(8 * L, True)[0], inv(4 * L, True)[0]) > 0.1
