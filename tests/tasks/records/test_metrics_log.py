"""`metrics.jsonl` on resume: records past the checkpoint dropped, torn lines survived."""

import json

from tasks.records.metrics_log import MetricsLog


def write_lines(path, steps, tail=""):
    path.write_text("".join(json.dumps({"step": s, "loss": 0.5}) + "\n" for s in steps) + tail)


def test_records_past_the_checkpoint_are_dropped(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    write_lines(log.path, range(1, 11))
    log.resume(8, warn=print)
    assert [r["step"] for r in log.read()] == list(range(1, 9))


def test_a_torn_last_line_is_dropped_with_a_warning_and_the_run_resumes(tmp_path):
    """A disk that filled (or a power loss) while a record was appended: every resume used
    to fail on the JSON error."""
    log = MetricsLog(tmp_path / "metrics.jsonl")
    write_lines(log.path, range(1, 11), tail='{"step": 11, "lo')
    warnings = []
    log.resume(8, warn=warnings.append)
    assert [r["step"] for r in log.read()] == list(range(1, 9))
    assert len(warnings) == 1 and "line 11 is torn" in warnings[0]
    assert log.path.read_text().endswith("}\n")  # the file is whole again: appends start a new line


def test_a_torn_line_inside_the_file_and_nul_bytes_are_skipped(tmp_path):
    """Appends after a torn write continue on its line; a power loss can leave NUL bytes."""
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.path.write_text('{"step": 1}\n{"step": 2, "lo{"step": 3}\n\0\0\0\n{"step": 4}\n')
    assert [r["step"] for r in log.read()] == [1, 4]
    warnings = []
    log.resume(4, warn=warnings.append)
    assert len(warnings) == 2 and [r["step"] for r in log.read()] == [1, 4]


MALFORMED = ['{"step": null, "loss": 0.5}', '{"step": "3"}', '[3, 4]', '7', '{"step": true}',
             '{"step": 5, "version": "2"}', '{"step": 6, "version": null, "eval": {"success_rate": 1.0}}',
             '{"step": 6, "version": 1, "eval": [1]}', '{"loss": 0.5}']


def test_valid_json_that_is_no_record_is_skipped_with_a_warning_by_every_reader(tmp_path):
    """`"step": null` (or a string, or no object at all) used to end a resume, and a report,
    in a TypeError."""
    log_warnings = []
    log = MetricsLog(tmp_path / "metrics.jsonl", warn=log_warnings.append)
    good = [json.dumps({"step": 1, "version": 0}), json.dumps({"step": 2, "version": 0}),
            json.dumps({"step": 2, "version": 0, "time": 1.0, "eval": {"success_rate": 0.5}})]
    log.path.write_text("\n".join([good[0], *MALFORMED, good[1], good[2]]) + "\n")

    assert [r["step"] for r in log.read()] == [1, 2]
    assert [r["version"] for r in log.read_evals()] == [0]
    assert len(log_warnings) == 2 and all(f"skipped {len(MALFORMED)} line(s) of {log.path}" in w
                                          for w in log_warnings)
    assert "line 2: step is not an integer" in log_warnings[0]

    resume_warnings = []
    log.resume(2, warn=resume_warnings.append)
    assert len(resume_warnings) == len(MALFORMED)
    assert resume_warnings[0].startswith(f"{log.path} line 2 is not a step record (step is not an integer): ")
    assert log.path.read_text() == "\n".join(good) + "\n"  # dropped
