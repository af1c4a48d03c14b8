"""Trains a tiny reward model on the default recipe's arithmetic task and saves it as a Hugging
Face ``LlamaForSequenceClassification`` directory that ``reward.name='model'`` loads.

    python scripts/train_rm.py --out=/tmp/rljax/arith_rm/reward_model
    rljax --config=configs/arith_rm.py --workdir=/tmp/rljax/arith_rm      # GRPO with it

The labelled pairs come from the task of configs/arith_tiny.py (2-digit addition, its train
split): each problem's prompt followed by its correct sum is labelled 1, and followed by a
perturbed wrong sum (off by one, or by a forgotten or extra carry: +-1, +-10, +-11, +-9) is
labelled 0. The model is the recipe's (the ~0.4M-parameter Llama and its char tokenizer),
randomly initialised, with a score head [D] in place of the LM head; the loss is the binary
cross-entropy of the last token's score, read as the logit of "correct". The sequences are the
ones the reward model scores in a run: the policy's prompt (rljax.data.tasks.encode_prompt)
then the answer's tokens, without a stop token. Prints the held-out pair accuracy as it goes
and one JSON line at the end.

Untuned: a 300-step smoke run from a random initialisation stayed near chance (0.5) on the
held-out pairs; judging a sum means learning to add, so expect to need many more steps (or a
model that already adds) before step 2 has a reward worth training on.
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
from rljax.models.classifier import save_classifier, sequence_scores
from rljax.models.loading import load_tokenizer
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import init_sharded

# Wrong sums a careless adder writes: off by one, a dropped or extra carry, or both.
PERTURBATIONS = (-11, -10, -9, -1, 1, 9, 10, 11)


def labelled_pairs(examples: list[dict], seed: int) -> list[tuple[dict, str, float]]:
    """(example, answer, label): each example with its correct answer (1.0) and one wrong
    answer (0.0), a perturbation of the correct one that stays >= 0."""
    rng = random.Random(seed)
    out = []
    for example in examples:
        correct = int(example["answer"])
        wrong = [correct + d for d in PERTURBATIONS if correct + d >= 0]
        out.append((example, str(correct), 1.0))
        out.append((example, str(rng.choice(wrong)), 0.0))
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
    graphdef, params = init_sharded(cfg.model, mesh, LEARNER_RULES, args.seed)
    # A random head, so that the trunk gets gradients from the first step (a zero head sends
    # none back through it).
    d = cfg.model.hidden_size
    head = jax.random.normal(jax.random.key(args.seed), (d,), jnp.float32) / np.sqrt(d)
    weights = (params, head)
    optimizer = optax.adamw(args.learning_rate, weight_decay=0.0)
    opt_state = optimizer.init(weights)

    def scores(weights, tokens_bt, lengths_b):
        return sequence_scores(nnx.merge(graphdef, weights[0]), weights[1], tokens_bt, lengths_b)

    def loss_fn(weights, tokens_bt, lengths_b, labels_b):
        logits_b = scores(weights, tokens_bt, lengths_b)
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logits_b, labels_b))

    @jax.jit
    def step(weights, opt_state, tokens_bt, lengths_b, labels_b):
        loss, grads = jax.value_and_grad(loss_fn)(weights, tokens_bt, lengths_b, labels_b)
        updates, opt_state = optimizer.update(grads, opt_state, weights)
        return optax.apply_updates(weights, updates), opt_state, loss

    accuracy = jax.jit(lambda w, t, n, y: jnp.mean((scores(w, t, n) > 0) == (y > 0.5)))
    rng = np.random.default_rng(args.seed)
    loss = float("nan")
    for i in range(args.steps):
        batch = rng.choice(len(train_set[0]), args.batch_size, replace=False)
        weights, opt_state, loss = step(weights, opt_state, *(a[batch] for a in train_set))
        if (i + 1) % args.eval_every == 0 or i + 1 == args.steps:
            acc = float(accuracy(weights, *held_set))
            print(f"step {i + 1}: loss {float(loss):.4f}, held-out pair accuracy {acc:.3f}")
    final = float(accuracy(weights, *held_set))
    save_classifier(args.out, cfg.model, weights[0], weights[1], pad_token_id=tokenizer.pad_id)
    tokenizer.save(args.out)
    return {"steps": args.steps, "loss": float(loss), "heldout_accuracy": final, "out": args.out}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the checkpoint directory to write")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--eval_every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    figures = train(parser.parse_args(argv))
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
