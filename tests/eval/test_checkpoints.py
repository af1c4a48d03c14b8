"""A run's checkpoint taken out and measured: ``rljax export`` (hf, peft, merged) round trips
through transformers and peft, ``init`` and ``rljax eval`` read a run's workdir, and every bad
input here is refused in one line.

One full fine-tune (2 RL steps, a checkpoint each) and one LoRA run started from it (``init``
= the first run's workdir) serve every test of the module.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rljax.configs import arith_tiny

from rljax.config import ConfigError, replace
from rljax.eval.checkpoints import RESULTS_FILE, SUMMARY_FILE, EvalSettings, evaluate
from rljax.eval.estimators import pass_at_k
from rljax.eval.problems import answer_key
from rljax.models import export, saved_runs
from rljax.models.loading import load_saved_run
from rljax.models.lora_export import ADAPTER_CONFIG_FILE
from rljax.models.sharding import make_mesh
from rljax.runtime.run import Run
from tests.models.parity import assert_logits_close

torch = pytest.importorskip("torch", reason="the reference is transformers on torch")
transformers = pytest.importorskip("transformers", reason="the reference is transformers")
peft = pytest.importorskip("peft", reason="the adapter is loaded by peft")

TOKENS = np.random.RandomState(0).randint(3, 18, (2, 7))


def _length_reward(completion: str, example: dict) -> float:
    return float(len(completion) % 3)  # varied, so every group has a gradient


def _cfg(**changes):
    return replace(
        arith_tiny.recipe("small"),
        **{
            "num_steps": 2,
            "sft.steps": 0,
            "learner.learning_rate": 1e-2,
            "checkpoint.enabled": True,
            "checkpoint.every_steps": 1,
            "checkpoint.async_save": False,
            **changes,
        },
    )


def _train(cfg, workdir):
    run = Run(cfg, str(workdir), reward_fn=_length_reward)
    try:
        run.train()
    finally:
        run.close()
    return workdir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    full = _train(_cfg(), root / "full")
    lora = _train(
        _cfg(**{"init": str(full), "lora.enabled": True, "lora.rank": 4}),
        root / "lora",
    )
    return full, lora


def _ours(run: saved_runs.SavedRun, *, merge: bool = True):
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    _, graphdef, params, _ = load_saved_run(run, mesh, "test", merge=merge)
    model = nnx.merge(graphdef, params)
    positions = np.tile(np.arange(TOKENS.shape[1]), (TOKENS.shape[0], 1))
    hidden = model(jnp.asarray(TOKENS), jnp.asarray(positions), jnp.ones(TOKENS.shape, jnp.int32))
    return np.asarray(model.logits(hidden))


def _theirs(model):
    with torch.no_grad():
        return model.eval()(torch.tensor(TOKENS)).logits.float().numpy()


def _hf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_hf_export_of_a_full_run_loads_in_transformers(runs, tmp_path):
    full, _ = runs
    written = export.export(saved_runs.parse(str(full), 1), "hf", str(tmp_path / "hf"))
    assert written["step"] == 1
    ours = _ours(saved_runs.SavedRun(str(full), 1))
    assert_logits_close(_theirs(_hf(tmp_path / "hf")), ours)
    # Step 1 is not step 2: the export read the step it was asked for.
    newest = _ours(saved_runs.SavedRun(str(full)))
    assert np.abs(newest - ours).max() > 1e-3 * np.abs(ours).max()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer("12+3=")["input_ids"] == [4, 5, 13, 6, 16]  # the run's char ids
    assert tokenizer.chat_template  # the template travels with the weights


def test_peft_export_of_a_lora_run_loads_onto_its_base_and_merged_equals_it(runs, tmp_path):
    _, lora = runs
    run = saved_runs.SavedRun(str(lora))
    export.export(run, "peft", str(tmp_path / "peft"))
    config = json.loads((tmp_path / "peft" / ADAPTER_CONFIG_FILE).read_text())
    # The LoRA run started from a run's workdir, which peft cannot read: its base is written
    # beside the adapter, and named.
    assert config["base_model_name_or_path"] == str(tmp_path / "peft" / export.BASE_DIR)
    base = _hf(config["base_model_name_or_path"])
    without = _theirs(base)
    adapted = _theirs(peft.PeftModel.from_pretrained(base, tmp_path / "peft"))
    ours = _ours(run, merge=False)
    assert_logits_close(adapted, ours)
    # The adapters trained: leaving them out moves the logits well past the tolerance.
    assert np.abs(adapted - without).max() > 1e-3 * np.abs(adapted).max()
    export.export(run, "merged", str(tmp_path / "merged"))
    assert_logits_close(_theirs(_hf(tmp_path / "merged")), adapted)


def test_export_refusals_are_one_line(runs, tmp_path):
    full, lora = runs
    cases = [
        (saved_runs.SavedRun(str(full)), "peft", r"full fine-tune .* use --format=hf"),
        (saved_runs.SavedRun(str(full)), "merged", r"is no LoRA run; use --format=hf"),
        (saved_runs.SavedRun(str(lora)), "hf", r"LoRA run .* --format=merged .* or peft"),
        (
            saved_runs.SavedRun(str(full), 7),
            "hf",
            r"no finalised checkpoint step 7 .* 1, 2\); pick one",
        ),
        (saved_runs.SavedRun(str(full)), "onnx", r"--format='onnx' is not one of"),
    ]
    for run, fmt, message in cases:
        with pytest.raises(ConfigError, match=message) as e:
            export.export(run, fmt, str(tmp_path / "x"))
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"step 1 of run .* but step 2 was asked for"):
        saved_runs.parse(f"{full}/checkpoints/1", 2)


def _parity(completion: str, example: dict) -> float:
    # Right on about half of all samples, by the parity of their characters' codes: a
    # problem's samples differ in their digits (not in their length, all cut at the limit), so
    # most problems are partly solved and pass@j differs from pass@1.
    return float((sum(map(ord, completion)) + int(example["answer"])) % 2 == 0)


def test_eval_samples_k_per_problem_scores_them_and_pairs_two_checkpoints(runs, tmp_path):
    full, _ = runs
    settings = EvalSettings(k=4, problems=6)
    cfg = _cfg()
    figures, problems = evaluate(
        cfg, str(full), str(tmp_path), settings, name="newest", reward_fn=_parity
    )
    assert figures["step"] == 2 and figures["problems"] == 6 and figures["k"] == 4
    rows = [json.loads(x) for x in (tmp_path / "newest" / RESULTS_FILE).read_text().splitlines()]
    assert json.loads((tmp_path / "newest" / SUMMARY_FILE).read_text())["k"] == 4
    assert [r["prompt"] for r in rows] == [p["prompt"] for p in _heldout(cfg)[:6]]
    counts = []
    for row in rows:
        assert len(row["samples"]) == 4
        for s in row["samples"]:
            # Each sample's verdict is the reward of its own text.
            assert s["correct"] == bool(_parity(s["text"], {"answer": row["reference"]}))
            assert s["answer"] == answer_key(s["text"])
        counts.append(sum(s["correct"] for s in row["samples"]))
    # Some problem partly solved: otherwise pass@j = c / k for every j and a pass@j computed
    # as pass@1 would pass.
    assert any(0 < c < 4 for c in counts), counts
    assert figures["avg@k"]["mean"] == pytest.approx(np.mean(counts) / 4)
    for j in (1, 2, 4):
        want = np.mean([pass_at_k(4, c, j) for c in counts])
        assert figures[f"pass@{j}"]["mean"] == pytest.approx(want)
    assert set(figures) >= {"maj@k", "tokens", "truncated"}
    # The same step named by its directory: the same samples (seeds depend on the problem and
    # the sample alone), so two checkpoints evaluated so are compared on equal terms.
    again, _ = evaluate(
        cfg,
        f"{full}/checkpoints/2",
        str(tmp_path),
        settings,
        name="again",
        reward_fn=_parity,
    )
    texts = [
        [s["text"] for s in json.loads(x)["samples"]]
        for x in (tmp_path / "again" / RESULTS_FILE).read_text().splitlines()
    ]
    assert texts == [[s["text"] for s in r["samples"]] for r in rows]
    assert again["avg@k"] == figures["avg@k"]


def _heldout(cfg):
    from rljax.data.tasks import load_task

    return load_task(cfg.data, cfg.seed)[1]


def test_eval_refusals_are_one_line(runs, tmp_path):
    full, _ = runs
    cfg = _cfg()
    cases = [
        (lambda: EvalSettings(k=0), r"--k=0 must be at least 1"),
        (lambda: EvalSettings(k=4, temperature=0.0), r"--k=4 with --temperature=0 .* --k=1"),
        (
            lambda: evaluate(cfg, str(tmp_path / "nope"), str(tmp_path), EvalSettings(k=1)),
            r"--checkpoint=.*nope' does not exist; name a run's workdir",
        ),
        (
            lambda: evaluate(cfg, str(full), str(tmp_path), EvalSettings(k=1), step=9),
            r"no finalised checkpoint step 9 .* \(it holds steps 1, 2\); pick one",
        ),
    ]
    for call, message in cases:
        with pytest.raises(ConfigError, match=message) as e:
            call()
        assert "\n" not in str(e.value)
