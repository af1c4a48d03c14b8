"""A conversation: one :class:`~rljax.envs.base.Env` behind the engine's ``Turns`` protocol.

The Sampler calls :meth:`Conversation.next_turn` on its own thread when a model turn ends; the
env's ``step`` then runs in the :class:`~rljax.envs.pool.EnvPool` and the returned future
resolves, on the pool's thread, to the observation's token ids (rljax.envs.render) or None when
the conversation is over. The Sampler keeps decoding other conversations meanwhile.

Limits (``env.*`` config): ``max_turns`` model turns (the last turn's step still runs, so it is
scored), and the engine's per-sample budget of response tokens (``Request.max_new_tokens``,
model and env tokens together; the Sampler ends a conversation whose observation would not
leave room for a model token).

Failures never reach the Sampler: an env that raises, overruns ``step_timeout_s``, or returns
something that is not a valid ``Step`` (``env_errors/raised``, ``timeout``, ``bad_step``), an
observation the tokenizer cannot encode (``bad_observation``), and a sample's env whose
``reset`` raises or gives another prompt than the group's (``bad_reset``), end the
conversation with what it has. Its reward is then the steps' so far, or NaN with
``on_failure='drop'`` (the driver drops its group: ``dropped_reward_failure``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import threading
import time
from collections.abc import Callable, Sequence

from rljax.envs.base import Env, Step, check_step
from rljax.envs.pool import EnvPool
from rljax.envs.render import ChatRenderer, ObservationError

ENV_ERROR_KINDS = ("raised", "timeout", "bad_step", "bad_observation", "bad_reset")
# A conversation's counters before its env answered a turn (``Conversation.info``).
NO_TURNS = {"turns": 0, "tool_calls": 0, "env_s": 0.0}


class Conversation:
    """One sample's env as the Sampler's ``Turns``: ``reward`` is the sum of the steps'
    rewards, ``info`` its counters (``turns``, ``tool_calls``, ``tool_errors/<kind>``,
    ``env_errors/<kind>``, ``env_s``)."""

    def __init__(
        self,
        env: Env,
        *,
        renderer: ChatRenderer,
        pool: EnvPool,
        max_turns: int,
        on_failure: str = "end",
    ):
        self.env = env
        self.renderer = renderer
        self.pool = pool
        self.max_turns = max_turns
        self.on_failure = on_failure
        self._lock = threading.Lock()
        self._reward = 0.0
        self._failed = False
        self._counts: collections.Counter[str] = collections.Counter()
        self._env_s = 0.0

    def next_turn(self, turn_tokens: list[int]) -> concurrent.futures.Future[list[int] | None]:
        """The env's answer to this model turn, as token ids to append (None: over)."""
        out: concurrent.futures.Future[list[int] | None] = concurrent.futures.Future()
        if self.failed:  # reset failed: the model's first turn is all it has
            out.set_result(None)
            return out
        with self._lock:
            self._counts["turns"] += 1
            last = self._counts["turns"] >= self.max_turns
        action = self.renderer.action_text(turn_tokens)
        stepped = self.pool.submit(self._timed_step, action)
        stepped.add_done_callback(lambda f: out.set_result(self._settle(f.result(), last)))
        return out

    def _settle(self, result: tuple[str, object], last: bool) -> list[int] | None:
        """:meth:`_answer`, which must resolve the future whatever goes wrong: a conversation
        whose future never resolved would hold its slot for ever."""
        try:
            return self._answer(result, last)
        except Exception:  # noqa: BLE001 - e.g. a chat template that raises on these messages
            self._fail("bad_observation", 0.0)
            return None

    def _timed_step(self, action: str) -> tuple[object, float]:
        start = time.perf_counter()
        step = self.env.step(action)
        return step, time.perf_counter() - start

    def _answer(self, result: tuple[str, object], last: bool) -> list[int] | None:
        """On the pool's thread: the observation's ids, or None (over, or failed: counted)."""
        status, value = result
        if status == "timeout":
            self._fail("timeout", self.pool.timeout_s)
            return None
        if status != "ok":
            self._fail("raised", 0.0)
            return None
        assert isinstance(value, tuple)
        step, seconds = value
        try:
            step = check_step(step)
        except TypeError:
            self._fail("bad_step", seconds)
            return None
        with self._lock:
            self._env_s += seconds
            self._reward += float(step.reward)
            self._count(step)
        if step.done or last:
            return None
        try:
            return self.renderer.observation_ids(step.observation)
        except (ObservationError, ValueError, TypeError):
            self._fail("bad_observation", 0.0)
            return None

    def _count(self, step: Step) -> None:
        for key, value in step.info.items():
            counted = key == "tool_calls" or key.startswith("tool_errors/")
            if counted and isinstance(value, int | float) and not isinstance(value, bool):
                self._counts[key] += int(value)

    def fail_at_once(self, kind: str) -> None:
        """Fail before the first turn: the next ``next_turn`` ends the conversation."""
        self._fail(kind, 0.0)

    def _fail(self, kind: str, seconds: float) -> None:
        with self._lock:
            self._env_s += seconds
            self._failed = True
            self._counts[f"env_errors/{kind}"] += 1

    @property
    def failed(self) -> bool:
        with self._lock:
            return self._failed

    @property
    def reward(self) -> float:
        with self._lock:
            if self._failed and self.on_failure == "drop":
                return math.nan
            return self._reward

    @property
    def info(self) -> dict:
        with self._lock:
            return {**NO_TURNS, **self._counts, "env_s": self._env_s}


class Conversations:
    """Makes each request's prompt and its samples' :class:`Conversation` from an env factory.

    ``prompt(example)`` resets a fresh env and returns the prompt ids (the same example always
    gives the same prompt: ``reset`` must be deterministic in the example); ``turns(example)``
    is the Request's ``turns``: a fresh env per sample, reset on the same example.
    """

    def __init__(
        self,
        factory: Callable[[], Env],
        renderer: ChatRenderer,
        *,
        max_turns: int = 4,
        step_timeout_s: float = 10.0,
        num_workers: int = 4,
        on_failure: str = "end",
    ):
        if not callable(factory):
            raise TypeError(
                f"env= must be a zero-argument callable returning a fresh rljax.envs.Env (a "
                f"class works), got {type(factory).__name__}"
            )
        self.factory = factory
        self._fresh()  # one env made now: a factory that makes no Env is refused at the start
        self.renderer = renderer
        self.max_turns = max_turns
        self.on_failure = on_failure
        self.pool = EnvPool(num_workers=num_workers, timeout_s=step_timeout_s)

    def _fresh(self) -> Env:
        env = self.factory()
        if not isinstance(env, Env):
            raise TypeError(
                f"the env factory returned {type(env).__name__}, which has no reset(example) "
                "and step(action): return an rljax.envs.Env"
            )
        return env

    def prompt(self, example: dict) -> list[int]:
        """The prompt ids of ``example``: a fresh env's ``reset`` rendered by the template."""
        return self.renderer.prompt_ids(self._fresh().reset(example))

    def turns(self, example: dict, prompt: Sequence[int]) -> Callable[[int], Conversation]:
        """The Request's ``turns``: sample ``i``'s conversation, its env reset on ``example``."""
        expected = list(prompt)

        def make(index: int) -> Conversation:
            env = self._fresh()
            conversation = Conversation(
                env,
                renderer=self.renderer,
                pool=self.pool,
                max_turns=self.max_turns,
                on_failure=self.on_failure,
            )
            try:  # on the sampler's thread: a bad reset fails this conversation, not the run
                same = self.renderer.prompt_ids(env.reset(example)) == expected
            except Exception:  # noqa: BLE001 - research code's env may raise anything
                same = False
            if not same:  # reset must depend on the example alone (it made the prompt)
                conversation.fail_at_once("bad_reset")
            return conversation

        return make

    def close(self) -> None:
        self.pool.close()
