"""Text sources -> documents -> token ids (cached).

A data spec is one of:
  - a named offline corpus: `pydoc` (CPython's bundled docs held out from the tiny model's training),
    `austen`, `mobydick` (Debian packages, see offline.py);
  - local paths, directories or globs: a `.txt`/`.md` file is ONE document; `.jsonl`/`.json`/`.parquet`/`.csv`
    hold one document per record in the text field (read with `datasets`);
  - `hf:NAME[:CONFIG][@SPLIT]` through `datasets.load_dataset` (needs the network).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..errors import CtxevalError
from ..util.hub import hub_reachable, offline_unless_reachable
from ..util.paths import cache_dir
from ..util.textfiles import decode, read_bytes
from .offline import NAMED_CORPORA, check_named_corpus, held_out_documents, load_named_corpus

TEXT_SUFFIXES = {".txt", ".md", ".text", ".rst"}
# corpora every install has: CPython's bundled docs, the part held out from the bundled tiny model's training
BUILTIN_CORPORA = {
    "pydoc": "CPython's bundled documentation (pydoc_data), the topics held out from the tiny model's training"
}
ALL_CORPORA = {**BUILTIN_CORPORA, **NAMED_CORPORA}
RECORD_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass(frozen=True)
class Document:
    doc_id: str  # stable within the data spec: title, file path, or record index
    text: str


def _local_files(spec: str, what: str = "--data") -> list[Path]:
    path = Path(spec).expanduser()
    if any(ch in spec for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True) if Path(p).is_file())
        if not files:
            raise CtxevalError(f"{what} '{spec}' matches no files")
        return files
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES | set(RECORD_SUFFIXES)
        )
        if not files:
            raise CtxevalError(f"{what} directory '{spec}' holds no .txt/.md/.jsonl/.json/.parquet/.csv files")
        return files
    if path.is_file():
        return [path]
    named = ", ".join(ALL_CORPORA)
    raise CtxevalError(
        f"{what} '{spec}': no such file or directory (named corpora: {named}; or hf:NAME[:CONFIG][@SPLIT])"
    )


def _read_text_file(path: Path) -> str:
    raw = read_bytes(path, "--data file")
    if b"\x00" in raw[:8192]:
        raise CtxevalError(f"'{path}' is not a text file (binary content); give .txt, .jsonl, .json, .parquet or .csv")
    return decode(raw, f"--data file {path}")


def _records(path: Path, text_field: str) -> Iterator[Document]:
    import datasets

    kind = RECORD_SUFFIXES[path.suffix.lower()]
    if path.stat().st_size == 0:
        raise CtxevalError(f"'{path}' is empty; give {kind} records with a '{text_field}' field")
    # quiet while reading: ctxeval draws its own progress, and a parse error is told once, in ctxeval's line
    verbosity, bars = datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(kind, data_files=str(path), split="train")
    except Exception as exc:  # datasets raises many types for malformed files, some without a message
        reason = exc.__cause__ or exc  # "An error occurred while generating the dataset" wraps the parser's error
        first_line = (str(reason).splitlines() or [type(reason).__name__])[0]
        raise CtxevalError(f"cannot read '{path}' as {kind}: {first_line[:200]}") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()
    if text_field not in ds.column_names:
        raise CtxevalError(
            f"'{path}' has no field '{text_field}' (fields: {', '.join(ds.column_names)}); use --text-field"
        )
    for i, text in enumerate(ds[text_field]):
        if isinstance(text, str) and text:
            yield Document(f"{path.name}#{i}", text)


def _hf_parts(spec: str, what: str = "--data") -> tuple[str, str, str]:
    """NAME, CONFIG, SPLIT of hf:NAME[:CONFIG][@SPLIT] (empty when not given); a CtxevalError when NAME is missing."""
    body, _, split = spec[3:].partition("@")
    name, _, config = body.partition(":")
    if not name.strip():
        raise CtxevalError(f"{what} '{spec}': write hf:NAME[:CONFIG][@SPLIT], e.g. hf:emozilla/pg19-test@test")
    return name, config, split


def _hf(spec: str, text_field: str) -> Iterator[Document]:
    import datasets

    name, config, split = _hf_parts(spec)
    offline_unless_reachable()
    try:
        ds = datasets.load_dataset(name, config or None, split=split or "test", streaming=True)
        for i, row in enumerate(ds):
            if text_field not in row:
                raise CtxevalError(f"{spec} has no field '{text_field}' (fields: {', '.join(row)}); use --text-field")
            yield Document(f"{name}#{i}", row[text_field])
    except CtxevalError:
        raise
    except Exception as exc:  # offline: ConnectionError, OSError, DatasetNotFoundError ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        if not hub_reachable():
            first = "the Hugging Face Hub is unreachable (no network) and the dataset is not cached"
        raise CtxevalError(
            f"could not load {spec} from the Hugging Face Hub ({first}); check the name and your network, or use a "
            f"local file or an offline corpus ({', '.join(ALL_CORPORA)})"
        ) from None


def check_data_spec(spec: str, what: str = "--data", text_field: str = "text") -> None:
    """Fail now, with one line, when the data spec cannot be read: an offline corpus that is not installed, local
    paths that do not exist or hold no readable file type, an hf: spec that is not hf:NAME[:CONFIG][@SPLIT], a
    reader (`datasets`) that is not installed. Cheap (a look at names and file types; nothing is read, the network
    is not asked): the commands call it before loading a model, so that a wrong --data fails in a second, not after
    the model's conversion. `what` names the option in the message."""
    if spec == "pydoc":
        return
    if spec in NAMED_CORPORA:
        check_named_corpus(spec)
        return
    if spec.startswith("hf:"):
        _hf_parts(spec, what)
        _need_datasets(spec, what)
        return
    for path in _local_files(spec, what):
        suffix = path.suffix.lower()
        if suffix in RECORD_SUFFIXES:
            _need_datasets(str(path), what)
            if path.stat().st_size == 0:
                raise CtxevalError(
                    f"{what} '{path}' is empty; give {RECORD_SUFFIXES[suffix]} records with a '{text_field}' field"
                )
        elif suffix and suffix not in TEXT_SUFFIXES:
            raise CtxevalError(
                f"'{path}': unsupported file type '{suffix}'; give .txt/.md, .jsonl/.json, .parquet or .csv"
            )


def _need_datasets(spec: str, what: str) -> None:
    if importlib.util.find_spec("datasets") is None:
        raise CtxevalError(
            f"{what} '{spec}' is read with the datasets package, which is not installed: pip install "
            f"datasets, or give .txt files or an offline corpus ({', '.join(ALL_CORPORA)})"
        )


def iter_documents(spec: str, text_field: str = "text") -> Iterator[Document]:
    """Documents of a data spec, in corpus order (lazily: hub datasets stream)."""
    if spec == "pydoc":
        for title, text in held_out_documents():
            yield Document(title, text)
        return
    if spec in NAMED_CORPORA:
        for title, text in load_named_corpus(spec):
            yield Document(title, text)
        return
    if spec.startswith("hf:"):
        yield from _hf(spec, text_field)
        return
    for path in _local_files(spec):
        suffix = path.suffix.lower()
        if suffix in RECORD_SUFFIXES:
            yield from _records(path, text_field)
        elif suffix in TEXT_SUFFIXES or not suffix:
            yield Document(str(path), _read_text_file(path))
        else:
            raise CtxevalError(
                f"'{path}': unsupported file type '{suffix}'; give .txt/.md, .jsonl/.json, .parquet or .csv"
            )


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Identifies a tokenizer for the token cache: its name/path, class, vocab size and a hash of its vocab."""
    cached = getattr(tokenizer, "_ctxeval_fingerprint", None)
    if cached:
        return cached
    backend = getattr(tokenizer, "backend_tokenizer", None)
    # the whole definition (vocab, merges, normalizer, pre-tokenizer) plus the Python-side options
    definition = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    options = json.dumps({k: str(v) for k, v in sorted(getattr(tokenizer, "init_kwargs", {}).items())})
    digest = hashlib.sha256((definition + options).encode()).hexdigest()[:24]
    fingerprint = f"{type(tokenizer).__name__}-{len(tokenizer)}-{digest}"
    try:
        tokenizer._ctxeval_fingerprint = fingerprint
    except AttributeError:
        pass
    return fingerprint


def tokenize(tokenizer: Any, doc: Document, cache: bool = True) -> np.ndarray:
    """Token ids of a whole document, without special tokens, cached under the user cache dir.  # (n_tokens,)"""
    key = hashlib.sha256(f"{tokenizer_fingerprint(tokenizer)}\0{doc.text}".encode()).hexdigest()[:32]
    path = cache_dir() / "tokens" / f"{key}.npy"
    if cache and path.is_file():
        try:
            return np.load(path)
        except (OSError, ValueError):
            pass  # damaged cache entry: re-tokenize
    ids = np.asarray(tokenizer(doc.text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    if cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
            np.save(tmp, ids)
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs speed
    return ids


@dataclass(frozen=True)
class TokenDoc:
    doc_id: str
    ids: np.ndarray  # (n_tokens,) int64, no special tokens


def select_long_documents(
    spec: str, tokenizer: Any, n_docs: int, min_tokens: int, text_field: str = "text", max_scan: int | None = 10_000
) -> list[TokenDoc]:
    """The first `n_docs` documents in corpus order with at least `min_tokens` tokens (the YaRN truncate protocol),
    looking at no more than `max_scan` documents (None: the whole corpus)."""
    chosen: list[TokenDoc] = []
    longest, scanned = 0, 0
    for doc in iter_documents(spec, text_field):
        ids = tokenize(tokenizer, doc)
        scanned += 1
        longest = max(longest, len(ids))
        if len(ids) >= min_tokens:
            chosen.append(TokenDoc(doc.doc_id, ids))
            if len(chosen) == n_docs:
                return chosen
        if max_scan is not None and scanned >= max_scan:
            break
    if not chosen:
        raise CtxevalError(
            f"no document in '{spec}' has {min_tokens} tokens (the longest of {scanned} has {longest}); "
            "use shorter --lengths or longer documents"
        )
    raise CtxevalError(
        f"only {len(chosen)} document(s) in '{spec}' have {min_tokens} tokens but --docs {n_docs} was asked; "
        f"use --docs {len(chosen)} or shorter --lengths"
    )


def first_documents(
    spec: str, tokenizer: Any, n_docs: int, text_field: str = "text", min_tokens: int = 2
) -> list[TokenDoc]:
    """The first `n_docs` documents with at least `min_tokens` tokens (sliding-window protocol)."""
    chosen = []
    for doc in iter_documents(spec, text_field):
        ids = tokenize(tokenizer, doc)
        if len(ids) >= min_tokens:
            chosen.append(TokenDoc(doc.doc_id, ids))
            if len(chosen) == n_docs:
                break
    if not chosen:
        raise CtxevalError(f"'{spec}' holds no document with at least {min_tokens} tokens")
    return chosen
