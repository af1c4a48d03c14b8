"""Staleness-aware replay buffer and admission control (pure policy: no threads, JAX or clocks).

The unit is a GRPO group (the G responses to one prompt). The version is the learner's step
count: the learner holding params version ``s`` consumes batch ``s``. A group whose oldest token
was produced by params ``m`` has staleness ``s - m`` when consumed, which must not exceed eta
(``max_staleness``).

One buffer per consumption version (StaleFlow). Each buffer holds exactly ``batch_groups`` (B)
groups and is consumed whole, in version order::

    learner version V = 3, eta = 2, B = 4         o = occupied group, r = reserved seat
                                                  . = free seat
      buffer 3  [o o o r]   <- consumed next, once all four seats hold groups
      buffer 4  [o r r .]
      buffer 5  [r . . .]   <- furthest buffer: V + eta (a sampler at version V reaches it)

    reserve(id, v)       a seat in some buffer s with V <= s <= v + eta (its deadline), granted
                         only if every open reservation can still be seated by its deadline
    occupy(id, group, m) group lands in the earliest buffer that is not full and leaves every
                         other open reservation a seat; returns surplus request ids when a
                         buffer fills
    release(id)          seat freed (abort, failure, dynamic-sampling drop)
    consume(V)           takes the full buffer V; the learner version becomes V + 1

Seats float (earliest-deadline-first): a reservation is a claim on *some* seat in a buffer no
later than its deadline, not on one buffer. So a group that completes early fills the buffer
the learner waits on, even when every seat there was claimed by groups still generating, as
long as each of those still has a seat by its own deadline: a slow group no longer holds the
learner back while faster groups wait in later buffers. ``snapshot`` shows the earliest-deadline
assignment of the open reservations.

Lifecycle contract: every successful ``reserve`` is closed by exactly one ``occupy`` or
``release`` with the same request id, including requests returned as surplus. A request id may
be reused once its previous reservation is closed.

Redundant rollout: with ``overprovision`` k each buffer accepts B + k reservations. The first B
groups to complete fill it; its still-pending reservations are surplus, returned by the
``occupy`` that filled it so the sampler can abort them. A surplus request that completes before
its abort lands is discarded by ``occupy`` (its buffer is already full); counted in
``discarded``.

Admission (AReaL): ``StalenessController.capacity`` says how many new requests the sampler may
dispatch; ``StalenessBuffer.reserve`` says where each one goes and may still deny one (see
``StalenessController``).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

RequestId = int | str
Group = Any


def _check_int(name: str, value: Any, minimum: int, fix: str) -> None:
    """Raises a ValueError naming ``name`` unless ``value`` is an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid: {fix}")


def _corrupt(problem: str) -> NoReturn:
    raise ValueError(
        f"state is not a valid StalenessBuffer.state_dict() ({problem}); restore the dict that "
        "state_dict() returned, with the same config"
    )


def _check_request_id(request_id: Any) -> None:
    # Ids go into state_dict, which must survive a JSON round trip unchanged.
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        raise ValueError(
            f"request_id={request_id!r} is invalid: use an int or a str (it is checkpointed)"
        )


class _Slot:
    """One buffer: the groups occupying seats of one consumption version."""

    __slots__ = ("groups",)

    def __init__(self) -> None:
        self.groups: list[tuple[RequestId, int, Group]] = []  # (request id, min_version, group)


class StalenessBuffer:
    """One buffer of ``batch_groups`` groups per consumption version; see the module docstring.

    Args:
      batch_groups: B, groups per learner step; every consumed buffer holds exactly B groups.
      max_staleness: eta >= 0; every consumed group satisfies ``version - min_version <= eta``.
        eta = 0 is synchronous on-policy training.
      overprovision: k >= 0 extra reservations per buffer (redundant rollout, B' = B + k).

    Attributes:
      lost_reservations: request ids whose reservations ``from_state_dict`` dropped (empty on a
        fresh buffer); the runtime re-dispatches their prompts.

    Not thread-safe by design: the runtime serialises calls under its own lock, and the
    simulator calls it from one thread.
    """

    def __init__(self, *, batch_groups: int, max_staleness: int, overprovision: int = 0):
        _check_int("batch_groups", batch_groups, 1, "use an int >= 1 (groups per learner step)")
        _check_int("max_staleness", max_staleness, 0, "use an int eta >= 0 (0 is on-policy)")
        _check_int("overprovision", overprovision, 0, "use an int k >= 0 (0 disables it)")
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.overprovision = overprovision
        self._version = 0
        self._slots: dict[int, _Slot] = {}
        # Open reservations: request id -> sampler_version, in reservation order. A reservation
        # claims a seat in some buffer up to sampler_version + eta, not in one buffer.
        self._reserved: dict[RequestId, int] = {}
        self._surplus: dict[RequestId, None] = {}  # told to abort, not yet closed (ordered set)
        self._accepted = 0
        self._discarded = 0
        self.lost_reservations: list[RequestId] = []  # set by from_state_dict only

    @property
    def version(self) -> int:
        """The learner version: the buffer that ``consume`` takes next."""
        return self._version

    @property
    def accepted(self) -> int:
        """Groups accepted over the whole run (consumed plus held): AReaL's ``accepted``."""
        return self._accepted

    @property
    def num_pending(self) -> int:
        """Reservations holding a seat (not yet occupied, released or made surplus)."""
        return len(self._reserved)

    @property
    def discarded(self) -> int:
        """Surplus groups that completed before their abort and were dropped by ``occupy``."""
        return self._discarded

    @property
    def surplus(self) -> list[RequestId]:
        """Request ids returned as surplus that are not yet closed by ``occupy``/``release``."""
        return list(self._surplus)

    def _seat_limit(self) -> int:
        return self.batch_groups + self.overprovision

    def _held(self, version: int) -> int:
        slot = self._slots.get(version)
        return 0 if slot is None else len(slot.groups)

    def _seat(
        self, reserved: dict[RequestId, int], fuller: int | None = None
    ) -> tuple[dict[RequestId, int], list[RequestId]]:
        """Seats ``reserved`` earliest deadline first; returns (buffer of each seated request,
        the requests left without a seat). ``fuller``: count that buffer one group fuller.

        A full buffer (B groups) seats nobody; another takes claims up to B + k. With every
        deadline at least the learner version, earliest-deadline-first seats every request
        whenever any assignment can.
        """
        first, eta = self._version, self.max_staleness
        free = {}
        for s in range(first, first + eta + 1):
            held = self._held(s) + (s == fuller)
            free[s] = 0 if held >= self.batch_groups else self._seat_limit() - held
        seats: dict[RequestId, int] = {}
        unseated: list[RequestId] = []
        # A stable sort by sampler_version is one by deadline, ties in reservation order.
        for rid, sampler_version in sorted(reserved.items(), key=lambda item: item[1]):
            last = min(sampler_version + eta, first + eta)
            seat = next((v for v in range(first, last + 1) if free[v] > 0), None)
            if seat is None:
                unseated.append(rid)
            else:
                free[seat] -= 1
                seats[rid] = seat
        return seats, unseated

    def reserve(self, request_id: RequestId, sampler_version: int) -> int | None:
        """Reserves a seat for a group request; returns its buffer version, or None if denied.

        Args:
          request_id: int or str, unique among open reservations.
          sampler_version: the oldest params version any token of the group will carry: the
            dispatch version for a fresh request, the oldest prefix token's version for a resumed
            partial rollout. At most the learner version.

        Returns:
          The buffer the earliest-deadline-first seating puts it in now (seats float: it may
          end up in another buffer s with ``version <= s <= sampler_version + eta``), or None
          when granting it would leave some open reservation without a seat by its deadline:
          the sampler must wait for a seat or, when ``sampler_version + eta < version``, sync
          newer params first.
        """
        _check_request_id(request_id)
        if request_id in self._reserved or request_id in self._surplus:
            raise ValueError(
                f"request_id={request_id!r} already holds an open reservation; close it with "
                "occupy() or release() before reusing the id"
            )
        _check_int("sampler_version", sampler_version, 0, "use the int params version (>= 0)")
        if sampler_version > self._version:
            raise ValueError(
                f"sampler_version={sampler_version} is ahead of the learner version "
                f"{self._version}; pass the version of the params the sampler actually holds"
            )
        if sampler_version + self.max_staleness < self._version:
            return None
        seats, unseated = self._seat({**self._reserved, request_id: sampler_version})
        if unseated:
            return None
        self._reserved[request_id] = sampler_version
        return seats[request_id]

    def occupy(self, request_id: RequestId, group: Group, min_version: int) -> list[RequestId]:
        """Stores a completed group; returns the request ids that became surplus (to abort).

        Placement: the earliest buffer that is not full and leaves every other open
        reservation a seat by its deadline (earliest-deadline-first), so a group that completes
        early fills the buffer the learner waits on first, even past slower groups that
        reserved there before it. Moving earlier is always staleness-safe.

        Args:
          request_id: an id returned a seat by ``reserve`` (or returned as surplus, in which case
            the group is discarded and [] returned).
          group: opaque payload, returned as-is by ``consume``.
          min_version: the version of the group's oldest token. It may exceed the reservation's
            ``sampler_version`` (the request waited for a slot while params were swapped in
            flight) but not be below it: reserve a resumed partial rollout with the version of
            its oldest prefix token. It cannot exceed the learner version.

        Returns:
          The open reservations left without any seat by this group filling a buffer (only
          overprovision can leave any: its B + k claims on a buffer outnumber its B seats).
        """
        if request_id in self._surplus:
            del self._surplus[request_id]
            self._discarded += 1
            return []
        if request_id not in self._reserved:
            raise ValueError(
                f"request_id={request_id!r} holds no reservation; call reserve() first (and "
                "occupy or release each reservation exactly once)"
            )
        sampler_version = self._reserved[request_id]
        _check_int("min_version", min_version, 0, "use the int version of the oldest token")
        if min_version < sampler_version:
            raise ValueError(
                f"min_version={min_version} is older than the reservation's sampler_version "
                f"{sampler_version} for request_id={request_id!r}; reserve resumed partial "
                "rollouts with the version of their oldest prefix token"
            )
        if min_version > self._version:
            raise ValueError(
                f"min_version={min_version} is ahead of the learner version {self._version}; "
                "pass the version of the params that produced the oldest token"
            )
        del self._reserved[request_id]
        # Its own earliest-deadline seat strands nobody, so some buffer qualifies; with
        # overprovision, the fewest stranded decides (the earliest among equals).
        best: tuple[int, int] | None = None
        last = min(min_version + self.max_staleness, self._version + self.max_staleness)
        for s in range(self._version, last + 1):
            if self._held(s) >= self.batch_groups:
                continue
            stranded = len(self._seat(self._reserved, fuller=s)[1])
            if best is None or stranded < best[1]:
                best = (s, stranded)
            if stranded == 0:
                break
        assert best is not None, "an open reservation always has a buffer that is not full"
        self._slots.setdefault(best[0], _Slot()).groups.append((request_id, min_version, group))
        self._accepted += 1
        surplus = self._seat(self._reserved)[1]
        for rid in surplus:
            del self._reserved[rid]
            self._surplus[rid] = None
        return surplus

    def release(self, request_id: RequestId) -> None:
        """Closes a reservation without a group (aborted, failed, surplus or dropped group).

        Dynamic sampling: call ``release`` instead of ``occupy`` for a group without signal
        (see ``has_signal``); the freed seat goes to the next ``reserve``.
        """
        if request_id in self._surplus:
            del self._surplus[request_id]
            return
        if request_id not in self._reserved:
            raise ValueError(
                f"request_id={request_id!r} holds no open reservation; release only reserved "
                "requests that were not occupied (an occupied group cannot be released)"
            )
        del self._reserved[request_id]

    def _check_learner_version(self, learner_version: int) -> None:
        if learner_version != self._version:
            raise ValueError(
                f"learner_version={learner_version!r} does not match the buffer version "
                f"{self._version}; the learner and buffer disagree (resume both from one "
                "checkpoint)"
            )

    def ready(self, learner_version: int) -> bool:
        """Whether buffer ``learner_version`` (the current one) is full and can be consumed."""
        self._check_learner_version(learner_version)
        slot = self._slots.get(learner_version)
        return slot is not None and len(slot.groups) == self.batch_groups

    def consume(self, learner_version: int) -> list[Group]:
        """Takes the full buffer ``learner_version`` and advances the learner version by one.

        Advancing here, not in a separate call, leaves no window in which a consumed buffer's
        version is still current. The learner then trains on the batch and publishes params
        ``learner_version + 1``; reservations for later buffers stay valid meanwhile.
        """
        if not self.ready(learner_version):
            held = len(self._slots[learner_version].groups) if learner_version in self._slots else 0
            raise ValueError(
                f"buffer {learner_version} is not full ({held}/{self.batch_groups} groups); "
                "wait until ready(learner_version) is True"
            )
        slot = self._slots.pop(learner_version)
        self._version += 1
        return [group for _, _, group in slot.groups]

    def snapshot(self) -> list[dict[str, int]]:
        """Counts per live buffer, for metrics: ``[{version, reserved, occupied}, ...]``.

        Lists every buffer a sampler at the learner version can reach, ``version`` to
        ``version + eta``, in order; ``reserved`` counts the open reservations the
        earliest-deadline-first seating puts there now.
        """
        reserved = collections.Counter(self._seat(self._reserved)[0].values())
        return [
            {"version": s, "reserved": reserved[s], "occupied": self._held(s)}
            for s in range(self._version, self._version + self.max_staleness + 1)
        ]

    def state_dict(self, encode: Callable[[Group], Any] | None = None) -> dict[str, Any]:
        """Plain-data state for a checkpoint.

        Groups are opaque: the dict holds ``encode(group)`` (the group itself by default), so it
        is JSON-serialisable when the encoded groups are. Pending reservations are saved so that
        ``from_state_dict`` can report them as ``lost_reservations``; surplus ids are not saved
        (their buffers are full, nothing needs re-dispatching).
        """
        encode = encode or (lambda group: group)
        seats = self._seat(self._reserved)[0]
        buffers = []
        for s in sorted(set(self._slots) | set(seats.values())):
            slot = self._slots.get(s, _Slot())
            buffers.append(
                {
                    "version": s,
                    "groups": [
                        {"request_id": rid, "min_version": m, "group": encode(g)}
                        for rid, m, g in slot.groups
                    ],
                    "reservations": [
                        {"request_id": rid, "sampler_version": self._reserved[rid]}
                        for rid in self._reserved
                        if seats.get(rid) == s
                    ],
                }
            )
        return {
            "batch_groups": self.batch_groups,
            "max_staleness": self.max_staleness,
            "overprovision": self.overprovision,
            "version": self._version,
            "accepted": self._accepted,
            "discarded": self._discarded,
            "buffers": buffers,
        }

    @classmethod
    def from_state_dict(
        cls, state: dict[str, Any], decode: Callable[[Any], Group] | None = None
    ) -> StalenessBuffer:
        """Rebuilds a buffer from ``state_dict`` output after a restart.

        Occupied groups keep their buffer and ``min_version``, so staleness does not drift.
        Pending reservations died with the sampler: they are dropped, their seats freed, and
        their ids listed in ``lost_reservations`` (in buffer order) so the runtime can
        re-dispatch those prompts.
        """
        decode = decode or (lambda group: group)
        try:
            buf = cls(
                batch_groups=state["batch_groups"],
                max_staleness=state["max_staleness"],
                overprovision=state["overprovision"],
            )
            version = state["version"]
            _check_int("state['version']", version, 0, "restore a state_dict() output")
            _check_int("state['accepted']", state["accepted"], 0, "restore a state_dict() output")
            _check_int("state['discarded']", state["discarded"], 0, "restore a state_dict() output")
            buf._version = version
            buf._accepted = state["accepted"]
            buf._discarded = state["discarded"]
            for entry in state["buffers"]:
                s = entry["version"]
                if not version <= s <= version + buf.max_staleness:
                    _corrupt(f"buffer {s} lies outside [version, version + eta]")
                if s in buf._slots:
                    _corrupt(f"buffer {s} appears twice")
                groups = entry["groups"]
                if len(groups) > buf.batch_groups:
                    _corrupt(f"buffer {s} holds {len(groups)} groups > batch_groups")
                slot = _Slot()
                for g in groups:
                    if s - g["min_version"] > buf.max_staleness:
                        _corrupt(f"group {g['request_id']!r} in buffer {s} exceeds eta")
                    slot.groups.append((g["request_id"], g["min_version"], decode(g["group"])))
                # An empty slot must still mark the version as seen, for the duplicate check.
                buf._slots[s] = slot
                buf.lost_reservations.extend(r["request_id"] for r in entry["reservations"])
        except (KeyError, TypeError) as err:
            _corrupt(f"{type(err).__name__}: {err}")
        held = sum(len(slot.groups) for slot in buf._slots.values())
        if buf._accepted != buf._version * buf.batch_groups + held:
            # Every consumed buffer held exactly B groups, so the counts must agree.
            _corrupt(f"accepted={buf._accepted} != version * batch_groups + {held} held groups")
        for s in [s for s, slot in buf._slots.items() if not slot.groups]:
            del buf._slots[s]
        return buf


class StalenessController:
    """AReaL admission control: how many new group requests the sampler may dispatch now.

    ``capacity = min(max_concurrent - running, (eta + version + 1) * B - (accepted + running))``
    clamped at 0, plus ``(eta + 1) * k`` on the staleness term with redundant rollout.

    Relation to ``StalenessBuffer``: pass ``version=buffer.version``,
    ``accepted=buffer.accepted`` and ``running`` = requests in flight. Since every consumed
    buffer held exactly B groups, ``accepted = version * B + held``, so the staleness term is
    ``(eta + 1) * (B + k) - held - running``: the seats left in the buffers ``version`` ..
    ``version + eta``. With ``running = buffer.num_pending`` and k = 0 it equals the number of
    ``reserve`` calls at the learner version that succeed. The controller is an upper bound:
    ``reserve`` can still deny a request whose sampler lags the learner, and surplus requests
    still running count against concurrency but hold no seat. Ask the controller how many,
    the buffer where each goes, and stop at the first None.

    Args:
      max_staleness: eta >= 0.
      batch_groups: B >= 1, groups per learner step.
      max_concurrent: most group requests in flight at once (>= 1).
      overprovision: k >= 0, as in ``StalenessBuffer``.
    """

    def __init__(
        self, *, max_staleness: int, batch_groups: int, max_concurrent: int, overprovision: int = 0
    ):
        _check_int("max_staleness", max_staleness, 0, "use an int eta >= 0 (0 is on-policy)")
        _check_int("batch_groups", batch_groups, 1, "use an int >= 1 (groups per learner step)")
        _check_int("max_concurrent", max_concurrent, 1, "use an int >= 1 (requests in flight)")
        _check_int("overprovision", overprovision, 0, "use an int k >= 0 (0 disables it)")
        self.max_staleness = max_staleness
        self.batch_groups = batch_groups
        self.max_concurrent = max_concurrent
        self.overprovision = overprovision

    def capacity(self, learner_version: int, running: int, accepted: int) -> int:
        """New group requests the sampler may dispatch now (>= 0).

        Args:
          learner_version: the learner's step count (``StalenessBuffer.version``).
          running: group requests in flight.
          accepted: groups accepted so far over the run (``StalenessBuffer.accepted``).
        """
        _check_int("learner_version", learner_version, 0, "use the learner step count (>= 0)")
        _check_int("running", running, 0, "use the count of requests in flight (>= 0)")
        _check_int("accepted", accepted, 0, "use StalenessBuffer.accepted (>= 0)")
        eta, batch = self.max_staleness, self.batch_groups
        stale_room = (eta + learner_version + 1) * batch + (eta + 1) * self.overprovision
        return max(0, min(self.max_concurrent - running, stale_room - (accepted + running)))


def has_signal(rewards: Sequence[float], *, atol: float = 0.0) -> bool:
    """Whether a group's rewards differ (spread > ``atol``), i.e. GRPO advantages are non-zero.

    Dynamic sampling (DAPO) releases groups without signal instead of occupying a seat.
    """
    if len(rewards) == 0:
        raise ValueError("rewards is empty; pass the G rewards of one group")
    if any(math.isnan(r) for r in rewards):
        raise ValueError(f"rewards={list(rewards)!r} contains NaN; fix the reward function")
    if atol < 0:
        raise ValueError(f"atol={atol!r} is negative; use a tolerance >= 0")
    return max(rewards) - min(rewards) > atol
