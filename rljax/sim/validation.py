"""The simulator judged against published per-step figures of real RL systems.

A validation config (``configs/sim/verl_async_h20.py``) lists *systems*, each with the
workload its authors published (model, chip, batch, lengths where published) and its *runs*:
one colocated (mode ``sync``) or disaggregated (mode ``async``) job with its published mean
seconds per step and, where published, its per-phase seconds (``gen_s``: generation, or for an
async run the learner's wait for its batch; ``train_s``: the learner's phases).

:func:`fit` fits two efficiencies to the per-phase times of one run (``decode_hbm`` to its
generation phase, ``train_mfu`` to its training phases) and nothing else; :func:`predict` runs
every run of every system with those efficiencies, without refitting; :func:`score` turns the
predictions into rows of :class:`Scored`: every run's step time (absolute, with its phase
errors) and every async speed-up (colocated step / async step of the same system and GPUs),
each with its signed error ``predicted / published - 1``. :func:`table` prints them.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from rljax.sim import scenario
from rljax.sim.costs import CostModel
from rljax.sim.simulator import Simulator
from rljax.sim.workload import LengthModel


@dataclasses.dataclass(frozen=True)
class Scored:
    """One published figure against its prediction.

    Attributes:
      system: the system that published it.
      figure: what it is (``<run> step_s`` or ``<colocated run> / <async run>``).
      role: "fit" (the efficiencies were fitted to this run's phases) or "held-out".
      source: where it was published.
      published, predicted: seconds per step, or a ratio of two.
      gen_error, train_error: signed errors of the generation (async: learner wait) and training
        phases, where those are published (None otherwise).
    """

    system: str
    figure: str
    role: str
    source: str
    published: float
    predicted: float
    gen_error: float | None = None
    train_error: float | None = None

    @property
    def error(self) -> float:
        """Signed relative error, predicted / published - 1."""
        return signed_error(self.predicted, self.published)


def signed_error(predicted: float, published: float) -> float:
    """``predicted / published - 1``: positive when the simulator predicts too much."""
    if published <= 0:
        raise ValueError(f"published figure must be > 0, got {published}")
    return predicted / published - 1.0


# ----- workloads -------------------------------------------------------------------------------


def system_scenario(c, system) -> ml_collections.ConfigDict:
    """The scenario ``c`` with a system's published workload fields in place of its own."""
    out = c.copy_and_resolve_references()
    with out.unlocked():
        for key, value in system["scenario"].items():
            out[key] = value
    return out


def median_for_mean(lengths: LengthModel, mean: float, iters: int = 30) -> float:
    """The lognormal median that gives responses of ``mean`` tokens on average (clipped at
    ``max_tokens``), by bisection on :meth:`LengthModel.mean` (deterministic)."""
    if not 1.0 <= mean < lengths.max_tokens:
        raise ValueError(
            f"a mean response of {mean} tokens is outside [1, max_tokens={lengths.max_tokens})"
        )
    lo, hi = 1.0, float(lengths.max_tokens)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if dataclasses.replace(lengths, median=mid).mean() < mean:
            lo = mid
        else:
            hi = mid
    return round(0.5 * (lo + hi), 1)


def run_lengths(c_sys, run, **overrides) -> LengthModel:
    """The response lengths of one run: the system's, with the run's published mean where it
    has one (the median is solved for it at the system's sigma and tail)."""
    lengths = scenario.length_model(c_sys, **overrides)
    if run.get("response_mean"):
        median = median_for_mean(lengths, run["response_mean"])
        lengths = dataclasses.replace(lengths, median=median)
    return lengths


def phases(c_sys, cost: CostModel, lengths: LengthModel, run, *, eta: int, steps: int) -> dict:
    """Simulates one published run; returns its seconds per step: ``step_s`` (after the
    pipeline fill: the first quarter of the steps), ``train_s`` (the learner's training) and
    ``gen_s`` (colocated: generation, the rest of the step but the weight reshard; async: the
    learner's wait for its batch, the rest but the publish)."""
    sync = run["mode"] == "sync"
    sampler = run["chips"] if sync else run["sampler_chips"]
    cfg = dataclasses.replace(
        scenario.sim_config(c_sys, run["mode"], sampler, eta=eta, steps=steps),
        total_chips=run["chips"],
        timeline=False,
    )
    sim = Simulator(cfg, cost, lengths)
    res = sim.run()
    step = res.steady_step_s(skip=steps // 4)
    train = res.learner_util * res.wall_s / res.steps
    if sync:
        publish = sim.cost.reshard_local_s()
    else:
        publish = sim.cost.sync_s(run["sampler_chips"], run["chips"] - run["sampler_chips"])
    return {"step_s": step, "gen_s": max(0.0, step - train - publish), "train_s": train}


# ----- fit and predict -------------------------------------------------------------------------


def _fit_target(c) -> tuple[dict, dict]:
    v = c.validation
    system = next(s for s in v.systems if s["name"] == v.fit.system)
    run = next(r for r in system["runs"] if r["name"] == v.fit.run)
    if not (run.get("gen_s") and run.get("train_s")) or run["mode"] != "sync":
        raise ValueError(
            f"the fitted run {v.fit.system}/{v.fit.run} must be colocated (mode 'sync') with "
            "published gen_s and train_s; pick a run that publishes its phases"
        )
    return system, run


def fit(c, **length_overrides) -> tuple[CostModel, dict]:
    """Fits ``decode_hbm`` to the generation phase and ``train_mfu`` to the training phases of
    ``c.validation.fit`` (one colocated run); every other efficiency stays as configured."""
    system, run = _fit_target(c)
    c_sys = system_scenario(c, system)
    lengths = run_lengths(c_sys, run, **length_overrides)
    base = scenario.cost_model(c_sys)
    steps = c.validation.fit_steps

    def measure(cost):
        return phases(c_sys, cost, lengths, run, eta=0, steps=steps)

    lo, hi = 0.05, 1.0
    for _ in range(c.validation.bisections):  # generation shrinks as decode_hbm grows
        mid = 0.5 * (lo + hi)
        eff = dataclasses.replace(base.efficiencies, decode_hbm=mid)
        gen = measure(dataclasses.replace(base, efficiencies=eff))["gen_s"]
        lo, hi = (lo, mid) if gen < run["gen_s"] else (mid, hi)
    eff = dataclasses.replace(base.efficiencies, decode_hbm=round(0.5 * (lo + hi), 4))
    got = measure(dataclasses.replace(base, efficiencies=eff))
    # Training seconds are exactly inversely proportional to train_mfu.
    mfu = min(1.0, round(eff.train_mfu * got["train_s"] / run["train_s"], 4))
    eff = dataclasses.replace(eff, train_mfu=mfu)
    return dataclasses.replace(base, efficiencies=eff), {
        "decode_hbm": eff.decode_hbm,
        "train_mfu": eff.train_mfu,
    }


def predict(
    c, fitted: CostModel, knobs: dict | None = None, systems: set[str] | None = None
) -> dict:
    """Every run of every system (or of ``systems``) at the fitted efficiencies, not refitted:
    {system: {run: phases}}. ``knobs`` overrides unpublished settings of a system: ``{system:
    {"eta": .., "lengths": {LengthModel field: value}, "train_flops_per_param": (sync,
    async)}}``."""
    v, knobs = c.validation, knobs or {}
    out: dict = {}
    for system in v.systems:
        if systems is not None and system["name"] not in systems:
            continue
        mine = knobs.get(system["name"], {})
        c_sys = system_scenario(c, system)
        if "train_flops_per_param" in mine:
            sync_f, async_f = mine["train_flops_per_param"]
            with c_sys.unlocked():
                c_sys.train_flops_per_param.sync = sync_f
                c_sys.train_flops_per_param.async_ = async_f
        cost = dataclasses.replace(scenario.cost_model(c_sys), efficiencies=fitted.efficiencies)
        eta = mine.get("eta", system["eta"])
        out[system["name"]] = {
            run["name"]: phases(
                c_sys,
                cost,
                run_lengths(c_sys, run, **mine.get("lengths", {})),
                run,
                eta=eta,
                steps=v.steps,
            )
            for run in system["runs"]
        }
    return out


# ----- scoring ---------------------------------------------------------------------------------


def score(c, predicted: dict) -> list[Scored]:
    """Every published step time and every async speed-up of ``c.validation`` against
    ``predicted`` (from :func:`predict`), with the phase errors where phases are published;
    a system missing from ``predicted`` is left out."""
    v, rows = c.validation, []
    for system in v.systems:
        name, runs = system["name"], {r["name"]: r for r in system["runs"]}
        if name not in predicted:
            continue
        got = predicted[name]
        for run in system["runs"]:
            p = got[run["name"]]
            fitted = name == v.fit.system and run["name"] == v.fit.run
            rows.append(
                Scored(
                    system=name,
                    figure=f"{run['name']} step_s",
                    role="fit" if fitted else "held-out",
                    source=system["source"],
                    published=run["step_s"],
                    predicted=p["step_s"],
                    gen_error=_phase_error(p, run, "gen_s"),
                    train_error=_phase_error(p, run, "train_s"),
                )
            )
        for colocated, disaggregated in system.get("speedups", []):
            num, den = runs[colocated], runs[disaggregated]
            rows.append(
                Scored(
                    system=name,
                    figure=f"{colocated} / {disaggregated}",
                    role="held-out",
                    source=system["source"],
                    published=num["step_s"] / den["step_s"],
                    predicted=got[colocated]["step_s"] / got[disaggregated]["step_s"],
                )
            )
    return rows


LENGTH_KNOBS = ("median", "sigma", "tail_prob")


def band(c, fitted: CostModel, nominal: list[Scored]) -> tuple[dict, list[dict]]:
    """Predictions over ``c.validation.knobs``, one unpublished setting at a time from nominal:
    {(system, figure): [low, high]} over the nominal and every setting, and one row of
    predictions per setting. A length setting of the fitted system refits the efficiencies to
    the same published phases (the fit depends on it); every other setting does not."""
    v = c.validation
    lows = {(r.system, r.figure): [r.predicted, r.predicted] for r in nominal}
    settings = []
    for system, knobs in v.knobs.items():
        for knob, values in knobs.items():
            for value in values:
                cost = fitted
                only: set[str] | None = {system}
                override: dict[str, dict] = {}
                if knob in LENGTH_KNOBS:
                    override = {system: {"lengths": {knob: value}}}
                    if system == v.fit.system:
                        cost, _ = fit(c, **{knob: value})
                        only = None  # new efficiencies: every system moves
                elif knob == "train_flops_per_param":
                    override = {system: {knob: tuple(value)}}
                else:
                    override = {system: {knob: value}}
                got = predict(c, cost, override, systems=only)
                row: dict[str, str | float] = {"setting": f"{system} {knob}={value}"}
                for r in score(c, got):
                    lo_hi = lows[(r.system, r.figure)]
                    lo_hi[0], lo_hi[1] = min(lo_hi[0], r.predicted), max(lo_hi[1], r.predicted)
                    row[f"{r.system} {r.figure}"] = round(r.predicted, 3)
                settings.append(row)
    return lows, settings


def _phase_error(p: dict, run, key: str) -> float | None:
    return signed_error(p[key], run[key]) if run.get(key) else None


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:+.0f}%"


def table(rows: list[Scored]) -> str:
    """The scored figures as a markdown table (one row per figure)."""
    lines = [
        "| system | figure | role | published | predicted | error | gen error | train error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.system} | {r.figure} | {r.role} | {r.published:.2f} | {r.predicted:.2f} | "
            f"{_pct(r.error)} | {_pct(r.gen_error)} | {_pct(r.train_error)} |"
        )
    return "\n".join(lines)
