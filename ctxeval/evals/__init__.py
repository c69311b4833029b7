"""One module per task kind: perplexity (with positions and key_tokens for LongPPL), needle, passkey, entropy and
the lm-eval bridge, all on the shared work planner (sweep) and progress/OOM helpers (common); RULER in ruler/, the
parameter search in tune/."""
