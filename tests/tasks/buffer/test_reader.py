"""The learner's end of the buffer: a batch interrupted while it waits goes back whole."""

import threading

import pytest

from tasks.buffer.ledger import balanced
from tasks.buffer.reader import BufferReader, waiting_words
from tests.support.groups import make_group, make_rules


class Clock:
    current = visible = 0


class Stop(Exception):
    pass


def test_groups_taken_for_a_batch_that_stops_go_back_first_in_line_and_stay_open():
    rules = make_rules(batch_groups=3)
    prompts = rules.dispatch(0)[0]
    for p in prompts[:2]:
        rules.on_report({"event": "buffered", "actor": 0, "id": p.id, "attempt": p.attempt})
    stop = threading.Event()

    def check():
        if stop.is_set():
            raise Stop

    reader = BufferReader(rules, Clock(), prefetch=8, check=check)
    reader.arrive([make_group(p.id) for p in prompts[:2]])
    stop.set()
    with pytest.raises(Stop):
        reader.take(3)  # two taken, then it waits for the third: stopped
    snapshot = rules.accounting()
    assert snapshot["consumed"] == 0 and snapshot["buffered"] == 2 and balanced(snapshot)
    assert sorted(p.id for p in rules.ledger.open_prompts()) == sorted(p.id for p in prompts)
    stop.clear()
    reader.arrive([make_group(prompts[2].id)])
    assert [g.prompt_id for g in reader.take(3)] == [p.id for p in prompts[:3]]  # in arrival order still
    assert rules.accounting()["consumed"] == 3


def test_the_waiting_message_is_words():
    words = waiting_words({"in_flight": 12, "buffered": 0, "consumed": 340, "excluded": {"aborted": 2, "filtered": 51}})
    assert words == "12 groups being played, 0 buffered, 340 trained; excluded so far: 51 filtered, 2 aborted"
