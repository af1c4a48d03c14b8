"""The runtime: builds a run from its config (``run.py``) and drives it (``driver.py``).

``Run(cfg, workdir).train()`` or ``run(cfg, workdir)``; see docs/library.md.
"""

from rljax.runtime import pod_run as _pod_run  # noqa: F401 - registers PodRun with Run
from rljax.runtime.run import Run, run

__all__ = ["Run", "run"]
