"""One module per task kind: perplexity (with positions and key_tokens for LongPPL), needle (with haystack, its
prompts), passkey, entropy and the lm-eval bridge, all on the shared work planner (sweep) and progress/OOM helpers
(common: the one out-of-memory ladder); RULER in ruler/, whose runner also runs the retrieval suites (retrieval/), the
sample record and prompt templates both use in prompts/, the parameter search in tune/."""
