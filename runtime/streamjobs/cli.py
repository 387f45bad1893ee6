"""The `streamjobs` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import redis
from streamjobs_core.connect import redacted
from streamjobs_core.control import Strategy, as_text
from streamjobs_core.crd import crd_yaml
from streamjobs_core.loading import SpecError, load_job

STRATEGIES = [s.value for s in Strategy]

JOB_HELP = "the job's name; for a StreamJob the operator runs, <namespace>/<name>"
URL_ENV = "STREAMJOBS_REDIS_URL"


def _validate(args) -> int:
    failed = 0
    for path in args.files:
        job = _load(path, args.allow_jvm_functions)
        if job is None:
            failed += 1
            continue
        print(f"{path}: valid StreamJob '{job.metadata.name}' ({len(job.spec.operators)} operators)")
    return 1 if failed else 0


def _load(path: str, allow_jvm_functions: bool = False):
    """The StreamJob in `path`, or None after naming each invalid field (and each SQL call that reaches the
    JVM, unless allowed: sqlguard.py)."""
    from streamjobs_core.sqlguard import refused_calls

    try:
        job = load_job(path)
        errors = [] if allow_jvm_functions else refused_calls(job)
    except SpecError as exc:
        errors = exc.errors
    for field, message in errors:
        print(f"{path}: {field}: {message}", file=sys.stderr)
    return None if errors else job


def _signing_key(args) -> bytes | None:
    """The key in --signing-key-file (its bytes, a trailing newline left out), or None."""
    if args.signing_key_file is None:
        return None
    try:
        key = Path(args.signing_key_file).read_bytes().rstrip(b"\r\n")
    except OSError as exc:
        raise SystemExit(f"--signing-key-file: cannot read {args.signing_key_file}: {exc.strerror}") from None
    if not key:
        raise SystemExit(f"--signing-key-file: {args.signing_key_file} is empty")
    return key


def _signing_key_file(parser, what: str) -> None:
    parser.add_argument("--signing-key-file", default=None, metavar="PATH", help=what)


def _allow_jvm_functions(parser) -> None:
    parser.add_argument("--allow-jvm-functions", action="store_true",
                        help="let SQL call reflect(), java_method() and try_reflect(): any Java method, with the "
                             "workers' rights")


def _run(args) -> int:
    from .run import run_job, stop_on_terminal_signals

    job = _load(args.file, args.allow_jvm_functions)
    if job is None:
        return 2
    from streamjobs_core.reconfigure import Refused
    from streamjobs_core.savepoint import Savepoint, SavepointError, Trust

    from .local import PreviousRun

    savepoint = None
    if args.from_savepoint:
        try:
            savepoint = Savepoint.read(args.from_savepoint, Trust(signing_key=_signing_key(args)))
        except SavepointError as exc:
            print(f"--from-savepoint: {exc}", file=sys.stderr)
            return 2
        refused = [] if args.allow_jvm_functions else savepoint.jvm_calls()
        for where, message in refused:
            print(f"{args.from_savepoint}: {where}: {message}", file=sys.stderr)
        if refused:
            return 2
    stop_on_terminal_signals()
    try:
        result = run_job(job, args.duration, args.redis_url, args.report, verify=not args.no_verify,
                         fresh=args.fresh or args.redis_url is None, savepoint=savepoint,
                         reset=tuple(args.reset_state))
    except PreviousRun as exc:
        print(f"--redis-url: {exc}", file=sys.stderr)
        return 2
    except SavepointError as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 2
    except Refused as exc:
        print(f"{args.file}: the run in {redacted(args.redis_url)} cannot go on with this spec: {exc}", file=sys.stderr)
        return 2
    verification = result.get("verification") or {}
    return 1 if result.get("failed") or verification.get("correct") is False else 0


def _running_job(args):
    """(job store, plan) of the job named by --job in --redis-url, or None after saying why."""
    from streamjobs_core.connect import connect
    from streamjobs_core.jobstore import RedisJobStore

    store = RedisJobStore(connect(args.redis_url), args.job)
    plan = store.plan()
    if plan is None:
        print(f"--job: no job '{args.job}' in {redacted(args.redis_url)}{_namespaced(store, args.job)}",
              file=sys.stderr)
        return None
    return store, plan


def _namespaced(store, name: str) -> str:
    """A hint naming the StreamJobs of that name the operator runs, whose ids carry their namespace."""
    if "/" in name:
        return ""
    found = sorted({as_text(key)[4:-6] for key in store.r.scan_iter(match=f"sj:{{*/{name}}}:plan", count=1000)})
    return f"; the operator runs {', '.join(found)} (--job <namespace>/<name>)" if found else ""


def _managed(store, job: str) -> bool:
    """Whether the kopf operator runs the job: then its resource's spec says its parallelism and logic."""
    if store.deployed_by() is None:
        return False
    print(f"--job: '{job}' is run by the StreamJob operator: change its parallelism or spec with "
          "kubectl apply", file=sys.stderr)
    return True


def _running_job_args(parser, operator: bool) -> None:
    parser.add_argument("--job", required=True, help=JOB_HELP)
    if operator:
        parser.add_argument("--operator", required=True)
    _redis_url_options(parser, required=True, what="as printed by `streamjobs run`")


def _redis_url_options(parser, required: bool, what: str) -> None:
    parser.add_argument("--redis-url", default=None,
                        help=f"{what}; or --redis-url-file, or ${URL_ENV}, which keep a password out of `ps`")
    parser.add_argument("--redis-url-file", default=None, metavar="PATH", help="the Redis URL, read from this file")
    parser.set_defaults(redis_url_required=required)


def _resolve_redis_url(parser, args) -> None:
    """--redis-url, else the file --redis-url-file names, else $STREAMJOBS_REDIS_URL."""
    if not hasattr(args, "redis_url_file"):
        return
    if args.redis_url is None and args.redis_url_file is not None:
        try:
            args.redis_url = Path(args.redis_url_file).read_text().strip() or None
        except OSError as exc:
            parser.error(f"--redis-url-file: cannot read {args.redis_url_file}: {exc.strerror}")
    if args.redis_url is None:
        args.redis_url = os.environ.get(URL_ENV) or None
    if args.redis_url is None and args.redis_url_required:
        parser.error(f"--redis-url (or --redis-url-file, or ${URL_ENV}) is required")


def _running_operator(args):
    """(job store, plan) of --job in --redis-url, which has an --operator; or the exit code after saying why."""
    found = _running_job(args)
    if found is None:
        return 1
    names = [op.name for op in found[1].spec.operators]
    if args.operator not in names:
        print(f"--operator: no operator '{args.operator}' (operators: {', '.join(names)})", file=sys.stderr)
        return 2
    return found


def _answer(fetch, wait_s: float) -> int:
    """Wait until the running job recorded what was asked of it (`fetch` returns the record then), print it."""
    import time

    deadline = time.monotonic() + wait_s
    while (record := fetch()) is None:
        if time.monotonic() > deadline:
            print(f"requested; not done within {wait_s:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(record.encode())
    return 2 if getattr(record, "refused", None) else 0


def _status(args) -> int:
    from .status import job_status, render

    found = _running_job(args)
    if found is None:
        return 1
    status = job_status(*found)
    if args.json:
        print(json.dumps(status.to_json(), indent=2))
    else:
        render(status)
    return 0


def _output(args) -> int:
    found = _running_job(args)
    if found is None:
        return 1
    store, plan = found
    sinks = [sink.name for sink in plan.spec.sinks if sink.type == "redis_stream"]
    if args.sink not in sinks:
        print(f"--sink: no redis_stream sink '{args.sink}' (those of '{args.job}': {', '.join(sinks) or 'none'})",
              file=sys.stderr)
        return 2
    after = "-"
    while True:
        entries = store.r.xrange(plan.keys.output_stream(args.sink), min=after, count=10_000)
        for _, fields in entries:
            print(json.dumps({k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}))
        if len(entries) < 10_000:
            return 0
        after = "(" + entries[-1][0].decode()


def _rescale(args) -> int:

    found = _running_operator(args)
    if isinstance(found, int):
        return found
    from streamjobs_core.control import RescaleRequest

    store, plan = found
    if _managed(store, args.job):
        return 2
    spec = plan.spec
    if not 1 <= args.parallelism <= spec.max_parallelism:
        print(f"--parallelism: must be in [1, {spec.max_parallelism}] (maxParallelism)", file=sys.stderr)
        return 2
    before = len(store.rescale_history())
    strategy = Strategy(args.strategy or spec.rescale.strategy)
    if plan.head(args.operator) != args.operator:
        print(f"'{args.operator}' is chained to '{plan.head(args.operator)}': the chain rescales as one", file=sys.stderr)
    store.request_rescale(RescaleRequest(args.operator, args.parallelism, strategy))
    return _answer(lambda: next(iter(store.rescale_history(before)), None), args.wait)


def _reconfigure(args) -> int:
    import uuid

    from streamjobs_core.control import ReconfigureRequest
    from streamjobs_core.reconfigure import diff

    job = _load(args.file, args.allow_jvm_functions)
    if job is None:
        return 2
    found = _running_job(args)
    if found is None:
        return 1
    store, plan = found
    if _managed(store, args.job):
        return 2
    reset = tuple(args.reset_state)
    changes = diff(plan.job, job, reset)
    for line in changes.lines():
        print(line)
    if changes.refused:
        print(f"refused: {len(changes.refused)} change(s) cannot be made to the running job; nothing applied",
              file=sys.stderr)
        return 2
    if args.dry_run or not changes.changes:
        return 0
    request = ReconfigureRequest(job.model_dump_json(by_alias=True), uuid.uuid4().hex, reset)
    before = len(store.reconfigure_history())
    store.request_reconfigure(request)
    return _answer(lambda: next((r for r in store.reconfigure_history(before) if r.request == request.id), None),
                   args.wait)


def _stop(args) -> int:
    found = _running_job(args)
    if found is None:
        return 1
    store, _ = found
    if store.deployed_by() is not None:
        print(f"--job: '{args.job}' is run by the StreamJob operator: set spec.suspend, or delete the StreamJob",
              file=sys.stderr)
        return 2
    (store.request_stop if args.drain else store.request_suspend)()
    if not _stopped(store, args.wait):
        return 1
    print(f"{args.job}: " + ("drained and stopped: it ended" if args.drain else
                             "stopped at its last commits; `streamjobs run <file> --redis-url "
                             f"{redacted(args.redis_url)}` goes on from there"))
    return 0


def _stopped(store, wait_s: float) -> bool:
    """Wait until every worker stopped after its last commit (each unregisters then), or say it did not."""
    import time

    deadline = time.monotonic() + wait_s
    while store.registered():
        if time.monotonic() > deadline:
            print(f"asked; workers still running after {wait_s:.0f} s", file=sys.stderr)
            return False
        time.sleep(0.2)
    return True


_PAUSE_MARGIN_S = 30.0  # a pause outlives the drain's wait by this much, for the copy; then it lapses by itself


def _drained(store, plan, wait_s: float) -> bool:
    """Wait until the paused sources' records went through every operator, or say what is still in flight."""
    import time

    from streamjobs_core.resplit import in_flight

    deadline = time.monotonic() + wait_s
    while pending := in_flight(store, plan):
        if time.monotonic() > deadline:
            print(f"--drain-in-flight: still in flight after {wait_s:.0f} s: {'; '.join(pending)}", file=sys.stderr)
            return False
        time.sleep(0.2)
    return True


def _savepoint(args) -> int:
    import time

    from streamjobs_core.savepoint import SavepointError, take

    found = _running_job(args)
    if found is None:
        return 1
    store, plan = found
    if args.stop and store.deployed_by() is not None:
        print(f"--stop: '{args.job}' is run by the StreamJob operator: set spec.suspend, then take the "
              "savepoint", file=sys.stderr)
        return 2
    stopping = False
    try:
        if args.drain_in_flight:
            now_ms = int(time.time() * 1000)
            store.request_pause(now_ms, now_ms + int((args.wait + _PAUSE_MARGIN_S) * 1000))
            if not _drained(store, plan, args.wait):
                return 1
        if args.stop:
            store.request_suspend()
            stopping = True
            if not _stopped(store, args.wait):
                return 1
        started = time.monotonic()
        savepoint = take(store)
    except SavepointError as exc:
        print(f"--job: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.drain_in_flight and not stopping:
            store.resumed()  # the sources go on (a stopped job's pause is lifted when it runs again)
    held_ms = (time.monotonic() - started) * 1000
    savepoint.write(args.path, _signing_key(args))
    state = ("stopped at" if args.stop else "running, copied between two commits at") + " its last commits" + (
        "; drained: nothing in flight between operators" if args.drain_in_flight else "")
    print(f"{args.job}: savepoint of plan version {savepoint.plan.version} ({state}): "
          f"{len(savepoint.keys)} keys, {savepoint.size_bytes / 1e6:.1f} MB, copied in {held_ms:.0f} ms -> "
          f"{args.path}\n`streamjobs run <file> --from-savepoint {args.path} [--redis-url URL]` goes on from it")
    return 0


def _control(args) -> int:
    import uuid

    from streamjobs_core.control import ControlEvent
    from streamjobs_core.reconfigure import ask
    from streamjobs_core.spec import BUILT_IN_HANDLERS

    found = _running_operator(args)
    if isinstance(found, int):
        return found
    store, plan = found
    handlers = (*BUILT_IN_HANDLERS, *plan.spec.handlers)
    if args.event not in handlers:
        print(f"--event: the job has no handler '{args.event}' (spec.controlHandlers and built-ins: "
              f"{', '.join(handlers)})", file=sys.stderr)
        return 2
    pairs = [arg.partition("=") for arg in args.arg]
    for key, sep, _ in pairs:
        if not sep or not key:
            print(f"--arg: '{key}' is not key=value", file=sys.stderr)
            return 2
    event = ControlEvent(uuid.uuid4().hex, args.operator, args.event, {k: v for k, _, v in pairs})
    try:
        record = ask(store, event, args.wait)
    except TimeoutError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(json.dumps(record.as_dict(), indent=2))
    if record.refused:  # the spec changed since it was read here
        print(f"refused: {record.refused}", file=sys.stderr)
        return 2
    errors = [f"{instance}: {reply['error']}" for instance, reply in record.replies.items()
              if isinstance(reply, dict) and "error" in reply]
    for line in errors:
        print(line, file=sys.stderr)
    return 1 if errors else 0


def _rebalance(args) -> int:

    from streamjobs_core.control import RescaleRequest
    from streamjobs_core.rebalance import balanced, measure, measure_committed
    from streamjobs_core.reconfigure import ask

    found = _running_operator(args)
    if isinstance(found, int):
        return found
    store, plan = found
    op = plan.head(args.operator)
    try:
        if args.dry_run:  # nothing through the job: no control event, no plan version
            load = measure_committed(store, plan, op, args.measure_s)
        else:
            load = measure(lambda event: ask(store, event, args.wait), plan, op, args.measure_s)
    except ValueError as exc:
        print(f"--operator: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as exc:
        print(f"measuring the load: {exc}", file=sys.stderr)
        return 1
    current = store.assignment(op)
    balance = balanced(current, load)
    moved = sum(a != b for a, b in zip(current.owners, balance.owners))
    print(json.dumps({"operator": op, "records_per_s": round(sum(load), 1), "moves": moved, **balance.as_dict()}))
    if args.dry_run or not moved:
        return 0
    before = len(store.rescale_history())
    store.request_rescale(RescaleRequest(op, current.parallelism, Strategy(args.strategy), balance.owners))
    return _answer(lambda: next(iter(store.rescale_history(before)), None), args.wait)


def _bench(args) -> int:
    if args.name == "autoscale":
        from .bench import autoscale

        png = str(Path(args.json).with_suffix(".png")) if args.json else None
        measured = autoscale.run(args.quick, args.scenario, png)
    elif args.name == "rescale":
        from .bench import rescale

        png = str(Path(args.json).with_suffix(".png")) if args.json else None
        measured = rescale.run(args.quick, args.state_mb, png, args.strategy)
    elif args.name == "reconfigure":
        from .bench import reconfigure

        measured = reconfigure.run(args.quick)
    elif args.name == "state":
        from .bench import state

        measured = state.run(args.quick, args.job, args.operator)
    elif args.name == "nexmark":
        from .bench import nexmark

        measured = nexmark.run(args.quick, args.runs or 1, tuple(args.cores or (1, 2)),
                               tuple(args.query or nexmark.QUERIES))
    elif args.name == "latency":
        from .bench import latency

        measured = latency.run(args.quick)
    elif args.name == "hop":
        from .bench import hop

        measured = hop.run(args.quick)
    else:
        from .bench import throughput

        measured = throughput.run(args.quick, args.runs or 3, tuple(args.cores or (1, 2)))
    result = {"bench": args.name, "quick": args.quick, **measured}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)
    return 0


def _chaos(args) -> int:
    from rich.console import Console

    from . import chaos

    duration, kills = chaos.QUICK if args.quick else chaos.FULL
    progress = Console(stderr=True, force_terminal=False, soft_wrap=True)  # the run's lines; the JSON alone goes to stdout
    result = {"chaos": True, "quick": args.quick, **chaos.run(duration, kills, args.seed, console=progress,
                                                                 marker_max_lag_records=args.marker_max_lag)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)
    ok = result["lost"] == 0 and result["duplicated"] == 0 and result["correct"] is True
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamjobs", description="Elastic, stateful stream jobs.")
    sub = parser.add_subparsers(dest="command", required=True)

    validate = sub.add_parser("validate", help="check StreamJob files; every error names its field")
    validate.add_argument("files", nargs="+")
    _allow_jvm_functions(validate)
    validate.set_defaults(func=_validate)

    crd = sub.add_parser("crd", help="print the StreamJob CRD generated from the spec model")
    crd.set_defaults(func=lambda args: sys.stdout.write(crd_yaml()) and 0)

    run = sub.add_parser("run", help="run a job on this machine with a live view")
    run.add_argument("file")
    _allow_jvm_functions(run)
    run.add_argument("--duration", type=float, default=None, help="seconds before the sources stop")
    run.add_argument("--report", default=None, help="write the JSON report here")
    _redis_url_options(run, required=False, what="use this Redis instead of starting one; a run of the job it holds "
                       "goes on from its last commits")
    run.add_argument("--fresh", action="store_true",
                     help="with --redis-url: delete what a run of the job left there and start anew")
    run.add_argument("--from-savepoint", default=None, metavar="PATH",
                     help="go on from this savepoint (`streamjobs savepoint`), the spec's changes applied live; "
                          "it replaces what the job holds in the Redis the run uses")
    _signing_key_file(run, "--from-savepoint: go on only from a savepoint signed with the key in this file")
    run.add_argument("--reset-state", action="append", default=[], metavar="STAGE",
                     help="going on (from Redis or a savepoint) under a changed spec: start this stateful stage's "
                          "state afresh at the cut; repeatable")
    run.add_argument("--no-verify", action="store_true", help="skip the oracle check")
    run.set_defaults(func=_run)

    status = sub.add_parser("status", help="a running job's operators: instances, rates, lag, busy share, rescales "
                            "and decisions")
    status.add_argument("--job", required=True, help=JOB_HELP)
    _redis_url_options(status, required=True, what="as printed by `streamjobs run`")
    status.add_argument("--json", action="store_true", help="everything, as JSON for scripts")
    status.set_defaults(func=_status)

    output = sub.add_parser("output", help="print what a redis_stream sink committed, a JSON object per record")
    _running_job_args(output, operator=False)
    output.add_argument("--sink", required=True)
    output.set_defaults(func=_output)

    rescale = sub.add_parser("rescale", help="change an operator's parallelism in a job started by `streamjobs run`")
    rescale.add_argument("--job", required=True, help=JOB_HELP)
    rescale.add_argument("--operator", required=True)
    rescale.add_argument("--parallelism", type=int, required=True)
    rescale.add_argument("--strategy", choices=STRATEGIES, default=None,
                         help="default: the job's spec.rescale.strategy")
    _redis_url_options(rescale, required=True, what="as printed by `streamjobs run`")
    rescale.add_argument("--wait", type=float, default=180.0, help="seconds to wait for the rescale to finish")
    rescale.set_defaults(func=_rescale)

    reconfigure = sub.add_parser(
        "reconfigure", help="change a running job's spec: live where it can, refused (naming the field) where not")
    reconfigure.add_argument("--job", required=True, help=JOB_HELP)
    reconfigure.add_argument("-f", "--file", required=True, help="the job's new StreamJob YAML")
    _allow_jvm_functions(reconfigure)
    _redis_url_options(reconfigure, required=True, what="as printed by `streamjobs run`")
    reconfigure.add_argument("--dry-run", action="store_true", help="print what would change and how; apply nothing")
    reconfigure.add_argument("--reset-state", action="append", default=[], metavar="STAGE",
                             help="start this stateful stage's state afresh at the cut, so that what its state "
                                  "depends on (key, window, aggregations, ...) may change; repeatable")
    reconfigure.add_argument("--wait", type=float, default=180.0, help="seconds to wait for the change to finish")
    reconfigure.set_defaults(func=_reconfigure)

    stop = sub.add_parser("stop", help="stop a job `streamjobs run --redis-url` runs: at its last commits, to go on "
                          "later from there; with --drain, after firing every window (it then ends)")
    _running_job_args(stop, operator=False)
    stop.add_argument("--drain", action="store_true", help="stop the sources, fire every open window, then stop")
    stop.add_argument("--wait", type=float, default=120.0, help="seconds to wait for every worker to stop")
    stop.set_defaults(func=_stop)

    savepoint = sub.add_parser(
        "savepoint", help="copy a job's state, offsets and watermarks, consistent, into a file to go on from later "
        "or elsewhere (`streamjobs run --from-savepoint`)")
    _running_job_args(savepoint, operator=False)
    savepoint.add_argument("--path", required=True, help="the file to write")
    _signing_key_file(savepoint, "sign the savepoint (HMAC-SHA256) with the key in this file, as the operator's "
                      "STREAMJOBS_SAVEPOINT_SIGNING_KEY (or `run --signing-key-file`) wants it")
    savepoint.add_argument("--stop", action="store_true",
                           help="stop the job at its last commits first (as `streamjobs stop`), then copy")
    savepoint.add_argument("--drain-in-flight", action="store_true",
                           help="pause the sources first and wait until every record they read went through every "
                           "operator (windows stay open), so the copy holds nothing in flight and every key group "
                           "of an edge the same watermark. Without --stop the sources go on after the copy")
    savepoint.add_argument("--wait", type=float, default=120.0,
                           help="--stop, --drain-in-flight: seconds to wait for the workers")
    savepoint.set_defaults(func=_savepoint)

    control = sub.add_parser(
        "control", help="deliver a control event in-band to every instance of an operator; print their replies")
    _running_job_args(control, operator=True)
    control.add_argument("--event", required=True, help="a handler name: spec.controlHandlers, or built in "
                         "(load: records read per key group; state: rows held per key group)")
    control.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE", help="passed to the handler")
    control.add_argument("--wait", type=float, default=180.0, help="seconds to wait for the replies")
    control.set_defaults(func=_control)

    rebalance = sub.add_parser(
        "rebalance", help="move key groups between an operator's instances by their measured load (same parallelism)")
    _running_job_args(rebalance, operator=True)
    rebalance.add_argument("--measure-s", type=float, default=10.0, help="seconds over which load is measured")
    rebalance.add_argument("--strategy", choices=STRATEGIES, default="batched", help="how the key groups move")
    rebalance.add_argument("--dry-run", action="store_true", help="print the shares before and after; move nothing")
    rebalance.add_argument("--wait", type=float, default=180.0, help="seconds to wait for the moves to finish")
    rebalance.set_defaults(func=_rebalance)

    bench = sub.add_parser("bench", help="benchmarks measured on this machine")
    bench.add_argument("name", choices=["throughput", "nexmark", "latency", "hop", "autoscale", "rescale", "state",
                                        "reconfigure"])
    bench.add_argument("--scenario", action="append", default=None,
                       help="autoscale: run only this load profile (repeatable)")
    bench.add_argument("--strategy", action="append", default=None, choices=STRATEGIES,
                       help="rescale: measure only this strategy (repeatable; default all)")
    bench.add_argument("--quick", action="store_true", help="a run of a few minutes")
    bench.add_argument("--state-mb", type=float, default=None,
                       help="rescale: the large state for handover_growth (default 500, --quick 200)")
    bench.add_argument("--job", default=None, help="state: the job to run (default examples/nexmark-q8.yaml)")
    bench.add_argument("--operator", default=None, help="state: the operator whose state is sampled (default new-users)")
    bench.add_argument("--runs", type=int, default=None,
                       help="throughput, nexmark: runs per system and core count (median, range; default 3 and 1)")
    bench.add_argument("--cores", type=int, action="append", default=None,
                       help="throughput, nexmark: measure on this many cores, every system pinned alike (repeatable; "
                       "default 1 and 2)")
    bench.add_argument("--query", action="append", default=None,
                       help="nexmark: measure only this query (q1 ... q8, ysb; repeatable; default all)")
    bench.add_argument("--json", default=None, help="write the results here")
    bench.set_defaults(func=_bench)

    chaos = sub.add_parser("chaos", help="a NEXMark job through worker SIGKILLs, a controller death and a Redis "
                           "restart, verified against the oracle")
    chaos.add_argument("--quick", action="store_true", help="4 minutes and 20 kills (else 10 minutes, 40 kills)")
    chaos.add_argument("--seed", type=int, default=1, help="the faults' random choices")
    chaos.add_argument("--marker-max-lag", type=int, default=None, metavar="RECORDS",
                       help="the job's rescale.markerMaxLagRecords (0: a key group whose owner has any backlog moves at a commit)")
    chaos.add_argument("--json", default=None, help="write the results here")
    chaos.set_defaults(func=_chaos)

    args = parser.parse_args(argv)
    _resolve_redis_url(parser, args)
    try:
        return int(args.func(args) or 0)
    except (redis.ConnectionError, redis.TimeoutError, redis.AuthenticationError) as exc:
        url = redacted(getattr(args, "redis_url", None) or "") or "the run's own redis-server"
        reason = str(exc).splitlines()[0].rstrip(".") if str(exc) else type(exc).__name__
        print(f"cannot reach Redis at {url}: {reason}. Check that redis-server runs there and that the URL (and "
              "its password) is right.", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
