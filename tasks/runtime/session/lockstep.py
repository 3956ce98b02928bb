"""The processes of a multi-host learner in lockstep.

Every JAX computation on a mesh that spans processes is collective: each process must
run the same ones, in the same order. Only process 0, the leader, runs the session (the
buffer, the ledger, the weight server, the checkpoint records, the Prefect events); the
others, the followers, hold their shards of the train state and do what the leader
announces, as it does it:

  BATCH rows length   the leader's packed batch follows; each process keeps its rows of it
  UPDATE              one optimizer update on the current batch
  PARAMS              the parameters gathered whole (the leader publishes them)
  SAVE version        a checkpoint of the train state (Orbax writes each process's shards)
  STOP                the session ended

An announcement is itself a collective (a broadcast from process 0), so a follower waits
in it until the leader's next step, however long the leader waits for groups.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterator, Sequence

import numpy as np

from learner import multihost
from learner.batching import Batch, batch_of_groups, empty_batch
from learner.trajectory import Group
from tasks.runtime.state.checkpoints import Checkpoints
from tasks.runtime.session.learner import Learner, Update

BATCH, UPDATE, PARAMS, SAVE, RESTORED, STOP = range(6)
_WORDS = 3  # a command and up to two arguments


def announce(command: int, *args: int) -> None:
    """The leader's side of a step every process takes."""
    multihost.share(np.array([command, *args] + [0] * (_WORDS - 1 - len(args)), np.int32))


def receive() -> list[int]:
    """A follower's side: the leader's next command and its arguments."""
    return [int(word) for word in multihost.share(np.zeros(_WORDS, np.int32))]


def share_batch(batch: Batch, minibatches: int) -> Batch:
    """This process's rows of the leader's `batch` (a follower passes an empty one of its shape)."""
    whole = Batch(**multihost.share(vars(batch)))
    return multihost.host_batch(whole, minibatches)


class LeadLearner(Learner):
    """The leader's learner: announces each collective step before it takes it."""

    def step(self, groups: Sequence[Group]) -> Iterator[Update]:
        batch = batch_of_groups(groups, self._config)
        announce(BATCH, *batch.shape)
        local = share_batch(batch, self._config.minibatches)
        # The padding of each whole minibatch, not of this process's rows of it.
        paddings = itertools.cycle([minibatch.padding for minibatch in batch.split(self._config.minibatches)])
        for update, padding in zip(self.updates(local, before_each=lambda: announce(UPDATE)), paddings):
            yield dataclasses.replace(update, metrics={**update.metrics, "padding": padding})

    def params(self) -> dict[str, Any]:
        announce(PARAMS)
        return super().params()


class LeadCheckpoints(Checkpoints):
    """The leader's checkpoints: every process writes its shards of each one."""

    def save(self, version: int, state: Any, record: dict):
        announce(SAVE, version)
        return super().save(version, state, record)


def restore_latest(checkpoints: Checkpoints, abstract_state: Any) -> tuple[Any, int | None]:
    """A follower's restore: the latest checkpoint that restores, as the leader tries them
    (it alone sets damaged ones aside); then checks that the leader restored the same."""
    state, version = None, None
    for candidate in reversed(checkpoints.versions()):
        try:
            state, _ = checkpoints.restore(candidate, abstract_state)
        except Exception:  # the leader sees the same damage, and says so
            continue
        version = candidate
        break
    command, leader_version, _ = receive()
    if command != RESTORED or leader_version != (-1 if version is None else version):
        raise RuntimeError(f"this learner host restored version {version}, process 0 version {leader_version}: "
                           "their checkpoint directories differ")
    return state, version


def follow(learner: Learner, checkpoints: Checkpoints, minibatches: int) -> None:
    """A follower's session: takes the steps the leader announces, until it stops."""
    updates: Iterator[Update] = iter(())
    while True:
        command, a, b = receive()
        if command == BATCH:
            updates = learner.updates(share_batch(empty_batch(a, b), minibatches))
        elif command == UPDATE:
            next(updates)
        elif command == PARAMS:
            learner.params()
        elif command == SAVE:
            checkpoints.save(a, learner.state(), {})  # the record is the leader's to write
        elif command == STOP:
            checkpoints.close()
            return
        else:
            raise RuntimeError(f"unknown learner command {command} from process 0")
