import sys

import pytest

from tasks.placement import cluster_class
from tasks.actors.envs import resolve_entrypoint
from tasks.buffer.filters import resolve_filter, zero_variance
from tasks.entrypoints import load


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Writes importable modules: modules(name=source, ...); forgets them afterwards."""
    written = []

    def write(**sources):
        for name, source in sources.items():
            (tmp_path / f"{name}.py").write_text(source)
            written.append(name)

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_builtin_or_module_attribute(modules):
    modules(user_mod="class Env:\n    pass\n")
    builtins = {"a": 1}
    assert load("a", builtins, "thing") == 1
    assert load("user_mod:Env", builtins, "thing").__name__ == "Env"


@pytest.mark.parametrize("name", ["nope", ":Env", "user_mod:", ""])
def test_a_name_of_neither_form(name):
    with pytest.raises(ValueError, match=r"unknown thing .*: use a built-in \(a, b\) or \"package\.module:attribute\""):
        load(name, {"a": 1, "b": 2}, "thing")


def test_missing_module_suggests_the_path():
    with pytest.raises(ValueError) as e:
        load("no_such_pkg_q1.envs:Env", {}, "environment")
    message = str(e.value)
    assert message.startswith("cannot import environment 'no_such_pkg_q1.envs:Env': no module named 'no_such_pkg_q1'")
    assert "PYTHONPATH" in message and "installed" in message
    assert "the spec's directory is not on the path unless you add it" in message


def test_missing_dependency_of_an_existing_module_is_named(modules):
    modules(needs_dep="import no_such_dep_q1\n")
    with pytest.raises(ValueError, match="module 'needs_dep' needs 'no_such_dep_q1', which is not installed"):
        load("needs_dep:Env", {}, "environment")


def test_module_failing_at_import_is_reported(modules):
    modules(broken="raise RuntimeError('boom')\n", bad_syntax="def (:\n")
    with pytest.raises(ValueError, match="importing module 'broken' raised RuntimeError: boom"):
        load("broken:Env", {}, "environment")
    with pytest.raises(ValueError, match="importing module 'bad_syntax' raised SyntaxError"):
        load("bad_syntax:Env", {}, "environment")


def test_missing_attribute(modules):
    modules(user_mod2="x = 1\n")
    with pytest.raises(ValueError, match="cannot load filter 'user_mod2:f': module 'user_mod2' has no attribute 'f'"):
        load("user_mod2:f", {}, "filter")


def test_env_filter_and_cluster_class_share_the_loader(modules):
    modules(user_mod3="def keep(group):\n    return True\nclass Cluster:\n    pass\n")
    assert resolve_entrypoint("guess-number").__name__ == "GuessNumber"
    assert resolve_filter("zero_variance") is zero_variance
    assert resolve_filter("user_mod3:keep").__name__ == "keep"
    assert cluster_class("user_mod3:Cluster").__name__ == "Cluster"
    for resolve, what in ((resolve_entrypoint, "environment"), (resolve_filter, "filter"),
                          (cluster_class, "cluster class")):
        with pytest.raises(ValueError, match=f"cannot import {what} 'no_such_pkg_q2:X'.*PYTHONPATH"):
            resolve("no_such_pkg_q2:X")
    with pytest.raises(ValueError, match=r"^actors\.cluster: cannot import"):  # named where it is raised
        cluster_class("no_such_pkg_q2:X")
