"""ctxeval: measure how well RoPE context-extension methods work (perplexity vs. length, needle in a haystack)."""

__version__ = "0.1.0"


def apply_method(model, method, geometry=None, **params):  # noqa: ANN001, ANN201 - re-exported, see patching
    """Apply a RoPE method to a loaded model in place; see `ctxeval.rope.patching.apply_method`."""
    from .rope.patching import apply_method as _apply

    return _apply(model, method, geometry, **params)
