"""Experiment recipes, one file per experiment, importable as ``rljax.configs``.

Each file defines ``get_config(arg) -> ml_collections.ConfigDict`` (what ``rljax
--config=configs/<name>.py[:arg]`` loads), ``VARIANTS`` (every ``arg`` it accepts besides none;
``small`` always means "shrunk for the CPU"), and, for runs, ``recipe(variant) -> RunConfig``,
the typed config behind ``get_config``. The launch command is in each module's docstring.
"""
