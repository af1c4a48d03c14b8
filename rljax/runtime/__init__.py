"""The runtime: builds a run from its config (``run.py``) and drives it (``driver.py``).

``Run(cfg, workdir).train()`` or ``run(cfg, workdir)``, on one process or every process of a
pod (``hosting.py`` picks the parts that differ); see docs/library.md.
"""

from rljax.runtime.run import Run, run

__all__ = ["Run", "run"]
