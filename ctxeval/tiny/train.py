"""Train the bundled tiny model from scratch on a CPU: byte-level BPE tokenizer + small Llama with plain RoPE.

Every training sequence is BOS + `length` - 1 tokens (the trained length L = `max_position_embeddings`), of four
kinds (`TinyConfig.mix`):
  lm      a window of the training text (pydoc training topics, stdlib docstrings, stdlib sources), starting at a
          document start or at a random token;
  needle  a needle or passkey prompt built by ctxeval's own PromptBuilder (the exact token layout of `ctxeval
          needle` / `ctxeval passkey`) over training text or the passkey filler, of a random length <= L and a
          random depth, then the answer (loss weight `answer_weight`), then more training text up to L;
  recall  retrieval lines: 2-6 key-value facts ("One of the special magic numbers for KEY is: VALUE." or
          "KEY: VALUE"), then every key queried again in shuffled order and answered (weighted like an answer);
  repeat  induction practice: random tokens or digits repeated later in the sequence, or a span of text repeated.
Seeded (numpy for the data, torch for the weights). Run with one torch thread for bit-reproducible weights.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..data.offline import held_out_documents
from ..evals.haystack import FILLER, KEY_ADJECTIVES, KEY_NOUNS, PromptBuilder, make_sample
from .corpus import training_corpus, training_presets


@dataclass
class TinyConfig:
    # model
    member: str = "tiny"  # the family member (ctxeval/tiny/family.py): the position encoding and its architecture
    length: int = 128  # trained length L = max_position_embeddings
    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    head_dim: int | None = None  # None: hidden_size / num_heads
    rope_theta: float = 100000.0
    # optimisation
    steps: int = 4000
    batch_size: int = 16
    lr: float = 8e-4
    min_lr_ratio: float = 0.1
    warmup: int = 200
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # data: share of each kind of sequence in a batch
    mix: dict[str, float] = field(default_factory=lambda: {"lm": 0.35, "needle": 0.3, "recall": 0.2, "repeat": 0.15})
    answer_weight: float = 5.0  # loss weight of the answer tokens of a retrieval sequence
    doc_start_fraction: float = 0.3  # language-modelling windows that start at a document start
    pools: dict[str, float] = field(default_factory=lambda: {"pydoc": 0.4, "docstrings": 0.3, "sources": 0.3})
    # retrieval kinds: preset name -> (share, haystack)
    retrieval_kinds: dict[str, list] = field(
        default_factory=lambda: {
            "ruler": [0.6, "text"],
            "ruler-distractor": [0.15, "text"],
            "passkey": [0.15, "filler"],
            "passkey-text": [0.1, "text"],
        }
    )
    seed: int = 0
    save_dtype: str = "float32"  # float32 | float16 (storage only; loads in float32)
    eval_every: int = 200


# ---------------------------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """Byte-level BPE with every digit its own pre-token (a 7-digit number is 7 tokens), BOS <s>, EOS </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=1_000_000,
        clean_up_tokenization_spaces=False,
    )


# ---------------------------------------------------------------------------------------------------------------
# data


class Stream:
    """Documents of one pool as one token stream (documents joined by the "\\n\\n" tokens)."""

    def __init__(self, tokenizer: Any, texts: list[str]) -> None:
        sep = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        parts, starts, pos = [], [], 0
        for ids in encoded:
            if not ids:
                continue
            starts.append(pos)
            parts += [np.asarray(ids, dtype=np.int64), np.asarray(sep, dtype=np.int64)]
            pos += len(ids) + len(sep)
        self.ids = np.concatenate(parts)  # (n_tokens,)
        self.starts = np.asarray(starts)

    def window(self, n: int, rng: np.random.Generator, at_doc_start: bool) -> np.ndarray:
        if at_doc_start:
            start = int(rng.choice(self.starts))
            start = min(start, len(self.ids) - n)
        else:
            start = int(rng.integers(0, len(self.ids) - n + 1))
        return self.ids[start : start + n]


class Batches:
    """Seeded batches of (input_ids, loss weights), each (batch, length)."""

    def __init__(self, tokenizer: Any, cfg: TinyConfig, corpus: dict[str, list[str]]) -> None:
        self.tok, self.cfg = tokenizer, cfg
        self.rng = np.random.default_rng([cfg.seed, 1])
        self.streams = {name: Stream(tokenizer, corpus[name]) for name in cfg.pools}
        self.pool_names = list(cfg.pools)
        self.pool_p = np.asarray([cfg.pools[n] for n in self.pool_names], dtype=float)
        self.pool_p /= self.pool_p.sum()
        self.presets = training_presets()
        filler = np.asarray(tokenizer(" " + FILLER, add_special_tokens=False)["input_ids"])
        filler = np.tile(filler, math.ceil(4 * cfg.length / len(filler)) + 1)
        self.builders: dict[tuple[str, str], Any] = {}
        for kind, (_, hay) in cfg.retrieval_kinds.items():
            preset = self.presets[kind.removesuffix("-text")]
            if hay == "filler":
                self.builders[(kind, "filler")] = PromptBuilder(tokenizer, preset, filler, chat_template=False)
            else:
                for name in self.pool_names:
                    self.builders[(kind, name)] = PromptBuilder(
                        tokenizer, preset, self.streams[name].ids, chat_template=False
                    )
        self.kinds = list(cfg.retrieval_kinds)
        self.kind_p = np.asarray([cfg.retrieval_kinds[k][0] for k in self.kinds], dtype=float)
        self.kind_p /= self.kind_p.sum()
        self.bos = tokenizer.bos_token_id
        self.sep = np.asarray(tokenizer("\n\n", add_special_tokens=False)["input_ids"])
        self.digit_ids = np.asarray(tokenizer.convert_tokens_to_ids(list("0123456789")))

    def _pool(self) -> str:
        return self.pool_names[int(self.rng.choice(len(self.pool_names), p=self.pool_p))]

    def lm(self) -> tuple[np.ndarray, np.ndarray]:
        n = self.cfg.length - 1
        window = self.streams[self._pool()].window(n, self.rng, self.rng.random() < self.cfg.doc_start_fraction)
        return np.concatenate([[self.bos], window]), np.ones(self.cfg.length, dtype=np.float32)

    def retrieval(self) -> tuple[np.ndarray, np.ndarray]:
        kind = self.kinds[int(self.rng.choice(len(self.kinds), p=self.kind_p))]
        hay = "filler" if self.cfg.retrieval_kinds[kind][1] == "filler" else self._pool()
        builder = self.builders[(kind, hay)]
        sample = make_sample(builder.preset, self.rng)
        answer = builder.encode(sample.answer_text)
        low = builder.minimum_length(sample, len(answer)) + 1
        total = int(self.rng.integers(low, self.cfg.length + 1)) if low <= self.cfg.length else None
        if total is None:  # does not fit (a distractor needle at a very short L): train language modelling instead
            return self.lm()
        depth = float(self.rng.uniform(0, 100))
        prompt = builder.build(total, depth, sample, self.rng, len(answer))
        ids = np.asarray(prompt.ids + answer, dtype=np.int64)
        weights = np.ones(len(ids), dtype=np.float32)
        weights[len(prompt.ids) :] = self.cfg.answer_weight
        rest = self.cfg.length - len(ids)
        if rest > 0:
            more = self.streams[self._pool()].window(rest, self.rng, False)
            tail = np.concatenate([self.sep, more])[:rest]
            ids = np.concatenate([ids, tail])
            weights = np.concatenate([weights, np.ones(rest, dtype=np.float32)])
        return ids, weights

    def recall(self) -> tuple[np.ndarray, np.ndarray]:
        """Retrieval lines: key-value facts, then queries of some of them (shuffled) answered with the value.

        Two layouts: the needle's own sentences (fact = needle, query = answer prefix) or compact `key: value`
        lines. Dense copy practice: the value tokens of every query are weighted like a needle answer."""

        rng, L = self.rng, self.cfg.length
        preset = self.presets["ruler"]
        compact = rng.random() < 0.5
        n = int(rng.integers(2, 7 if compact else 4))
        pairs = rng.choice(len(KEY_ADJECTIVES) * len(KEY_NOUNS), size=n, replace=False)
        keys = [f"{KEY_ADJECTIVES[p // len(KEY_NOUNS)]}-{KEY_NOUNS[p % len(KEY_NOUNS)]}" for p in pairs]
        values = [str(rng.integers(10**6, 10**7)) for _ in keys]

        def enc(text: str) -> np.ndarray:
            return np.asarray(self.tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)

        if compact:
            facts = [enc(f"\n{k}: {v}") for k, v in zip(keys, values)]
            queries = [(enc(f"\n{k}:"), enc(f" {v}")) for k, v in zip(keys, values)]
        else:
            facts = [enc(" " + preset.needle.format(key=k, value=v)) for k, v in zip(keys, values)]
            queries = [(enc(" " + preset.answer_prefix.format(keys=k)), enc(f" {v}.")) for k, v in zip(keys, values)]
        order = rng.permutation(n)
        while n > 1 and 1 + sum(len(f) + len(q[0]) + len(q[1]) for f, q in zip(facts[:n], queries[:n])) > L:
            n -= 1  # keep only the facts whose queries fit too
            order = order[order < n]
        room = L - 1 - sum(len(f) + len(q[0]) + len(q[1]) for f, q in zip(facts[:n], queries[:n]))
        gaps = (
            rng.multinomial(int(rng.integers(0, max(room, 0) + 1)), np.ones(n + 1) / (n + 1))
            if room > 0
            else np.zeros(n + 1, int)
        )
        ids = [np.asarray([self.bos])]
        w = [np.ones(1, dtype=np.float32)]
        for i, f in enumerate(facts[:n]):
            gap = self.streams[self._pool()].window(int(gaps[i]), rng, False)
            ids += [gap, f]
            w += [np.ones(len(gap) + len(f), dtype=np.float32)]
        gap = self.streams[self._pool()].window(int(gaps[n]), rng, False)
        ids.append(gap)
        w.append(np.ones(len(gap), dtype=np.float32))
        for q in order:
            prefix, value = queries[q]
            ids += [prefix, value]
            w += [np.ones(len(prefix), dtype=np.float32), np.full(len(value), self.cfg.answer_weight, dtype=np.float32)]
        ids_a, w_a = np.concatenate(ids)[:L], np.concatenate(w)[:L]
        if len(ids_a) < L:
            rest = L - len(ids_a)
            ids_a = np.concatenate([ids_a, self.sep, self.streams[self._pool()].window(rest, rng, False)])[:L]
            w_a = np.concatenate([w_a, np.ones(rest, dtype=np.float32)])
        return ids_a, w_a

    def repeat(self) -> tuple[np.ndarray, np.ndarray]:
        """Induction practice. Half the time: BOS + random tokens (or digits) + the same tokens again, loss only on
        the copy; else BOS + text + a span of that text again."""
        rng, L = self.rng, self.cfg.length
        if rng.random() < 0.5:
            n = int(rng.integers(8, (L - 1) // 2 + 1))
            if rng.random() < 0.5:
                seq = rng.choice(self.digit_ids, size=n)
            else:
                seq = rng.integers(3, len(self.tok), size=n)
            lead = int(rng.integers(0, L - 1 - 2 * n + 1))
            gap = int(rng.integers(0, L - 1 - 2 * n - lead + 1))
            text = self.streams[self._pool()].window(lead + gap, rng, False)
            ids = np.concatenate([[self.bos], text[:lead], seq, text[lead:], seq])
            w = np.ones(len(ids), dtype=np.float32)
            w[1 + lead : 1 + lead + n] = 0.0  # the random tokens themselves are unpredictable
            rest = L - len(ids)
            ids = np.concatenate([ids, self.sep, self.streams[self._pool()].window(rest, rng, False)])[:L]
            w = np.concatenate([w, np.ones(rest, dtype=np.float32)])
            return ids, w
        stream = self.streams[self._pool()]
        first = stream.window(L - 1, rng, False)
        span = int(rng.integers(12, L // 3))
        start = int(rng.integers(0, (L - 1) // 2 - span + 1)) if (L - 1) // 2 > span else 0
        cut = int(rng.integers(start + span, L - 1 - span + 1))
        ids = np.concatenate([[self.bos], first[:cut], first[start : start + span]])
        ids = np.concatenate([ids, first[cut:]])[:L]
        return ids, np.ones(L, dtype=np.float32)

    def next(self) -> tuple[Any, Any, list[str]]:
        """(input_ids (B, L), loss weights (B, L), kind of each row)"""
        import torch

        kinds = list(self.cfg.mix)
        p = np.asarray([self.cfg.mix[k] for k in kinds], dtype=float)
        p /= p.sum()
        make = {"lm": self.lm, "needle": self.retrieval, "recall": self.recall, "repeat": self.repeat}
        seqs, weights, is_ret = [], [], []
        for _ in range(self.cfg.batch_size):
            kind = kinds[int(self.rng.choice(len(kinds), p=p))]
            ids, w = make[kind]()
            seqs.append(ids)
            weights.append(w)
            is_ret.append(kind)
        return torch.from_numpy(np.stack(seqs)), torch.from_numpy(np.stack(weights)), is_ret


# ---------------------------------------------------------------------------------------------------------------
# model and evaluation


def build_model(cfg: TinyConfig, vocab_size: int, tokenizer: Any) -> Any:
    from .family import build_model as build_member

    return build_member(cfg.member, cfg, vocab_size, tokenizer)


def weighted_loss(logits: Any, ids: Any, weights: Any) -> tuple[Any, Any]:
    """Mean weighted next-token NLL over positions 1.., and the per-token NLL.  logits (B, T, V), ids/weights (B, T)."""
    import torch.nn.functional as F

    nll = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1), reduction="none"
    ).view(ids.shape[0], -1)  # (B, T-1)
    w = weights[:, 1:]
    return (nll * w).sum() / w.sum(), nll


def held_out_loss(model: Any, tokenizer: Any, length: int) -> dict[str, float]:
    """Mean NLL per token on the held-out pydoc topics: BOS + consecutive chunks of L-1 tokens."""
    import torch

    total, count = 0.0, 0
    seqs = []
    for _, text in held_out_documents():
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids) - (length - 1) + 1, length - 1):
            seqs.append([tokenizer.bos_token_id] + ids[start : start + length - 1])
    model.eval()
    with torch.inference_mode():
        for i in range(0, len(seqs), 32):
            batch = torch.tensor(seqs[i : i + 32])
            logits = model(input_ids=batch).logits
            _, nll = weighted_loss(logits, batch, torch.ones(batch.shape, dtype=torch.float32))
            total += float(nll.sum())
            count += nll.numel()
    model.train()
    return {"held_out_nll": total / count, "held_out_ppl": math.exp(total / count), "held_out_tokens": count}


def needle_check(model: Any, tokenizer: Any, length: int, n: int = 48, seed: int = 1234) -> dict[str, float]:
    """Forced-scoring needle accuracy (ruler preset) at the trained length on a held-out haystack: a quick probe."""
    import torch

    preset = training_presets()["ruler"]
    hay = tokenizer("\n\n".join(t for _, t in held_out_documents()[:3]), add_special_tokens=False)["input_ids"]
    builder = PromptBuilder(tokenizer, preset, np.asarray(hay), chat_template=False)
    rng = np.random.default_rng(seed)
    correct, digits = 0, 0.0
    model.eval()
    with torch.inference_mode():
        for i in range(n):
            sample = make_sample(preset, rng)
            answer = builder.encode(sample.answer_text)
            prompt = builder.build(length, 100.0 * i / (n - 1), sample, rng, len(answer))
            ids = torch.tensor([prompt.ids + answer])
            pred = model(input_ids=ids).logits[0, len(prompt.ids) - 1 : -1].argmax(-1)
            hit = pred == torch.tensor(answer)
            correct += int(hit.all())
            digits += float(hit.float().mean())
    model.train()
    return {"needle_forced_acc": correct / n, "needle_token_acc": digits / n}


# ---------------------------------------------------------------------------------------------------------------
# training


def _lr(step: int, cfg: TinyConfig, total: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, total - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    out: str | Path,
    cfg: TinyConfig | None = None,
    *,
    minutes: float | None = None,
    corpus: dict[str, list[str]] | None = None,
    log: Callable[[str], None] = print,
    evaluate: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train tokenizer + model into `out` (safetensors + tokenizer + training_log.json); returns the summary.

    `minutes`: instead of cfg.steps, run as many steps as the speed of the first steps allows in that time (the
    step count is then fixed and the learning-rate schedule follows it). `corpus` replaces the training texts
    (tests pass a small one). `stop_after` ends the run after that many steps of the full schedule (a check that the
    first losses reproduce), without the final evaluation, and saves nothing."""
    import torch

    cfg = cfg or TinyConfig()
    out = Path(out)
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    threads = torch.get_num_threads()
    corpus = corpus if corpus is not None else training_corpus()
    texts = [t for part in ("pydoc", "docstrings", "sources", "retrieval") for t in corpus.get(part, [])]
    log("corpus: " + ", ".join(f"{k} {len(v)} texts / {sum(map(len, v)):,} chars" for k, v in corpus.items()))
    tokenizer = train_tokenizer(texts, cfg.vocab_size)
    log(f"tokenizer: {len(tokenizer)} tokens ({time.perf_counter() - t_start:.0f}s)")
    batches = Batches(tokenizer, cfg, corpus)
    log(
        "streams: "
        + ", ".join(f"{k} {len(s.ids):,} tokens" for k, s in batches.streams.items())
        + f" ({time.perf_counter() - t_start:.0f}s)"
    )
    model = build_model(cfg, len(tokenizer), tokenizer)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"model: {cfg.member} ({type(model).__name__}), {n_params:,} parameters, L={cfg.length}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_heads} heads, torch threads {threads}"
    )
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    total = cfg.steps
    history: list[dict[str, Any]] = []
    t_train = time.perf_counter()
    ema = None
    step = 0
    while step < total:
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg, total)
        ids, weights, kinds = batches.next()
        logits = model(input_ids=ids).logits
        loss, nll = weighted_loss(logits, ids, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        with torch.no_grad():

            def part(kind: str, answers: bool, kinds=kinds, weights=weights, nll=nll) -> float:
                rows = torch.tensor([k == kind for k in kinds])[:, None]
                mask = rows & ((weights[:, 1:] > 1) if answers else torch.ones_like(weights[:, 1:], dtype=torch.bool))
                return float(nll[mask].mean()) if mask.any() else float("nan")

            lm_loss, ans_loss, recall_loss = part("lm", False), part("needle", True), part("recall", True)
        value = float(loss.detach())
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        if minutes is not None and step == 20:
            per_step = (time.perf_counter() - t_train) / step
            total = max(step + 1, int(minutes * 60 / per_step))
            log(f"--minutes {minutes:g}: {per_step:.2f}s per step -> {total} steps")
        if step % 50 == 0 or step == total:
            elapsed = time.perf_counter() - t_train
            row = {
                "step": step,
                "loss": round(value, 4),
                "loss_ema": round(ema, 4),
                "lm_loss": round(lm_loss, 4),
                "answer_loss": round(ans_loss, 4),
                "recall_loss": round(recall_loss, 4),
                "lr": round(_lr(step - 1, cfg, total), 6),
                "seconds": round(elapsed, 1),
                "tokens_per_s": round(step * cfg.batch_size * cfg.length / elapsed),
            }
            if evaluate and (step % cfg.eval_every == 0 or step == total):
                row.update({k: round(v, 4) for k, v in needle_check(model, tokenizer, cfg.length).items()})
            history.append(row)
            log(" ".join(f"{k}={v}" for k, v in row.items()))
        if stop_after is not None and step >= stop_after:
            evaluate = False
            break
    stopped_early = step < total
    train_seconds = time.perf_counter() - t_train
    model.eval()
    summary: dict[str, Any] = {
        "config": asdict(cfg),
        "steps": total,
        "steps_run": step,
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "tokens_seen": total * cfg.batch_size * cfg.length,
        "train_seconds": round(train_seconds, 1),
        "final_loss_ema": round(ema, 4) if ema is not None else None,
        "final_lm_loss": history[-1]["lm_loss"] if history else None,
        "torch_threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    if evaluate:
        summary.update(
            {
                k: round(v, 4) if isinstance(v, float) else v
                for k, v in held_out_loss(model, tokenizer, cfg.length).items()
            }
        )
        summary.update({k: round(v, 4) for k, v in needle_check(model, tokenizer, cfg.length, n=96, seed=99).items()})
    if stopped_early:  # a check of the first steps: nothing to save
        summary["history"] = history
        return summary
    out.mkdir(parents=True, exist_ok=True)
    if cfg.save_dtype == "float16":
        model = model.to(torch.float16)
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    summary["total_seconds"] = round(time.perf_counter() - t_start, 1)
    summary["history"] = history
    (out / "training_log.json").write_text(json.dumps(summary, indent=1))
    if cfg.member != "tiny":  # tiny's card is written by hand
        from .family import model_card

        (out / "MODEL_CARD.md").write_text(model_card(cfg.member, summary))
    log(
        f"saved {out} ({summary['total_seconds']:.0f}s in all; held-out ppl {summary.get('held_out_ppl')}, "
        f"needle (forced, L) {summary.get('needle_forced_acc')})"
    )
    return summary
