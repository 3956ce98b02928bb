from tasks.buffer.ledger import Ledger, balanced
from tasks.buffer.prompts import Prompt


def test_attempts_move_through_states_and_balance():
    ledger = Ledger()
    prompts = [Prompt(i, f"p{i}") for i in range(4)]
    for p in prompts:
        ledger.dispatched(p)
    ledger.buffered(0, 0)
    ledger.buffered(1, 0)
    ledger.consume(0, 0)
    assert ledger.exclude(2, 0, "aborted") == prompts[2]
    snap = ledger.snapshot()
    assert snap == {"started": 4, "in_flight": 1, "buffered": 1, "consumed": 1,
                    "excluded": {"aborted": 1}, "retried": 0}
    assert balanced(snap)


def test_late_and_repeated_reports_are_ignored():
    ledger = Ledger()
    ledger.dispatched(Prompt(0, "p"))
    ledger.consume(0, 0)  # taken before its "buffered" report arrived
    ledger.buffered(0, 0)
    ledger.consume(0, 0)
    assert ledger.exclude(0, 0, "stale") is None
    snap = ledger.snapshot()
    assert snap["consumed"] == 1 and snap["buffered"] == 0 and balanced(snap)


def test_restore_reopens_nothing_and_balances():
    ledger = Ledger()
    for i in range(3):
        ledger.dispatched(Prompt(i, "p"))
    ledger.consume(0, 0)
    ledger.exclude(1, 0, "filtered")
    redo = ledger.open_prompts()
    restored = Ledger()
    restored.restore(ledger.state())
    assert [p.id for p in redo] == [2]
    snap = restored.snapshot()
    assert snap["started"] == 2 and balanced(snap)
    restored.dispatched(redo[0])
    assert restored.snapshot()["started"] == 3 and balanced(restored.snapshot())
