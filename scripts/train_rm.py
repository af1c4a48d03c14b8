"""Trains a tiny reward model on the default recipe's arithmetic task and saves it as a Hugging
Face ``LlamaForSequenceClassification`` directory that ``reward.name='model'`` loads.

    python scripts/train_rm.py --out=/tmp/rljax/arith_rm/reward_model
    rljax --config=configs/arith_rm.py --workdir=/tmp/rljax/arith_rm      # GRPO with it

The labelled pairs come from the task of configs/arith_tiny.py (2-digit addition, its train
split): each problem's prompt followed by its correct sum is labelled 1, and followed by a wrong
one labelled 0: a perturbed sum (off by one, or by a forgotten or extra carry: +-1, +-10, +-11,
+-9), or, one time in four, a malformed one (a digit dropped or repeated). The trunk is the
default recipe's trained model (``--init``, a run's workdir: its newest checkpoint; 'random'
starts from scratch), with a score head [D] in place of the LM head. The loss is, per pair, the
Bradley-Terry loss of the correct answer's score over the wrong one's (the order within a
prompt: all GRPO reads of a reward) plus each answer's binary cross-entropy (so a score above 0
means "correct", which the held-out agreement reads). The sequences are the ones the reward
model scores in a run: the policy's prompt (rljax.data.tasks.encode_prompt) then the answer's
tokens, without a stop token. Prints the held-out pairs ranked right and the answers classified
right as it goes, and one JSON line at the end. From a random trunk it stays near chance: judging
a sum means knowing how to add.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from rljax.configs import arith_tiny

from rljax.data.tasks import encode_prompt, load_task
from rljax.models import saved_runs
from rljax.models.classifier import save_classifier, sequence_scores
from rljax.models.loading import load_saved_run, load_tokenizer
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import init_sharded

# Wrong sums a careless adder writes: off by one, a dropped or extra carry, or both.
PERTURBATIONS = (-11, -10, -9, -1, 1, 9, 10, 11)


def labelled_pairs(examples: list[dict], seed: int) -> list[tuple[dict, str, float]]:
    """(example, answer, label): each example with its correct answer (1.0) and one wrong
    answer (0.0): a perturbation of the correct one that stays >= 0, or (one in four) a
    malformed one: a digit dropped or repeated, as a sampling policy writes."""
    rng = random.Random(seed)
    out = []
    for example in examples:
        correct = str(int(example["answer"]))
        if rng.random() < 0.25:
            i = rng.randrange(len(correct))
            wrong = [correct[:i] + correct[i + 1 :], correct[:i] + correct[i] + correct[i:]]
            answer = rng.choice([w for w in wrong if w and w != correct] or [correct + "0"])
        else:
            numbers = [int(correct) + d for d in PERTURBATIONS if int(correct) + d >= 0]
            answer = str(rng.choice(numbers))
        out.append((example, correct, 1.0))
        out.append((example, answer, 0.0))
    return out


def encode(pairs, tokenizer, data_cfg, length: int):
    """Right-padded tokens [N, length], lengths [N] and labels [N] of the pairs."""
    tokens = np.full((len(pairs), length), tokenizer.pad_id, np.int32)
    lengths = np.zeros(len(pairs), np.int32)
    for i, (example, answer, _) in enumerate(pairs):
        seq = encode_prompt(tokenizer, data_cfg, example) + tokenizer.encode(answer)
        tokens[i, : len(seq)] = seq
        lengths[i] = len(seq)
    return tokens, lengths, np.asarray([label for _, _, label in pairs], np.float32)


def train(args) -> dict:
    """Trains and saves the reward model; returns the figures the JSON line prints."""
    cfg = arith_tiny.recipe()
    tokenizer = load_tokenizer(cfg)
    train_examples, heldout = load_task(cfg.data, cfg.seed)
    length = cfg.sampling.max_seq_len
    train_set = encode(labelled_pairs(train_examples, args.seed), tokenizer, cfg.data, length)
    held_set = encode(labelled_pairs(heldout, args.seed + 1), tokenizer, cfg.data, length)
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    model_cfg = cfg.model
    if args.init == "random":
        graphdef, params = init_sharded(model_cfg, mesh, LEARNER_RULES, args.seed)
    else:  # a run's newest checkpoint: a trunk that already reads sums
        run = saved_runs.parse(args.init)
        if run is None:
            sys.exit(f"train_rm: --init={args.init!r} is not a run's workdir; name one or 'random'")
        model_cfg, graphdef, params, _ = load_saved_run(run, mesh, "--init")
    # A random head, so that the trunk gets gradients from the first step (a zero head sends
    # none back through it).
    d = model_cfg.hidden_size
    head = jax.random.normal(jax.random.key(args.seed), (d,), jnp.float32) / np.sqrt(d)
    weights = (params, head)
    optimizer = optax.adamw(args.learning_rate, weight_decay=0.0)
    opt_state = optimizer.init(weights)

    def scores(weights, tokens_bt, lengths_b):
        return sequence_scores(nnx.merge(graphdef, weights[0]), weights[1], tokens_bt, lengths_b)

    def loss_fn(weights, tokens_bt, lengths_b, labels_b):
        # Rows come in pairs (correct, wrong) of one prompt: the Bradley-Terry loss of the pair
        # ranks them (all GRPO reads of a reward is its order within a group), the pointwise
        # one keeps the score's sign meaning correct.
        logits_b = scores(weights, tokens_bt, lengths_b)
        pairwise = -jax.nn.log_sigmoid(logits_b[0::2] - logits_b[1::2])
        pointwise = optax.sigmoid_binary_cross_entropy(logits_b, labels_b)
        return jnp.mean(pairwise) + jnp.mean(pointwise)

    @jax.jit
    def step(weights, opt_state, tokens_bt, lengths_b, labels_b):
        loss, grads = jax.value_and_grad(loss_fn)(weights, tokens_bt, lengths_b, labels_b)
        updates, opt_state = optimizer.update(grads, opt_state, weights)
        return optax.apply_updates(weights, updates), opt_state, loss

    @jax.jit
    def accuracy(weights, tokens_bt, lengths_b, labels_b):
        """(pairs ranked right, answers classified right by the score's sign)."""
        s = scores(weights, tokens_bt, lengths_b)
        return jnp.mean(s[0::2] > s[1::2]), jnp.mean((s > 0) == (labels_b > 0.5))

    rng = np.random.default_rng(args.seed)
    loss = float("nan")
    pairs = len(train_set[0]) // 2
    for i in range(args.steps):
        chosen = rng.choice(pairs, args.batch_size // 2, replace=False)
        batch = np.stack([2 * chosen, 2 * chosen + 1], axis=1).reshape(-1)  # pairs together
        weights, opt_state, loss = step(weights, opt_state, *(a[batch] for a in train_set))
        if (i + 1) % args.eval_every == 0 or i + 1 == args.steps:
            ranked, signed = (float(x) for x in accuracy(weights, *held_set))
            print(
                f"step {i + 1}: loss {float(loss):.4f}, held-out pairs ranked {ranked:.3f}, "
                f"answers classified {signed:.3f}"
            )
    ranked, final = (float(x) for x in accuracy(weights, *held_set))
    save_classifier(args.out, model_cfg, weights[0], weights[1], pad_token_id=tokenizer.pad_id)
    tokenizer.save(args.out)
    return {
        "steps": args.steps,
        "loss": float(loss),
        "heldout_pairs_ranked": ranked,
        "heldout_accuracy": final,
        "out": args.out,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the checkpoint directory to write")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--eval_every", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--init",
        default="/tmp/rljax/arith_tiny",
        help="the trunk: a run's workdir (default: the default recipe's, trained with "
        "--config.checkpoint.enabled=True) or 'random'",
    )
    figures = train(parser.parse_args(argv))
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
