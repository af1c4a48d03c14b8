"""A train step's metrics: from the micro-batches' summed metric sums on the device, then as
the floats ``Learner.step`` returns on the host.

On the device (:func:`device_metrics`): every sum over trained tokens becomes a mean over
them; the train-inference mismatch over the fresh tokens alone (behaviour version == learner
version, :data:`MISMATCH_FRESH`) is a mean over those, with their share of the batch; the
router's metrics are its own (:meth:`rljax.learner.routing.RouterTraining.metrics`).

On the host (:func:`host_metrics`): the last update's metrics, except the ``mismatch/*`` ones,
the first update's (taken at the version that sampled); keys that a step without the tokens
they average over would make NaN are dropped.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rljax.learner.routing import FLIPPED, FLIPPED_SUFFIX, GAP_FORCED, GAP_FREE, RouterTraining

# Mismatch metrics over the fresh tokens (behaviour version == learner version) only; absent
# from a step's metrics when it has none.
MISMATCH_FRESH = ("mismatch/abs_logp_fresh", "mismatch/k3_fresh")


def device_metrics(sums: dict[str, jax.Array], router: RouterTraining | None) -> dict:
    """The means of a step's metric sums (``sums`` holds ``tokens``, and ``fresh_tokens`` when
    the loss trains on sampled tokens)."""
    sums = dict(sums)
    tokens = jnp.maximum(sums.pop("tokens"), 1.0)
    fresh = sums.pop("fresh_tokens", None)
    routing = router.metrics(sums) if router else {}
    metrics = {k: v / tokens for k, v in sums.items() if k not in MISMATCH_FRESH}
    metrics |= routing
    if fresh is not None:
        # NaN with no fresh token; host_metrics then drops the keys.
        metrics.update({k: sums[k] / fresh for k in MISMATCH_FRESH})
        metrics["mismatch/fresh_frac"] = fresh / tokens
    return metrics


def host_metrics(last: dict[str, Any], first: dict[str, Any]) -> dict[str, float]:
    """The floats a step returns: ``last`` update's metrics with ``first``'s ``mismatch/*``,
    less the keys no token of the step defines."""
    metrics = {k: float(v) for k, v in jax.device_get(last).items()}
    for k, v in jax.device_get(first).items():
        if k.startswith("mismatch/"):
            metrics[k] = float(v)
    if metrics.get("mismatch/fresh_frac") == 0.0:
        for k in MISMATCH_FRESH:
            del metrics[k]
    if metrics.get(FLIPPED) == 0.0:  # no flipped token: no mismatch over them
        for k in (GAP_FORCED, GAP_FREE):
            del metrics[k + FLIPPED_SUFFIX]
    return metrics
