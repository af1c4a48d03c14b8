"""A :class:`~rljax.runtime.run.Run` on a pod: each process builds and plays one role.

``rljax.HostedRun(cfg, workdir)`` on several processes running a split topology
(``mesh.mode='split'``) is hosted by :class:`PodHosting`; the launcher and the library need
nothing else. The sampler leader (process 0) runs the run's phases (warm start, evaluation,
the driver, checkpoints) through stand-ins that post each operation to the other processes
(:mod:`rljax.runtime.pod`); the sampler followers and the learner processes replay them.

Checkpoints hold what one host would hold: the learner's params and optimiser state (laid
out over every device of the pod, :func:`~rljax.checkpoint.save_shardings`, so every process
takes part in orbax's save and restore), and the leader's meta (buffer, pending prompts,
prompt-stream position, metrics cursor) plus the pod's shape, so a resume with another process
count is refused (another split of whole hosts is fine). A resize mid-run goes through such a
checkpoint, in-process (:mod:`rljax.runtime.pod_resize`).
"""

from __future__ import annotations

import collections
import time
from typing import Any

import jax

from rljax.checkpoint import save_shardings, use_orbax_distributed_barriers
from rljax.config import ConfigError, RunConfig
from rljax.engine.homes import process_homes
from rljax.engine.sampler import Sampler
from rljax.learner.learner import Learner
from rljax.mesh import distributed
from rljax.mesh.control import Channel
from rljax.mesh.roles import Roles
from rljax.mesh.roles import roles as roles_of
from rljax.mesh.transfer import transfer
from rljax.policy.reallocation import Split
from rljax.runtime import pod, pod_replay, pod_resize, prompts, resume, scoring
from rljax.runtime.clocks import compile_seconds
from rljax.runtime.env_answers import EnvAnswers
from rljax.runtime.exchange import ChannelExchange, Server
from rljax.runtime.hosted import HostedRun
from rljax.runtime.parts import Parts
from rljax.runtime.pod import Op
from rljax.runtime.prompts import PromptStream, resumed_position
from rljax.runtime.scoring import Scorer


def check_pod(cfg: RunConfig) -> None:
    """Refuse, with a one-line error, what a pod cannot run."""
    if cfg.lending.enabled:
        raise ConfigError(
            "config key 'lending.enabled' = True is single-process for now (a pod's lent chips "
            "would need their own tick stream); turn it off for a pod run"
        )
    resizes = cfg.mesh.reallocate or cfg.mesh.resize_schedule
    if resizes and not cfg.checkpoint.enabled:
        raise ConfigError(
            "a pod resizes through a checkpoint (every process saves, rebuilds for the new "
            "split, restores); set checkpoint.enabled=True, or turn mesh.reallocate and "
            "mesh.resize_schedule off"
        )
    if cfg.mesh.reallocate:
        pod_resize.check_granularity(cfg.mesh.reallocate_granularity, jax.local_device_count())


class PodHosting:
    """This process's part in a pod run: its role's objects, rebuilt at each resize."""

    def __init__(self, channel: Channel | None = None):
        self.channel = Channel() if channel is None else channel
        self.roles: Roles | None = None
        self.preempted = False
        self.resizes = 0  # builds since the start: the epoch of every per-build key
        self.tick = 0  # the next tick this process reads (a follower)
        self.ticks: pod.Ticks | None = None  # the leader's, one count across resizes
        self.scored_by_host: dict[int, int] = {}  # trajectories each sampler host scored
        self.read_by_host: dict[int, int] = {}  # prompts each sampler host read
        self.env_turns_by_host: dict[int, int] = {}  # env answers each sampler host gave
        self.slot_homes: list[int] | None = None
        # a sampler follower's parts (the leader's are the run's)
        self.real_sampler: Sampler | None = None
        self.servers: list[Server] = []  # a follower's prompt reader and scorer
        self.answers: EnvAnswers | None = None  # a sampler host's conversations
        self.resizer: pod_resize.PodResizer | None = None  # the leader's
        self.learner: Learner | None = None  # a learner process's

    @property
    def is_leader(self) -> bool:
        return self.roles.is_leader if self.roles is not None else jax.process_index() == 0

    def check(self, cfg: RunConfig) -> None:
        check_pod(cfg)
        distributed.check_same_config(cfg)
        use_orbax_distributed_barriers()  # before any Checkpointer opens

    def fail(self, error: BaseException) -> None:
        self.channel.fail(error)  # the others stop waiting for this process at once

    def build(self, run: HostedRun) -> Parts | None:
        self.roles = roles_of(run.topology)
        pod_resize.check_schedule(run)
        compile_seconds()  # from now on, count the seconds spent compiling
        return self.build_split(run)[0]

    def build_split(self, run: HostedRun) -> tuple[Parts | None, float]:
        """The parts that depend on the split (at start, and after each resize): the leader's
        parts (None elsewhere), and the seconds spent restoring a checkpoint."""
        cfg, roles = run.cfg, self.roles
        assert roles is not None
        abstract = resume.abstract_learner(cfg, run.topology.learner, run.loss)
        # What a checkpoint holds: with LoRA, the adapters and their optimiser state alone.
        self.abstract_state = (abstract.saved_params, abstract.opt_state)
        self.weights = pod.PodWeights(
            abstract.params,
            run.topology.sampler,
            cfg.sampling.dtype,
            run.topology.slices,
            adapters_only=cfg.lora.enabled,
        )
        self.save_layout = save_shardings(self.abstract_state, run.devices)
        start = time.perf_counter()
        restored = resume.restore(
            run.ckpt, cfg, abstract, check_meta=self.check_meta, layout=self.save_layout
        )
        restore_s = time.perf_counter() - start
        meta = None if restored is None else restored.meta
        self.learner_version = 0 if restored is None else restored.version
        self.learner = None
        if roles.role == "learner":
            mesh = run.topology.learner
            self.learner = resume.learner_for(cfg, mesh, run.loss, restored, run.learners)
        run.adopt_learner(self.learner, meta, abstract.graphdef)
        parts = self._build_sampler(run) if roles.role == "sampler" else None
        if not self.resizes:  # a resize's cost exchange is its barrier (pod_resize.rebuild)
            self.channel.barrier("built")
        return parts, restore_s

    def _build_sampler(self, run: HostedRun) -> Parts | None:
        cfg, roles = run.cfg, self.roles
        assert roles is not None
        mesh = run.topology.sampler
        engine = run.engines.get(mesh, lambda: run.build_engine(mesh))
        # each host's prompts take its own slots (None: slots replicated over the hosts)
        self.slot_homes = homes = process_homes(engine, roles.sampler)
        # No weights until the first swap.
        sampler = Sampler(
            engine,
            None,
            version=self.learner_version,
            stop_ids=sorted(run.tokenizer.stop_ids),
            slot_homes=homes,
        )
        exchange = ChannelExchange(self.channel, roles.sampler, roles.me, self.resizes)
        stream = PromptStream(
            run.train_examples,
            seed=cfg.seed,
            batch_size=cfg.learner.batch_groups,
            exchange=exchange,
            start=resumed_position(run.resumed_meta),
            homes=True,
            read_by=self.read_by_host,
        )
        # every sampler host scores a share of the groups
        scorer = Scorer(exchange, run.reward_pool(), run.tokenizer, scored=self.scored_by_host)
        # each conversation's env runs on the sampler host that read its prompt
        self.answers = answers = EnvAnswers(run.conversations, exchange, self.env_turns_by_host)
        if not roles.is_leader:  # the leader's stream and scorer ask; these serve
            self.real_sampler = sampler
            self.servers = [
                Server(exchange, prompts.TOPIC, stream.read),
                Server(exchange, scoring.TOPIC, scorer.score_share),
            ]
            return None
        sync = pod.PodWeightSync()
        self.ticks = self.ticks or pod.Ticks(self.channel)
        on_tick = lambda: self._poll_stop(run)  # noqa: E731 - the leader polls for stops
        pod_sampler = pod.PodSampler(sampler, self.ticks, self.weights, sync, answers, on_tick)
        self.resizer = pod_resize.PodResizer(run)
        return Parts(
            sampler=pod_sampler,
            learner=pod.RemoteLearner(pod_sampler, self.channel, self.learner_version),
            weight_sync=sync,
            prompts=stream,
            scorer=scorer,
            resizer=self.resizer,
            answers=answers,
            batches=pod.make_pod_batch,
            engine=engine,
        )

    def release_role(self, run: HostedRun) -> None:
        """Let go of this process's role objects before a resize (their meshes are cached)."""
        if self.learner is not None:
            self.learner.release()
        run.adopt_parts(None)
        self.learner = self.real_sampler = self.answers = None
        self.servers = []

    # -- checkpoints ----------------------------------------------------------------------------

    def shape(self) -> dict[str, Any]:
        r = self.roles
        assert r is not None
        return {
            "processes": jax.process_count(),
            "sampler": list(r.sampler),
            "learner": list(r.learner),
        }

    def check_meta(self, meta: dict[str, Any]) -> None:
        pod_resize.check_shape(meta.get("pod"), self.shape())

    def checkpoint_extra(self) -> dict[str, Any]:
        return {"pod": self.shape()}

    def write_state(
        self, run: HostedRun, version: int, meta: dict[str, Any], *, wait: bool
    ) -> None:
        """The leader's save: every process saves at this tick (:meth:`save_state`)."""
        assert self.ticks is not None
        with self.ticks.lock:
            self.ticks.flush(Op.SAVE, {"version": version, "meta": meta, "wait": wait})
            self.save_state(run, version, meta, wait=wait)

    def save_state(self, run: HostedRun, version: int, meta: dict[str, Any], *, wait: bool) -> None:
        """Every process: the learner state onto the save layout, then one orbax save."""
        assert run.ckpt is not None
        learner = self.learner
        state = None if learner is None else (learner.saved_params, learner.opt_state)
        params, opt_state = transfer(state or self.abstract_state, self.save_layout)
        run.ckpt.write(version, params=params, opt_state=opt_state, meta=meta)
        if wait:
            run.ckpt.wait()

    # -- stopping -------------------------------------------------------------------------------

    def request_stop(self, run: HostedRun) -> None:
        """SIGTERM: the leader stops at the next step boundary; others tell the leader."""
        self.preempted = True
        if self.is_leader:
            if run.driver is not None:
                run.driver.stop()
        else:
            self.channel.post(f"stop/{jax.process_index()}", {}, overwrite=True)

    def _poll_stop(self, run: HostedRun) -> None:
        if not run.stop_requested and self.channel.keys("stop"):
            run.request_stop()

    # -- phases ---------------------------------------------------------------------------------

    def warm_start(self, run: HostedRun) -> None:
        """The learner processes warm-start at the 'sft' tick; the leader waits for them."""
        if run.cfg.sft.steps:
            assert self.ticks is not None
            self.ticks.flush(Op.SFT)
            self.channel.get("done/sft", waiting_for="the warm start")

    def train(self, run: HostedRun) -> dict[str, Any]:
        start = time.perf_counter()
        while True:
            summary, resize = self._train_split(run)
            if resize is None:
                break
            split, cause, decided = resize
            record = self._rebuild(run, split, decided)
            if self.resizer is not None:  # the leader's
                self.resizer.logged(record, cause)
        if self.learner is not None:
            digests = pod_replay.shard_digests(self.learner.params)
            self.channel.post(f"replicas/{jax.process_index()}", digests)
        if self.is_leader:
            summary["pod"] = self._summary(run, time.perf_counter() - start)
        return summary

    def _summary(self, run: HostedRun, wall_s: float) -> dict[str, Any]:
        roles = self.roles
        assert roles is not None
        out: dict[str, Any] = {**self.shape(), "resizes": self.resizes, "wall_s": wall_s}
        counts_by_host = (
            ("scored", self.scored_by_host),
            ("read", self.read_by_host),
            ("env_turns", self.env_turns_by_host),
        )
        for what, counts in counts_by_host:
            out[f"{what}_by_host"] = {str(h): n for h, n in counts.items()}
        slots = collections.Counter(self.slot_homes or [])
        out["slots_by_host"] = {str(h): n for h, n in sorted(slots.items())}
        digests = [
            self.channel.get(f"replicas/{p}", waiting_for=f"learner process {p}'s digests")
            for p in roles.learner
        ]
        check = pod_replay.compare_replicas(digests)
        run.metrics.write(run.learner.version, "replicas", check)
        out["learner_replicas"] = check
        return out

    def _train_split(self, run: HostedRun) -> tuple[dict[str, Any], tuple | None]:
        """Run until the end or a resize: (summary, (split, cause, when decided) or None)."""
        roles = self.roles
        assert roles is not None
        if roles.role == "learner":
            assert self.learner is not None
            self.tick, op, arg = pod_replay.follow_learner(run, self, self.learner, self.tick)
            summary: dict[str, Any] = {"role": "learner", "steps": self.learner.version}
        elif not roles.is_leader:
            assert self.real_sampler and self.answers
            self.tick, op, arg = pod_replay.follow_sampler(run, self, self.real_sampler, self.tick)
            self.answers.stop()  # after END or RESIZE: its last env answer posted
            for server in self.servers:  # the leader closed their topics before this tick
                server.join()
            summary = {"role": "sampler"}
        else:
            summary, op, arg = self._lead(run)
        if op is Op.END:
            return summary, None
        decided = arg.get("decided", time.perf_counter())  # a follower: when the tick came
        return summary, (pod_resize.split_of(arg), arg["cause"], decided)

    def _lead(self, run: HostedRun) -> tuple[dict[str, Any], Op, Any]:
        assert self.ticks is not None
        if run.resumed_meta is not None:
            run.publish()  # the restored version, before anything samples
        summary = run.phases()
        assert run.parts is not None and self.resizer is not None and self.answers is not None
        resize = self.resizer.take()
        run.parts.scorer.stop()  # before 'end' or 'resize': the followers' servers stop first
        run.prompts.stop()
        if resize is not None and not self.preempted:
            split, cause, decided = resize
            arg = {"split": [split.sampler_chips, split.learner_chips], "cause": cause}
            self.ticks.flush(Op.RESIZE, arg)
            self.answers.stop()  # the followers' last env answers heard
            run.clear_stop()
            return summary, Op.RESIZE, {**arg, "decided": decided}
        # Only on success: after an error the others learn of it from Channel.fail and exit
        # non-zero instead of ending cleanly.
        self.ticks.flush(Op.END)
        self.answers.stop()
        return summary, Op.END, None

    # -- resizing -------------------------------------------------------------------------------

    def _rebuild(self, run: HostedRun, split: Split, started: float) -> dict[str, Any]:
        """Every process, at the ``resize`` tick: the save made durable, this process's role
        rebuilt for ``split``, the state restored (:mod:`rljax.runtime.pod_resize`).

        ``started`` is when this process learned of the resize (the leader: when it decided).
        Returns the pod's cost record (the same on every process).
        """
        compiled = compile_seconds()
        old, roles = run.topology.split, self.roles  # a pod's topology is always split
        assert old is not None and roles is not None
        old_hosts = (len(roles.sampler), len(roles.learner))
        run.open_checkpointer()  # closing the last waits for its save: the restore reads it
        saved = time.perf_counter()
        self.release_role(run)
        run.move_to(pod_resize.check_split(run, split, what="cannot resize to"))
        self.roles = roles = roles_of(run.topology)
        self.resizes += 1
        # The restore ends in a collective over every device: enter it together.
        self.channel.barrier(f"resizing{self.resizes}")
        parts, restore_s = self.build_split(run)
        run.adopt_parts(parts)
        mine = {
            "save_s": saved - started,
            "rebuild_s": time.perf_counter() - saved - restore_s,
            "restore_s": restore_s,
            "compile_s": compile_seconds() - compiled,
        }
        record = pod_resize.pod_costs(self.channel, f"resized{self.resizes}", roles.me, mine)
        return {
            "from": f"{old.sampler_chips}/{old.learner_chips}",
            "to": f"{split.sampler_chips}/{split.learner_chips}",
            "hosts_from": f"{old_hosts[0]}+{old_hosts[1]}",
            "hosts_to": f"{len(roles.sampler)}+{len(roles.learner)}",
            "sampler_devices": split.sampler_chips,
            "learner_devices": split.learner_chips,
            **record,
            "seconds": time.perf_counter() - started,
            "version": self.learner_version,
        }
