"""ctxeval bound: the RoPE base lower bound of Men et al. 2024, against a plain float64 brute force written here."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from ctxeval.cli.methods import fmt_base
from ctxeval.rope import bound as BD

# ---------------------------------------------------------------------------------------------------------------
# the reference: B_m = sum_i cos(m * b^(-2i/d)), every m, float64, no tricks


def ref_values(base, d, length):
    theta = np.array([base ** (-2 * i / d) for i in range(d // 2)])  # (d/2,)
    m = np.arange(length + 1, dtype=np.float64)  # (L+1,)
    return np.cos(m[:, None] * theta[None, :]).sum(axis=1)  # (L+1,)


def ref_first_negative(base, d, length):
    neg = np.flatnonzero(ref_values(base, d, length) < 0)
    return int(neg[0]) if neg.size else length + 1


def ref_grid(top):
    out, exp = [], -1
    while True:
        for mant in range(10, 100):
            b = mant * 10.0**exp
            if b > top:
                return out
            if b > 1.05:
                out.append(float(f"{b:.1e}"))
        exp += 1


def ref_bounds(d, length, top):
    """(first feasible, all feasible above) over the two-digit grid up to top, by brute force."""
    grid = ref_grid(top)
    ok = [ref_first_negative(b, d, length) > length for b in grid]
    first = next(b for b, good in zip(grid, ok) if good)
    last_bad = max(i for i, good in enumerate(ok) if not good)
    return first, grid[last_bad + 1]


# ---------------------------------------------------------------------------------------------------------------
# the math


def test_grid_has_two_significant_digits():
    grid = BD.base_grid(1.1, 1e5)
    assert grid[:3] == [1.1, 1.2, 1.3] and grid[88:92] == [9.9, 10.0, 11.0, 12.0]
    assert 4300.0 in grid and 4.3e3 in grid and 99000.0 in grid and grid[-1] == 1e5
    assert all(float(f"{b:.1e}") == b for b in grid) and grid == sorted(set(grid))


@pytest.mark.parametrize("d", [4, 16, 32])
def test_first_negative_matches_brute_force(d):
    rng = np.random.default_rng(d)
    bases = [float(b) for b in 10 ** rng.uniform(0.2, 8, 40)] + BD.base_grid(1.1, 1e4)[::7]
    for base in bases:
        for length in (1, 7, 100, 512):
            assert BD.first_negative(base, d, length) == ref_first_negative(base, d, length), (base, length)


def test_first_negative_matches_brute_force_long_d128():
    # the block product (float32 screen + float64 confirmation) against the reference, near the paper's bases
    for base in (3.1e5, 3.2e5, 6.3e5, 6.4e5, 4.3e3, 1e4, 5e5):
        assert BD.first_negative(base, 128, 40_000) == ref_first_negative(base, 128, 40_000), base


@pytest.mark.parametrize("d", [16, 32])
def test_table_matches_brute_force_small(d):
    lengths = [16, 64, 200, 512]
    table = BD.bound_table(d, lengths)
    for row in table.rows:
        top = BD.base_grid(row.safe_base, row.safe_base * 10)[0]
        assert (row.first_feasible, row.all_feasible_above) == ref_bounds(d, row.length, top), row
        assert row.paper is None


def test_safe_base_really_is_safe():
    for d, length in ((8, 50), (16, 300), (32, 512)):
        safe = BD.safe_base(d, length)
        assert math.isfinite(safe)
        for factor in (1.0, 1.37, 3.0, 11.0, 1e3):
            assert ref_first_negative(safe * factor, d, length) > length
    assert BD.safe_base(64, 1) == 1.0  # L = 1: every base passes
    assert BD.safe_base(2, 2) == math.inf  # d = 2: B_m = cos(m) for every base


def test_first_feasible_differs_from_all_feasible_above():
    # d = 128, L = 1000: 4.3e3 passes, but some grid bases above it fail again, up to 6.0e3
    row = BD.bound_table(128, [1000]).rows[0]
    assert (row.first_feasible, row.all_feasible_above) == (4.3e3, 6.1e3)
    assert ref_first_negative(4.3e3, 128, 1000) > 1000
    failing = [b for b in BD.base_grid(4.4e3, 6.0e3) if ref_first_negative(b, 128, 1000) <= 1000]
    assert failing and max(failing) == 6.0e3
    assert all(ref_first_negative(b, 128, 1000) > 1000 for b in BD.base_grid(6.1e3, 2e4))


def test_max_context():
    for base, d in ((1e4, 128), (1e5, 64), (5e5, 128), (500.0, 16)):
        assert BD.max_context(base, d) == ref_first_negative(base, d, 50_000) - 1 < 50_000
    assert BD.max_context(1e14, 128, limit=100_000) == 100_000  # nothing fails: the limit comes back
    with pytest.raises(BD.CtxevalError, match="even number"):
        BD.max_context(1e4, 7)


def test_bad_input():
    with pytest.raises(BD.CtxevalError, match="even number >= 2"):
        BD.bound_table(0, [100])
    with pytest.raises(BD.CtxevalError, match="out of range"):
        BD.bound_table(128, [BD.MAX_LENGTH + 1])
    row = BD.bound_table(2, [2]).rows[0]  # d = 2: no base at all
    assert row.first_feasible is None and row.all_feasible_above is None


# ---------------------------------------------------------------------------------------------------------------
# the paper's table (d = 128; lengths in thousands). The whole table takes ~3 s, so this is not marked slow.

# what the two-digit ascending scan gives: (first feasible, all feasible above)
EXPECTED = {
    1_000: (4.3e3, 6.1e3),
    2_000: (1.6e4, 1.8e4),
    4_000: (2.7e4, 5.8e4),
    8_000: (8.4e4, 1.4e5),
    16_000: (3.2e5, 7.0e5),
    32_000: (6.3e5, 1.9e6),
    64_000: (2.1e6, 8.1e6),
    128_000: (7.8e6, 2.3e7),
    256_000: (3.3e7, 5.0e7),
    512_000: (6.5e7, 3.7e8),
    1_000_000: (3.5e8, 7.9e8),
}
# rows where the paper's value itself violates the criterion: (length, a position m <= L where B_m < 0)
PAPER_FAILS = {16_000: 12_223, 32_000: 27_685, 256_000: 207_455, 512_000: 511_210, 1_000_000: 874_868}


@pytest.fixture(scope="module")
def paper_table():
    return BD.bound_table(128, list(BD.PAPER_LENGTHS))


def test_paper_table(paper_table):
    got = {r.length: (r.first_feasible, r.all_feasible_above) for r in paper_table.rows}
    assert got == EXPECTED
    matching = [r.length for r in paper_table.rows if r.first_feasible == r.paper]
    assert matching == [1_000, 2_000, 4_000, 8_000, 64_000, 128_000]


@pytest.mark.parametrize("length", sorted(PAPER_FAILS))
def test_paper_values_that_do_not_match_violate_the_criterion(length):
    """No search that checks every m <= L could return these: the paper's own base goes negative before L."""
    m = PAPER_FAILS[length]
    base = BD.PAPER_TABLE[length]
    theta = np.array([base ** (-2 * i / 128) for i in range(64)])
    assert m <= length and np.cos(m * theta).sum() < 0
    assert BD.first_negative(base, 128, length) == m


# ---------------------------------------------------------------------------------------------------------------
# the command


@pytest.fixture
def cli():
    from ctxeval.cli import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_fmt_base():
    assert fmt_base(4300.0) == "4.3e3" and fmt_base(5.1e8) == "5.1e8" and fmt_base(None) == "-"


def test_cli_table_with_paper_column(cli):
    result = cli("bound", "--head-dim", "128", "--lengths", "1000,2000")
    assert result.exit_code == 0, result.output
    assert "paper (d=128)" in result.stdout and "4.3e3" in result.stdout and "1.8e4" in result.stdout
    assert "2 of 2 rows match" in result.stdout


def test_cli_json_and_csv(cli):
    result = cli("bound", "--head-dim", "16", "--lengths", "64,200", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = BD.bound_table(16, [64, 200]).rows
    assert [r["first_feasible"] for r in data["rows"]] == [r.first_feasible for r in expected]
    assert [r["all_feasible_above"] for r in data["rows"]] == [r.all_feasible_above for r in expected]
    assert data["head_dim"] == 16 and data["model"] is None
    result = cli("bound", "--head-dim", "16", "--lengths", "64,200", "--format", "csv")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "length,paper,first_feasible,all_feasible_above,safe_base" and len(lines) == 3
    assert lines[1].startswith(f"64,,{expected[0].first_feasible!r},{expected[0].all_feasible_above!r},")


def test_cli_model_from_local_config(cli, tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=1,
        intermediate_size=64,
        vocab_size=32,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    ).save_pretrained(tmp_path)
    result = cli("bound", "--model", str(tmp_path), "--lengths", "100", "--format", "json")
    assert result.exit_code == 0, result.output
    model = json.loads(result.stdout)["model"]
    assert (model["rotary_dim"], model["base"], model["trained_length"]) == (16, 500.0, 64)
    assert model["max_context"] == ref_first_negative(500.0, 16, 10_000) - 1
    assert [r["length"] for r in json.loads(result.stdout)["rows"]] == [64, 100]  # the trained length is added
    result = cli("bound", "--model", str(tmp_path), "--lengths", "100")
    assert result.exit_code == 0, result.output
    assert f"its base supports L = {model['max_context']:,}" in result.stdout and "64 (trained)" in result.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--head-dim", "7"], "even number >= 2"),
        (["--head-dim", "0"], "even number >= 2"),
        (["--head-dim", "128", "--lengths", "1k,zz"], "bad length"),
        (["--head-dim", "128", "--lengths", "99999999"], "out of range"),
        ([], "needs --head-dim"),
        (["--head-dim", "64", "--model", "smollm2"], "not both"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(cli, args, fragment):
    result = cli("bound", *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_cli_model_without_rope(cli, tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=32).save_pretrained(tmp_path)
    result = cli("bound", "--model", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "has no RoPE" in result.stderr and len(result.stderr.strip().splitlines()) == 1
