"""GSM8K- and MATH-style tasks read from local (or ``gs://``) JSONL or parquet files.

Records are normalised to the task example format ``{"id", "prompt", "answer"}`` where
``answer`` is the bare final answer that ``rljax.rewards.math_answer`` compares against:

* GSM8K rows ``{"question", "answer": "...reasoning... #### 72"}`` give ``"72"``;
* MATH rows ``{"problem", "solution": "... \\boxed{\\frac{1}{2}}"}`` give ``"\\frac{1}{2}"``;
  rows that already carry a short ``"answer"`` (MATH-500 style) use it as is.

``id`` is the row number in the file, so it is stable for a given file on every host.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from rljax import io
from rljax.rewards.verifiers import last_boxed

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


def _normalise(record: dict, kind: str, path: str, row: int) -> tuple[str, str]:
    """Returns ``(question, final_answer)`` of one row."""
    where = f"{path} row {row}"
    if kind == "gsm8k":
        if "question" not in record or "answer" not in record:
            raise ValueError(
                f"{where}: GSM8K rows need 'question' and 'answer' keys (it has "
                f"{sorted(record)}); fix or delete the row."
            )
        answer = gsm8k_final_answer(str(record["answer"]))
        if answer is None:
            raise ValueError(
                f"{where}: GSM8K answer has no '#### <final answer>' line; end the answer with one."
            )
        return str(record["question"]), answer
    if "problem" not in record:
        raise ValueError(
            f"{where}: MATH rows need a 'problem' key (it has {sorted(record)}); fix or delete "
            "the row."
        )
    if record.get("answer") not in (None, ""):
        return str(record["problem"]), str(record["answer"]).strip()
    if "solution" not in record:
        raise ValueError(
            f"{where}: MATH rows need a 'solution' or an 'answer' key; add one to the row."
        )
    answer = last_boxed(str(record["solution"]))
    if answer is None:
        raise ValueError(
            f"{where}: MATH solution has no \\boxed{{...}} final answer; add an 'answer' key "
            "or box the answer."
        )
    return str(record["problem"]), answer.strip()


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
) -> list[dict]:
    """Loads a GSM8K/MATH file as ``[{"id", "prompt", "answer"}, ...]``.

    Args:
      path: a local or ``gs://`` path to ``.jsonl``/``.json``/``.parquet``.
      kind: ``"gsm8k"``, ``"math"`` or ``"auto"`` (by the first row's keys).
      prompt_fn: turns the question into the prompt; see :func:`chat_prompt_builder`.
      limit: keep only the first ``limit`` rows.
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
    if kind == "auto":
        kind = _detect_kind(records[0], path)
    examples = []
    for row, record in enumerate(records):
        question, answer = _normalise(record, kind, path, row)
        examples.append({"id": row, "prompt": prompt_fn(question), "answer": answer})
    return examples


def load_splits(data_cfg) -> tuple[list[dict], list[dict]]:
    """Returns ``(train, heldout)`` examples for a GSM8K/MATH ``DataConfig``.

    Uses ``data_cfg.task`` (``"gsm8k"`` or ``"math"``), ``path``, ``train_size`` and
    ``heldout_size``. The last ``heldout_size`` rows of the file are held out and the first
    ``train_size`` of the rest train, so the split depends on the file alone and is the same on
    every host. Prompts are :func:`plain_prompt` text; the runtime applies any chat template.
    """
    if data_cfg.task not in ("gsm8k", "math"):
        raise ValueError(f"data.task={data_cfg.task!r} is not a file task; use 'gsm8k' or 'math'.")
    examples = load_math_examples(data_cfg.path, kind=data_cfg.task)
    heldout_size = data_cfg.heldout_size
    if len(examples) <= heldout_size:
        raise ValueError(
            f"{data_cfg.path} has {len(examples)} rows, not more than data.heldout_size="
            f"{heldout_size}; lower heldout_size so some rows are left to train on."
        )
    train = examples[: len(examples) - heldout_size][: data_cfg.train_size]
    return train, examples[len(examples) - heldout_size :]
