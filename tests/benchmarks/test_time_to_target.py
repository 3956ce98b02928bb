"""time_to_target's command line: the variants a cell runs beside the audit's settings."""

import argparse
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks are scripts that import their siblings

from time_to_target import _variant  # noqa: E402


def test_a_variant_is_a_name_and_its_overrides():
    assert _variant("tis=learner.loss.objective=tis,learner.loss.is_cap=2") == (
        "tis", ["learner.loss.objective=tis", "learner.loss.is_cap=2"])
    assert _variant("e4=learner.epochs=4") == ("e4", ["learner.epochs=4"])


@pytest.mark.parametrize("text", ["tis", "=learner.epochs=4", "tis="])
def test_a_variant_without_a_name_or_overrides_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=path=value"):
        _variant(text)
