"""The rljax launcher.

    rljax --config=configs/<name>.py[:variant] --workdir=DIR          # train
    rljax eval --config=... --checkpoint=CKPT [--step=N] [--k=16] [--compare=CKPT2] --out=DIR
    rljax export --checkpoint=WORKDIR [--step=N] --format=hf|peft|merged --out=DIR

With no ``--config`` it uses the default recipe, ``configs/arith_tiny.py`` (installed as
``rljax.configs.arith_tiny``). Override any key with ``--config.<section>.<key>=<value>``, with
or without ``--config``. This file only parses flags and calls library code (``rljax.runtime``,
``rljax.eval``, ``rljax.models.saved_runs``).
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

# The flags of `rljax eval` and `rljax export` (refused by the others, see _check_command_flags).
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint",
    None,
    "eval/export: a run's workdir or one step's directory in it; eval also takes a Hugging "
    "Face directory or a GGUF file.",
)
_STEP = flags.DEFINE_integer("step", None, "eval/export: the run's step (default: its newest).")
_OUT = flags.DEFINE_string("out", None, "eval/export: the output directory (local or gs://).")
_K = flags.DEFINE_integer("k", 16, "eval: samples per problem.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "eval: sampling temperature (0: greedy).")
_TOP_P = flags.DEFINE_float("top_p", None, "eval: nucleus sampling (default: sampling.top_p).")
_PROBLEMS = flags.DEFINE_integer("problems", 0, "eval: held-out problems (0: eval_examples).")
_COMPARE = flags.DEFINE_string(
    "compare", None, "eval: a second checkpoint, evaluated on the same problems and compared."
)
_COMPARE_STEP = flags.DEFINE_integer("compare_step", None, "eval: --compare's step.")
_FORMAT = flags.DEFINE_enum("format", None, ["hf", "peft", "merged"], "export: what to write.")

COMMANDS = ("train", "eval", "export")
_COMMAND_FLAGS = {
    "train": ("workdir",),
    "eval": (
        "checkpoint",
        "step",
        "out",
        "k",
        "temperature",
        "top_p",
        "problems",
        "compare",
        "compare_step",
    ),
    "export": ("checkpoint", "step", "out", "format"),
}
_command = "train"


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


def _check_command_flags(command: str) -> None:
    """Refuses, in one line, a flag another command owns (``--k`` while training, say)."""
    mine = set(_COMMAND_FLAGS[command])
    every = {name for names in _COMMAND_FLAGS.values() for name in names}
    for name in sorted(every - mine):
        if flags.FLAGS[name].present:
            owner = [c for c, n in _COMMAND_FLAGS.items() if name in n]
            sys.exit(
                f"rljax: --{name} is a flag of `rljax {' / '.join(owner)}`, not of "
                f"`rljax {command}`; drop it or run that command"
            )
    for name in ("checkpoint", "out") if command != "train" else ():
        if not flags.FLAGS[name].value:
            sys.exit(f"rljax {command}: --{name} is required; see `rljax {command} --help`")
    if command == "export" and not _FORMAT.value:
        sys.exit("rljax export: --format is required: hf, peft or merged")
    if command == "eval" and _COMPARE_STEP.present and not _COMPARE.value:
        sys.exit("rljax eval: --compare_step needs --compare (the checkpoint it is a step of)")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    _check_command_flags(_command)
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
        if _command == "export":
            summary = _export()
        elif _command == "eval":
            summary = _eval(_run_config(config_lib), world.is_primary)
        else:
            summary = runtime.run(_run_config(config_lib), _WORKDIR.value)
    except (config_lib.ConfigError, distributed.DistributedConfigError, CheckpointError) as e:
        sys.exit(f"rljax{'' if _command == 'train' else ' ' + _command}: {e}")
    if not world.is_primary:
        return
    print(json.dumps({k: v for k, v in summary.items() if k != "last"}, default=float))


def _export() -> dict:
    from rljax.config import ConfigError
    from rljax.models import export, saved_runs

    checkpoint = str(_CHECKPOINT.value)  # required: _check_command_flags
    run = saved_runs.parse(checkpoint, _STEP.value)
    if run is None:
        raise ConfigError(
            f"--checkpoint={checkpoint!r} is not a run's workdir (it holds no "
            "checkpoints/ directory); name the --workdir a run wrote"
        )
    written = export.export(run, str(_FORMAT.value), str(_OUT.value))
    print(f"exported step {written['step']} as {written['format']} to {written['out']}")
    return written


def _eval(cfg, primary: bool) -> dict:
    from rljax import io
    from rljax.eval import checkpoints, compare

    settings = checkpoints.EvalSettings(
        k=_K.value, temperature=_TEMPERATURE.value, top_p=_TOP_P.value, problems=_PROBLEMS.value
    )
    out = str(_OUT.value)  # required: _check_command_flags
    runs = [("checkpoint", str(_CHECKPOINT.value), _STEP.value)]
    if _COMPARE.value:
        runs = [("a", *runs[0][1:]), ("b", _COMPARE.value, _COMPARE_STEP.value)]
    summaries, problems = {}, []
    for name, checkpoint, step in runs:
        figures, evaluated = checkpoints.evaluate(
            cfg, checkpoint, out, settings, step=step, name=name
        )
        summaries[f"{name}: {checkpoint}" if len(runs) > 1 else name] = figures
        problems.append(evaluated)
    if not primary:
        return {}
    from rljax.eval.problems import table

    print(table(summaries))
    result: dict = {"summaries": summaries, "out": out}
    if len(problems) == 2:
        diff = compare.compare(problems[0], problems[1], settings.k)
        print(compare.difference_table(diff, ("a", "b")))
        result["difference"] = diff
        io.write_text(io.join(out, compare.DIFFERENCE_FILE), json.dumps(diff, indent=2))
    plot = f"{out}/{compare.PLOT_FILE}"
    if compare.plot_pass_at_k(summaries, plot):
        result["plot"] = plot
    else:
        print("no pass@k plot: pip install matplotlib (rljax[plot]) for one")
    return result


def run() -> None:
    """Console-script entry point: ``rljax [eval|export] --flags``."""
    global _command
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        _command = sys.argv.pop(1)
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
