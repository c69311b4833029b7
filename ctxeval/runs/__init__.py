"""A run directory: the row contract (rows), run.json + rows.jsonl written so that nothing measured is lost
(store), its lock (lock), and the ranks of a torchrun job (distributed)."""
