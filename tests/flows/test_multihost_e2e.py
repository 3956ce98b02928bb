"""A learner of two processes launched by `tandem run` through Prefect: it trains as one
process with the same devices, and a process killed mid-run fails the attempt, whose
retry restarts both from the latest checkpoint."""

import pytest

from tests.support.two_hosts import (
    check_a_killed_host_is_retried,
    check_two_hosts_train_as_one,
)

pytestmark = pytest.mark.e2e


@pytest.mark.slow  # 57 s on 2 cores: CI's time (README, "The two commands")
def test_two_hosts_train_as_one_with_the_same_devices(prefect_api, tmp_path):
    check_two_hosts_train_as_one(tmp_path, placement=[])


@pytest.mark.slow  # ~3-4 min on 2 cores; CI runs the single-host fault tests
def test_a_killed_host_fails_the_attempt_and_the_retry_restarts_both(prefect_api, tmp_path):
    check_a_killed_host_is_retried(tmp_path, placement=[])
