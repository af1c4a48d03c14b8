"""The type checker's proof that every implementation of a run's part conforms to its Protocol.

Nothing imports this module (so it adds no import cycle); mypy, run by ``.ci/run``, reads it
like every module of ``rljax``. Each function puts each implementation in a list typed with
its Protocol: one that loses a member its users call, or changes a signature, fails the check.
The Protocols are in :mod:`rljax.runtime.parts` (the driver's parts) and
:mod:`rljax.runtime.hosting` (what differs between one process and a pod).
"""

from __future__ import annotations

from rljax.engine.sampler import Sampler
from rljax.learner.learner import Learner
from rljax.mesh.weight_sync import WeightSync
from rljax.runtime.driver import Driver
from rljax.runtime.exchange import AllGather, Alone, ChannelExchange, Exchange
from rljax.runtime.hosted import HostedRun
from rljax.runtime.hosting import Hosting, InPlaceResizer, LocalHosting
from rljax.runtime.lending import Lending, LendingLearner, RunLending
from rljax.runtime.lending.replicas import ReplicaSet
from rljax.runtime.parts import (
    DriverView,
    LearnerPart,
    LenderPart,
    PromptSource,
    Resizer,
    RunSamplerPart,
    SamplerPart,
    ScorerPart,
    WeightSyncPart,
)
from rljax.runtime.pod import PodSampler, PodWeightSync, RemoteLearner
from rljax.runtime.pod_hosting import PodHosting
from rljax.runtime.pod_resize import PodResizer
from rljax.runtime.prompts import PromptStream
from rljax.runtime.run import Run
from rljax.runtime.scoring import Scorer
from rljax.testing.fake_lending import FakeLending
from rljax.testing.fakes import FakeLearner, FakeSampler, FakeWeightSync


def driver_parts(
    sampler: Sampler,
    pod_sampler: PodSampler,
    replicas: ReplicaSet,
    fake_sampler: FakeSampler,
    learner: Learner,
    remote_learner: RemoteLearner,
    lending_learner: LendingLearner,
    fake_learner: FakeLearner,
    weight_sync: WeightSync,
    pod_weight_sync: PodWeightSync,
    fake_weight_sync: FakeWeightSync,
    lending: Lending,
    run_lending: RunLending,
    fake_lending: FakeLending,
    driver: Driver,
) -> None:
    """Never called: the driver's parts (:mod:`rljax.runtime.parts`)."""
    samplers: list[SamplerPart] = [sampler, pod_sampler, replicas, fake_sampler]
    learners: list[LearnerPart] = [learner, remote_learner, lending_learner, fake_learner]
    syncs: list[WeightSyncPart] = [weight_sync, pod_weight_sync, fake_weight_sync]
    lenders: list[LenderPart] = [lending, run_lending, fake_lending]
    drivers: list[DriverView] = [driver]
    run_samplers: list[RunSamplerPart] = [sampler, pod_sampler]
    del run_samplers, samplers, learners, syncs, lenders, drivers


def hosting_parts(
    local: LocalHosting,
    pod: PodHosting,
    stream: PromptStream,
    scorer: Scorer,
    in_place: InPlaceResizer,
    pod_resizer: PodResizer,
    alone: Alone,
    all_gather: AllGather,
    channel: ChannelExchange,
    run: Run,
) -> None:
    """Never called: what differs between one process and a pod (:mod:`rljax.runtime.hosting`),
    and the transports the parts written once run over (:mod:`rljax.runtime.exchange`)."""
    hostings: list[Hosting] = [local, pod]
    sources: list[PromptSource] = [stream]
    scorers: list[ScorerPart] = [scorer]
    resizers: list[Resizer] = [in_place, pod_resizer]
    exchanges: list[Exchange] = [alone, all_gather, channel]
    hosted: list[HostedRun] = [run]  # what the hostings see of the run
    del hostings, sources, scorers, resizers, exchanges, hosted
