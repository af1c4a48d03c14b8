"""What could admission reach on the pipeline benchmark's workloads? A fast event model (issue 47).

    python scripts/admission_study.py                       # rho 0, 0.5, 0.8; seeds 0-4
    python scripts/admission_study.py --rho=0 --seeds=0     # the benchmark's own lengths

Issue 47 asks for admission that predicts a group's longest response and paces groups against
their deadlines, to bring the async pipeline from about 0.6 to 0.9 of the corrected staleness
bound. Before building that into the driver, this script asks what such rules reach, on a
discrete-event model of ``scripts/bench_pipeline.py``'s pipeline (not the driver: no threads,
no sleeps; 64 continuous-batching slots at 2 ms + 10 us per live slot a decode step, G = 8,
B = 8 groups a step, a learner step of 20 ms + 30 us a token, a 5 ms publish, the staleness
buffer's seats and deadlines, a learner that consumes buffer V once it holds B finished
groups and every group due there). On the benchmark's lengths its greedy rule lands where the
driver does (printed beside the driver's figures in docs/benchmarks.md).

Lengths: lognormal with the workload's median and sigma, the log-variance split into a
per-prompt part (share ``rho``) and a per-sample part; a dataset of ``--prompts`` prompts read in
shuffled epochs. rho = 0 is the benchmark's workload: every length independent of its prompt,
so nothing before a group runs tells its length.

Rules (each admits only while the buffer's seats and the slots allow, as the runtime's does):
- greedy: the runtime's rule, prompts in stream order;
- sorted: from a lookahead of the next ``--lookahead`` prompts, the one predicted longest first
  (prediction: the longest response of the prompt's previous group, else the median of the
  last 200 groups' longest);
- paced: sorted, and the longest-predicted group that still finishes before its deadline (the
  start of step v + eta: the publish of version v plus eta recent step gaps), the
  others waiting for the next version; when none fits and the learner's buffer could not fill
  without one, the shortest-predicted goes;
- oracle: paced, predicting each group's longest response exactly (its lengths are drawn when
  it enters the lookahead): what these rules reach with a perfect predictor;
- planned: ``Workload.staleness_reachable``'s schedule run in this model: blocks of
  ``--lookahead`` groups, lengths known, sorted longest first and cut into steps of B, each
  group admitted in that order once the sampler's version lets its step consume it (step k at
  sampler version k - eta or later), within the same seats and slots.

A run's rate is counted in tokens, not steps: the response tokens its steps consumed after
the warm-up, over the mean batch's (B x G x the mean length), per second. A rule that reorders
can defer its longest groups past the run's end, and counted in steps its batches of short
groups would look faster than any schedule of the whole workload (a lookahead of 1,024 prompts
did reach 1.02 of the bound so). Each figure is a fraction of the workload's ideal
(``Workload.limits``) and of its clairvoyant staleness bound (``Workload.staleness_bound``'s
relaxation, on groups drawn as this model draws them), median and range over seeds. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import statistics
import sys

import numpy as np

from rljax.testing.pipeline_workload import Workload, makespan_floor

RULES = ("greedy", "sorted", "paced", "oracle", "planned")


@dataclasses.dataclass
class _Group:
    version: int
    lengths: list[int]
    prompt: int
    left: int
    done_at: float | None = None


class _Prompts:
    """A dataset of prompts with per-prompt log-length means, read in shuffled epochs."""

    def __init__(self, w: Workload, rho: float, n: int, rng: np.random.Generator):
        self.rng, self.n, self.cap = rng, n, w.max_len
        self.sigma_sample = w.sigma * math.sqrt(1.0 - rho)
        self.mu = math.log(w.median_len) + rng.normal(0.0, w.sigma * math.sqrt(rho), n)
        self._order: list[int] = []

    def next(self) -> int:
        if not self._order:
            self._order = list(self.rng.permutation(self.n))
        return self._order.pop()

    def lengths(self, prompt: int, g: int) -> list[int]:
        draws = self.rng.lognormal(self.mu[prompt], self.sigma_sample, g)
        return [int(min(self.cap, max(1, round(x)))) for x in draws]


def _seat_free(groups: list[_Group], V: int, sv: int, eta: int, B: int) -> bool:
    """Whether one more group reserved at sampler version ``sv`` keeps every group a seat in
    buffers V .. V + eta by its deadline (earliest deadline first)."""
    if len(groups) >= (eta + 1) * B:
        return False
    due = collections.Counter(min(g.version + eta, V + eta) for g in groups)
    due[sv + eta] += 1
    total = 0
    for d in range(V, V + eta + 1):
        total += due[d]
        if total > (d - V + 1) * B:
            return False
    return True


class _Model:
    """One run of the event model; :meth:`run` returns (mean batches consumed a second, slot
    occupancy)."""

    def __init__(self, w: Workload, eta: int, rule: str, rho: float, prompts: int, seed: int):
        self.w, self.eta, self.rule = w, eta, rule
        self.prompts = _Prompts(w, rho, prompts, np.random.default_rng(seed))
        self.t, self.V, self.published = 0.0, 0, {0: 0.0}
        self.groups: list[_Group] = []
        self.queue: collections.deque = collections.deque()
        self.remaining: list[int] = []
        self.owner: list[_Group] = []
        self.lookahead: list[tuple[int, list[int]]] = []  # (prompt, its group's lengths)
        self.planned_steps = 0  # planned: steps planned so far (the next block's first step)
        self.last_longest: dict[int, int] = {}
        self.recent: collections.deque = collections.deque(maxlen=200)
        self.step_starts: list[float] = []
        self.step_tokens: list[int] = []  # response tokens each step consumed
        self.learning: tuple[float, int] | None = None
        self.busy = self.decode_steps = 0

    def _predict(self, item: tuple[int, list[int]], fallback: float) -> float:
        if self.rule == "oracle":
            return max(item[1])
        return self.last_longest.get(item[0], fallback)

    def _learn(self) -> None:
        eta, V, B = self.eta, self.V, self.w.batch_groups
        live = [g for g in self.groups if g.version >= V - eta]
        done = [g for g in live if g.done_at is not None]
        if len(done) < B or any(g.done_at is None for g in live if g.version == V - eta):
            return
        done.sort(key=lambda g: (g.version, g.done_at))
        batch = done[:B]
        taken = {id(g) for g in batch}
        self.groups = [g for g in self.groups if id(g) not in taken]
        tokens = sum(self.w.prompt_len + n for g in batch for n in g.lengths)
        cost = self.w.learn_fixed_s + self.w.learn_per_token_s * tokens + self.w.sync_s
        self.step_starts.append(self.t)
        self.step_tokens.append(sum(n for g in batch for n in g.lengths))
        self.learning, self.V = (self.t + cost, V + 1), V + 1

    def _planned(self, sv: int) -> tuple[int, list[int]] | None:
        """The planned rule's next group, or None until the sampler's version allows it."""
        B = self.w.batch_groups
        if not self.lookahead:
            block = []
            for _ in range(self.look - self.look % B or B):
                prompt = self.prompts.next()
                block.append((prompt, self.prompts.lengths(prompt, self.w.group_size)))
            block.sort(key=lambda item: -max(item[1]))
            self.lookahead = [(i, item) for i, item in enumerate(block)]  # type: ignore[misc]
            self.block_start, self.planned_steps = (
                self.planned_steps,
                self.planned_steps + len(block) // B,
            )
        i, item = self.lookahead[0]  # type: ignore[misc]
        if self.block_start + i // B > sv + self.eta:
            return None
        self.lookahead.pop(0)
        return item

    def _choose(self, sv: int) -> tuple[int, list[int]] | None:
        """The next prompt (and its group's lengths) to admit at sampler version ``sv``, or
        None to wait."""
        if self.rule == "planned":
            return self._planned(sv)
        while len(self.lookahead) < (self.look if self.rule != "greedy" else 1):
            prompt = self.prompts.next()
            self.lookahead.append((prompt, self.prompts.lengths(prompt, self.w.group_size)))
        if self.rule == "greedy":
            return self.lookahead.pop(0)
        fallback = float(np.median(self.recent)) if len(self.recent) >= 20 else self.w.median_len
        ranked = sorted(self.lookahead, key=lambda p: -self._predict(p, fallback))
        pick = ranked[0]
        gaps = np.diff(self.step_starts[-7:])
        if self.rule in ("paced", "oracle") and len(gaps) >= 2:
            deadline = self.published[sv] + self.eta * float(np.median(gaps))
            step_s = self.w.decode_s + self.w.decode_per_slot_s * self.w.slots
            fits = [p for p in ranked if self.t + self._predict(p, fallback) * step_s <= deadline]
            if fits:
                pick = fits[0]
            elif sum(g.version >= self.V - self.eta for g in self.groups) >= self.w.batch_groups:
                return None
            else:
                pick = ranked[-1]
        self.lookahead.remove(pick)
        return pick

    def _admit(self) -> None:
        w, sv = self.w, max(self.published)
        while _seat_free(self.groups, self.V, sv, self.eta, w.batch_groups):
            if len(self.remaining) + len(self.queue) + w.group_size > w.slots:
                return
            item = self._choose(sv)
            if item is None:
                return
            g = _Group(sv, item[1], item[0], w.group_size)
            self.groups.append(g)
            self.queue.extend((g, n) for n in g.lengths)

    def _decode(self) -> None:
        w = self.w
        while self.queue and len(self.remaining) < w.slots:
            g, n = self.queue.popleft()
            self.owner.append(g)
            self.remaining.append(n)
        if not self.remaining:  # idle until the learner publishes, or a tick
            self.t = self.learning[0] if self.learning else self.t + w.decode_s
            return
        self.busy += len(self.remaining)
        self.decode_steps += 1
        self.t += w.decode_s + w.decode_per_slot_s * len(self.remaining)
        keep_r, keep_o = [], []
        for n, g in zip(self.remaining, self.owner):
            if n > 1:
                keep_r.append(n - 1)
                keep_o.append(g)
                continue
            g.left -= 1
            if g.left == 0:
                g.done_at = self.t
                self.last_longest[g.prompt] = max(g.lengths)
                self.recent.append(max(g.lengths))
        self.remaining, self.owner = keep_r, keep_o

    def run(self, steps: int, warmup: int, look: int) -> tuple[float, float]:
        self.look = look
        while len(self.step_starts) < steps:
            if self.learning and self.t >= self.learning[0]:
                self.published[self.learning[1]] = self.learning[0]
                self.learning = None
            if self.learning is None:
                self._learn()
            self._admit()
            self._decode()
        # Steps of the mean batch per second: the response tokens the steps after the warm-up
        # consumed, over B x G x the mean length. A rule that reorders can defer its long
        # groups past the run's end; counted in steps, its short batches would look faster.
        starts, w = self.step_starts, self.w
        tokens = sum(self.step_tokens[warmup + 1 :])
        mean_batch = w.batch_groups * w.group_size * w.mean_response_len()
        rate = tokens / mean_batch / (starts[-1] - starts[warmup])
        return rate, self.busy / max(1, self.decode_steps * w.slots)


def clairvoyant_bound(w: Workload, eta: int, rho: float, prompts: int, groups: int = 50_000):
    """``Workload.staleness_bound``'s ceiling on groups drawn as the model draws them."""
    rng = np.random.default_rng(12345)
    p = _Prompts(w, rho, prompts, rng)
    lengths = np.array([p.lengths(p.next(), w.group_size) for _ in range(groups)])
    durations = lengths.max(axis=1) * (w.decode_s + w.decode_per_slot_s)
    tokens = (lengths + w.prompt_len).sum(axis=1)
    order = np.argsort(-durations, kind="stable")
    by_step = order[: len(order) - len(order) % w.batch_groups].reshape(-1, w.batch_groups)
    costs = w.learn_fixed_s + w.learn_per_token_s * tokens[by_step].sum(axis=1)
    mean_len = float(lengths.mean())
    sampler = w.slots / (w.decode_s + w.decode_per_slot_s * w.slots)
    sampler /= w.batch_groups * w.group_size * mean_len
    step_cost = w.learn_fixed_s + w.learn_per_token_s * w.batch_groups * w.group_size * (
        w.prompt_len + mean_len
    )
    ideal = min(sampler, 1.0 / (step_cost + w.sync_s))
    floor = makespan_floor(durations[by_step].max(axis=1), costs, w.sync_s, eta)
    return ideal, float(min(1.0, len(by_step) / ideal / floor))


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rho", default="0,0.5,0.8", help="per-prompt shares of the log-variance")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--etas", default="1,2")
    p.add_argument("--prompts", type=int, default=256, help="dataset size (epochs repeat it)")
    p.add_argument("--lookahead", type=int, default=64, help="prompts the sorted rules rank")
    p.add_argument("--steps", type=int, default=80, help="learner steps a run (after warm-up)")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_pipeline  # noqa: PLC0415 (the benchmark's workloads, by path)

    workloads = bench_pipeline.WORKLOADS[:2]
    seeds = [int(s) for s in args.seeds.split(",")]
    out: dict = {"prompts": args.prompts, "lookahead": args.lookahead, "rows": []}
    for w, rho, eta in (
        (w, float(r), int(e))
        for w in workloads
        for r in args.rho.split(",")
        for e in args.etas.split(",")
    ):
        ideal, bound = clairvoyant_bound(w, eta, rho, args.prompts)
        for rule in RULES:
            runs = [
                _Model(w, eta, rule, rho, args.prompts, s).run(args.steps + 6, 6, args.lookahead)
                for s in seeds
            ]
            of_bound = [r / ideal / bound for r, _ in runs]
            row = {
                "workload": w.name, "rho": rho, "eta": eta, "rule": rule,
                "bound_of_ideal": bound,
                "of_bound_median": statistics.median(of_bound),
                "of_bound_range": [min(of_bound), max(of_bound)],
                "slot_occupancy_median": statistics.median(o for _, o in runs),
            }  # fmt: skip
            out["rows"].append(row)
            print(
                f"{w.name} rho={rho} eta={eta} {rule:>6}: of the bound "
                f"{row['of_bound_median']:.3f} [{min(of_bound):.3f}, {max(of_bound):.3f}] "
                f"(bound {bound:.3f} of the ideal), slots {row['slot_occupancy_median']:.2f}",
                flush=True,
            )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
