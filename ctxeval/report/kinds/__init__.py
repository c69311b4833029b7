"""One module per task kind: its protocol key, tables, figures and captions as a report.kind.Kind (ppl, needle and
passkey, entropy, ruler, lm-eval, tune); report/registry.py lists them in the report's order."""
