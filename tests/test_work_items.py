"""Typed work-item payloads: a document sweep's DocumentBatch (one document per planned item, merged by ppl's
--batch-size), and what each evaluation's work function receives."""

from types import SimpleNamespace

import pytest

from ctxeval.evals.perplexity import batch_documents
from ctxeval.evals.sweep import DocumentBatch, WorkItem


def _doc(doc_id):
    return SimpleNamespace(doc_id=doc_id)


def test_a_one_document_batch_gives_its_document_and_a_merged_one_refuses():
    a, b = _doc("a"), _doc("b")
    assert DocumentBatch((a,), (16, 32)).document is a
    with pytest.raises(ValueError):
        _ = DocumentBatch((a, b), (16,)).document


def test_batch_documents_merges_the_documents_of_one_method_waiting_for_the_same_lengths():
    a, b, c, d = map(_doc, "abcd")
    items = [
        WorkItem(0, DocumentBatch((a,), (16, 32)), 1.0, 10, 32),
        WorkItem(0, DocumentBatch((b,), (16, 32)), 2.0, 20, 32),
        WorkItem(0, DocumentBatch((c,), (16, 32)), 4.0, 40, 32),
        WorkItem(0, DocumentBatch((d,), (32,)), 8.0, 80, 32),
        WorkItem(1, DocumentBatch((a,), (16, 32)), 16.0, 160, 32),
    ]
    assert batch_documents(items, 2) == [
        WorkItem(0, DocumentBatch((a, b), (16, 32)), 3.0, 30, 32),
        WorkItem(0, DocumentBatch((c,), (16, 32)), 4.0, 40, 32),
        WorkItem(0, DocumentBatch((d,), (32,)), 8.0, 80, 32),
        WorkItem(1, DocumentBatch((a,), (16, 32)), 16.0, 160, 32),
    ]
