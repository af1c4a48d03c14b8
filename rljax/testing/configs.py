"""Model and run configs for tests and research code; the recipes themselves live in configs/.

``TINY_MODEL`` is the default recipe's ~0.4M-parameter model (``configs/arith_tiny.py``), small
enough to build engines and learners in a unit test. For a whole run that finishes in seconds,
use that recipe's ``small`` variant: ``rljax.configs.arith_tiny.recipe("small")``.
"""

from __future__ import annotations

from rljax.configs import arith_tiny

TINY_MODEL = arith_tiny.MODEL
