"""The first run as a new user has it: `git clone` of this repository, then `make demo`, in
fresh clones, one after another; the README's table of times is this script's medians.

Each clone gets a Prefect home of its own (an empty database), so a run starts a Prefect
server unless one already listens on 127.0.0.1:4200; each run's server is stopped after it
(`tandem server stop`), so the next run starts one anew. Seconds from the clone: the
install (until `make` launches `tandem run`), the start-up (until the first step's record),
training from that record to 90% success (the 20-step mean) and to the run's stop (95%,
`learner.stop_at_success`), and the whole. Printed per run, then the median and range.
Clones go to a temporary directory, removed after. Usage:

    python benchmarks/first_run.py [--runs 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from harness import ROOT, emit, reached

WINDOW = 20  # steps the success rate is averaged over, as `learner.stop_window`
PARTS = ("install_s", "startup_s", "to_90_s", "to_stop_s", "steps", "whole_s")


def one_run(clone: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "VIRTUAL_ENV")}
    env["PREFECT_HOME"] = str(clone / ".prefect-home")
    launched = time.time()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    install_s = None
    with (clone.parent / f"{clone.name}.log").open("w") as log:
        make = subprocess.Popen(["make", "demo"], cwd=clone, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        for line in make.stdout:  # `make` echoes the command it launches once installed
            log.write(f"{time.time() - launched:7.1f} {line}")
            if install_s is None and "tandem run" in line:
                install_s = time.time() - launched
        make.wait()
    whole_s = time.time() - launched
    subprocess.run([str(clone / ".venv/bin/tandem"), "server", "stop"], cwd=clone, env=env, capture_output=True)
    records = [json.loads(line) for line in (clone / "runs/guess-number/metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "eval" not in r]
    first = records[0]["time"]
    at_90 = reached(records, 0.9, WINDOW)
    return {"exit": make.returncode, "install_s": install_s, "startup_s": first - launched - install_s,
            "to_90_s": at_90["time"] - first if at_90 else None, "to_stop_s": records[-1]["time"] - first,
            "steps": records[-1]["step"], "whole_s": whole_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "first_run.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-first-run-") as work:
        for i in range(args.runs):
            rows.append({"run": i, **one_run(Path(work) / f"clone-{i}")})
            print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for part in PARTS:
        values = [r[part] for r in rows if r[part] is not None]
        summary[part] = {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None
    emit("a fresh clone's `make demo`, seconds (median and range over the runs in the summary)", rows, args.out,
         summary=summary)
    for part, figures in summary.items():
        if figures:
            print(f"{part:10s} median {figures['median']:7.1f}   range {figures['min']:.1f}-{figures['max']:.1f}")


if __name__ == "__main__":
    main()
