"""evals/prompts/templates.py: a template is checked by name, in one line naming RULER's and ctxeval's."""

from __future__ import annotations

import pytest


def test_templates_are_checked_by_name():
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.prompts.templates import MODEL_TEMPLATES, check_template

    assert check_template("meta-chat") == "meta-chat"
    with pytest.raises(CtxevalError) as exc:
        check_template("llama")
    assert str(exc.value) == (
        "unknown RULER model template 'llama'; templates (RULER's template.py): "
        + ", ".join(MODEL_TEMPLATES)
        + "; ctxeval's: auto, chat (the tokenizer's chat template)"
    )
