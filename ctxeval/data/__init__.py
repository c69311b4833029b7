"""What evaluations read: corpora by name or path, tokenized into documents (corpora), the offline corpora and the
tiny model's held-out split (offline), and the TOML presets of tasks/ (presets)."""
