"""`python -m streamjobs_worker --redis-url URL --job NAME --operator OP (--instance I | --spare ID)`"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from streamjobs_core.connect import Credentials, connect
from streamjobs_core.control import EXIT_FAILED, JobFailure
from streamjobs_core.reconfigure import plan_for
from streamjobs_core.spares import await_promotion, pod_spare, serves_as_instance, watch_demotion

from .parent import die_with_parent
from .ports import Ports
from .quarantine import Exhausted
from .rehearsal import SPARE_REHEARSALS, warm_up
from .stages import StageBroken
from .standby import await_epoch
from .worker import Retired, Worker


class Signals:
    """What stops a worker: a stop (SIGTERM, SIGINT) lets it finish its batch and end; a demotion (the fleet's
    SIGUSR1, a scale-in) stops it too, after which it lets go of the instance and waits as a spare again. A
    process gets them as signals (`installed`); a worker run in a thread (launchers.py) from its owner."""

    def __init__(self) -> None:
        self.stop, self.demoted = threading.Event(), threading.Event()
        self.terminated = False  # a stop asked for: it holds across a demotion that came just before it

    @classmethod
    def installed(cls) -> Signals:
        signals = cls()
        signal.signal(signal.SIGTERM, lambda *_: signals.terminate())
        signal.signal(signal.SIGINT, lambda *_: signals.terminate())
        signal.signal(signal.SIGUSR1, lambda *_: signals.demote())
        return signals

    def next_life(self) -> tuple[threading.Event, threading.Event]:
        """(stop, demoted) for the worker's next life: new ones after a demotion (it serves again as a spare),
        else the same, so that a stop asked before its first life began (a pod deleted as it starts) holds."""
        if self.demoted.is_set() and not self.terminated:
            self.stop, self.demoted = threading.Event(), threading.Event()
        return self.stop, self.demoted

    def terminate(self) -> None:
        self.terminated = True
        self.stop.set()

    def demote(self) -> None:
        self.demoted.set()
        self.stop.set()


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    args = arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return serve(args, Signals.installed())


def serve(args: argparse.Namespace, signals: Signals, ports: Ports | None = None) -> int:
    """A worker's whole life, as its arguments say, until stopped or retired; its exit status. `ports`: what it
    runs over, when its owner hands them (a worker run in a thread); else the job's Redis at --redis-url."""
    ports = ports or Ports.over_redis(connect(args.redis_url, args.credentials), args.job)
    try:
        return _serve(ports, args, signals)
    except (StageBroken, Exhausted) as exc:
        failure = exc.failure if isinstance(exc, Exhausted) else JobFailure(args.operator, args.instance, str(exc))
        ports.jobs.fail(failure)
        logging.getLogger(__name__).error("the job cannot go on: %s", failure.describe())
        return EXIT_FAILED


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="streamjobs_worker")
    parser.add_argument("--redis-url", default=os.environ.get("STREAMJOBS_REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument("--job", required=True)
    parser.add_argument("--operator", required=True)
    parser.add_argument("--instance", type=int, default=int(os.environ.get("STREAMJOBS_INSTANCE", "0")))
    parser.add_argument("--metrics-host", default=os.environ.get("STREAMJOBS_METRICS_HOST", "127.0.0.1"))
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("STREAMJOBS_METRICS_PORT", "0")),
                        help="0: any free port (several instances share a host in the local runtime)")
    parser.add_argument("--advertise-host", default=os.environ.get("STREAMJOBS_POD_IP"),
                        help="address others scrape /metrics at (default: --metrics-host)")
    parser.add_argument(
        "--await-epoch", type=int, default=None,
        help="start as a standby: warm up Spark, then wait until the operator's assignment reaches this epoch",
    )
    parser.add_argument(
        "--spare", default=None, metavar="ID",
        help="start as a warm spare: warm up Spark, then wait to be promoted to an instance (spares.py)",
    )
    parser.add_argument(
        "--pod-spares", action="store_true",
        help="a pod of a StatefulSet with warm spares: the ordinal (--instance) beyond the parallelism waits as a "
        "spare, and an instance a scale-in empties becomes one again (spares.py)",
    )
    args = parser.parse_args(argv)
    args.credentials = Credentials.taken_from_env()
    return args


def _serve(ports: Ports, args: argparse.Namespace, signals: Signals) -> int:
    """Run as the instance (or spare, or standby) the arguments say, until stopped or retired."""
    jobs = ports.jobs
    plan = plan_for(jobs, args.operator)
    log = logging.getLogger(__name__)
    spare, instance, epoch, warm = args.spare, args.instance, args.await_epoch, False
    if args.pod_spares and spare is None and epoch is None and not serves_as_instance(jobs, args.operator, instance):
        spare = pod_spare(instance)
        jobs.unregister(args.operator, instance)  # what a crash as that instance left: it is a spare now
    while True:
        stop, demoted = signals.next_life()
        if spare is not None:
            if not warm:
                warm_up(ports, plan, args.operator, SPARE_REHEARSALS)
                warm = True
            jobs.spare_ready(args.operator, spare)
            promotion = await_promotion(jobs, args.operator, spare, stop)
            if promotion is None:
                jobs.spare_gone(args.operator, spare)  # not to be promoted while it is gone or starting anew
                return 0
            if args.pod_spares and not serves_as_instance(jobs, args.operator, promotion.instance):
                log.info("spare %s: a promotion withdrawn since (a scale-out rolled back)", spare)
                continue
            instance, epoch = promotion.instance, promotion.await_epoch
            log.info("spare %s promoted to %s/%d%s", spare, args.operator, instance,
                     "" if epoch is None else f" (standby of epoch {epoch})")
        prestaged = None
        if epoch is not None:
            proceed, prestaged = await_epoch(ports, plan, args.operator, instance, epoch, stop, warm)
            if not proceed:
                return 0
            warm = True
        try:
            worker = Worker(ports, plan, args.operator, instance, args.metrics_host, args.metrics_port,
                            args.advertise_host, prestaged, warm)
        except Retired as exc:  # restarted after its chain was removed: the runtime stops it
            log.info("%s", exc)
            stop.wait()
            return 0
        if args.pod_spares:
            threading.Thread(target=watch_demotion, args=(jobs, args.operator, instance, signals.demote, stop),
                             name="demotion", daemon=True).start()
        worker.run(stop)
        if not demoted.is_set():
            return 0
        worker.close()
        if args.pod_spares:
            jobs.unregister(args.operator, instance)
            spare = pod_spare(instance)
        else:
            spare = jobs.demoted_as(args.operator, instance)
        epoch, warm = None, True
        if spare is None:
            return 0
        log.info("%s/%d demoted to spare %s", args.operator, instance, spare)


if __name__ == "__main__":
    sys.exit(main())
