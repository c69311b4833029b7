"""Reports, derived from rows only: a run's own outputs (each kind's module in kinds/, with what they share in single.py) and `ctxeval report` over any set of
runs (runs.py loads and groups them, merged.py merges each group's rows, render.py and html.py write them). What a
task kind is to the report (its protocol key, tables, figures, captions) is a Kind (kind.py), one module per kind
in kinds/, listed in registry.py; tables.py formats every cell, plots.py draws every figure and figures.py holds
what every kind's figures share; assets/ holds the HTML page's style sheet and script."""
