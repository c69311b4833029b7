"""Reports, derived from rows only: a run's own outputs (single.py) and `ctxeval report` over any set of runs
(runs.py loads and groups them, merged.py builds the tables with ppl_tables.py, render.py and html.py write them);
tables.py formats every cell and plots.py draws every figure for both; assets/ holds the HTML page's style sheet
and script."""
