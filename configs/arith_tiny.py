"""The embedded default: SFT warm start then GRPO on 2-digit addition, CPU, a few minutes.

    rljax --config=configs/arith_tiny.py --workdir=/tmp/rljax/arith_tiny
    rljax --config=configs/arith_tiny.py:test --workdir=/tmp/rljax/test   # < 1 minute

Override any key: ``--config.learner.learning_rate=1e-4``.
"""

from rljax.config import to_config_dict
from rljax.testing.configs import arith_tiny


def get_config(arg: str | None = None):
    return to_config_dict(arith_tiny(arg or ""))
