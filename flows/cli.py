"""`tandem`: validate, run and resume experiment specs.

Exit codes: 0 success, 1 the run failed, 2 a bad spec: one that does not validate, or
that cannot run from here (an environment, filter or cluster class that does not import,
a data file that does not read), found before anything starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flows.spec import Spec, SpecError, load_spec

BAD_SPEC = 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "report":
        from flows.report import report_command

        return report_command(args.run_dir)
    try:
        spec = _spec(args)
    except SpecError as e:
        print(e, file=sys.stderr)
        return BAD_SPEC
    if args.command == "validate":
        print(f"{args.spec}: ok ({spec.name}, run directory {spec.run_dir})")
        return 0
    if args.command == "audit":
        from flows.audit import audit_command

        return audit_command(spec, target_busy=args.target_busy, groups=args.groups,
                             train_steps=args.train_steps, env_steps=args.env_steps,
                             actor_cores=args.actor_cores, json_path=args.json)
    return _run(spec)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (("validate", ("check a spec, and that its modules import and its data file reads; "
                                      "print every error with its field and line")),
                        ("run", "run a spec (resumes if its run directory has checkpoints)")):
        command = commands.add_parser(name, help=help_)
        command.add_argument("spec", type=Path)
        command.add_argument("--set", dest="overrides", action="append", default=[],
                             metavar="PATH=VALUE", help="override a field; VALUE is parsed as YAML")
    resume = commands.add_parser("resume", help="continue a run from its latest checkpoint")
    resume.add_argument("run_dir", type=Path)
    resume.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="override a field of the run's spec (e.g. learner.steps=400 to extend it)")
    audit = commands.add_parser("audit", help="measure env, actor and learner times here; size the actor pool")
    audit.add_argument("spec", type=Path)
    audit.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                       help="override a field; VALUE is parsed as YAML")
    audit.add_argument("--target-busy", type=float, default=0.9, help="learner busy fraction to size for")
    audit.add_argument("--groups", type=int, default=8, help="groups to play and time")
    audit.add_argument("--train-steps", type=int, default=5, help="learner steps to time")
    audit.add_argument("--env-steps", type=int, default=200, help="environment steps to time")
    audit.add_argument("--actor-cores", type=float, default=None,
                       help="cores the actors get (default: one per actor, up to this machine's)")
    audit.add_argument("--json", type=Path, default=None, help="also write the audit here")
    report = commands.add_parser("report", help="plot a run's metrics into RUN_DIR/report/ and RUN_DIR/tensorboard/")
    report.add_argument("run_dir", type=Path)
    return parser


def _spec(args: argparse.Namespace) -> Spec:
    if args.command == "resume":
        # The run directory is where the spec was found, wherever the run was started from.
        return load_spec(args.run_dir / "spec.yaml",
                         [*args.overrides, f"checkpoint.dir={args.run_dir.resolve()}"])
    return load_spec(args.spec, args.overrides)


def _run(spec: Spec) -> int:
    from flows.server import ensure_api, ui_url

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.train import train

    api_url = ensure_api()
    print(f"Prefect UI: {ui_url(api_url)}  (API {api_url})", flush=True)
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        state = train(spec, return_state=True)
    if not state.is_completed():
        print(f"run failed: {state.message}", file=sys.stderr)
        return 1
    result = state.result()
    print(f"done: step {result['step']}, version {result['version']}, run directory {spec.run_dir.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
