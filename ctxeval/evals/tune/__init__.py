"""ctxeval tune: the search space of each method (space), the optuna search and its trial scorer (search), the export
to a config transformers loads natively (export), and the job that ties them to a run directory (job)."""
