"""The tiny position-encoding family: models trained exactly like `tiny` (same data, tokenizer, steps, seed, trained
length 128, about 1.38M parameters) that differ in how they encode position, each a plain transformers class.

Two pairs share a block, so that within a pair the position encoding is the only difference:
  Llama block (RMSNorm, SwiGLU 384, no biases):   tiny (RoPE)              tiny-nope (SmolLM3 with every layer's
                                                                            RoPE off: no position encoding at all)
  GPT block (LayerNorm, GELU 576, biases):        tiny-rope-gpt (Falcon,   tiny-alibi (the same Falcon with
                                                   rotary)                  alibi=True)
                                                   tiny-learned (GPT-2: a learned table of 128 positions)
                                                   tiny-sinusoidal (XGLM: the Transformer paper's sinusoids)
The GPT block's MLP is 576 wide so that it holds as many weights as the Llama block's SwiGLU 384 (within 0.5%).
Falcon here is sequential (parallel_attn=False), multi-head (multi_query=False), with biases: the same block as
GPT-2 and XGLM up to parameter names. Falcon's ALiBi adds the bias before scaling by 1/sqrt(head_dim), so its
slopes are the ALiBi paper's divided by sqrt(32) (the Falcon-RW checkpoints were trained so); BLOOM and MPT keep the
paper's slopes but have no rotary twin. No causal architecture in transformers carries T5's relative bias, so the
family has no T5 member.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..util.paths import TINY_FAMILY_DIR, TINY_MODEL_DIR

FAMILY_DIR: Path = TINY_FAMILY_DIR


@dataclass(frozen=True)
class Member:
    name: str
    position: str  # how the model encodes position: rope | nope | alibi | learned | sinusoidal
    architecture: str  # the transformers class its checkpoint loads as
    block: str  # llama | gpt: members of one block differ in the position encoding alone
    summary: str


MEMBERS: dict[str, Member] = {
    m.name: m
    for m in (
        Member("tiny", "rope", "LlamaForCausalLM", "llama", "RoPE (Llama block)"),
        Member("tiny-nope", "nope", "SmolLM3ForCausalLM", "llama", "no position encoding (Llama block, RoPE off)"),
        Member("tiny-rope-gpt", "rope", "FalconForCausalLM", "gpt", "RoPE (GPT block, Falcon)"),
        Member("tiny-alibi", "alibi", "FalconForCausalLM", "gpt", "ALiBi (GPT block, Falcon)"),
        Member("tiny-learned", "learned", "GPT2LMHeadModel", "gpt", "learned absolute positions (GPT-2)"),
        Member("tiny-sinusoidal", "sinusoidal", "XGLMForCausalLM", "gpt", "sinusoidal positions (XGLM)"),
    )
}
# the GPT block's MLP width: 2 * 128 * 576 weights, as many as the Llama block's SwiGLU 3 * 128 * 384
GPT_MLP_WIDTH = 576


def member_dir(name: str) -> Path:
    """Where a member's weights ship: `tiny` in ctxeval/tiny/model, the others in ctxeval/tiny/family/NAME."""
    return TINY_MODEL_DIR if name == "tiny" else FAMILY_DIR / name


def build_config(name: str, cfg: Any, vocab_size: int, tokenizer: Any) -> Any:
    """The transformers config of family member `name` at TinyConfig `cfg`'s sizes."""
    member = MEMBERS[name]
    heads, hidden, layers, length = cfg.num_heads, cfg.hidden_size, cfg.num_layers, cfg.length
    tokens = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": True,
    }
    rope = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    if member.block == "llama":
        from transformers import LlamaConfig, SmolLM3Config

        llama = dict(
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            head_dim=cfg.head_dim or hidden // heads,
            max_position_embeddings=length,
            rope_parameters=rope,
            initializer_range=0.02,
            attention_bias=False,
            mlp_bias=False,
            **tokens,
        )
        if member.position == "rope":
            return LlamaConfig(**llama)
        return SmolLM3Config(**llama, no_rope_layers=[0] * layers, use_sliding_window=False)
    gpt_dropout_off = {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
    if member.architecture == "FalconForCausalLM":
        from transformers import FalconConfig

        return FalconConfig(
            vocab_size=vocab_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=heads,
            ffn_hidden_size=GPT_MLP_WIDTH,
            activation="gelu",
            alibi=member.position == "alibi",
            new_decoder_architecture=False,
            multi_query=False,
            parallel_attn=False,
            bias=True,
            max_position_embeddings=length,
            rope_parameters=rope,
            initializer_range=0.02,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            **tokens,
        )
    if member.architecture == "GPT2LMHeadModel":
        from transformers import GPT2Config

        return GPT2Config(
            vocab_size=vocab_size,
            n_positions=length,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_inner=GPT_MLP_WIDTH,
            activation_function="gelu",
            layer_norm_epsilon=1e-5,
            initializer_range=0.02,
            **gpt_dropout_off,
            **tokens,
        )
    from transformers import XGLMConfig

    return XGLMConfig(
        vocab_size=vocab_size,
        max_position_embeddings=length,
        d_model=hidden,
        ffn_dim=GPT_MLP_WIDTH,
        num_layers=layers,
        attention_heads=heads,
        activation_function="gelu",
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        layerdrop=0.0,
        init_std=0.02,
        scale_embedding=True,  # sqrt(d_model), as the Transformer paper and fairseq (the ALiBi paper's baselines)
        decoder_start_token_id=tokenizer.bos_token_id,
        **tokens,
    )


def build_model(name: str, cfg: Any, vocab_size: int, tokenizer: Any) -> Any:
    """A freshly initialised family member (transformers' own initialisation, under the caller's torch seed)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(build_config(name, cfg, vocab_size, tokenizer))


BLOCKS = {
    "llama": "RMSNorm, SwiGLU MLP 384 wide (SiLU), no biases, tied embeddings",
    "gpt": "pre-LayerNorm, GELU MLP 576 wide, biases, tied embeddings",
}


def model_card(name: str, log: dict[str, Any]) -> str:
    """MODEL_CARD.md of a family member, from its training log (every number in it comes from the log)."""
    member, cfg = MEMBERS[name], log["config"]
    twins = [m.name for m in MEMBERS.values() if m.block == member.block and m.name != name]
    minutes = log["train_seconds"] / 60
    return f"""# ctxeval {name}: {member.summary}, trained at {cfg["length"]} tokens

A member of the bundled tiny model's position-encoding family (`ctxeval/tiny/family.py`): trained exactly as `tiny`
(same data, tokenizer, steps, seed and trained length), differing in how it encodes position. It loads in
transformers with no ctxeval code: `AutoModelForCausalLM.from_pretrained("{member_dir(name).relative_to(TINY_MODEL_DIR.parent.parent.parent)}")`.
In ctxeval: `--model {name}`, or `--model tiny-family` for the whole family in one run.

| | |
|---|---|
| class | `{member.architecture}` (transformers 5), {log.get("save_dtype", cfg.get("save_dtype", "float32"))} safetensors |
| position encoding | {member.summary} |
| block | {BLOCKS[member.block]}; the same block as {", ".join(twins)} |
| parameters | {log["parameters"]:,} (tiny: 1,377,408) |
| layers / hidden / heads | {cfg["num_layers"]} / {cfg["hidden_size"]} / {cfg["num_heads"]} (head dim {cfg["hidden_size"] // cfg["num_heads"]}) |
| trained length L | **{cfg["length"]}** tokens (`max_position_embeddings`) |
| tokenizer | tiny's, byte for byte |

## Training

`python -m ctxeval.tiny train --member {name}` (seed {cfg["seed"]}, {log["torch_threads"]} torch thread): {log["steps"]:,} steps of
batch {cfg["batch_size"]} = {log["tokens_seen"] / 1e6:.2f}M tokens, tiny's data mix and optimiser, in {minutes:.1f} minutes on {log["cpu_count"]} CPU cores
(torch {log["torch"]}). `python -m ctxeval.tiny reproduce {name}` retrains the first 100 steps and compares their
losses with this log.

- Final loss (EMA): {log["final_loss_ema"]}; language-modelling part {log["final_lm_loss"]}.
- The training script's check at {cfg["length"]} tokens: held-out pydoc ppl {log.get("held_out_ppl")}; forced needle accuracy
  {log.get("needle_forced_acc")}.

## Limits

Like tiny: a 1.4M-parameter model trained for 8M tokens, for the shape of the curves, not for ranking real models.
{FAMILY_NOTES.get(name, "")}
"""


FAMILY_NOTES = {
    "tiny-alibi": "Falcon adds the ALiBi bias before scaling by 1/sqrt(head_dim): its slopes are the ALiBi paper's "
    "2^(-8h/H) divided by sqrt(32).",
    "tiny-learned": "A learned table of 128 positions: no position past 128 exists, so ctxeval measures it up to 128 "
    "and refuses (alone) or drops (across models) longer lengths.",
    "tiny-sinusoidal": "XGLM's sinusoids start at position 2 (its padding offset), as XGLM's checkpoints do. Its token "
    "embeddings are multiplied by sqrt(128) before the sinusoids are added, as in the Transformer paper and fairseq.",
    "tiny-nope": "SmolLM3 with `no_rope_layers` all 0: no layer applies RoPE; the causal mask alone tells it order.",
}


__all__ = [
    "BLOCKS",
    "model_card",
    "FAMILY_DIR",
    "GPT_MLP_WIDTH",
    "MEMBERS",
    "Member",
    "build_config",
    "build_model",
    "member_dir",
]
