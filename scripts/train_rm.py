"""Trains a tiny reward model on the default recipe's arithmetic task and saves it as a Hugging
Face ``LlamaForSequenceClassification`` directory that ``reward.name='model'`` loads.

    rljax --workdir=/tmp/rljax/arith_tiny --config.checkpoint.enabled=True       # the trunk
    rljax --workdir=/tmp/rljax/warm_start --config.checkpoint.enabled=True --config.num_steps=0
    python scripts/train_rm.py --out=/tmp/rljax/arith_rm/reward_model
    rljax --config=configs/arith_rm.py --workdir=/tmp/rljax/arith_rm      # GRPO with it

The labelled pairs come from the task of configs/arith_tiny.py (2-digit addition, its train
split): each problem's prompt followed by its correct sum is labelled 1, and followed by a wrong
one labelled 0. Every batch draws its wrong answers anew (a fixed one per problem is learnt by
heart). Half of them, where there is one, are the policies' own: the wrong answers among 4
samples per problem at temperature 1 (judged by exact match) of each run in ``--sampled_from``
(by default the warm start, which drops carries, and the trained default recipe, which slips
by a carry now and then). The others are made up, of one of four kinds with equal chance
(:data:`WRONG_KINDS`): careless (+-1, +-9, +-10, +-11), one digit changed at any place, a digit
dropped, repeated or inserted (one place too short or long), or a wild guess (any number below
2 x 10^places of the sum). The trunk is the default recipe's trained model (``--init``, a run's
workdir: its newest checkpoint; 'random' starts from scratch), with a score head [D] in place
of the LM head. The loss is, per pair, the Bradley-Terry loss of the correct answer's score over
the wrong one's (the order within a prompt: all GRPO reads of a reward) plus each answer's
binary cross-entropy (so a score above 0 means "correct", which the held-out agreement reads);
AdamW, 10,000 steps of 32 pairs, the learning rate on a cosine from 1e-3 to 0. The sequences are
the ones the reward model scores in a run: the policy's prompt (rljax.data.tasks.encode_prompt)
then the answer's tokens, without a stop token.

It prints, as it goes, the held-out problems' pairs ranked right (the training mix, then each
kind alone, then the policies' wrong answers alone: "sampled") and the answers classified right,
and one JSON line at the end. What each recipe gave and why this one: docs/benchmarks.md
("Reward model").
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
from rljax.rewards.verifiers import exact_match

# Wrong sums a careless adder writes: off by one, a dropped or extra carry, or both.
PERTURBATIONS = (-11, -10, -9, -1, 1, 9, 10, 11)


def careless(correct: str, rng: random.Random) -> str:
    """Off by one, or by a dropped or extra carry (:data:`PERTURBATIONS`), staying >= 0."""
    numbers = [int(correct) + d for d in PERTURBATIONS if int(correct) + d >= 0]
    return str(rng.choice(numbers))


def one_digit(correct: str, rng: random.Random) -> str:
    """One digit, at any place, replaced by another: a wrong ones, tens or hundreds digit."""
    i = rng.randrange(len(correct))
    digit = rng.choice([d for d in "0123456789" if d != correct[i]])
    return correct[:i] + digit + correct[i + 1 :]


def wrong_length(correct: str, rng: random.Random) -> str:
    """A digit dropped (of a one-digit sum: no answer at all), repeated or inserted: an answer
    one place too short or too long."""
    i = rng.randrange(len(correct))
    dropped = correct[:i] + correct[i + 1 :]
    repeated = correct[:i] + correct[i] + correct[i:]
    inserted = correct[:i] + rng.choice("0123456789") + correct[i:]
    return rng.choice([dropped, repeated, inserted])


def other_number(correct: str, rng: random.Random) -> str:
    """Any number from 0 to twice the correct one's order of magnitude: a wild guess."""
    return str(rng.randrange(2 * 10 ** len(correct)))


# Kinds of wrong answers, drawn with equal chance for each negative.
WRONG_KINDS = {
    "careless": careless,
    "one_digit": one_digit,
    "wrong_length": wrong_length,
    "other_number": other_number,
}


def wrong_answer(correct: str, rng: random.Random, kind: str | None = None) -> str:
    """A wrong answer to a problem whose answer is ``correct``: of ``kind``, or of a kind drawn
    from :data:`WRONG_KINDS`; never ``correct`` itself."""
    make = WRONG_KINDS[kind or rng.choice(list(WRONG_KINDS))]
    answer = make(correct, rng)
    while answer == correct:  # an insertion that repeats a digit, a guess that is right
        answer = make(correct, rng)
    return answer


def labelled_pairs(
    examples: list[dict],
    rng: random.Random,
    kind: str | None = None,
    sampled: dict[int, list[str]] | None = None,
    sampled_share: float = 0.0,
) -> list[tuple[dict, str, float]]:
    """(example, answer, label): each example with its correct answer (1.0) and one wrong
    answer (0.0) drawn from ``rng``: with chance ``sampled_share``, one a policy wrote
    (``sampled``: problem id -> its wrong samples; a problem without any gets a made-up one),
    else one from :func:`wrong_answer` (of ``kind``, or of any)."""
    out = []
    for example in examples:
        correct = str(int(example["answer"]))
        written = (sampled or {}).get(example["id"])
        if written and rng.random() < sampled_share:
            wrong = rng.choice(written)
        else:
            wrong = wrong_answer(correct, rng, kind)
        out.append((example, correct, 1.0))
        out.append((example, wrong, 0.0))
    return out


def sample_answers(
    graphdef, params, prompts: list[list[int]], tokenizer, new_tokens: int, key, temperature=1.0
) -> list[list[int]]:
    """One answer of the policy ``nnx.merge(graphdef, params)`` to each prompt (token ids): up
    to ``new_tokens`` tokens sampled at ``temperature`` (0: greedy), without the stop token
    that ends it. One forward of every row per token, no KV cache: answers are a few tokens."""
    width = max(map(len, prompts)) + new_tokens
    stops = np.asarray(sorted(tokenizer.stop_ids))

    @jax.jit
    def next_token(tokens_bt, lengths_b, key):
        model = nnx.merge(graphdef, params)
        positions_bt = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), tokens_bt.shape)
        segment_ids_bt = (positions_bt < lengths_b[:, None]).astype(jnp.int32)
        hidden_btd = model(tokens_bt, positions_bt, segment_ids_bt)
        last_bd = jnp.take_along_axis(hidden_btd, (lengths_b - 1)[:, None, None], axis=1)[:, 0]
        logits_bv = model.logits(last_bd)
        if temperature == 0:
            return jnp.argmax(logits_bv, axis=-1)
        return jax.random.categorical(key, logits_bv / temperature)

    tokens = np.full((len(prompts), width), tokenizer.pad_id, np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    done = np.zeros(len(prompts), bool)
    for _ in range(new_tokens):
        key, sub = jax.random.split(key)
        token = np.asarray(next_token(tokens, lengths, sub))
        done |= np.isin(token, stops)
        write = np.flatnonzero(~done)
        tokens[write, lengths[write]] = token[write]
        lengths[write] += 1
    return [tokens[i, len(p) : lengths[i]].tolist() for i, p in enumerate(prompts)]


def sample_wrong_answers(
    workdir: str, examples: list[dict], tokenizer, cfg, samples: int, seed: int, mesh
) -> dict[int, list[str]]:
    """Each problem's wrong answers among ``samples`` answers that the policy saved in
    ``workdir`` (a run's newest checkpoint) writes at temperature 1, judged by exact match:
    problem id -> those answers, as the reward model sees them (decoded, no stop token)."""
    run = saved_runs.parse(workdir)
    if run is None:
        sys.exit(f"train_rm: --sampled_from={workdir!r} is not a run's workdir; name one")
    _, graphdef, params, _ = load_saved_run(run, mesh, "--sampled_from")
    prompts = [encode_prompt(tokenizer, cfg.data, e) for e in examples]
    wrong: dict[int, list[str]] = {}
    keys = jax.random.split(jax.random.key(seed), samples)
    for key in keys:
        answers = sample_answers(
            graphdef, params, prompts, tokenizer, cfg.sampling.max_new_tokens, key
        )
        for example, answer in zip(examples, answers, strict=True):
            text = tokenizer.decode(answer)
            if not exact_match(text, example):
                wrong.setdefault(example["id"], []).append(text)
    return wrong


def encode(pairs, tokenizer, data_cfg, length: int):
    """Right-padded tokens [N, length], lengths [N] and labels [N] of the pairs."""
    tokens = np.full((len(pairs), length), tokenizer.pad_id, np.int32)
    lengths = np.zeros(len(pairs), np.int32)
    for i, (example, answer, _) in enumerate(pairs):
        seq = encode_prompt(tokenizer, data_cfg, example) + tokenizer.encode(answer)
        tokens[i, : len(seq)] = seq
        lengths[i] = len(seq)
    return tokens, lengths, np.asarray([label for _, _, label in pairs], np.float32)


def load_trunk(args, model_cfg, mesh):
    """(model_cfg, graphdef, params) of ``--init``: a run's newest checkpoint, or random."""
    if args.init == "random":
        return (model_cfg, *init_sharded(model_cfg, mesh, LEARNER_RULES, args.seed))
    run = saved_runs.parse(args.init)
    if run is None:
        sys.exit(f"train_rm: --init={args.init!r} is not a run's workdir; name one or 'random'")
    model_cfg, graphdef, params, _ = load_saved_run(run, mesh, "--init")
    return model_cfg, graphdef, params


class Pairs:
    """The labelled pairs of the train and held-out problems, encoded as the reward model reads
    them: fresh ones for each training step, fixed ones per held-out set."""

    def __init__(self, args, cfg, tokenizer, mesh):
        self.cfg, self.tokenizer, self.share = cfg, tokenizer, args.sampled_share
        self.rng = random.Random(args.seed)  # the training negatives: new ones every batch
        self.train, heldout = load_task(cfg.data, cfg.seed)
        self.sampled: dict[int, list[str]] = {}
        for i, workdir in enumerate(w for w in args.sampled_from.split(",") if w):
            for examples in (self.train, heldout):
                found = sample_wrong_answers(
                    workdir, examples, tokenizer, cfg, args.samples, args.seed + i, mesh
                )
                for problem, answers in found.items():
                    self.sampled.setdefault(problem, []).extend(answers)
        # Fixed held-out sets: the training mix, each kind of wrong answer alone (so that a
        # weak spot shows by name), and the policies' own wrong answers alone.
        held_rng = random.Random(args.seed + 1)
        self.held = {"all": self.encode(labelled_pairs(heldout, held_rng, **self._mix()))}
        for kind in WRONG_KINDS:
            self.held[kind] = self.encode(labelled_pairs(heldout, held_rng, kind))
        written = [e for e in heldout if e["id"] in self.sampled]
        if written:
            pairs = labelled_pairs(written, held_rng, sampled=self.sampled, sampled_share=1)
            self.held["sampled"] = self.encode(pairs)

    def _mix(self) -> dict:
        return {"sampled": self.sampled, "sampled_share": self.share}

    def encode(self, pairs):
        return encode(pairs, self.tokenizer, self.cfg.data, self.cfg.sampling.max_seq_len)

    def batch(self, size: int):
        """``size`` pairs of distinct train problems, each with a wrong answer drawn anew: a
        fixed one per problem is learnt by heart (docs/benchmarks.md, "Reward model")."""
        chosen = self.rng.sample(range(len(self.train)), size)
        return self.encode(labelled_pairs([self.train[j] for j in chosen], self.rng, **self._mix()))


def train(args) -> dict:
    """Trains and saves the reward model; returns the figures the JSON line prints."""
    cfg = arith_tiny.recipe()
    tokenizer = load_tokenizer(cfg)
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    data = Pairs(args, cfg, tokenizer, mesh)
    model_cfg, graphdef, params = load_trunk(args, cfg.model, mesh)
    # A random head, so that the trunk gets gradients from the first step (a zero head sends
    # none back through it).
    d = model_cfg.hidden_size
    head = jax.random.normal(jax.random.key(args.seed), (d,), jnp.float32) / np.sqrt(d)
    weights = (params, head)
    schedule = optax.cosine_decay_schedule(args.learning_rate, args.steps)
    optimizer = optax.adamw(schedule, weight_decay=0.0)
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

    def evaluate():
        return {k: [float(x) for x in accuracy(weights, *v)] for k, v in data.held.items()}

    loss = float("nan")
    for i in range(args.steps):
        weights, opt_state, loss = step(weights, opt_state, *data.batch(args.batch_size // 2))
        if (i + 1) % args.eval_every == 0 or i + 1 == args.steps:
            figures = evaluate()
            kinds = ", ".join(f"{k} {r:.3f}" for k, (r, _) in figures.items() if k != "all")
            print(
                f"step {i + 1}: loss {float(loss):.4f}, held-out pairs ranked "
                f"{figures['all'][0]:.3f} ({kinds}), answers classified {figures['all'][1]:.3f}"
            )
    figures = evaluate()
    save_classifier(args.out, model_cfg, weights[0], weights[1], pad_token_id=tokenizer.pad_id)
    tokenizer.save(args.out)
    return {
        "steps": args.steps,
        "loss": float(loss),
        "heldout_pairs_ranked": figures["all"][0],
        "heldout_accuracy": figures["all"][1],
        "heldout_pairs_ranked_by_kind": {k: r for k, (r, _) in figures.items() if k != "all"},
        "out": args.out,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the checkpoint directory to write")
    parser.add_argument("--steps", type=int, default=10000)
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
    parser.add_argument(
        "--sampled_from",
        default="/tmp/rljax/warm_start,/tmp/rljax/arith_tiny",
        help="comma-separated run workdirs whose policies' wrong answers at temperature 1 "
        "(exact match) are negatives too (on-policy negatives); '' for made-up ones alone",
    )
    parser.add_argument("--samples", type=int, default=4, help="answers per problem and policy")
    parser.add_argument(
        "--sampled_share",
        type=float,
        default=0.5,
        help="the chance that a problem's negative is one a policy wrote, when it wrote one",
    )
    figures = train(parser.parse_args(argv))
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
