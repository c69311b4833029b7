"""Issue 27, mutmut round 2 (positions, key_tokens, entropy, attention): behaviours the surviving mutants showed
untested. Each test names the behaviour it pins; docs/testing.md lists the mutants each one kills."""

from __future__ import annotations

import numpy as np
import pytest

from ctxeval.errors import CtxevalError
from ctxeval.evals.positions import MAX_BUCKETS, default_edges, key_sums, parse_position_buckets


# ------------------------------------------------------------------------------------------------ positions.py

def test_default_edges_without_a_trained_length_are_the_octaves():
    assert default_edges(1024) == (1, 32, 64, 128, 256, 512, 1024)
    assert default_edges(1024, None) == default_edges(1024, 0) == (1, 32, 64, 128, 256, 512, 1024)


def test_a_trained_length_of_two_tokens_is_its_own_edge():
    assert default_edges(48, 2) == (1, 2, 32, 48)
    assert default_edges(48, 1) == (1, 32, 48)  # 1 is already the first edge


def test_default_edges_are_exact_powers_of_two_below_a_short_length():
    assert default_edges(40) == (1, 32, 40)
    assert default_edges(32) == (1, 32)
    assert default_edges(16) == (1, 16)  # shorter than the first octave: one bucket
    assert all(isinstance(e, int) for e in default_edges(5000, 3000))


@pytest.mark.parametrize("text", [None, "", "   ", "\t"])
def test_no_position_buckets_means_octaves_with_the_trained_length(text):
    assert parse_position_buckets(text, 1024, 100) == (1, 32, 64, 100, 128, 256, 512, 1024)


def test_a_bucket_count_above_the_limit_names_the_range():
    with pytest.raises(CtxevalError, match=rf"^--position-buckets must be a bucket count in 1\.\.{MAX_BUCKETS}, "
                                           r"got '1025'$"):
        parse_position_buckets("1025", 4096, None)
    edges = parse_position_buckets(str(MAX_BUCKETS), 10**6, None)  # the limit itself is allowed
    assert edges[:3] == (1, 2, 3) and edges[-1] == 10**6


def test_a_word_for_a_bucket_count_gets_the_usage_message():
    with pytest.raises(CtxevalError, match=r"^--position-buckets takes a bucket count \(e\.g\. 16\) or edges"):
        parse_position_buckets("many", 1024, None)
    with pytest.raises(CtxevalError, match=r"^--position-buckets takes a bucket count \(e\.g\. 16\) or edges"):
        parse_position_buckets("2.5", 1024, None)


def test_at_most_1025_edges():
    allowed = ",".join(str(i) for i in range(MAX_BUCKETS + 1))
    assert parse_position_buckets(allowed, 4096, None) == tuple(range(MAX_BUCKETS + 1))
    with pytest.raises(CtxevalError, match=r"^--position-buckets takes at most 1025 edges, got 1026$"):
        parse_position_buckets(",".join(str(i) for i in range(MAX_BUCKETS + 2)), 4096, None)


def test_one_edge_is_refused_with_the_text():
    with pytest.raises(CtxevalError, match=r"^--position-buckets needs at least two edges, got '5,'$"):
        parse_position_buckets("5,", 1024, None)


def test_a_bad_edge_names_the_option():
    with pytest.raises(CtxevalError, match=r"^--position-buckets: 'x' is not a token count"):
        parse_position_buckets("1,x", 1024, None)
    with pytest.raises(CtxevalError, match=r"^--position-buckets: '-4' must be a whole number of tokens >= 0"):
        parse_position_buckets("-4,8", 1024, None)


def test_key_sums_add_float32_losses_in_float64():
    # float32 addition would drop each 1.0 next to 2**24; the sum is exact in float64
    nll = np.array([2.0**24, 1.0, 1.0, 1.0, 1.0, 5.0], dtype=np.float32)
    total, count = key_sums(nll, np.array([1, 2, 3, 4, 5, 6]), 6)
    assert (total, count) == (2.0**24 + 4.0, 5)
