"""The buffer's rules: the README's worked examples of versions and staleness, and the accounting under any interleaving."""

import collections

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.trajectory import OBSERVATION, Group, Sample
from tasks.buffer.ledger import Ledger, balanced
from tasks.config import BufferConfig, DataConfig
from tasks.buffer.prompts import Prompt, PromptSource
from tasks.actors.envs.guess_number import GuessNumber
from tasks.buffer.intake import IntakeRules, Pace


def sample(*versions, reward=0.0):
    """A sample whose generated tokens were made at `versions` (after one observation token)."""
    v = np.array([OBSERVATION, *versions], np.int32)
    return Sample(np.ones(len(v), np.int32), np.zeros(len(v), np.float32), v, reward)


def group(prompt_id, *samples, attempt=0, arrival=None):
    return Group(prompt_id, "secret=a", tuple(samples), 0.0, 0.0, attempt=attempt, arrival_version=arrival)


def sent(messages):
    """(actor, prompt) pairs of one `dispatch`, in the order each actor plays them."""
    return [(actor, prompt) for actor, message in messages.items() for prompt in message]


def rules(n_actors=1, outstanding=100, synchronous=False, **buffer):
    source = PromptSource(DataConfig(), GuessNumber, {}, seed=0)
    pace = Pace(batch_groups=2, sync_interval=1, outstanding=outstanding, synchronous=synchronous)
    return IntakeRules(BufferConfig(**buffer), Ledger(), source, pace, n_actors, log=lambda _: None)


# Worked examples: versions, staleness and the exit check.

def test_group_made_at_v3_taken_while_v3_deployed_has_staleness_0():
    # Sync every 3 steps: step 9 published v3; at step 11 the learner still has v3 deployed.
    sync_interval, step = 3, 11
    current_version = step // sync_interval
    g = group(0, sample(3, 3, 3), sample(3, 3))
    assert current_version == 3 and g.staleness(current_version) == 0


def test_group_started_v3_continued_v4_taken_at_v5_has_staleness_2():
    g = group(0, sample(3, 3, 4, 4), sample(4, 4), arrival=4)
    assert g.oldest_version == 3
    assert g.staleness(5) == 2
    assert g.staleness_parts(5) == (1, 1)  # one version in flight, one in the queue


def test_one_old_sample_makes_the_group_old():
    assert group(0, sample(4, 4), sample(2, 4)).oldest_version == 2


def test_exit_check_excludes_b_and_consumes_c():
    r = rules(max_staleness=1, retry=())
    for actor, prompt in sent(r.dispatch(version=5))[:2]:
        r.on_report({"event": "buffered", "actor": actor, "id": prompt.id, "attempt": 0})
    b, c = group(0, sample(3)), group(1, sample(4))
    assert r.on_take(b, version=5) is None  # 5 - 3 = 2 > 1
    assert r.on_take(c, version=5) == 1
    acc = r.accounting()
    assert acc["excluded"] == {"stale": 1} and acc["consumed"] == 1 and balanced(acc)


def test_stale_prompt_is_retried_ahead_of_new_ones_and_filtered_never():
    r = rules(max_staleness=0, outstanding=3)
    (_, p0), (_, p1), (_, p2) = sent(r.dispatch(version=0))
    r.on_report({"event": "excluded", "actor": 0, "id": p1.id, "attempt": 0, "reason": "filtered", "detail": ""})
    r.on_take(group(p0.id, sample(0)), version=1)  # stale: retried
    next_prompts = [p for _, p in sent(r.dispatch(version=1))]
    assert next_prompts[0] == Prompt(p0.id, p0.text, attempt=1)
    assert p1.id not in [p.id for p in next_prompts]
    assert balanced(r.accounting())


def test_retries_stop_at_max_retries():
    r = rules(max_staleness=0, outstanding=1, max_retries=1)
    for attempt in range(2):
        [(_, p)] = sent(r.dispatch(version=attempt))
        assert (p.id, p.attempt) == (0, attempt)
        r.on_take(group(0, sample(attempt), attempt=attempt), version=attempt + 1)
    [(_, p)] = sent(r.dispatch(version=2))
    assert p.id == 1 and r.accounting()["excluded"] == {"stale": 2}


def test_admission_control_bounds_the_staleness_of_started_groups():
    # 2 groups a step, 1 step a version, budget 1: at version 0 at most (0+1+1)*2 = 4 may start.
    r = rules(outstanding=100, max_staleness=1, admission=True)
    first = sent(r.dispatch(version=0))
    assert len(first) == 4 and sent(r.dispatch(version=0)) == []
    for _, p in first[:2]:
        r.on_take(group(p.id, sample(0)), version=0)
    # Two attempts of version 0 are still open: nothing more may start.
    assert sent(r.dispatch(version=1)) == []
    for _, p in first[2:]:
        r.on_take(group(p.id, sample(0)), version=1)
    assert len(sent(r.dispatch(version=2))) == 4  # (2+1+1)*2 - 4 consumed


def test_synchronous_mode_starts_only_what_the_waiting_learner_lacks():
    r = rules(synchronous=True)
    assert sent(r.dispatch(version=0)) == []  # nobody waits yet
    r.want(2)
    first = sent(r.dispatch(version=0))
    assert len(first) == 2 and sent(r.dispatch(version=0)) == []
    r.on_report({"event": "excluded", "actor": 0, "id": first[0][1].id, "attempt": 0,
                 "reason": "filtered", "detail": "zero variance"})
    assert len(sent(r.dispatch(version=0))) == 1  # a filtered group is replaced, nothing more
    r.on_report({"event": "buffered", "actor": 0, "id": first[1][1].id, "attempt": 0})
    assert r.on_take(group(first[1][1].id, sample(0)), version=0) == 0
    assert r.wanted == 1 and sent(r.dispatch(version=0)) == []  # the replacement is still open


@settings(max_examples=200, deadline=None)
@given(order=st.lists(st.integers(0, 2), min_size=60, max_size=200), budget=st.integers(0, 2))
def test_admission_control_never_lets_a_group_go_stale_whatever_the_arrival_order(order, budget):
    """Actors finish in any order (`order` picks which one finishes next); the learner takes
    2 groups per step and publishes every step; with admission on, nothing is ever stale."""
    r = rules(n_actors=3, outstanding=12, max_staleness=budget, admission=True)
    held = [collections.deque() for _ in range(3)]
    buffer, consumed = collections.deque(), 0
    for actor in order:
        version = consumed // 2
        for a, prompt in sent(r.dispatch(version)):
            held[a].append((prompt, version))
        if held[actor]:
            prompt, started = held[actor].popleft()
            r.on_report({"event": "buffered", "actor": actor, "id": prompt.id, "attempt": prompt.attempt})
            buffer.append(group(prompt.id, sample(started), attempt=prompt.attempt))
        while len(buffer) >= 2:  # one step: two groups at the current version
            version = consumed // 2
            for _ in range(2):
                assert r.on_take(buffer.popleft(), version) is not None, "a group went stale"
                consumed += 1
    assert r.accounting()["excluded"] == {}


def test_one_dispatch_sends_one_message_per_actor():
    r = rules(n_actors=2, outstanding=5)
    messages = r.dispatch(version=0)
    assert [[p.id for p in messages[a]] for a in (0, 1)] == [[0, 2, 4], [1, 3]]
    assert [list(h) for h in r.held] == [[[(0, 0), (2, 0), (4, 0)]], [[(1, 0), (3, 0)]]]


def test_restarted_actor_loses_every_attempt_it_held():
    """An actor plays the prompts of several messages at once: when it restarts, every
    attempt it held is lost and retried, those of messages it had not read yet too."""
    r = rules(n_actors=1, outstanding=3)
    r.on_report({"event": "hello", "actor": 0})
    p0, p1, p2 = r.dispatch(version=0)[0]  # one message
    r.on_report({"event": "buffered", "actor": 0, "id": p0.id, "attempt": 0})
    r.on_take(group(p0.id, sample(0)), version=0)
    [p3] = r.dispatch(version=0)[0]  # a second message
    r.on_report({"event": "hello", "actor": 0})  # it died playing p1, p2 and p3
    acc = r.accounting()
    assert acc["excluded"] == {"lost": 3} and acc["in_flight"] == 0 and acc["waiting"] == 3
    assert list(r.held[0]) == []
    assert r.dispatch(version=0)[0] == [Prompt(p.id, p.text, attempt=1) for p in (p1, p2, p3)]


def test_a_group_put_just_before_its_actor_restarted_is_not_trained_besides_its_retry():
    r = rules(n_actors=1, outstanding=1)
    r.on_report({"event": "hello", "actor": 0})
    [p] = r.dispatch(version=0)[0]
    orphan = group(p.id, sample(0))  # put into the buffer; the actor died before reporting it
    r.on_report({"event": "hello", "actor": 0})  # its prompt: lost, and sent again
    [retry] = r.dispatch(version=0)[0]
    assert retry == Prompt(p.id, p.text, attempt=1)
    assert r.on_take(orphan, version=0) is None
    r.on_report({"event": "buffered", "actor": 0, "id": p.id, "attempt": 1})
    assert r.on_take(group(p.id, sample(0), attempt=1), version=0) == 0
    acc = r.accounting()
    assert acc["consumed"] == 1 and acc["excluded"] == {"lost": 1} and balanced(acc)


# The accounting invariant under random interleavings of everything that can happen.

OPS = st.lists(st.tuples(
    st.sampled_from(["dispatch", "finish", "deliver", "take", "bump", "crash", "crash_after_put"]),
    st.integers(0, 2),
    st.sampled_from(["buffered", "buffered", "aborted", "filtered", "invalid"]),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, max_staleness=st.none() | st.integers(0, 2), admission=st.booleans(),
       retry=st.sampled_from([(), ("aborted",), ("aborted", "stale")]))
def test_accounting_balances_after_every_event(ops, max_staleness, admission, retry):
    admission = admission and max_staleness is not None
    r = rules(n_actors=3, outstanding=6, max_staleness=max_staleness, admission=admission,
              retry=retry, max_retries=2)
    version = 0
    held = [collections.deque() for _ in range(3)]  # each simulated actor's messages
    buffer, reports = collections.deque(), collections.deque()  # reports: one FIFO, as on Dask
    trained = collections.Counter()  # prompt id -> times trained
    for actor in range(3):
        reports.append({"event": "hello", "actor": actor})
    for op, actor, outcome in ops:
        if op == "dispatch":
            for a, message in r.dispatch(version).items():
                held[a].append(collections.deque((prompt, version) for prompt in message))
        elif op == "finish" and held[actor]:
            prompt, started = held[actor][0].popleft()
            if not held[actor][0]:
                held[actor].popleft()
            report = {"actor": actor, "id": prompt.id, "attempt": prompt.attempt}
            if outcome == "buffered":
                buffer.append(group(prompt.id, sample(started, version), attempt=prompt.attempt))
                reports.append({**report, "event": "buffered"})
            else:
                reports.append({**report, "event": "excluded", "reason": outcome, "detail": ""})
        elif op == "deliver" and reports:
            r.on_report(reports.popleft())
        elif op == "take" and buffer:
            taken = buffer.popleft()
            if r.on_take(taken, version) is not None:
                trained[taken.prompt_id] += 1
        elif op == "bump":
            version += 1
        elif op == "crash":
            if held[actor]:
                held[actor].popleft()  # the message it was playing dies with it
            reports.append({"event": "hello", "actor": actor})
        elif op == "crash_after_put" and held[actor]:  # its group is in the buffer, unreported
            prompt, started = held[actor].popleft()[0]
            buffer.append(group(prompt.id, sample(started, version), attempt=prompt.attempt))
            reports.append({"event": "hello", "actor": actor})
        acc = r.accounting()
        assert balanced(acc), (op, acc)
        assert all(n == 1 for n in trained.values()), trained
        assert acc["in_flight"] + acc["buffered"] <= 6


def test_group_lost_with_its_worker_is_retried_whichever_message_comes_first():
    for report_first in (True, False):
        r = rules(outstanding=1)
        [(_, p)] = sent(r.dispatch(version=0))
        report = {"event": "buffered", "actor": 0, "id": p.id, "attempt": 0, "key": "group-key"}
        if report_first:
            r.on_report(report)
            r.on_fetch("group-key", lost=True)
        else:
            r.on_fetch("group-key", lost=True)
            r.on_report(report)
        acc = r.accounting()
        assert acc["excluded"] == {"lost": 1} and acc["waiting"] == 1 and balanced(acc)
        assert sent(r.dispatch(version=0))[0][1] == Prompt(p.id, p.text, attempt=1)


def test_fetched_group_is_not_lost_by_a_late_report():
    r = rules(outstanding=1)
    [(_, p)] = sent(r.dispatch(version=0))
    r.on_fetch("k", lost=False)
    r.on_report({"event": "buffered", "actor": 0, "id": p.id, "attempt": 0, "key": "k"})
    assert r.accounting()["buffered"] == 1 and r.accounting()["excluded"] == {}
