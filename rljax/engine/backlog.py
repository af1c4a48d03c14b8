"""What waits for a decode slot in a :class:`~rljax.engine.sampler.Sampler`: :class:`Backlog`.

Three kinds of work wait, served in this order:

- prefilled groups: samples whose prompt was prefilled (their first tokens drawn), waiting for
  free slots with the :class:`~rljax.engine.state.Prefix` they share (prefix sample ``i`` is
  ``samples[i]``);
- resumed samples: interrupted, preempted or handed over, each to be prefilled again from its
  own prefix (prompt and tokens so far);
- new requests: a prompt and ``num_samples`` samples to draw from it.

The Backlog decides what to prefill next (:meth:`Backlog.take_prompts`: resumed samples first,
then new groups, as many as fit the free slots of their homes in one batched prefill) and which
prefilled group takes free slots next (:meth:`Backlog.group_for`); :func:`prefill_request` is
how one prompt's samples are prefilled. The seam: the Backlog owns
the samples that hold no slot and do not wait for an env; the Sampler owns the slots, the
engine calls and the params, and asks the Backlog for work when slots are free.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import jax
import jax.numpy as jnp

from rljax.engine.homes import SlotHomes
from rljax.engine.prefill import PrefillRequest
from rljax.engine.samples import Request, Sample
from rljax.engine.state import Prefix


class Backlog:
    """The samples waiting for a slot (see the module docstring).

    ``homes``: which slots each sample may take; ``prefill_batch``: the most prompts one
    batched prefill takes (``sampling.prefill_batch``).
    """

    def __init__(self, homes: SlotHomes, prefill_batch: int):
        self._homes = homes
        self._prefill_batch = prefill_batch
        self._prefilled: collections.deque[tuple[Prefix, list[Sample]]] = collections.deque()
        self._resumed: collections.deque[Sample] = collections.deque()
        self._requests: collections.deque[Request] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._prefilled or self._resumed or self._requests)

    @property
    def samples(self) -> int:
        """Samples waiting for a slot (submitted, prefilled, or resumed)."""
        prefilled = sum(len(samples) for _, samples in self._prefilled)
        return len(self._resumed) + prefilled + sum(r.num_samples for r in self._requests)

    def request_ids(self) -> set[int]:
        """Ids of the requests with a sample here."""
        samples = list(self._resumed) + [s for _, group in self._prefilled for s in group]
        return {s.request.request_id for s in samples} | {r.request_id for r in self._requests}

    # -- adding -----------------------------------------------------------------------------

    def add_requests(self, requests: Iterable[Request]) -> None:
        """Queue new requests, after those queued."""
        self._requests.extend(requests)

    def add_resumed(self, s: Sample, *, front: bool = False) -> None:
        """Queue a sample to prefill again from its prefix (``front``: before the others)."""
        (self._resumed.appendleft if front else self._resumed.append)(s)

    def add_prefilled(self, prefix: Prefix, samples: list[Sample]) -> None:
        """Queue prefilled samples for slots, after the groups queued."""
        self._prefilled.append((prefix, samples))

    def put_back(self, prefix: Prefix, samples: list[Sample]) -> None:
        """A group that could not be inserted (the page pool was short): it goes first."""
        self._prefilled.appendleft((prefix, samples))

    # -- taking -----------------------------------------------------------------------------

    def group_for(self, free: list[int]) -> tuple[Prefix, list[Sample]] | None:
        """The first prefilled group with room in ``free`` slots of its home, cut to that room
        (the rest waits in its place with its share of the prefix); None if none fits."""
        for i, (prefix, samples) in enumerate(self._prefilled):
            room = len(self._homes.usable(samples[0].request.home, free))
            if not room:
                continue
            del self._prefilled[i]
            if len(samples) > room:
                rest = list(range(room, len(samples)))
                self._prefilled.insert(i, (prefix.select(rest), samples[room:]))
                prefix, samples = prefix.select(list(range(room))), samples[:room]
            return prefix, samples
        return None

    def take_prompts(self, free: list[int]) -> list[list[Sample]]:
        """The next prompts to prefill together: resumed samples first (each its own prompt),
        then new groups; at least one, then more while their samples fit the free slots of
        their homes. One whose home has no free slot waits without holding up the others."""
        left = self._homes.rooms(free)
        batch: list[list[Sample]] = []
        sources: tuple[collections.deque, collections.deque] = (self._resumed, self._requests)
        for source in sources:
            i = 0
            while i < len(source) and len(batch) < self._prefill_batch:
                item = source[i]
                if isinstance(item, Sample):  # resumed: one sample, its own prompt
                    samples = [item]
                else:
                    samples = [Sample(item, k) for k in range(item.num_samples)]
                home = self._homes.key(samples[0].request.home)
                if not left.get(home):
                    if not any(left.values()):
                        return batch
                    i += 1
                    continue
                if batch and len(samples) > left[home]:
                    return batch
                del source[i]
                batch.append(samples)
                left[home] -= min(len(samples), left[home])
                if home is not None:
                    left[None] -= min(len(samples), left[None])
        return batch

    def drop_prefixes(self) -> None:
        """Prefilled samples lose their prefixes (new params: their KV is stale) and go first
        among the resumed, in their order."""
        waiting = [s for _, samples in self._prefilled for s in samples]
        self._prefilled.clear()
        self._resumed.extendleft(reversed(waiting))

    def remove(self, request_id: int) -> list[Sample]:
        """Take out every sample of a request: resumed, prefilled, then not yet made."""
        out = [s for s in self._resumed if s.request.request_id == request_id]
        keep = [s for s in self._resumed if s.request.request_id != request_id]
        self._resumed.clear()
        self._resumed.extend(keep)
        prefilled = list(self._prefilled)
        self._prefilled.clear()
        for prefix, samples in prefilled:
            kept = [i for i, s in enumerate(samples) if s.request.request_id != request_id]
            out.extend(s for s in samples if s.request.request_id == request_id)
            if len(kept) == len(samples):
                self._prefilled.append((prefix, samples))
            elif kept:
                self._prefilled.append((prefix.select(kept), [samples[i] for i in kept]))
        for r in list(self._requests):
            if r.request_id == request_id:
                self._requests.remove(r)
                out.extend(Sample(r, i) for i in range(r.num_samples))
        return out

    def clear(self) -> None:
        """Drop everything waiting."""
        self._prefilled.clear()
        self._resumed.clear()
        self._requests.clear()


def prefill_request(samples: list[Sample]) -> PrefillRequest:
    """The prefill of samples that share a prompt and their tokens so far (one new group, or one
    resumed sample): each draws its next token from its own PRNG stream, at its step."""
    first = samples[0]
    seeds = [_sample_seed(s.request.seed, s.index) for s in samples]
    return PrefillRequest(
        list(first.request.prompt_tokens) + first.tokens,
        len(samples),
        _keys(seeds),
        first.request.sampling,
        step=len(first.tokens),  # a resumed sample continues its stream
    )


def _keys(seeds: list[int]) -> jax.Array:
    """One PRNG key per seed, for prefill_multisampling's ``rng``."""
    return jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))


def _sample_seed(seed: int, index: int) -> int:
    """A per-sample seed, independent of which slot or batch the sample lands in; a resumed
    sample keeps it (its tokens are drawn at their steps of the one stream)."""
    return (seed * 1_000_003 + index * 7919) % (2**31 - 1)
