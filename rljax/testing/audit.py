"""Audits of a finished run, read back from its workdir: what ``scripts/chaos.py`` checks.

Each ``audit_*`` function takes what a run left behind (the records of ``metrics.jsonl``, a
checkpoint's meta or arrays) and returns a list of failures, empty when the run passes:

- :func:`audit_steps`: train steps 0..num_steps-1 once each, in order (a resumed run rewinds
  the metrics a killed one logged past its checkpoint), one evaluation of each kind;
- :func:`audit_staleness`: no consumed group staler than eta;
- :func:`audit_prompts`: every prompt drawn from the stream consumed once or still held;
- :func:`audit_sigterms`: each SIGTERM (a preemption notice) exited 0 at the next boundary;
- :func:`audit_same_metrics` / :func:`audit_same_state`: two runs equal, bit for bit;
- :func:`audit_routes` (a mixture of experts recording routes): every checkpoint's buffered
  trajectories carry routes for each model token they fed, and the learner trained each
  buffered group on the routes its checkpoint held (lost, altered or shifted routes show).
"""

from __future__ import annotations

import collections
import json
import logging
import pathlib
import re
import signal
from typing import Any


def read_metrics(workdir: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def read_meta(workdir: pathlib.Path, step: int) -> dict[str, Any]:
    """The JSON meta of checkpoint ``step`` (what ``Checkpointer.save`` wrote beside the arrays)."""
    path = workdir / "checkpoints" / str(step) / "meta" / "metadata"
    return json.loads(path.read_text())["meta"]


def audit_steps(records: list[dict[str, Any]], num_steps: int) -> list[str]:
    """Train steps 0..num_steps-1 once each, in order, version = step + 1; one of each eval."""
    failures = []
    train = [r for r in records if r["phase"] == "train"]
    steps = [r["step"] for r in train]
    if steps != list(range(num_steps)):
        dup = sorted(s for s, n in collections.Counter(steps).items() if n > 1)
        failures.append(f"train steps {steps} are not 0..{num_steps - 1} once each (twice: {dup})")
    bad = [(r["step"], r["version"]) for r in train if r["version"] != r["step"] + 1]
    if bad:
        failures.append(f"(step, version) pairs with version != step + 1: {bad}")
    for phase in ("eval_initial", "eval_final", "summary"):
        n = sum(r["phase"] == phase for r in records)
        if n != 1:
            failures.append(f"{n} '{phase}' records in metrics.jsonl, expected 1")
    return failures


def audit_staleness(records: list[dict[str, Any]], eta: int) -> list[str]:
    """No consumed group was staler than eta (from staleness_max and staleness_hist)."""
    failures = []
    for r in records:
        if r["phase"] != "train":
            continue
        worst = max([r["staleness_max"], *(int(k) for k in r["staleness_hist"])])
        if worst > eta:
            failures.append(f"step {r['step']} consumed a group of staleness {worst} > eta {eta}")
    return failures


def leftover_prompts(meta: dict[str, Any]) -> list[Any]:
    """Ids of the prompts a checkpoint holds: buffered groups, then pending prompts."""
    driver = meta.get("driver") or {}
    ids = [
        g["group"]["example"]["id"]
        for b in driver.get("buffer", {}).get("buffers", [])
        for g in b["groups"]
    ]
    return ids + [ex["id"] for ex in driver.get("pending", [])]


def audit_prompts(records: list[dict[str, Any]], leftover: list, drawn: list) -> list[str]:
    """Consumed + leftover prompts are exactly the ``drawn`` ones: none lost, none twice."""
    consumed = [i for r in records if r["phase"] == "train" for i in r["prompt_ids"]]
    failures = []
    twice = sorted(i for i, n in collections.Counter(consumed).items() if n > 1)
    if twice:
        failures.append(f"prompts consumed more than once: {twice}")
    held = collections.Counter(consumed) + collections.Counter(leftover)
    want = collections.Counter(drawn)
    if held != want:
        lost, extra = sorted((want - held).elements()), sorted((held - want).elements())
        failures.append(f"prompts drawn but never consumed nor held: {lost}; extra: {extra}")
    return failures


def audit_sigterms(records: list[dict[str, Any]]) -> list[str]:
    """A SIGTERM sent once training runs exits 0 at the step after the one in flight."""
    failures = []
    for i, r in enumerate(records):
        if r["signal"] != "SIGTERM" or not r["fired"]:
            continue
        if r["rc"] == -signal.SIGTERM and not r["trained"]:
            continue  # it landed before the handler (the run was still building): nothing to save
        if r["rc"] == 0 and r.get("finished"):
            continue  # it landed after the last step: the run finished (and saved) as it should
        limit = (r["checkpoint_at_signal"] or 0) + 2  # a save in flight, the step in flight
        if r["rc"] != 0 or r["stopped_at"] is None or r["stopped_at"] > limit:
            failures.append(
                f"launch {i}: SIGTERM at checkpoint {r['checkpoint_at_signal']} gave exit "
                f"{r['rc']}, stopped at {r['stopped_at']} (expected exit 0 by step {limit})"
            )
    return failures


TIMING = re.compile(r"(_s|_per_s)$|^time$")  # wall-clock metrics differ between any two runs


def audit_same_metrics(
    clean: list[dict[str, Any]], killed: list[dict[str, Any]], volatile: tuple[str, ...] = ()
) -> list[str]:
    """Every train step's metrics equal the clean run's, except wall-clock ones and the keys
    in ``volatile`` (metrics a scenario's threads make timing-dependent)."""
    failures = []
    want = {r["step"]: r for r in clean if r["phase"] == "train"}
    for r in killed:
        if r["phase"] != "train" or r["step"] not in want:
            continue
        diff = sorted(
            k
            for k in set(r) | set(want[r["step"]])
            if not TIMING.search(k) and k not in volatile and r.get(k) != want[r["step"]].get(k)
        )
        if diff:
            failures.append(f"step {r['step']}: metrics {diff} differ from the uninterrupted run")
    return failures


def load_arrays(step_dir: pathlib.Path) -> dict[str, list]:
    """The params and optimiser state of a checkpoint as host numpy leaves, in tree order."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # orbax warns of metadata files a host restore does not need
    try:
        out = {}
        for item in ("params", "opt_state"):
            with ocp.PyTreeCheckpointer() as ckptr:
                tree = ckptr.metadata(step_dir / item).item_metadata.tree
                args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
                out[item] = jax.tree.leaves(ckptr.restore(step_dir / item, restore_args=args))
        return out
    finally:
        absl.setLevel(level)


def audit_same_state(clean: pathlib.Path, killed: pathlib.Path, step: int) -> list[str]:
    """The final params and optimiser state equal the clean run's, bit for bit."""

    want = load_arrays(clean / "checkpoints" / str(step))
    got = load_arrays(killed / "checkpoints" / str(step))
    failures = []
    for item in want:
        if len(want[item]) != len(got[item]):
            failures.append(f"{item}: {len(got[item])} leaves, uninterrupted {len(want[item])}")
            continue
        differ = [
            i
            for i, (a, b) in enumerate(zip(want[item], got[item], strict=True))
            if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes()
        ]
        if differ:
            failures.append(f"{item}: leaves {differ} differ from the uninterrupted run's")
    return failures


def drawn_prompts(cfg, data_state: Any, limit: int = 100_000) -> list[Any]:
    """Ids of the prompts a run drew to reach ``data_state`` (the iterator's saved state, or a
    pod's ``{"position": p}``: the first ``p`` examples of the same stream)."""
    from rljax.data.pipeline import prompt_dataset, prompt_iterator
    from rljax.data.tasks import load_task

    train, _ = load_task(cfg.data, cfg.seed)
    if "position" in data_state:
        stream = prompt_dataset(train, seed=cfg.seed)
        return [stream[p]["id"] for p in range(data_state["position"])]
    it = prompt_iterator(train, batch_size=cfg.learner.batch_groups, seed=cfg.seed)
    ids: list[Any] = []
    while len(ids) <= limit:
        if json.loads(json.dumps(it.get_state())) == data_state:
            return ids
        ids.extend(ex["id"] for ex in next(it))
    raise ValueError(f"the prompt stream never reaches the saved data state {data_state}")


def held_groups(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The buffered groups of a checkpoint's meta, as the JSON ``encode_group`` wrote."""
    driver = meta.get("driver") or {}
    return [g["group"] for b in driver.get("buffer", {}).get("buffers", []) for g in b["groups"]]


def route_failures(group: dict[str, Any], width: int, num_experts: int) -> list[str]:
    """A buffered group's trajectories each hold one route per response token: ``width``
    (Lm*k) expert ids in [0, num_experts) for every model token that was fed (all but the
    last), none for the last token and for env tokens."""
    failures = []
    for j, t in enumerate(group["trajectories"]):
        name = f"prompt {group['example'].get('id')} sample {j}"
        routes, n = t.get("routes"), len(t["response_tokens"])
        if routes is None or len(routes) != n:
            got = None if routes is None else len(routes)
            failures.append(f"{name}: {got} routes for {n} response tokens")
            continue
        mask = t.get("loss_mask") or [1] * n
        bad = [
            p
            for p, ids in enumerate(routes)
            if (
                (len(ids) != width or not all(0 <= e < num_experts for e in ids))
                if p < n - 1 and mask[p]
                else bool(ids)
            )
        ]
        if bad:
            failures.append(f"{name}: malformed routes at response positions {bad[:8]}")
    return failures


def audit_routes(
    records: list[dict[str, Any]],
    metas: list[dict[str, Any]],
    final_leftover: list[Any],
    *,
    width: int,
    num_experts: int,
) -> list[str]:
    """Routes survive interruptions: each train record logs a ``routes_digest`` per consumed
    group; each group buffered in a checkpoint of ``metas`` (those the relaunches resumed
    from, those left at the end) has well-formed routes (:func:`route_failures`) and is
    trained, at its first consumption from the checkpoint's version on, with the digest of
    the routes the checkpoint held (or is still held at the end: ``final_leftover``)."""
    from rljax.runtime.rollout import routes_digest

    failures = []
    trained: list[tuple[int, Any, str]] = []
    for r in records:
        if r["phase"] != "train":
            continue
        digests = r.get("routes_digest")
        if digests is None or len(digests) != len(r["prompt_ids"]):
            failures.append(f"step {r['step']}: routes_digest {digests} for {r['prompt_ids']}")
            continue
        trained.extend((r["step"], i, d) for i, d in zip(r["prompt_ids"], digests, strict=True))
    for meta in metas:
        version = meta["version"]
        for g in held_groups(meta):
            failures += [f"version {version}: {f}" for f in route_failures(g, width, num_experts)]
            pid = g["example"].get("id")
            held = routes_digest([t.get("routes") for t in g["trajectories"]])
            later = [d for s, i, d in trained if i == pid and s >= version]
            if not later and pid not in final_leftover:
                failures.append(f"prompt {pid} held at version {version} was never trained")
            elif later and later[0] != held:
                failures.append(
                    f"prompt {pid} trained with routes digest {later[0]}, its checkpoint at "
                    f"version {version} held {held}"
                )
    return failures
