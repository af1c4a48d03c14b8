"""Response-length distributions for the simulator's synthetic workload.

RL rollouts are long-tailed: most responses stop early, a few run to the token limit, and
the median often grows as the policy learns to reason longer. A ``LengthModel`` draws one
response length per sample from a lognormal body plus a truncation tail, optionally with a
median that grows linearly over training, or from an empirical histogram file.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class LengthModel:
    """Distribution of response lengths (tokens), possibly drifting with the policy version.

    Attributes:
      median: median length of the lognormal body at version 0.
      sigma: log-space standard deviation of the body (0.5-1.0 is typical).
      tail_prob: probability that a response runs to ``max_tokens`` (never emits EOS).
      max_tokens: generation limit; every draw is clipped to [1, max_tokens].
      growth: the median at version ``growth_steps`` is ``growth`` times the initial one
        (linear in between, flat after); 1.0 = stationary.
      growth_steps: versions over which the growth happens.
      histogram: optional ((length, count), ...) pairs; when set, lengths are drawn from it
        (scaled by the same growth factor) and the lognormal fields are ignored.
    """

    median: float = 1024.0
    sigma: float = 0.7
    tail_prob: float = 0.02
    max_tokens: int = 8192
    growth: float = 1.0
    growth_steps: int = 1000
    histogram: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self):
        if self.median <= 0 or self.sigma < 0:
            raise ValueError(f"need median > 0 and sigma >= 0, got {self.median}, {self.sigma}")
        if not 0.0 <= self.tail_prob < 1.0:
            raise ValueError(f"tail_prob must be in [0, 1), got {self.tail_prob}")
        if self.max_tokens < 1 or self.growth <= 0 or self.growth_steps < 1:
            raise ValueError("need max_tokens >= 1, growth > 0 and growth_steps >= 1")
        if self.histogram is not None and not any(c > 0 for _, c in self.histogram):
            raise ValueError("histogram has no positive counts; pass (length, count) pairs")

    def scale(self, version: int) -> float:
        """Median multiplier at a policy version."""
        frac = min(1.0, max(0, version) / self.growth_steps)
        return 1.0 + (self.growth - 1.0) * frac

    def sampler(self, seed: int):
        """Returns ``draw(version) -> length``, a deterministic stream for ``seed``."""
        draw_group = self.group_sampler(seed)
        return lambda version: draw_group(version, 1)[0]

    def group_sampler(self, seed: int):
        """Returns ``draw(version, count) -> lengths``, the stream of ``sampler(seed)`` drawn
        ``count`` at a time (the simulator draws a whole group per call)."""
        rng = random.Random(seed)
        uniform = rng.random
        max_tokens = self.max_tokens
        if self.histogram is not None:
            lengths = [int(length) for length, _ in self.histogram]
            cumulative, total = [], 0
            for _, count in self.histogram:
                total += max(0, count)
                cumulative.append(total)

            def draw_hist(version: int, count: int) -> list[int]:
                scale = self.scale(version)
                out = []
                for _ in range(count):
                    pick = bisect.bisect_right(cumulative, uniform() * total)
                    length = lengths[min(pick, len(lengths) - 1)] * scale
                    out.append(int(min(max_tokens, max(1, round(length)))))
                return out

            return draw_hist

        mu, sigma, tail_prob = math.log(self.median), self.sigma, self.tail_prob
        exp, log = math.exp, math.log
        magic = 4 * math.exp(-0.5) / math.sqrt(2.0)  # random.NV_MAGICCONST (typeshed omits it)

        def draw(version: int, count: int) -> list[int]:
            # random.lognormvariate(mu, sigma) inlined (Kinderman-Monahan normalvariate, then
            # exp): the same numbers from the same stream, without two calls per sample.
            scale = self.scale(version)
            out = []
            for _ in range(count):
                if uniform() < tail_prob:
                    out.append(max_tokens)
                    continue
                while True:
                    u1 = uniform()
                    u2 = 1.0 - uniform()
                    z = magic * (u1 - 0.5) / u2
                    if z * z / 4.0 <= -log(u2):
                        break
                length = exp(mu + z * sigma) * scale
                out.append(int(min(max_tokens, max(1, round(length)))))
            return out

        return draw

    def mean(self, version: int = 0, samples: int = 4000, seed: int = 0) -> float:
        """Monte-Carlo mean length at a version (used to size KV slots)."""
        draw = self.sampler(seed)
        return sum(draw(version) for _ in range(samples)) / samples


def load_histogram(path: str | Path) -> tuple[tuple[int, int], ...]:
    """Reads a histogram file: one ``length count`` (or ``length,count``) pair per line.

    Blank lines and lines starting with '#' are skipped.
    """
    pairs = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{lineno}: expected 'length count', got {line!r}")
        pairs.append((int(parts[0]), int(parts[1])))
    if not pairs:
        raise ValueError(f"{path}: no 'length count' lines; write one pair per line")
    return tuple(pairs)
