"""Bad command lines and configs: the launcher prints one line and touches nothing."""

import pytest

CASES = [
    ("C01", ["--config.learner.lr=0.1"], "valid keys under 'learner.' are"),
    ("C02", ["--config.learner.group_size=eight"], "a value of the type its default"),
    ("C03", ["--config.learner.learning_rate=-0.1"], "expected a finite number >= 0"),
    ("C04", ["--config.learner.group_size=1"], "expected an integer >= 2"),
    ("C05", ["--config.sampling.top_p=1.5"], "expected a number in (0, 1]"),
    ("C06", ["--config.mode=fast"], "expected one of sync, async"),
    ("C07", ["--config.buffer.max_staleness=2"], "set mode='async' to train off-policy"),
    ("C08", ["--config.sampling.max_concurrent_decodes=4"], "at least learner.group_size=8"),
    ("C09", ["--config.mesh.reallocate=True"], "False in colocated mode"),
    (
        "C10",
        [
            "--config.mesh.mode=split",
            "--config.mesh.sampler_devices=4",
            "--config.mesh.learner_devices=4",
            "--config.mesh.reallocate=True",
        ],
        "set mode='async' or turn it off",
    ),
    ("C11", ["--config=configs/no_such_recipe.py"], "name a file such as configs/arith_tiny.py"),
    ("C12", ["--config=configs/arith_tiny.py:test"], "use one of ('small',) or none"),
    ("C13", ["--config.data.task=gsm8k"], "a JSONL or parquet file for task 'gsm8k'"),
    ("C14", ["--config.data.prompt_template=Q: {answer}"], "only {prompt}/{question}"),
    ("C15", ["--config.learner.loss=ppo2"], "set config key 'learner.loss' to one of them"),
    ("C16", ["--config.reward.name=f1"], "set config key 'reward.name' to one of them"),
    ("C17", ["--config.tokenizer=init"], "set tokenizer='char' or a tokenizer directory"),
    ("C18", ["--config.sft.teacher=oracle"], "expected one of reference, drops_carries"),
    ("C19", ["--config.learner.micro_batches=1000"], "at most the batch size"),
    ("C22", ["--config.lora.rank=0"], "expected an integer > 0"),
    ("C23", ['--config.lora.targets=("q","qkv")'], "expected one of q, k, v, o, gate, up, down"),
    ("C24", ["--config.lora.dropout=1.5"], "expected a probability in [0, 1)"),
    (
        "C25",
        ["--config.sft.teacher=looks_up_sometimes"],
        "set data.task='arithmetic_lookup', or sft.teacher='reference'",
    ),
    (
        "C26",
        ["--config=configs/arith_moe.py:small", "--config.model.num_experts_per_tok=9"],
        "expected between 1 and model.num_experts=8 (top-k of the experts)",
    ),
    (
        "C27",
        ["--config=configs/arith_moe.py:small", "--config.mesh.expert_parallel=3"],
        "expected a divisor of model.num_experts=8: each expert-parallel shard holds whole",
    ),
    ("C28", ["--config.moe.router_replay=rollout"], "no experts to replay"),
    (
        "C30",
        ["--config=configs/arith_gemma.py:small", "--config.model.sliding_window=100"],
        "a larger window is global attention: set the layers to 'full_attention'",
    ),
    (
        "C31",
        ["--config=configs/arith_gemma.py:small", "--config.model.attn_logit_softcapping=-1.0"],
        "expected a finite number > 0, or None (no cap)",
    ),
    (
        "C33",
        ["--config=configs/arith_gemma.py:small", "--config.sampling.num_local_pages=2"],
        "raise it, or leave it 0 for the default",
    ),
    ("C34", ["--config.sampling.num_local_pages=64"], "this model does not have"),
    (
        "C35",
        ["--config=configs/arith_gemma.py:small", "--config.model.partial_rotary_factor=1.5"],
        "expected a share of head_dim in [0, 1]",
    ),
    ("C37", ["--config.lora.dtype=float16"], "expected one of float32, bfloat16"),
    (
        "C36",
        ["--config.model.enable_moe_block=True"],
        "expected False for family 'llama' (the block beside a dense MLP is Gemma 4's)",
    ),
    (
        "C32",
        ['--config.model.layer_types=("sliding_attention","full_attention")'],
        "expected an integer >= 1 for the 'sliding_attention' layers",
    ),
]


@pytest.mark.parametrize("row_id, args, fix", CASES, ids=[c[0] for c in CASES])
def test_bad_command_line(launch_error, check_row, row_id, args, fix):
    check_row(row_id, launch_error(*args), fix)


@pytest.mark.parametrize(
    "row_id, source, fix",
    [
        ("C20", 'def get_config(arg=None):\n    return {"mode": 1,\n', "fix its Python syntax"),
        ("C21", "MODE = 'sync'\n", "define one that returns the run's ConfigDict"),
    ],
    ids=["C20", "C21"],
)
def test_broken_config_file(launch_error, check_row, tmp_path, row_id, source, fix):
    path = tmp_path / "my_experiment.py"
    path.write_text(source)
    check_row(row_id, launch_error(f"--config={path}"), fix)
