"""The `streamjobs` command."""

from __future__ import annotations

import argparse
import json
import sys

from streamjobs_core.crd import crd_yaml
from streamjobs_core.loading import SpecError, load_job


def _validate(args) -> int:
    failed = 0
    for path in args.files:
        try:
            job = load_job(path)
        except SpecError as exc:
            failed += 1
            for field, message in exc.errors:
                print(f"{path}: {field}: {message}", file=sys.stderr)
            continue
        print(f"{path}: valid StreamJob '{job.metadata.name}' ({len(job.spec.operators)} operators)")
    return 1 if failed else 0


def _run(args) -> int:
    from .run import install_sigterm_as_interrupt, run_job

    try:
        job = load_job(args.file)
    except SpecError as exc:
        for field, message in exc.errors:
            print(f"{args.file}: {field}: {message}", file=sys.stderr)
        return 2
    install_sigterm_as_interrupt()
    result = run_job(job, args.duration, args.redis_url, args.report, verify=not args.no_verify)
    verification = result.get("verification") or {}
    return 1 if verification.get("correct") is False else 0


def _status(args) -> int:
    from streamjobs_core.connect import connect
    from streamjobs_core.layout import JobKeys
    from streamjobs_core.plan import JobPlan, read_assignment

    r = connect(args.redis_url)
    keys = JobKeys(args.job)
    raw = r.get(keys.plan)
    if raw is None:
        print(f"no job '{args.job}' in {args.redis_url}", file=sys.stderr)
        return 1
    plan = JobPlan.from_json(raw)
    out = {}
    for op in plan.spec.operators:
        assignment = read_assignment(r, keys, op.name)
        out[op.name] = {"parallelism": assignment.parallelism, "epoch": assignment.epoch} if assignment else None
    print(json.dumps({"job": args.job, "operators": out}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamjobs", description="Elastic, stateful stream jobs.")
    sub = parser.add_subparsers(dest="command", required=True)

    validate = sub.add_parser("validate", help="check StreamJob files; every error names its field")
    validate.add_argument("files", nargs="+")
    validate.set_defaults(func=_validate)

    crd = sub.add_parser("crd", help="print the StreamJob CRD generated from the spec model")
    crd.set_defaults(func=lambda args: sys.stdout.write(crd_yaml()) and 0)

    run = sub.add_parser("run", help="run a job on this machine with a live view")
    run.add_argument("file")
    run.add_argument("--duration", type=float, default=None, help="seconds before the sources stop")
    run.add_argument("--report", default=None, help="write the JSON report here")
    run.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    run.add_argument("--no-verify", action="store_true", help="skip the oracle check")
    run.set_defaults(func=_run)

    status = sub.add_parser("status", help="assignment and epoch of a running job")
    status.add_argument("--job", required=True)
    status.add_argument("--redis-url", required=True)
    status.set_defaults(func=_status)

    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
