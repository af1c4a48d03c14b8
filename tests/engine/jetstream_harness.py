"""A four-thread driver that calls an engine exactly the way JetStream's orchestrator does.

prefill thread (tokenize, prefill, first token to detokenize) -> transfer thread (device_put
to ``get_prefix_destination_sharding``) -> generate thread (``insert``/``bulk_insert`` into
free slots, ``generate``, ``copy_to_host_async``) -> detokenize thread (``convert_to_numpy``,
``get_result_at_slot(s)``, stop on a stop token, an invalid token or ``max_tokens``, then
``free_resource`` and the slot back to the free queue). Threads block on queues only; a
failure in one thread stops the others through sentinels and is re-raised by :meth:`run`.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading

import jax
import numpy as np

_NOTHING = object()


@dataclasses.dataclass
class Request:
    text: str
    max_tokens: int
    num_samples: int = 1
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    prefix: object = None
    samples: list[list[int]] = dataclasses.field(default_factory=list)
    texts: list[str] = dataclasses.field(default_factory=list)
    done: np.ndarray | None = None


class Harness:
    """Runs requests through ``engine`` on four threads; ``multi_sampling`` as in JetStream."""

    def __init__(self, engine, params, *, multi_sampling: bool = False):
        self.engine, self.params, self.multi = engine, params, multi_sampling
        self.prefill_q: queue.Queue = queue.Queue()
        # Unbounded, so a failing thread's sentinels never wait for room.
        self.transfer_q: queue.Queue = queue.Queue()
        self.generate_q: queue.Queue = queue.Queue()
        self.detok_q: queue.Queue = queue.Queue()
        self.slots: queue.Queue = queue.Queue()
        for slot in range(engine.max_concurrent_decodes):
            self.slots.put(slot)
        self.inserts = collections.Counter()  # slot -> times a request was inserted into it
        self.errors: list[BaseException] = []

    def run(self, requests: list[Request]) -> list[Request]:
        self.pending = len(requests)
        threads = [
            threading.Thread(target=self._guard, args=(fn,), name=fn.__name__)
            for fn in (self._prefill, self._transfer, self._generate, self._detokenize)
        ]
        for t in threads:
            t.start()
        for r in requests:
            self.prefill_q.put(r)
        self.prefill_q.put(None)
        for t in threads:
            t.join()
        if self.errors:
            raise self.errors[0]
        return requests

    def _guard(self, fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by run()
            self.errors.append(e)
            for q in (self.prefill_q, self.transfer_q, self.generate_q, self.detok_q):
                q.put_nowait(None)

    def _prefill(self):
        tokenizer = self.engine.build_tokenizer(self.engine.get_tokenizer())
        self.tokenizer = tokenizer
        while (r := self.prefill_q.get()) is not None:
            padded, true_length = tokenizer.encode(
                r.text, is_bos=True, max_prefill_length=self.engine.max_prefill_length
            )
            r.prompt_ids = [int(t) for t in np.asarray(padded)[:true_length]]
            r.samples = [[] for _ in range(r.num_samples)]
            r.texts = [""] * r.num_samples
            r.done = np.zeros(r.num_samples, bool)
            if self.multi:
                prefix, first = self.engine.prefill_multisampling(
                    params=self.params,
                    padded_tokens=padded,
                    true_length=true_length,
                    num_samples=r.num_samples,
                )
            else:
                prefix, first = self.engine.prefill(
                    params=self.params, padded_tokens=padded, true_length=true_length
                )
            r.prefix = prefix
            self.detok_q.put(("first", first, r))
            self.transfer_q.put(r)
        self.transfer_q.put(None)  # the generate thread stops when the last request is done

    def _transfer(self):
        while (r := self.transfer_q.get()) is not None:
            r.prefix = jax.device_put(r.prefix, self.engine.get_prefix_destination_sharding())
            jax.block_until_ready(r.prefix)
            self.generate_q.put(r)

    def _generate(self):
        eng = self.engine
        state = eng.init_decode_state()
        total, step, held = eng.max_concurrent_decodes, 0, _NOTHING
        while not self.errors:
            while True:  # insert while there are requests and free slots for them
                if held is _NOTHING:
                    try:  # block only when every slot is free: there is nothing to step
                        held = self.generate_q.get(block=self.slots.qsize() == total)
                    except queue.Empty:
                        break
                if held is None:
                    self.detok_q.put(None)
                    return
                n = held.num_samples if self.multi else 1
                if self.slots.qsize() < n:
                    break
                slots = [self.slots.get() for _ in range(n)]
                if self.multi:
                    state = eng.bulk_insert(held.prefix, state, slots=slots)
                else:
                    state = eng.insert(held.prefix, state, slot=slots[0])
                self.inserts.update(slots)
                self.detok_q.put(("insert", slots, held))
                held = _NOTHING
            state, result = eng.generate(self.params, state)
            result.copy_to_host_async()
            self.detok_q.put(("step", step, result))
            step += 1
        self.detok_q.put(None)

    def _emit(self, r: Request, i: int, token: int, valid: bool, stops) -> None:
        if r.done[i]:
            return
        if not valid:
            r.done[i] = True
            return
        r.samples[i].append(token)
        r.texts[i] += self.tokenizer.decode([token])
        r.done[i] = token in stops or len(r.samples[i]) >= r.max_tokens

    def _detokenize(self):
        stops = None
        live: dict[tuple[int, ...], Request] = {}
        while (item := self.detok_q.get()) is not None:
            kind, a, b = item
            stops = stops or self.tokenizer.stop_tokens
            if kind == "first":
                data = a.convert_to_numpy().get_result_at_slot(0)
                for i in range(b.num_samples):
                    self._emit(b, i, int(data.tokens[i, 0]), bool(data.valid[i, 0]), stops)
            elif kind == "insert":
                live[tuple(a)] = b
            else:
                result = b.convert_to_numpy()
                for slots, r in list(live.items()):
                    data = result.get_result_at_slots(slots)
                    for i in range(len(slots)):
                        self._emit(r, i, int(data.tokens[i, 0]), bool(data.valid[i, 0]), stops)
                    if r.done.all():
                        del live[slots]
                        for slot in slots:
                            self.engine.free_resource(slot)
                            self.slots.put(slot)
                        self.pending -= 1
                        if self.pending == 0:
                            self.generate_q.put(None)
