"""The runtime: builds a run from its config (``run.py``) and drives it (``driver.py``).

``Run(cfg, workdir).train()`` or ``run(cfg, workdir)``; see docs/library.md.
"""

from rljax.runtime.run import Run, run

__all__ = ["Run", "run"]
