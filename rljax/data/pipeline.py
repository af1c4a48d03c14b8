"""grain pipelines that feed prompt examples to the sampler.

Everything runs in the calling process: grain's multiprocessing workers need absl flags parsed
and would fork a process that already holds a JAX runtime. Prompt examples are small dicts, so
reading them is never the bottleneck; generation is.

The iterator returned by :func:`prompt_iterator` is a ``grain.DatasetIterator``: its
``get_state()`` is a small JSON-able dict that the checkpointer saves, and ``set_state()`` on
a freshly built iterator (same examples, seed and sharding) resumes the exact same sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

import grain

# Thread pools and prefetch buffers only add nondeterministic memory for tiny dict records.
_READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}.")
    return value


def process_shard() -> tuple[int, int]:
    """Returns ``(shard_index, shard_count)`` for this host: ``jax.process_index/count()``."""
    import jax  # Imported here so the data pipeline itself stays usable without a backend.

    return jax.process_index(), jax.process_count()


def prompt_dataset(
    examples: Sequence[dict],
    *,
    seed: int,
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_index: int = 0,
    shard_count: int = 1,
) -> grain.MapDataset:
    """Builds a ``grain.MapDataset`` of examples: shard, then shuffle, then repeat.

    Args:
      examples: the task's examples, e.g. ``ArithmeticTask(...).train()``.
      seed: shuffle seed. Every epoch is reshuffled, deterministically from this seed.
      shuffle: whether to shuffle; turn off for evaluation.
      num_epochs: passes over the data; None repeats forever.
      shard_index: this host's shard, in ``[0, shard_count)``.
      shard_count: number of hosts reading disjoint shards. Every shard gets exactly
        ``len(examples) // shard_count`` examples (the few left over are dropped) so that all
        hosts produce the same number of batches and none waits at a collective.

    Returns:
      A MapDataset whose elements are shallow copies of the examples, so a consumer that
      mutates an element cannot change what later epochs see.
    """
    if isinstance(examples, str | bytes | dict) or not isinstance(examples, Sequence):
        raise TypeError(
            f"examples must be a sequence of example dicts, got {type(examples).__name__}; "
            "pass e.g. task.train()."
        )
    _check_int("seed", seed, minimum=0)
    _check_int("shard_count", shard_count, minimum=1)
    _check_int("shard_index", shard_index, minimum=0)
    if shard_index >= shard_count:
        raise ValueError(f"shard_index={shard_index} must be < shard_count={shard_count}.")
    if num_epochs is not None:
        _check_int("num_epochs", num_epochs, minimum=1)
    per_shard = len(examples) // shard_count
    if per_shard == 0:
        raise ValueError(
            f"{len(examples)} examples cannot fill {shard_count} shards; "
            "provide at least one example per shard."
        )
    ds = grain.MapDataset.source(examples)
    # Strided slicing after truncation gives every host the same count and disjoint shards.
    ds = ds[: per_shard * shard_count][shard_index::shard_count]
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)
    return ds.map(dict)


def prompt_iterator(
    examples: Sequence[dict],
    *,
    batch_size: int,
    seed: int,
    shard_index: int = 0,
    shard_count: int = 1,
    shuffle: bool = True,
    num_epochs: int | None = None,
    drop_remainder: bool = False,
) -> grain.DatasetIterator:
    """Returns a checkpointable iterator over lists of ``batch_size`` examples.

    Batches are Python lists of example dicts (prompts are strings, so there is nothing to
    stack). With ``num_epochs=None`` the stream never ends and a batch may straddle two
    epochs. ``get_state()``/``set_state()`` save and restore the position exactly.
    """
    _check_int("batch_size", batch_size, minimum=1)
    ds = prompt_dataset(
        examples,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        shard_index=shard_index,
        shard_count=shard_count,
    )
    ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=list)
    return iter(ds.to_iter_dataset(_READ_OPTIONS))
