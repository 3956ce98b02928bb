"""`make test` runs on two processes with `--dist loadgroup`, so that the tests reading the
session's `tiny_run` share one process and the run is built once (about 1.5 minutes of CI).
pytest 9.2 silently broke that grouping (pytest-xdist#1386); this catches it coming back."""

import re
import subprocess
import sys
import textwrap


def test_a_marked_group_runs_on_one_worker(tmp_path):
    grouped = textwrap.dedent("""
        import pytest
        pytestmark = pytest.mark.xdist_group("g")
        def test_1(): pass
        def test_2(): pass
        def test_3(): pass
    """)
    (tmp_path / "test_grouped.py").write_text(grouped)
    (tmp_path / "test_free.py").write_text("def test_x(): pass\ndef test_y(): pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
                             "-p", "no:cacheprovider", str(tmp_path)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]
    workers = set(re.findall(r"\[(gw\d)\] .*PASSED .*test_grouped\.py", result.stdout))
    assert len(re.findall(r"PASSED .*test_grouped\.py", result.stdout)) == 3
    assert len(workers) == 1, result.stdout
