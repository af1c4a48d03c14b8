"""A generative judge: a causal LM of its own reads the completion and writes a verdict.

The judge's prompt is ``reward.judge.template`` with ``{response}`` (the completion), and
optionally ``{prompt}`` (the task prompt) and ``{answer}`` (the reference answer), filled in; as
a user turn of its tokenizer's chat template, or raw. An engine of the judge's own
(:class:`~rljax.engine.paged.PagedEngine` driven by a :class:`~rljax.engine.sampler.Sampler`, on
``reward.judge.devices``) decodes every verdict of a call greedily, with continuous batching.

**The verdict format** (:func:`parse_verdict`): the reward is the number of the verdict's *last*
``Score: <number>`` (case-insensitive; ``=`` for ``:``, markdown bold and spaces allowed; a
number such as ``7``, ``7.5`` or ``-1``), divided by ``max_score``. A score outside
``[0, max_score]``, or a verdict without one, fails that completion alone: the batched verifier
returns the exception in its place and the reward pool counts it as ``raised``
(``reward_errors/raised``), with the message naming the verdict. So does a judge prompt the
tokenizer cannot encode or longer than ``max_prompt_length``.

Cost: a prefill of the judge prompt and up to ``max_new_tokens`` decode steps per completion,
on the judge's devices (by default the first local device, shared with whatever role the run put
there); its weights and KV pages stay there for the run.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Sequence
from typing import Any

from rljax import io
from rljax.config import JudgeConfig, SamplingConfig
from rljax.engine.paged import PagedEngine
from rljax.engine.sampler import FINISH_STOP, Request, Sampler
from rljax.engine.state import SlotSampling
from rljax.models.hf import load_hf
from rljax.models.sharding import SAMPLER_RULES
from rljax.rewards.model import RewardContext, check_vocab, local_mesh, reward_tokenizer

# 'Score: 7', 'score = 7.5', '**Score:** 3'; the last one in the verdict counts.
SCORE_RE = re.compile(r"score\s*\**\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_EXCERPT = 80


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _EXCERPT else "..." + flat[-_EXCERPT:]


def parse_verdict(verdict: str, max_score: float) -> float:
    """The reward a verdict gives: its last 'Score: <number>' divided by ``max_score``, in
    [0, 1]. Raises ValueError (naming the verdict) when there is none or it is out of range."""
    found = SCORE_RE.findall(verdict)
    if not found:
        raise ValueError(
            f"the judge's verdict has no 'Score: <number>': {_excerpt(verdict)!r}; fix "
            "reward.judge.template so that the judge ends with one"
        )
    score = float(found[-1])
    if not 0.0 <= score <= max_score:
        raise ValueError(
            f"the judge's score {score:g} is outside [0, reward.judge.max_score={max_score:g}]: "
            f"{_excerpt(verdict)!r}"
        )
    return score / max_score


class _Slots(dict):
    """The template's slots; a missing one (an example without 'answer') says which."""

    def __missing__(self, key: str) -> str:
        raise KeyError(f"the judge template's {{{key}}} needs the example's {key!r}")


class Judge:
    """The batched verifier of a judge: ``fn(completions, examples) -> list``, each a reward in
    [0, 1] or the exception that failed that completion (see the module docstring).

    Args:
      engine: the judge's engine (greedy; its ``sampling.max_new_tokens`` is the verdict's
        budget and ``max_prefill_length`` the longest judge prompt).
      params: the judge's weights, on the engine's mesh.
      tokenizer: the judge's tokenizer (``rljax.models.tokenizer.Tokenizer``).
      template: the prompt, with a {response} slot (``rljax.config.JudgeConfig``).
      prompt_format: 'chat' or 'raw'.
      max_score: the top of the verdict's scale.
    """

    def __init__(
        self,
        engine: PagedEngine,
        params: Any,
        tokenizer: Any,
        *,
        template: str,
        prompt_format: str,
        max_score: float,
    ):
        self.engine, self.tokenizer = engine, tokenizer
        self.template, self.prompt_format, self.max_score = template, prompt_format, max_score
        self.sampler = Sampler(engine, params, stop_ids=sorted(tokenizer.stop_ids))
        self._ids = itertools.count()
        self._lock = threading.Lock()  # one call at a time drives the sampler

    def prompt_tokens(self, completion: str, example: dict) -> list[int]:
        """The judge prompt of ``completion``, tokenized; raises when it cannot be written or
        is longer than the engine's prefill."""
        slots = _Slots(response=completion)
        for key in ("prompt", "answer"):
            if key in example:
                slots[key] = str(example[key])
        content = self.template.format_map(slots)
        if self.prompt_format == "chat":
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True
            )
            tokens = self.tokenizer.encode(text, add_bos=False)
        else:
            tokens = self.tokenizer.encode(content, add_bos=self.tokenizer.bos_id is not None)
        if len(tokens) > self.engine.max_prefill_length:
            raise ValueError(
                f"the judge prompt has {len(tokens)} tokens, more than "
                f"reward.judge.max_prompt_length={self.engine.max_prefill_length}; raise it or "
                "shorten reward.judge.template"
            )
        return tokens

    def verdicts(
        self, completions: Sequence[str], examples: Sequence[dict]
    ) -> list[str | Exception]:
        """The judge's greedy verdict on each completion, or why it could not give one."""
        out: list[str | Exception] = []
        requests, index = [], {}
        for completion, example in zip(completions, examples, strict=True):
            try:
                tokens = self.prompt_tokens(completion, example)
            except (ValueError, KeyError, TypeError) as e:
                out.append(e)
                continue
            request_id = next(self._ids)
            index[request_id] = len(out)
            out.append("")
            greedy = SlotSampling(temperature=0.0)
            requests.append(Request(tokens, sampling=greedy, request_id=request_id))
        with self._lock:
            finished = self.sampler.run(requests)
        for t in finished:
            tokens = t.response_tokens
            if t.finish_reason == FINISH_STOP and tokens:
                tokens = tokens[:-1]
            vocab = self.tokenizer.vocab_size  # an embedding padded past the tokenizer
            out[index[t.group_id]] = self.tokenizer.decode([i for i in tokens if i < vocab])
        return out

    def __call__(
        self, completions: Sequence[str], examples: Sequence[dict]
    ) -> list[float | Exception]:
        rewards: list[float | Exception] = []
        for verdict in self.verdicts(completions, examples):
            if isinstance(verdict, Exception):
                rewards.append(verdict)
                continue
            try:
                rewards.append(parse_verdict(verdict, self.max_score))
            except ValueError as e:
                rewards.append(e)
        return rewards

    def warm_up(self) -> None:
        """Compiles the judge's prefill (of the shortest bucket) and decode step now, so that
        its first scoring call does not wait on them (``reward.timeout_s`` bounds each call)."""
        with self._lock:
            greedy = SlotSampling(temperature=0.0)
            request = Request([self.tokenizer.eos_id], sampling=greedy, request_id=next(self._ids))
            self.sampler.run([request])

    def __reduce__(self):
        raise TypeError(
            "the 'judge' reward holds an engine on this process's devices and runs in the "
            "reward pool's thread mode only: set reward.mode='thread'"
        )


def build_judge(cfg: JudgeConfig, context: RewardContext) -> Judge:
    """The 'judge' reward of ``reward.judge``: its checkpoint loaded onto its devices, an
    engine of its own, compiled."""
    mesh = local_mesh(cfg.devices, "reward.judge.devices")
    with io.input_error("reward.judge.path", cfg.path):
        model_cfg, graphdef, params = load_hf(cfg.path, mesh=mesh, rules=SAMPLER_RULES)
    tokenizer = reward_tokenizer(
        cfg.tokenizer, "reward.judge.tokenizer", cfg.path, context.tokenizer
    )
    check_vocab(tokenizer, model_cfg, "reward.judge.tokenizer", cfg.tokenizer)
    sampling = SamplingConfig(
        temperature=0.0,
        max_new_tokens=cfg.max_new_tokens,
        max_prefill_length=cfg.max_prompt_length,
        max_concurrent_decodes=cfg.batch_size,
    )
    engine = PagedEngine(model_cfg, sampling, mesh, graphdef, impl=context.kernel_impl)
    judge = Judge(
        engine,
        params,
        tokenizer,
        template=cfg.template,
        prompt_format=cfg.prompt_format,
        max_score=cfg.max_score,
    )
    judge.warm_up()
    return judge
