"""The rljax launcher: ``rljax --config=configs/<name>.py[:variant] --workdir=DIR``.

With no ``--config`` it runs the default recipe, ``configs/arith_tiny.py`` (installed as
``rljax.configs.arith_tiny``). Override any key with ``--config.<section>.<key>=<value>``, with
or without ``--config``. This file only parses flags and calls library code.
"""

from __future__ import annotations

import faulthandler
import json
import pathlib
import re
import signal
import sys

from absl import app, flags
from ml_collections import config_flags

from rljax import configs as recipes

# The installed file of configs/arith_tiny.py (its package holds only a docstring to import).
DEFAULT_CONFIG = str(pathlib.Path(recipes.__file__).with_name("arith_tiny.py"))
_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment file configs/<name>.py[:variant]; without it, the default recipe "
    f"{DEFAULT_CONFIG}.",
    # Not locked: an unknown --config.<key> is let through to rljax.config, which rejects it
    # with a one-line error listing the valid keys (a locked ConfigDict raises a traceback).
    lock_config=False,
    accept_new_attributes=True,
)
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/rljax/default", "Run directory (local or gs://).")


def _last_line(error: BaseException) -> str:
    """The message a traceback ends with, without its exception type."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return re.sub(r"^\w+(Error|Exception): ", "", lines[-1]) if lines else repr(error)


def _cannot_load(error: OSError) -> str:
    return (
        f"cannot load the --config file: {_last_line(error)}; name a file such as "
        "configs/arith_tiny.py, relative to the current directory"
    )


def _with_default_config(argv: list[str]) -> list[str]:
    """``argv`` with ``--config`` naming the default recipe when it names no file.

    The default is passed as a flag rather than as DEFINE_config_file's default: config_flags
    loads a default file (and defines the ``--config.<key>`` flags) when this module is
    imported, where a bad override raises a traceback instead of :func:`_parse_flags`'s one
    line.
    """
    if any(re.match(r"^--?config(=|$)", arg) for arg in argv):  # config_flags' own test
        return argv
    return [*argv[:1], f"--config={DEFAULT_CONFIG}", *argv[1:]]


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, ending in one line on bad input.

    config_flags folds the config file's traceback into its message (an unknown variant, say);
    the traceback's last line is the message.
    """
    try:
        return flags.FLAGS(_with_default_config(argv))
    except flags.Error as e:
        message = _last_line(e)
        if isinstance(e, flags.IllegalFlagValueError) and str(e).startswith("flag --config."):
            message += "; give the key a value of the type its default in the config file has"
        sys.exit(f"rljax: {message}")
    except OSError as e:  # a missing config file, when --config.<key> overrides touch it
        sys.exit(f"rljax: {_cannot_load(e)}")
    except SyntaxError as e:  # config_flags imports the --config file while parsing
        sys.exit(
            f"rljax: the --config file {e.filename} does not parse (line {e.lineno}: {e.msg}); "
            "fix its Python syntax"
        )
    except AttributeError as e:
        if "get_config" not in str(e):
            raise
        sys.exit(
            "rljax: the --config file has no get_config(arg) function; define one that returns "
            "the run's ConfigDict, as configs/arith_tiny.py does"
        )


def _run_config(config_lib):
    """The typed config of --config (the default recipe when the command line names none)."""
    try:
        return config_lib.from_config_dict(_CONFIG.value)
    except OSError as e:  # config_flags defers a missing file's error to the first access
        raise config_lib.ConfigError(_cannot_load(e)) from None


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax

    # `kill -USR1 <pid>` prints every thread's stack to stderr: where a hung pod process waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Random bits that do not depend on how arrays are sharded.
    jax.config.update("jax_threefry_partitionable", True)

    from rljax import config as config_lib
    from rljax import runtime
    from rljax.checkpoint import CheckpointError
    from rljax.mesh import distributed

    try:
        # Joins the hosts of a pod (or JAX_COORDINATOR_ADDRESS world) before any device is used.
        world = distributed.maybe_initialize()
        summary = runtime.run(_run_config(config_lib), _WORKDIR.value)
    except (config_lib.ConfigError, distributed.DistributedConfigError, CheckpointError) as e:
        sys.exit(f"rljax: {e}")
    if not world.is_primary:
        return
    print(json.dumps({k: v for k, v in summary.items() if k != "last"}, default=float))


def run() -> None:
    """Console-script entry point."""
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
