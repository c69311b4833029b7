"""The presets (TOML files, data only). This file only makes the folder the package `ctxeval.tasks`, so that a wheel
and an editable install find the presets the same way (importlib.resources); ctxeval/data/presets.py reads them."""
