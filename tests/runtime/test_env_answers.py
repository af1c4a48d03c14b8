"""runtime.env_answers over a pod's transport, in one process (threads and an in-memory
channel): a conversation's env runs on its home host only; the home's answers reach the
leader's stand-in in order, with the env's reward and counters; the hosts' conversation serials
agree; a build's end stops the answers and leaves nothing in the store. On one process every
conversation is its own."""

from __future__ import annotations

import pytest

from rljax.engine.samples import Request
from rljax.envs import Conversations, LookupEnv
from rljax.envs.conversation import NO_TURNS
from rljax.envs.render import ChatRenderer
from rljax.mesh.control import PodProtocolError
from rljax.models.tokenizer import Tokenizer
from rljax.runtime.env_answers import AnswerBook, EnvAnswers, HomeTurns, RemoteTurns
from rljax.runtime.exchange import Alone, ChannelExchange
from rljax.runtime.prompts import POSITION
from rljax.testing.pod import MemoryChannel

TOK = Tokenizer.char_level()
LOOKUP = TOK.encode("*") + [TOK.eos_id]  # a model turn that calls the lookup tool
ANSWER = TOK.encode("82") + [TOK.eos_id]


class CountedLookup(LookupEnv):
    """The lookup env, counting its steps (per class: every host's envs in this process)."""

    steps: list[str] = []

    def step(self, action):
        CountedLookup.steps.append(action)
        return super().step(action)


def _conversations():
    reward = lambda completion, example: float(completion == example["answer"])  # noqa: E731
    return Conversations(lambda: CountedLookup(reward), ChatRenderer(TOK), max_turns=3)


def _request(request_id: int, example: dict, conversations) -> Request:
    prompt = conversations.prompt(example)
    return Request(prompt, 2, request_id=request_id, payload=example)


def _answers(channel, me: int, conversations, counts=None, epoch: int = 3) -> EnvAnswers:
    return EnvAnswers(conversations, ChannelExchange(channel, (0, 1), me, epoch), counts)


EXAMPLE = {"prompt": "37+*=", "hidden": "45", "answer": "82"}


def test_a_conversation_steps_its_env_on_its_home_host_and_the_leader_hears_it():
    CountedLookup.steps = []
    channel, counts = MemoryChannel(), {}
    convs = _conversations()
    leader, follower = _answers(channel, 0, convs, counts), _answers(channel, 1, convs)
    # Position 5 was read by host 1 (5 % 2); an evaluation prompt (no position) of request 4
    # belongs to host 0 (4 % 2).
    remote, own = {**EXAMPLE, POSITION: 5}, dict(EXAMPLE)
    lead = [leader.bind(_request(rid, ex, convs)) for rid, ex in ((10, remote), (4, own))]
    follow = [follower.bind(_request(rid, ex, convs)) for rid, ex in ((10, remote), (4, own))]
    assert lead[0].turns is not None and follow[0].turns is not None
    stand_in, real = lead[0].turns(0), follow[0].turns(0)
    assert isinstance(stand_in, RemoteTurns) and isinstance(real, HomeTurns)
    assert stand_in.info == NO_TURNS and stand_in.reward == 0.0

    asked = stand_in.next_turn(LOOKUP)  # the leader's sampler asks first: nothing came yet
    assert not asked.done()
    ids = real.next_turn(LOOKUP).result(timeout=30)
    assert asked.result(timeout=30) == ids == TOK.encode("45=")  # the tool's message
    assert stand_in.info == real.info and stand_in.info["tool_calls"] == 1
    over = real.next_turn(ANSWER).result(timeout=30)
    assert over is None and real.reward == 1.0
    assert stand_in.next_turn(ANSWER).result(timeout=30) is None
    assert stand_in.reward == 1.0 and stand_in.info == real.info
    assert CountedLookup.steps == ["*", "82"], "the env stepped once a turn, on host 1 only"

    # Request 4 is the leader's own: a real conversation there, a stand-in on host 1.
    mine, theirs = lead[1].turns(0), follow[1].turns(0)
    assert isinstance(mine, HomeTurns) and isinstance(theirs, RemoteTurns)
    assert mine.next_turn(ANSWER).result(timeout=30) is None
    assert not theirs.next_turn(ANSWER).done(), "a follower's stand-in waits for the ticks"

    follower.stop()  # END: the null after the last answer ends the leader's reader
    leader.stop()
    late = follow[0].turns(1)  # a conversation of the ended build: its answers are not posted
    assert late.next_turn(ANSWER).result(timeout=30) is None
    assert counts == {1: 2, 0: 1}
    assert channel.store == {} and channel.failed is None
    convs.close()


def test_the_hosts_number_their_conversations_alike_and_check_it():
    book = AnswerBook()
    early = (TOK.encode("1="), 0.5, {"turns": 1, "tool_calls": 1, "env_s": 0.0})
    book.deliver(1, 0, early)  # before the leader made serial 1
    first, second = book.make(0, 1), book.make(1, 0)
    assert second.next_turn(LOOKUP).result(timeout=1) == early[0] and second.reward == 0.5
    asked = first.next_turn(LOOKUP)
    del first  # its sample is gone (a clear): a late answer finds nobody
    book.deliver(0, 1, early)
    assert not asked.done()
    book.deliver(2, 0, early)
    with pytest.raises(PodProtocolError, match="conversation 2 is sample 1 here and sample 0"):
        book.make(2, 1)


def test_a_request_without_turns_is_left_as_it_is_and_serials_follow_the_making_order():
    convs = _conversations()
    envs = _answers(MemoryChannel(), 1, convs)
    plain = Request([5, 6], 2, request_id=0)
    assert envs.bind(plain) is plain
    bound = envs.bind(_request(7, {**EXAMPLE, POSITION: 3}, convs))  # host 1's
    assert bound.turns is not None
    made = [bound.turns(i) for i in (1, 0)]
    assert [t.serial for t in made] == [0, 1]
    without_env = _answers(MemoryChannel(), 0, None)
    assert without_env.bind(bound) is bound  # a run without an env binds nothing
    envs.stop()
    convs.close()


def test_on_one_process_every_conversation_is_its_own():
    CountedLookup.steps = []
    convs, counts = _conversations(), {}
    answers = EnvAnswers(convs, Alone(), counts)
    bound = answers.bind(_request(5, {**EXAMPLE, POSITION: 9}, convs))
    turns = bound.turns(0)
    assert isinstance(turns, HomeTurns)
    assert turns.next_turn(LOOKUP).result(timeout=30) == TOK.encode("45=")
    assert counts == {0: 1} and CountedLookup.steps == ["*"]
    answers.stop()
    convs.close()
