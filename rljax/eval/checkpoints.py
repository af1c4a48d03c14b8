"""``rljax eval``: k samples per held-out problem from a checkpoint, scored and summarised.

A checkpoint is a run's workdir (its newest step, or ``step``), one step's directory in it, a
Hugging Face directory or a GGUF file: anything ``init`` takes (:mod:`rljax.models.loading`).
The evaluation is a :class:`~rljax.runtime.run.Run` of the given config with that checkpoint
as its initial weights and no training: the same engine, prompts, chat template, rewards and
hosts as training, so a figure here is the figure a run would log. Every sample's seed
depends only on the config's seed, the problem and the sample, so two checkpoints evaluated
with one config see the same problems with the same random numbers (a paired comparison).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from rljax import io
from rljax.config import ConfigError, RunConfig, replace
from rljax.engine.state import SlotSampling
from rljax.eval.problems import Problem, summary
from rljax.models import saved_runs

RESULTS_FILE = "problems.jsonl"
SUMMARY_FILE = "summary.json"


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """What ``rljax eval`` samples: ``k`` per problem at ``temperature`` (0: greedy, k = 1),
    with ``top_p`` (None: the config's ``sampling.top_p``; top-k and min-p are always the
    config's), over the first ``problems`` held-out examples (0: ``eval_examples``)."""

    k: int = 16
    temperature: float = 1.0
    top_p: float | None = None
    problems: int = 0

    def __post_init__(self):
        if self.k < 1:
            raise ConfigError(f"--k={self.k} must be at least 1; sample k >= 1 per problem")
        if self.temperature < 0:
            raise ConfigError(f"--temperature={self.temperature} must be >= 0 (0: greedy)")
        if self.temperature == 0 and self.k > 1:
            raise ConfigError(
                f"--k={self.k} with --temperature=0 samples the same greedy answer {self.k} "
                "times; set --k=1 for greedy, or a temperature above 0"
            )
        if self.problems < 0:
            raise ConfigError(f"--problems={self.problems} must be >= 0 (0: eval_examples)")

    def sampling(self, cfg: RunConfig) -> SlotSampling:
        """The run's ``sampling.*`` with this temperature (and ``top_p``, when given)."""
        if self.temperature == 0:
            return SlotSampling(temperature=0.0)
        top_p = cfg.sampling.top_p if self.top_p is None else self.top_p
        return dataclasses.replace(
            SlotSampling.from_config(cfg.sampling), temperature=self.temperature, top_p=top_p
        )


def eval_config(
    cfg: RunConfig, checkpoint: str, step: int | None = None
) -> tuple[RunConfig, int | None]:
    """``cfg`` with ``checkpoint`` as its initial weights and nothing to train (no warm start,
    no RL step, no checkpoint of its own), and the run step it reads (None: not a run). A
    run's workdir brings its tokenizer; a LoRA run's adapters are folded into the weights."""
    if not checkpoint:
        raise ConfigError("--checkpoint is empty; name a run's workdir or a model directory")
    run = saved_runs.parse(checkpoint, step)
    if run is None:
        if step is not None:
            raise ConfigError(
                f"--step={step} needs --checkpoint to be a run's workdir, but "
                f"{checkpoint!r} holds no checkpoints/ directory; drop --step or name a workdir"
            )
        if not (checkpoint == "smollm2" or io.exists(checkpoint)):
            raise ConfigError(
                f"--checkpoint={checkpoint!r} does not exist; name a run's workdir, one step's "
                "directory in it, a Hugging Face directory or a GGUF file"
            )
        init, tokenizer = checkpoint, cfg.tokenizer
    else:
        saved_runs.saved_config(run, "--checkpoint")  # a missing step fails here, in one line
        if run.step is None:
            run = saved_runs.SavedRun(run.workdir, saved_runs.steps(run)[-1])
        step = run.step
        init, tokenizer = f"{run.workdir}/checkpoints/{run.step}", "init"
    changes = {
        "init": init,
        "tokenizer": tokenizer,
        "num_steps": 0,
        "sft.steps": 0,
        "checkpoint.enabled": False,
        "metrics.progress_bar": False,
    }
    return replace(cfg, **changes), step


def sample_and_score(run: Any, settings: EvalSettings, progress: bool = True) -> list[Problem]:
    """``settings.k`` samples of each held-out problem from ``run``'s sampler, scored, once the
    run's weights are published to the sampler (the run's phases call it on the leader)."""
    from rljax.runtime.evaluation import sample_problems

    cfg = run.cfg
    examples = run.heldout_examples[: settings.problems or cfg.eval_examples]
    run.publish()
    bar = _progress(len(examples), progress and run.metrics.is_writer)
    try:
        return sample_problems(run, examples, settings.k, settings.sampling(cfg), bar)
    finally:
        if bar is not None:
            bar.close()


def _progress(total: int, show: bool):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="eval", unit="problem", dynamic_ncols=True)


def write_results(out: str, name: str, problems: Sequence[Problem], figures: dict) -> None:
    """``<out>/<name>/problems.jsonl`` (one row per problem with its samples) and
    ``summary.json``."""
    where = io.join(out, name)
    io.makedirs(where)
    rows = "".join(json.dumps(p.row()) + "\n" for p in problems)
    io.write_text(io.join(where, RESULTS_FILE), rows)
    io.write_text(io.join(where, SUMMARY_FILE), json.dumps(figures, indent=2))


def evaluate(
    cfg: RunConfig,
    checkpoint: str,
    out: str,
    settings: EvalSettings,
    *,
    step: int | None = None,
    name: str = "checkpoint",
    progress: bool = True,
    reward_fn: Any = None,
) -> tuple[dict[str, Any], list[Problem]]:
    """Evaluate one checkpoint (:func:`eval_config`) into ``<out>/<name>/``; (summary,
    problems). ``reward_fn``: a Python reward in place of ``reward.*`` (as ``Run`` takes).
    Every process of a pod calls it; only the leader's return holds the results."""
    from rljax.runtime.run import Run, run

    ecfg, step = eval_config(cfg, checkpoint, step)
    result: dict[str, Any] = {}

    def phases(evaluation: Run) -> dict[str, Any]:
        problems = sample_and_score(evaluation, settings, progress)
        figures = summary(problems, settings.k)
        figures |= {
            "checkpoint": checkpoint,
            "step": step,
            "task": ecfg.data.task,
            "temperature": settings.temperature,
        }
        write_results(out, name, problems, figures)
        result.update(figures=figures, problems=problems)
        return figures

    run(ecfg, str(io.join(out, name)), reward_fn=reward_fn, phases=phases)
    return result.get("figures", {}), result.get("problems", [])
