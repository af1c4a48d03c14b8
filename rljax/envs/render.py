"""Token-in/token-out: chat messages to the token ids a conversation appends, never re-encoding
what it already holds.

A conversation's ids are the prompt (the chat template's rendering of ``Env.reset``'s
messages), then each model turn exactly as the engine decoded it (its stop token included),
then each observation's ids. An observation's ids are what the chat template puts after an
assistant turn's stop token up to the next assistant turn's header: rendered once from a
stand-in conversation, ``[user, assistant SENTINEL, *observation]`` with the generation prompt,
and cut after the sentinel and the stop token's text. Earlier turns are never decoded and
encoded again (decoding and re-templating changes tokens; verl's multi-turn PPO diverged on it).
"""

from __future__ import annotations

from collections.abc import Sequence

from rljax.envs.base import check_messages

# Stands in for the model's turn when the template renders an observation: no template
# rewrites it and no tokenizer merges across it (it is only ever cut out).
_SENTINEL = "\u2063RLJAX-TURN\u2063"


class ObservationError(ValueError):
    """An observation the tokenizer cannot encode (counted as ``bad_observation``)."""


class ChatRenderer:
    """A tokenizer's chat template as prompt ids, action text and observation ids.

    ``tokenizer`` is an :class:`rljax.models.tokenizer.Tokenizer` (``apply_chat_template``,
    ``encode``, ``decode``, ``stop_ids``, ``bos_id``/``bos_token``).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        # Each stop token's text and id, the longest text first (one may begin another).
        stops = ((tokenizer.decode([i], skip_special_tokens=False), i) for i in tokenizer.stop_ids)
        self._stops = sorted(stops, key=lambda stop: len(stop[0]), reverse=True)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The prompt: the messages with the generation prompt; a BOS in front when the
        tokenizer has one and the template does not write it."""
        tok = self.tokenizer
        text = tok.apply_chat_template(
            check_messages(messages, "Env.reset"), add_generation_prompt=True
        )
        bos = tok.bos_id is not None and not text.startswith(tok.bos_token)
        return self._encode(text, add_bos=bos, what="Env.reset's messages")

    @property
    def turn_end_id(self) -> int:
        """The stop id the chat template writes where an assistant turn ends (SmolLM2's
        ``<|im_end|>``, Gemma's ``<end_of_turn>``): the id a turn written for the model (a
        teacher's) ends with. The tokenizer's EOS when the template writes no stop token there.
        """
        tok = self.tokenizer
        stand_in = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _SENTINEL}]
        text = tok.apply_chat_template(stand_in, add_generation_prompt=False)
        rest = text[text.rfind(_SENTINEL) + len(_SENTINEL) :] if _SENTINEL in text else ""
        for stop, stop_id in self._stops:
            if stop and rest.startswith(stop):
                return stop_id
        return tok.eos_id

    def action_text(self, turn_tokens: Sequence[int]) -> str:
        """The model's turn as the env sees it: decoded, its stop token left out."""
        tok = self.tokenizer
        ids = list(turn_tokens)
        if ids and ids[-1] in tok.stop_ids:
            ids = ids[:-1]
        return tok.decode([i for i in ids if i < tok.vocab_size])

    def observation_ids(self, observation: list[dict]) -> list[int]:
        """The ids appended after a model turn's stop token: the observation's messages and the
        next assistant turn's header, as the chat template renders them."""
        tok = self.tokenizer
        stand_in = [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": _SENTINEL},
            *check_messages(observation, "Env.step's Step.observation"),
        ]
        text = tok.apply_chat_template(stand_in, add_generation_prompt=True)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise ValueError(
                "the chat template does not render assistant messages, so an observation's "
                "place after the model's turn is unknown; use a template that renders every "
                "role (the char-level one does)"
            )
        rest = text[at + len(_SENTINEL) :]
        # The model's own stop token already ends its turn: the template's is not repeated.
        for stop, _ in self._stops:
            if stop and rest.startswith(stop):
                rest = rest[len(stop) :]
                break
        return self._encode(rest, add_bos=False, what="the observation")

    def _encode(self, text: str, *, add_bos: bool, what: str) -> list[int]:
        try:
            return self.tokenizer.encode(text, add_bos=add_bos) if text else []
        except ValueError as e:
            raise ObservationError(
                f"{what} cannot be encoded by this tokenizer ({e}); keep env messages to "
                "characters the tokenizer has (the char-level one knows only its alphabet)"
            ) from None
