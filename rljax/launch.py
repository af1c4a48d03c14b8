"""The rljax launcher: ``rljax --config=configs/<name>.py[:arg] --workdir=DIR``.

With no ``--config`` it runs the embedded default (``rljax.testing.configs.arith_tiny``).
Override any key with ``--config.<section>.<key>=<value>``. This file only parses flags and
calls library code.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment file configs/<name>.py[:arg].",
    # Not locked: an unknown --config.<key> is let through to rljax.config, which rejects it
    # with a one-line error listing the valid keys (a locked ConfigDict raises a traceback).
    lock_config=False,
    accept_new_attributes=True,
)
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/rljax/default", "Run directory (local or gs://).")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax

    # Random bits that do not depend on how arrays are sharded.
    jax.config.update("jax_threefry_partitionable", True)

    from rljax import config as config_lib
    from rljax import runtime
    from rljax.mesh import distributed
    from rljax.testing.configs import arith_tiny

    try:
        # Joins the hosts of a pod (or JAX_COORDINATOR_ADDRESS world) before any device is used.
        world = distributed.maybe_initialize()
        cfg = (
            config_lib.from_config_dict(_CONFIG.value)
            if _CONFIG.value is not None
            else arith_tiny()
        )
        summary = runtime.run(cfg, _WORKDIR.value)
    except (config_lib.ConfigError, distributed.DistributedConfigError) as e:
        sys.exit(f"rljax: {e}")
    if not world.is_primary:
        return
    print(json.dumps({k: v for k, v in summary.items() if k != "last"}, default=float))


def run() -> None:
    """Console-script entry point."""
    app.run(main)


if __name__ == "__main__":
    run()
