"""The background threads' lifecycle: a thread that does not stop in time is given up on, loudly."""

import logging
import threading

from tasks.background import Background


class Hangs(Background):
    """A thread stuck in a call that never returns (a scheduler that does not answer)."""

    def __init__(self):
        super().__init__("tandem-weight-publisher")
        self.release = threading.Event()

    def _run(self):
        self.release.wait()


def test_a_thread_that_does_not_stop_in_time_is_given_up_on_with_a_warning(caplog):
    thread = Hangs().start()
    with caplog.at_level(logging.WARNING, logger="tasks"):
        assert thread.stop(timeout_s=0.2) is False
    assert "tandem-weight-publisher did not stop within 0.2s" in caplog.text
    thread.release.set()
    assert thread.stop(timeout_s=5) is True
