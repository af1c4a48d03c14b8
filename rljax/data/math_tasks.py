"""GSM8K- and MATH-style tasks read from local (or ``gs://``) JSONL or parquet files.

Records are normalised to the task example format ``{"id", "prompt", "question", "answer",
"solution"}`` where ``answer`` is the bare final answer that ``rljax.rewards.math_answer``
compares against and ``solution`` the row's worked text it was read from (what the warm start's
``sft.teacher='worked'`` imitates):

* GSM8K rows ``{"question", "answer": "...reasoning... #### 72"}`` give ``"72"``;
* MATH rows ``{"problem", "solution": "... \\boxed{\\frac{1}{2}}"}`` give ``"\\frac{1}{2}"``;
  rows that already carry a short ``"answer"`` (MATH-500 style) use it as is;
* other files name their keys and answer format (``data.prompt_field``, ``data.answer_field``,
  ``data.answer_format``: ``gsm8k``, ``boxed``, ``number`` for the last number, or ``raw``).

A row without its question or answer, or with an answer that does not parse, is skipped and
counted (the run logs the counts); a file with no usable row is refused in one line.

``id`` is the row number in the file, so it is stable for a given file on every host.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Callable

from rljax import io
from rljax.data.registry import ANSWER_FORMATS
from rljax.rewards.verifiers import NUMBER_RE, last_boxed, parse_number

log = logging.getLogger(__name__)

KINDS = ("auto", "gsm8k", "math")
DEFAULT_INSTRUCTION = (
    "Solve the problem step by step, then give the final answer as \\boxed{answer}."
)
PromptFn = Callable[[str], str]


def _open_binary(path: str):
    """Opens a task file, a local path or a ``gs://`` URL, through :mod:`rljax.io`."""
    try:
        return io.open_file(path, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"Task file {path} does not exist; point data.path at a JSONL or parquet file."
        ) from None
    except Exception as exc:  # gcsfs raises its own types (no credentials, HTTP errors)
        text = " ".join(str(exc).split())[:200]
        raise OSError(
            f"Cannot open task file {path}: {text}; check the path and your credentials."
        ) from None


def _read_jsonl(path: str) -> list[dict]:
    with _open_binary(path) as f:
        data = f.read()
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {exc.start}); JSONL task files must be UTF-8 JSON "
            "lines."
        ) from None
    records = []
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path} line {line_number} is not valid JSON: {exc}; fix or delete that line."
            ) from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{path} line {line_number} must be a JSON object, not "
                f"{type(record).__name__}; write one {{...}} record per line."
            )
        records.append(record)
    return records


def _read_parquet(path: str) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            f"Reading {path} needs pyarrow, which is not installed; run `pip install pyarrow` "
            "or convert the file to JSONL."
        ) from None
    with _open_binary(path) as f:
        try:
            table = pq.read_table(f)
        except Exception as exc:
            text = " ".join(str(exc).split())[:200]
            raise ValueError(
                f"{path} is not a readable parquet file: {text}; re-export it or use JSONL."
            ) from None
    return table.to_pylist()


def read_records(path: str) -> list[dict]:
    """Reads every row of a ``.jsonl`` / ``.json`` (one object per line) or ``.parquet`` file."""
    path = str(path)
    if path.endswith(".parquet"):
        return _read_parquet(path)
    if path.endswith((".jsonl", ".json")):
        return _read_jsonl(path)
    raise ValueError(
        f"Task file {path} must end in .jsonl, .json or .parquet; rename or convert it."
    )


def gsm8k_final_answer(solution: str) -> str | None:
    """Returns the text after the last ``####`` with thousands separators removed."""
    if "####" not in solution:
        return None
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def _detect_kind(record: dict, path: str) -> str:
    if "question" in record:
        return "gsm8k"
    if "problem" in record:
        return "math"
    raise ValueError(
        f"{path}: cannot tell the task kind from keys {sorted(record)}; expected 'question' "
        "(GSM8K) or 'problem' (MATH), or pass kind= explicitly."
    )


@dataclasses.dataclass(frozen=True)
class Fields:
    """Where a row keeps its question and answer, and how the final answer is read from the
    answer's text (:data:`ANSWER_FORMATS`). ``answer`` '' (MATH's default): the row's short
    ``answer`` when it has one, else the last ``\\boxed{}`` of its ``solution``."""

    prompt: str
    answer: str
    answer_format: str


def fields_for(
    kind: str, prompt: str = "", answer: str = "", answer_format: str = "auto"
) -> Fields:
    """The fields of a ``kind`` file ('gsm8k' or 'math'), each '' or 'auto' taking the kind's
    default: GSM8K's ``question``/``answer`` with ``#### N``; MATH's ``problem`` with its
    ``answer``, or the last ``\\boxed{}`` of its ``solution``."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format={answer_format!r} is not one of {ANSWER_FORMATS}.")
    if kind == "gsm8k":
        default = Fields("question", "answer", "gsm8k")
    else:
        default = Fields("problem", "", "boxed")
    return Fields(
        prompt or default.prompt,
        answer or default.answer,
        default.answer_format if answer_format == "auto" else answer_format,
    )


def final_answer(text: str, answer_format: str) -> str | None:
    """The final answer in a row's answer ``text``, read as ``answer_format`` says; None when
    it has none: GSM8K's ``#### N`` (a number), MATH's last ``\\boxed{}``, the text's last
    number, or the whole text (``raw``)."""
    if answer_format == "gsm8k":
        answer = gsm8k_final_answer(text)
        return answer if answer and parse_number(answer) is not None else None
    if answer_format == "boxed":
        boxed = last_boxed(text)
        return boxed.strip() if boxed is not None and boxed.strip() else None
    if answer_format == "number":
        numbers = NUMBER_RE.findall(text)
        return numbers[-1].replace(",", "") if numbers else None
    return text.strip() or None


def _row(record: dict, fields: Fields) -> tuple[str, str, str] | str:
    """``(question, final answer, solution)`` of one row, or why it cannot be used:
    ``missing '<key>'`` or ``unparsable answer``. The solution is the text the final answer
    was read from (a GSM8K row's worked answer, a MATH row's ``solution``; a short answer
    stands for itself)."""
    if fields.prompt not in record or record[fields.prompt] in (None, ""):
        return f"missing {fields.prompt!r}"
    if fields.answer:
        if fields.answer not in record or record[fields.answer] in (None, ""):
            return f"missing {fields.answer!r}"
        solution = str(record[fields.answer])
        answer = final_answer(solution, fields.answer_format)
    elif record.get("answer") not in (None, ""):  # MATH-500 style: a short answer already
        answer = solution = str(record["answer"]).strip()
    elif record.get("solution") in (None, ""):
        return "missing 'solution' or 'answer'"
    else:
        solution = str(record["solution"])
        answer = final_answer(solution, fields.answer_format)
    if answer is None:
        return "unparsable answer"
    return str(record[fields.prompt]), answer, solution.strip()


def plain_prompt(question: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    """A template-free prompt, for base models without a chat template."""
    return f"{question.strip()}\n{instruction}\n"


def chat_prompt_builder(
    tokenizer, *, system: str | None = None, instruction: str = DEFAULT_INSTRUCTION
) -> PromptFn:
    """Returns ``question -> prompt`` that renders a chat turn with ``tokenizer``'s template.

    Args:
      tokenizer: an ``rljax.models.tokenizer.Tokenizer`` (anything with
        ``apply_chat_template``).
      system: optional system message.
      instruction: appended to the question in the user message.
    """

    def build(question: str) -> str:
        messages = [] if system is None else [{"role": "system", "content": system}]
        messages.append({"role": "user", "content": f"{question.strip()}\n{instruction}"})
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    return build


def load_math_examples(
    path: str,
    *,
    kind: str = "auto",
    prompt_fn: PromptFn = plain_prompt,
    limit: int | None = None,
    fields: Fields | None = None,
    skipped: Counter | None = None,
) -> list[dict]:
    """Loads a GSM8K/MATH-style file as ``[{"id", "prompt", "question", "answer", "solution"},
    ...]`` (see the module docstring).

    A row without its question or answer, or whose answer does not parse, is skipped and
    counted in ``skipped`` (by reason) and in one warning; a file with no usable row at all is
    refused (ValueError).

    Args:
      path: a local or ``gs://`` path to ``.jsonl``/``.json``/``.parquet``.
      kind: ``"gsm8k"``, ``"math"`` or ``"auto"`` (by the first row's keys).
      prompt_fn: turns the question into the prompt; see :func:`chat_prompt_builder`.
      limit: keep only the first ``limit`` rows.
      fields: where the question and answer are (default: the kind's, :func:`fields_for`).
      skipped: a Counter the skipped rows are counted into, by reason.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not supported; use one of {list(KINDS)}.")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit={limit!r} must be a positive int or None.")
    records = read_records(path)
    if not records:
        raise ValueError(
            f"Task file {path} has no rows; point data.path at a file with one record per line."
        )
    if limit is not None:
        records = records[:limit]
    if fields is None:
        fields = fields_for(_detect_kind(records[0], path) if kind == "auto" else kind)
    examples: list[dict] = []
    bad: Counter = Counter()
    for row, record in enumerate(records):
        got = _row(record, fields)
        if isinstance(got, str):
            bad[got] += 1
            continue
        question, answer, solution = got
        question = question.strip()
        examples.append(
            {
                "id": row,
                "prompt": prompt_fn(question),
                "question": question,
                "answer": answer,
                "solution": solution,
            }
        )
    reasons = ", ".join(f"{n} {why}" for why, n in bad.most_common())
    if not examples:
        raise ValueError(
            f"{path}: none of its {len(records)} rows is usable ({reasons}); point "
            f"data.prompt_field, data.answer_field and data.answer_format at the file's keys "
            f"({sorted(records[0])}) and answers"
        )
    if bad:
        log.warning(
            "%s: skipped %d of %d rows (%s)", path, sum(bad.values()), len(records), reasons
        )
    if skipped is not None:
        skipped.update(bad)
    return examples


def load_splits(data_cfg, skipped: Counter | None = None) -> tuple[list[dict], list[dict]]:
    """Returns ``(train, heldout)`` examples for a GSM8K/MATH ``DataConfig``.

    Uses ``data_cfg.task`` (``"gsm8k"`` or ``"math"``), ``path``, ``train_size`` and
    ``heldout_size``. The last ``heldout_size`` rows of the file are held out and the first
    ``train_size`` of the rest train, so the split depends on the file alone and is the same on
    every host. Prompts are :func:`plain_prompt` text; the runtime applies any chat template.
    ``data_cfg.prompt_field``, ``answer_field`` and ``answer_format`` say where a row keeps
    its question and answer; rows that cannot be used are counted into ``skipped``.
    """
    if data_cfg.task not in ("gsm8k", "math"):
        raise ValueError(f"data.task={data_cfg.task!r} is not a file task; use 'gsm8k' or 'math'.")
    fields = fields_for(
        data_cfg.task, data_cfg.prompt_field, data_cfg.answer_field, data_cfg.answer_format
    )
    examples = load_math_examples(data_cfg.path, kind=data_cfg.task, fields=fields, skipped=skipped)
    heldout_size = data_cfg.heldout_size
    if len(examples) <= heldout_size:
        raise ValueError(
            f"{data_cfg.path} has {len(examples)} rows, not more than data.heldout_size="
            f"{heldout_size}; lower heldout_size so some rows are left to train on."
        )
    train = examples[: len(examples) - heldout_size][: data_cfg.train_size]
    return train, examples[len(examples) - heldout_size :]
