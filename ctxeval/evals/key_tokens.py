"""Key tokens and LongPPL (Fang et al. 2025, "What is Wrong with Perplexity for Long-context Language Modeling?").

A key token is one an evaluator model predicts much better with the long context than with a short one. LongPPL's
`find_key_token` (PKU-ML/LongPPL, longppl/longppl.py), which this follows step by step:
  - one forward of the evaluator over the whole sequence: the long-context loss of every token;
  - short windows of `context + window` tokens starting at 0, window, 2 window, ... (while start < n - context; the
    last one cut at the sequence's end): each scores the tokens at start + context .. start + context + window - 1,
    so every such token sees between `context` and `context + window - 1` tokens of context;
  - key: short loss - long loss > alpha and long loss < beta (alpha = beta = 2): the long context lowers the loss by
    more than 2 nats, and the evaluator is confident with it (probability > e^-2).
What each model reads, as the original: the evaluator reads the text with its tokenizer's default special tokens
(`find_key_token` calls the tokenizer with its defaults: BOS first for Llama's), the evaluated model reads it
without them (`compute_longppl` tokenizes with add_special_tokens=False); `ctxeval ppl --key-tokens` therefore
defaults to --no-bos, and `--bos` gives the evaluated model BOS while the evaluator keeps its tokenizer's defaults.
Tokens before the evaluator's position `context` are never key tokens. LongPPL of a model = exp(mean NLL over the
key tokens); over documents exp(sum key NLL / sum key tokens) (report/tables.py).

Kept differences: both models read the document's token ids (the original decodes them to text and tokenizes the
text again, which can change tokens where decoding and encoding are not inverse), so they must share a tokenizer
(refused otherwise; the paper's code aligns two tokenizers by character offsets); the key tokens of a shorter length
are the longest length's key tokens before it (the same set LongPPL finds on the truncated text: a causal
evaluator's losses and the window starts do not depend on where the text ends).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..data.corpora import TokenDoc
from ..errors import CtxevalError
from ..models.load import LoadedModel
from ..runs.distributed import current
from ..runs.store import RunStore
from ..specs import MethodSpec
from ..util.numbers import whole_number
from ..util.textfiles import MAX_TEXT_BYTES, read_json, write_text
from .common import Progress, SilentProgress, oom_guard
from .perplexity import token_nll
from .sweep import applying, length_dependent

ALPHA = 2.0  # LongPPL: the short-context loss must exceed the long-context loss by more than this (nats)
BETA = 2.0  # LongPPL: the long-context loss must be below this (log-probability > -2)
PAPER_CONTEXT, PAPER_WINDOW = 4096, 1024  # LongPPL's trunc_len and internal
CACHE_FILE = "key-tokens.json"


@dataclass(frozen=True)
class KeyTokenSettings:
    """Which evaluator finds the key tokens, under which method, with which short context."""

    evaluator: str  # model name as --key-tokens gives it
    method: str  # the evaluator's method label (e.g. yarn(factor=2))
    context: int  # LongPPL's trunc_len: the short context
    window: int  # LongPPL's internal: the short windows' stride
    evaluator_prefix: tuple[int, ...] = ()  # the special tokens the evaluator's tokenizer puts before a text
    bos: bool = False  # whether the evaluated model's sequences start with BOS
    alpha: float = ALPHA
    beta: float = BETA

    def record(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "evaluator_prefix": list(self.evaluator_prefix),
            "rule": "LongPPL find_key_token: short loss - long loss > alpha and long loss < beta",
        }


def default_context(trained_length: int, longest: int) -> int:
    """LongPPL's 4096-token short context (its trunc_len, for every model the paper evaluates, 4k-trained Llama-2
    included) when the longest length exceeds it; below that, half the shorter of the trained and longest lengths
    (a small model, where 4096 tokens would leave no token with more than the short context)."""
    if longest > PAPER_CONTEXT:
        return PAPER_CONTEXT
    return max(2, min(trained_length, longest) // 2)


def default_window(context: int) -> int:
    """LongPPL's 1024-token stride for its 4096-token context: a quarter of the short context."""
    return max(1, context // (PAPER_CONTEXT // PAPER_WINDOW))


def check_settings(settings: KeyTokenSettings, lengths: tuple[int, ...], protocol: str) -> None:
    if protocol != "truncate":
        raise CtxevalError("--key-tokens (LongPPL) scores one long context per document: use --protocol truncate")
    if settings.context < 1 or settings.window < 1:
        raise CtxevalError(
            f"--key-tokens-context must be at least 1 token (its stride a quarter of it, at least 1), "
            f"got {settings.context}"
        )
    if settings.context >= max(lengths):
        raise CtxevalError(
            f"--key-tokens-context {settings.context} is not shorter than the longest length "
            f"{max(lengths)}: no token would have more than the short context; use a smaller "
            "--key-tokens-context or longer --lengths"
        )


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers map text to the same ids (same vocabulary, BOS and default special tokens)."""
    if a is b:
        return True
    return (
        a.get_vocab() == b.get_vocab()
        and getattr(a, "bos_token_id", None) == getattr(b, "bos_token_id", None)
        and special_prefix(a) == special_prefix(b)
    )


def special_prefix(tokenizer: Any) -> tuple[int, ...]:
    """The ids a tokenizer puts before a text when called with its defaults (BOS for Llama's, nothing for GPT-2's):
    what LongPPL's find_key_token gives the evaluator ahead of the text."""
    probe = "The key tokens are found here."
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(probe)["input_ids"])
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return tuple(full[:start])
    raise CtxevalError(
        "the tokenizer's default special tokens change the text's own tokens; LongPPL's key tokens "
        "cannot be placed: use an evaluator whose tokenizer only adds tokens around the text"
    )


@torch.inference_mode()
def key_positions(
    model: torch.nn.Module,
    device: str,
    sequence: list[int],
    context: int,
    window: int,
    alpha: float = ALPHA,
    beta: float = BETA,
    chunk_size: int = 1024,
) -> np.ndarray:
    """The key tokens of one sequence as positions t (index into `sequence`), ascending."""
    ids = torch.tensor([sequence], device=device)  # (1, n)
    n = len(sequence)
    with oom_guard(device):
        long = token_nll(model, ids, chunk_size).double()  # (n-1,): long[t - 1] is token t's loss
    keys = []
    for start in range(0, n - context, window):
        stop = min(start + context + window, n)
        with oom_guard(device):
            short = token_nll(model, ids[:, start:stop], chunk_size).double()  # short[j] predicts start + j + 1
        targets = torch.arange(start + context, stop)
        short_loss, long_loss = short[targets - start - 1], long[targets - 1]
        keys.append(targets[((short_loss - long_loss) > alpha) & (long_loss < beta)])
    return torch.cat(keys).numpy().astype(np.int64) if keys else np.zeros(0, dtype=np.int64)


def document_sequence(doc: TokenDoc, length: int, bos: int | None) -> list[int]:
    """The sequence the truncate protocol feeds at `length`: BOS (if any) + the document's first tokens."""
    n_doc = length - 1 if bos is not None else length
    return ([bos] if bos is not None else []) + doc.ids[:n_doc].tolist()


def evaluator_keys(
    model: torch.nn.Module, device: str, document: list[int], settings: KeyTokenSettings, chunk_size: int
) -> np.ndarray:
    """Key tokens of the document tokens the evaluated model reads, as positions in its sequence (BOS first when
    settings.bos): the evaluator reads the same tokens behind its own tokenizer's default prefix, as LongPPL's
    find_key_token, so its key token at position e is the document's token e - len(prefix)."""
    prefix = list(settings.evaluator_prefix)
    found = key_positions(
        model, device, prefix + document, settings.context, settings.window, settings.alpha, settings.beta, chunk_size
    )
    positions = found - len(prefix) + (1 if settings.bos else 0)
    return positions[positions >= 1]  # position 0 has no loss (never the case while context > len(prefix))


def read_cache(path: Path, settings: KeyTokenSettings, expected: dict[str, int]) -> dict[str, np.ndarray] | None:
    """The cached key tokens, if the file holds these settings and these documents at these sequence lengths, each
    document's positions whole numbers increasing inside its sequence (1 .. tokens - 1); None for anything else (a
    file another tool or an edit left: the key tokens are found again and the file replaced)."""
    try:
        data = read_json(path, "key-tokens file", max_bytes=MAX_TEXT_BYTES, finite=False)
    except CtxevalError:
        return None
    if not isinstance(data, dict) or data.get("settings") != json.loads(json.dumps(settings.record())):
        return None
    docs = data.get("documents")
    if not isinstance(docs, dict):
        return None
    found = {}
    for doc, n in expected.items():
        entry = docs.get(doc)
        if (
            not isinstance(entry, dict)
            or entry.get("sequence_tokens") != n
            or not isinstance(entry.get("positions"), list)
        ):
            return None
        positions = [whole_number(p, minimum=1, maximum=n - 1) for p in entry["positions"]]
        if None in positions or any(b <= a for a, b in zip(positions, positions[1:])):
            return None
        found[doc] = np.asarray(positions, dtype=np.int64)
    return found


def summary(settings: KeyTokenSettings, found: dict[str, np.ndarray], expected: dict[str, int]) -> dict[str, Any]:
    """What run.json records: the settings, and per document how many of its candidate tokens are key tokens."""
    docs = []
    for doc, positions in found.items():
        evaluator_tokens = expected[doc] - (1 if settings.bos else 0) + len(settings.evaluator_prefix)
        candidates = max(0, evaluator_tokens - settings.context)
        docs.append(
            {
                "doc": doc,
                "key_tokens": int(len(positions)),
                "candidates": candidates,
                "fraction": round(len(positions) / candidates, 6) if candidates else None,
            }
        )
    return {**settings.record(), "file": CACHE_FILE, "documents": docs}


def find_key_tokens(
    store: RunStore,
    settings: KeyTokenSettings,
    load_evaluator: Callable[[], tuple[LoadedModel, Callable[[], None]]],
    spec: MethodSpec,
    docs: list[TokenDoc],
    max_length: int,
    bos: int | None,
    chunk_size: int,
    progress: Progress | None = None,
) -> dict[str, np.ndarray]:
    """doc id -> key-token positions, computed once per run directory (key-tokens.json) by the main rank under the
    evaluator's method, then read by every rank; run.json's `key_tokens` records the counts."""
    if settings.bos != (bos is not None):
        raise ValueError(f"KeyTokenSettings.bos is {settings.bos} but the sequences' BOS id is {bos}")
    progress = progress or SilentProgress()
    dist = current()
    path = Path(store.dir) / CACHE_FILE
    expected = {d.doc_id: len(document_sequence(d, max_length, bos)) for d in docs}
    found = read_cache(path, settings, expected) if dist.is_main else None
    if dist.is_main and found is None:
        lm, release = load_evaluator()
        try:
            if length_dependent(spec, lm):
                raise CtxevalError(
                    f"--key-tokens-method {spec.label} depends on the sequence length; key tokens are "
                    "found once per document: give a static method (e.g. yarn:factor=2)"
                )
            found = {}
            with applying(lm, spec, (max_length,)):
                for doc in docs:
                    progress.note(f"key tokens: {settings.evaluator} under {spec.label} on {doc.doc_id}")
                    document = document_sequence(doc, max_length, bos)[1 if bos is not None else 0 :]
                    found[doc.doc_id] = evaluator_keys(lm.model, lm.device, document, settings, chunk_size)
        finally:
            release()
        data = {
            "settings": settings.record(),
            "documents": {doc: {"sequence_tokens": expected[doc], "positions": found[doc].tolist()} for doc in found},
        }
        write_text(path, json.dumps(data) + "\n", "key-tokens file")
    if dist.is_main:
        store.update(key_tokens=summary(settings, found, expected))
    dist.barrier()
    if found is None:
        found = read_cache(path, settings, expected)
        if found is None:
            raise CtxevalError(f"{path} is missing or stale on this rank; run the command again")
    return found
