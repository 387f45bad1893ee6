"""`streamjobs run`: a job on this machine, watched live, reported and verified."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import redis
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from streamjobs_autoscaler.topology import Topology
from streamjobs_core import deadletters
from streamjobs_core.connect import redacted
from streamjobs_core.control import ControlRecord, ReconfigureRecord
from streamjobs_core.savepoint import Savepoint
from streamjobs_core.spec import StreamJob
from streamjobs_worker.ports import Ports

from . import report as reporting
from .autoscaling import local_autoscaler
from .launchers import Launcher, ProcessLauncher
from .live import LiveView, latency_samples, percentiles
from .local import LocalRuntime
from .redis_server import RedisServer
from .supervisor import JobFailed

DRAIN_TIMEOUT_S = 240.0

def run_job(
    job: StreamJob,
    duration_s: float | None = None,
    redis_url: str | None = None,
    report_path: str | None = None,
    verify: bool = True,
    console: Console | None = None,
    log_dir: str | None = None,
    during=None,
    prepare=None,
    fresh: bool = True,
    savepoint: Savepoint | None = None,
    reset: tuple[str, ...] = (),
    launcher: Launcher | None = None,
    ports: Ports | None = None,
) -> dict:
    """Run until duration (or Ctrl-C, or bounded sources finish), drain, verify, report.

    The duration counts from the moment every worker is up. `during(runtime, elapsed_s)`
    is called about every 0.5 s while the job runs (chaos in tests); `prepare(r, plan)` before
    any worker starts. Unless `fresh`, a run of the job that `redis_url` holds goes on from its
    last commits (LocalRuntime.start); from `savepoint`'s, when given. Going on under a changed spec,
    the stateful stages in `reset` start their state afresh. `launcher`: how workers start (processes by
    default; launchers.ThreadLauncher runs them in this process). `ports`: what the job runs over instead of
    Redis (Ports.in_memory, its workers threads of a ThreadLauncher over the same ports).
    """
    console = console or Console()
    with contextlib.ExitStack() as stack:
        redis_url = None if ports is not None else redis_url
        own_redis = redis_url is None and ports is None  # the run's own redis-server: it goes when the run ends
        if own_redis:
            redis_url = stack.enter_context(RedisServer()).url
        logs = Path(log_dir or tempfile.mkdtemp(prefix=f"streamjobs-{job.metadata.name}-"))
        runtime = LocalRuntime(job, redis_url, logs, launcher or ProcessLauncher(), ports=ports)
        stack.callback(runtime.shutdown)
        where = "this process's memory" if redis_url is None else redacted(redis_url)
        console.print(f"starting {job.metadata.name} on {where}: workers log to {logs}")
        try:
            return _run(runtime, console, logs, own_redis, duration_s, report_path, verify, during, prepare, fresh,
                        savepoint, reset)
        except JobFailed as exc:
            return _failed(runtime, console, exc, logs, report_path)


def _run(runtime: LocalRuntime, console: Console, logs: Path, own_redis: bool, duration_s, report_path, verify,
         during, prepare, fresh, savepoint, reset) -> dict:
    job = runtime.job
    if runtime.start(prepare=prepare, fresh=fresh, savepoint=savepoint, reset=reset):
        origin = "the savepoint" if savepoint else f"its last commits in {redacted(runtime.redis_url)}"
        console.print(f"resumed {job.metadata.name} from {origin}")
    for note in runtime.notes:
        console.print(escape(note))
    started = time.monotonic()
    started_ms = int(time.time() * 1000)
    view = LiveView(runtime.ports, runtime.plan, runtime.parallelism)
    autoscaler, events = local_autoscaler(runtime, console)
    interrupted = _run_live(runtime, view, console, duration_s, during, started, autoscaler)
    if runtime.jobs.suspend_requested():
        return _suspend(runtime, console, time.monotonic() - started, logs, report_path, own_redis)
    if not interrupted:
        _resume_rescale(runtime, console)  # a controller that died in the last tick left it half done
    stopped_ms = int(time.time() * 1000)
    runtime.request_stop()
    console.print("stopping sources; draining in-flight records ...")
    drained = runtime.wait_drained(DRAIN_TIMEOUT_S)
    elapsed = time.monotonic() - started
    result = {
        "job": job.metadata.name,
        "duration_s": round(elapsed, 2),
        "interrupted": interrupted,
        "drained": drained,
        "restarts": runtime.restarts(),
        "spares_promoted": runtime.processes.spares.promoted,
        "operators": reporting.committed_counts(runtime.ports.exchange, runtime.plan),
        "sinks": reporting.sink_counts(runtime.ports.exchange, runtime.plan),
        "latency_ms": percentiles(latency_samples(runtime.ports.exchange, runtime.keys)),
        # The first batches pay Spark's query compilation and JIT, and the drain fires every
        # open window at once: the second half of the run shows the steady state.
        "latency_second_half_ms": percentiles(
            latency_samples(runtime.ports.exchange, runtime.keys, (started_ms + stopped_ms) // 2, stopped_ms)
        ),
        "dead_letters": runtime.ports.exchange.length([runtime.keys.dead_letter])[0],
        "dead_letters_by_operator": reporting.dead_letter_counts(runtime.ports.exchange, runtime.plan),
        # per operator and kind (undecodable, oversize, future, rejected, late, quarantined)
        "dead_letters_by_kind": deadletters.totals(runtime.ports.exchange, runtime.keys.dead_letter_totals),
        "shed": {op.decode(): int(n) for op, n in runtime.ports.exchange.hashes([runtime.keys.shed_totals])[0].items()},
        "rescales": [record.as_dict() for record in runtime.jobs.rescale_history()],
        "reconfigurations": [record.as_dict() for record in runtime.jobs.reconfigure_history()],
        "control_events": [record.as_dict() for record in runtime.jobs.control_history()],
        "autoscaler": {
            "policy": job.spec.autoscaler.policy,
            "decisions": [_timed(entry, entry.get("time"), started, started_ms) for entry in autoscaler.log.entries()],
            "events": [_timed(event, event["time"] - started_ms / 1000 + started, started, started_ms)
                       for event in events.events],
            "final_parallelism": dict(runtime.parallelism),
        },
    }
    runtime.shutdown()
    if verify:
        result["verification"] = _verify(runtime, drained, logs)
    report = _write_report(result, report_path, logs)
    _summary(console, result, report)
    return result


def _timed(entry: dict, monotonic: float | None, started: float, started_ms: int) -> dict:
    """An entry timed by the run's monotonic clock, also in seconds since the run started and as wall time."""
    if monotonic is None:
        return entry
    since = monotonic - started
    at = datetime.fromtimestamp(started_ms / 1000 + since, UTC).isoformat(timespec="milliseconds")
    return {**entry, "t_s": round(since, 2), "at": at}


def _failed(runtime: LocalRuntime, console: Console, exc: JobFailed, logs: Path, report_path: str | None) -> dict:
    """A worker said the job cannot go on, or one kept dying: everything stops, and the report says why."""
    runtime.shutdown()
    failure = exc.failure
    result = {"job": runtime.job.metadata.name, "failed": {"operator": failure.operator, "instance": failure.instance,
                                                         "cause": failure.cause, "input": failure.where},
              "restarts": runtime.restarts()}
    if runtime.plan is not None:
        result["operators"] = reporting.committed_counts(runtime.ports.exchange, runtime.plan)
        result["dead_letters_by_operator"] = reporting.dead_letter_counts(runtime.ports.exchange, runtime.plan)
    report = _write_report(result, report_path, logs)
    console.print(escape(f"FAILED: {failure.describe()}"))
    console.print(f"worker logs: {logs}; report: {report}")
    return result


def _suspend(runtime, console, elapsed: float, logs: Path, report_path: str | None, own_redis: bool) -> dict:
    """`streamjobs stop` without --drain: every worker stops after its current commit, and the job's state,
    offsets and open windows stay in Redis for `streamjobs run --redis-url` to go on from (nothing is fired
    or verified: the output is whole only once the job has drained)."""
    runtime.shutdown()
    result = {"job": runtime.plan.name, "duration_s": round(elapsed, 2), "suspended": True,
              "restarts": runtime.restarts(),
              "operators": reporting.committed_counts(runtime.ports.exchange, runtime.plan),
              "reconfigurations": [record.as_dict() for record in runtime.jobs.reconfigure_history()]}
    report = _write_report(result, report_path, logs)
    if own_redis:
        console.print(f"suspended, but in the run's own Redis, which ends with it: nothing to go on from. Run with "
                      f"--redis-url to suspend and resume. Report: {report}")
    else:
        console.print("suspended at its last commits: `streamjobs run <file> --redis-url "
                      f"{redacted(runtime.redis_url)}` goes on from there. Report: {report}")
    return result


def _write_report(result: dict, report_path: str | None, logs: Path) -> Path:
    """The whole report goes to a file (the log folder's when no path is given); the terminal gets a summary."""
    report = Path(report_path) if report_path else logs / "report.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(result, indent=2))
    return report


def _run_live(runtime, view, console, duration_s, during, started, autoscaler) -> bool:
    deadline = None if duration_s is None else started + duration_s
    rescales = len(runtime.jobs.rescale_history())
    try:
        with Live(console=console, refresh_per_second=2, transient=False) if console.is_terminal \
                else contextlib.nullcontext() as live:
            draw = _Drawing(view, console, live)
            runtime.while_waiting = draw.now  # a rescale or reconfiguration holds the loop: the view goes on
            while deadline is None or time.monotonic() < deadline:
                if during is not None:
                    during(runtime, time.monotonic() - started)
                try:
                    if _tick(runtime, console, autoscaler):
                        return False  # bounded sources have finished
                    rescales = _rescaled(runtime, console, rescales)
                    if runtime.jobs.suspend_requested():
                        return False
                    view.plan = runtime.plan  # a live reconfiguration adds and removes operators
                    draw.now()
                except redis.ConnectionError as exc:  # BusyLoadingError too: Redis replays its AOF
                    # The workers die and are restarted from their commits; the runtime waits it out.
                    console.print(f"redis unavailable ({exc}); retrying")
                    time.sleep(0.5)
                    continue
                time.sleep(0.5)
    except KeyboardInterrupt:
        return True
    finally:
        runtime.while_waiting = lambda: None
    return False


class _Drawing:
    """The live table (a line every 5 s where the output is not a terminal), drawn at most twice a second."""

    def __init__(self, view: LiveView, console: Console, live) -> None:
        self.view, self.console, self.live = view, console, live
        self.last = self.last_line = 0.0

    def now(self) -> None:
        if time.monotonic() - self.last < 0.5:
            return
        self.last = time.monotonic()
        rows = self.view.rows()
        if self.live is not None:
            self.live.update(self.view.render(rows))
        elif self.last - self.last_line >= 5:
            self.last_line = self.last
            self.console.print(" | ".join(f"{r['operator']} inst {r['parallelism']} in {r['in_per_s']:.0f}/s lag "
                                          f"{r['lag']:.0f}" for r in rows))


def _rescaled(runtime, console, seen: int) -> int:
    """Say each rescale that ended since the `seen` first, whoever asked for it (the CLI, the autoscaler)."""
    history = runtime.jobs.rescale_history(seen)
    for record in history:
        if record.rolled_back:
            console.print(f"rescale of {record.operator} {record.from_parallelism} -> {record.to_parallelism} "
                          "rolled back")
            continue
        took = f" in {record.rescale_s:.1f} s" if record.rescale_s is not None else ""
        console.print(f"rescaled {record.operator} {record.from_parallelism} -> {record.to_parallelism} "
                      f"({record.strategy.value}){took}: key groups paused {record.pause_ms:,.0f} ms at most")
    return seen + len(history)


def _tick(runtime, console, autoscaler) -> bool:
    """Supervise, finish a rescale a dead controller left, carry out requests, let the autoscaler decide;
    True when bounded sources have finished."""
    for what in runtime.supervise():
        console.print(escape(f"worker died: {what}"))
    _resume_rescale(runtime, console)
    # escape: a change names its operator in brackets (spec.stages[tag]), which rich would take for a style
    try:
        for record in runtime.handle_requests():
            if isinstance(record, ReconfigureRecord):
                if record.refused or record.version is None:
                    said = (f"reconfiguration refused: {record.refused}" if record.refused else
                            f"reconfigured: {'; '.join(record.changes)}")
                else:
                    said = (f"reconfigured live to plan version {record.version} in {record.duration_s:.1f} s "
                            f"(input held back {record.pause_ms:.0f} ms at most): {'; '.join(record.changes)}")
            elif isinstance(record, ControlRecord):
                event = record.event
                said = f"control event {event.name} -> {event.operator}: " + (
                    f"refused: {record.refused}" if record.refused else
                    f"{len(record.replies)} replies at plan version {record.version}")
            else:
                continue  # a rescale is said once it ended, whoever asked for it (_rescaled)
            console.print(escape(said))
    except (redis.ConnectionError, JobFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - what it left in Redis is resumed or rolled back next tick
        console.print(escape(f"rescale or reconfiguration failed: {exc}"))
    autoscaler.follow(Topology.of(runtime.plan))
    autoscaler.tick()
    return runtime.drained()


def _resume_rescale(runtime, console) -> None:
    resumed = runtime.resume_rescale()
    if resumed is not None:
        console.print(f"resumed the rescale a dead controller left: {resumed.operator} "
                      f"{resumed.from_parallelism} -> {resumed.to_parallelism} "
                      f"({'rolled back' if resumed.rolled_back else 'done'})")


def _verify(runtime: LocalRuntime, drained: bool, logs: Path) -> dict:
    from streamjobs_worker import spark

    from . import oracle

    if not drained:
        return {"correct": False, "reason": "the job did not drain; its output is incomplete"}
    try:
        with _jvm_console_to(logs / "oracle-spark.log"):
            session = spark.session("local[2]", "2g")
        return oracle.verify(session, runtime.ports, runtime.plan)
    except Exception as exc:  # noqa: BLE001 - a verification that cannot finish says so; the report is written
        lines = str(exc).strip().splitlines()
        return {"correct": None, "reason": f"the verification could not finish: {type(exc).__name__}: "
                                           f"{lines[0][:500] if lines else ''} (see {logs / 'oracle-spark.log'})"}


@contextlib.contextmanager
def _jvm_console_to(path: Path):
    """A JVM started inside writes its console (Spark's own log lines) to `path` for good: it inherits fds 1
    and 2, which are this process's again afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)

def _summary(console: Console, result: dict, report: Path) -> None:
    table = Table(title=f"{result['job']}: {result['duration_s']:.0f} s", title_justify="left")
    for column in ("operator", "records in", "records out", "dead letters"):
        table.add_column(column, justify="left" if column == "operator" else "right")
    for op, counts in result["operators"].items():
        table.add_row(op, f"{counts['records_in']:,}", f"{counts['records_out']:,}",
                      f"{result['dead_letters_by_operator'].get(op, 0):,}")
    console.print(table)
    latency = result["latency_ms"]
    if latency.get("p50_ms") is not None and latency["p50_ms"] > (result["duration_s"] + 60) * 1000:
        console.print("latency at the sinks: not shown, results are timed from event times older than the run "
                      "(input written before it)")
    elif latency.get("p50_ms") is not None:
        console.print(f"latency at the sinks: p50 {latency['p50_ms']:,.0f} ms, "
                      f"p99 {latency['p99_ms']:,.0f} ms, max {latency['max_ms']:,.0f} ms")
        half = result["latency_second_half_ms"]
        if half.get("p50_ms") is not None:
            console.print(f"  second half of the run: p50 {half['p50_ms']:,.0f} ms, p99 {half['p99_ms']:,.0f} ms "
                          "(without the first batches' compilation and JIT warm-up, and the drain)")
    for op, shed in result["shed"].items():
        console.print(f"load shedding: source {op} dropped {shed:,} records (each batch logged in the shed stream)")
    verification = result.get("verification")
    if verification:
        console.print(escape(_verdict(verification)))
    console.print(f"report: {report}")


def _verdict(verification: dict) -> str:
    correct = verification.get("correct")
    if correct is None:
        return f"verification: not decided ({verification.get('reason')})"
    said = (f"verification: {'correct' if correct else 'NOT correct'}, lost {verification.get('lost')}, "
            f"duplicated {verification.get('duplicated')}, unexpected {verification.get('unexpected')}")
    left_out = {op: n for op, kinds in (verification.get("left_out") or {}).items() for n in [sum(kinds.values())]}
    if left_out:
        said += "; left out as the job dead-lettered them: " + ", ".join(f"{op} {n:,}" for op, n in left_out.items())
    unchecked = [name for name, sink in verification.get("sinks", {}).items() if sink.get("checked") is False]
    if unchecked:
        said += f"; not compared: {', '.join(unchecked)} (see the report)"
    return said + (f" ({verification['reason']})" if verification.get("reason") else "")


def stop_on_terminal_signals() -> None:
    """SIGTERM and SIGHUP (a closed terminal) stop a run as Ctrl-C does: drained, verified, its redis-server
    and workers gone."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

