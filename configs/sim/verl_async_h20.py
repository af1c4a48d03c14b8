"""The simulator against published per-step figures of two RL systems (verl, NeMo RL).

verl fully async (Qwen2.5-Math-7B, DAPO, H20, vLLM + FSDP2, 512 prompts x 16 per step,
responses up to 28K tokens): table "Asynchronous Training on 7B Model" of
https://github.com/volcengine/verl/blob/main/recipe/fully_async_policy/README.md (per-step
means of step, gen, old_log_prob and update_actor for colocated sync on 32/64/128 GPUs and
fully async on 16:16/32:32/64:64).
NeMo RL v0.4 (Llama-3.1-8B-Instruct GRPO, 16 H100, 64 prompts x 32 per step, on-policy
colocated and one step off-policy on 8 + 8 GPUs): the GRPO table of
https://github.com/NVIDIA-NeMo/RL/blob/main/docs/about/performance-summary.md (recipes
examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g.yaml and
async-grpo-llama3.1-8b-instruct-2n8g.yaml).

Fitted, and only to these: the per-phase times of verl's colocated run on 32 GPUs (decode_hbm
to gen 357.41 s, train_mfu to old_log_prob + update_actor 107.71 + 269.80 s). Every other
figure is predicted without refitting: the step times of the other five verl runs and the two
NeMo RL runs, and each system's async speed-ups (colocated step / async step), all per step.
``:fit128`` fits to verl's 128-GPU colocated run instead (a sensitivity check). The band runs
over the settings neither publication gives (see ``KNOBS``).

  python scripts/simulate.py --config=configs/sim/verl_async_h20.py          # nominal + band
  python scripts/simulate.py --config=configs/sim/verl_async_h20.py:small    # nominal only
  python scripts/simulate.py --config=configs/sim/verl_async_h20.py:fit128   # fit to 128 GPUs
"""

import ml_collections

# small: the nominal knobs only, fewer steps; fit128: fit to the 128-GPU colocated run
# instead (a sensitivity check; 32 GPUs is the fit, see docs/simulator.md).
VARIANTS = ("small", "fit128")

VERL = "https://github.com/volcengine/verl/blob/main/recipe/fully_async_policy/README.md"
NEMO = "https://github.com/NVIDIA-NeMo/RL/blob/main/docs/about/performance-summary.md"


def _verl_run(name, chips, step_s, gen_s, train_s, sampler_chips=0):
    mode = "async" if sampler_chips else "sync"
    run = dict(name=name, mode=mode, chips=chips, step_s=step_s, gen_s=gen_s, train_s=train_s)
    if sampler_chips:
        run["sampler_chips"] = sampler_chips
    return run


# verl: per-step means; a colocated run's train_s is old_log_prob + update_actor, an async
# run's gen_s the trainer's wait for samples ("gen") and its train_s update_actor alone (the
# async trainer uses the rollout's log-probs: use_rollout_log_probs, no old_log_prob phase).
VERL_SYSTEM = dict(
    name="verl",
    source=VERL,
    # staleness_threshold 0.5: at most 1.5 batches in flight per sync, so one version ahead
    # (eta 1, the smallest integer that admits it); partial_rollout: in-flight responses keep
    # decoding across a sync, as the simulator's in-flight update does.
    eta=1,
    scenario=dict(),  # the config's own fields are verl's
    runs=[
        _verl_run("colocated_32", 32, 790.10, 357.41, 107.71 + 269.80),
        _verl_run("async_16_16", 32, 294.77, 21.26, 313.81, sampler_chips=16),
        _verl_run("colocated_64", 64, 365.28, 150.72, 70.26 + 133.41),
        _verl_run("async_32_32", 64, 189.26, 28.46, 156.98, sampler_chips=32),
        _verl_run("colocated_128", 128, 356.30, 177.85, 53.92 + 113.81),
        _verl_run("async_64_64", 128, 150.63, 33.14, 113.16, sampler_chips=64),
    ],
    speedups=[
        ("colocated_32", "async_16_16"),
        ("colocated_64", "async_32_32"),
        ("colocated_128", "async_64_64"),
    ],
)

# NeMo RL v0.4: step time only (no phases). "G-Average Seq len" is the mean response: with
# tokens/s/GPU x step x 16 GPUs / 2,048 samples = 1,192 and 1,260 tokens per sample, both runs
# give a 131-token prompt. Training: Megatron with activation checkpointing (fwd + recomputed
# fwd + bwd = 8N per token) plus the policy's previous log-probs (2N) and the reference
# model's (2N, grpo_math_1B.yaml's default KL penalty 0.01): 12N, in both runs.
NEMO_SYSTEM = dict(
    name="nemo_rl",
    source=NEMO,
    eta=1,  # max_trajectory_age_steps: 1
    scenario=dict(
        model="llama-3.1-8b",
        chip="h100",
        tp=1,  # Generation [TP, PP] = [1, 1]
        batch_groups=64,  # num_prompts_per_step
        group_size=32,  # num_generations_per_prompt
        prompt_tokens=131,
        max_slots=256,  # vLLM max_num_seqs default
        # sigma and tail unpublished: LengthModel's documented sigma default, no tail (the
        # 4,096-token limit caps prompt + response); the median is solved per run.
        lengths=dict(median=900.0, sigma=0.7, tail_prob=0.0, max_tokens=4096 - 131),
        train_flops_per_param=dict(sync=12.0, async_=12.0),
    ),
    runs=[
        dict(name="on_policy_16", mode="sync", chips=16, step_s=97.7, response_mean=1060),
        dict(
            name="one_off_8_8",
            mode="async",
            chips=16,
            sampler_chips=8,  # generation colocated: false, 1 node x 8 GPUs
            step_s=74.6,
            response_mean=1129,
        ),
    ],
    speedups=[("on_policy_16", "one_off_8_8")],
)

# The unpublished settings and the band each spans, one at a time from nominal. verl's length
# knobs refit the two efficiencies (the fitted run is verl's); the others do not.
KNOBS = {
    "verl": dict(median=[500.0, 1000.0], sigma=[0.7, 1.1], tail_prob=[0.0005, 0.005], eta=[2, 4]),
    "nemo_rl": dict(sigma=[0.5, 1.0], train_flops_per_param=[(10.0, 10.0)]),
}


def validation(arg: str, small: bool) -> ml_collections.ConfigDict:
    """The validation section: the systems, the fitted run, the band's knobs."""
    fit = dict(system="verl", run="colocated_128" if arg == "fit128" else "colocated_32")
    return ml_collections.ConfigDict(
        dict(
            enabled=True,
            steps=8 if small else 20,
            fit_steps=4,
            bisections=12,
            fit=fit,
            systems=[VERL_SYSTEM, NEMO_SYSTEM],
            knobs={} if arg else KNOBS,  # the band runs on the main fit only
        )
    )


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """The verl case; ``arg``: "small" (nominal knobs only) or "fit128" (see VARIANTS)."""
    if arg and arg not in VARIANTS:
        raise ValueError(
            f"unknown variant {arg!r} of configs/sim/verl_async_h20.py; "
            f"use one of {VARIANTS} or none"
        )
    small = arg == "small"
    c = ml_collections.ConfigDict()
    c.name = "verl_async_h20"
    c.model = "qwen2.5-7b"  # Qwen2.5-Math-7B has the same shapes
    c.chip = "h20"
    c.tp = 1
    # The starting point of the fit; decode_hbm and train_mfu are replaced by the fitted
    # values (nominal knobs: see docs/simulator.md), the rest are the generic defaults.
    c.efficiencies = ml_collections.ConfigDict(
        dict(decode_hbm=0.5, decode_mfu=0.5, prefill_mfu=0.5, train_mfu=0.45, sync=0.5)
    )
    # verl's colocated trainer recomputes old log-probs (+2N per token); fully async uses the
    # rollout's log-probs.
    c.train_flops_per_param = ml_collections.ConfigDict(dict(sync=8.0, async_=6.0))
    c.total_chips = 128
    c.steps = 6 if small else 20
    c.batch_groups = 512
    c.group_size = 16
    c.prompt_tokens = 200
    c.max_slots = 256  # vLLM max_num_seqs default
    c.phase_steps = 10
    c.switch_cost_s = -1.0
    c.seed = 0
    c.lengths = ml_collections.ConfigDict(
        # Unpublished: median, sigma and the share that runs to the limit (tail_prob).
        dict(
            median=700.0,
            sigma=0.9,
            tail_prob=0.002,
            max_tokens=28_672,
            growth=1.0,
            growth_steps=400,
        )
    )
    c.validation = validation(arg, small)
    c.etas, c.sampler_fractions, c.tails = [], [], []
    c.growth = ml_collections.ConfigDict(dict(median=0.0, growth=1.0, tail=0.0, eta=1))
    c.perf_steps = 0
    c.plot = ""
    return c
