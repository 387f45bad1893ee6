"""`python -m streamjobs_worker --redis-url URL --job NAME --operator OP --instance I`"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from streamjobs_core.connect import connect
from streamjobs_core.layout import JobKeys
from streamjobs_core.plan import JobPlan

from .standby import await_epoch
from .worker import Worker


def main(argv: list[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    r = connect(args.redis_url)
    plan = JobPlan.from_json(r.get(JobKeys(args.job).plan))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    prestaged = None
    if args.await_epoch is not None:
        proceed, prestaged = await_epoch(r, plan, args.operator, args.instance, args.await_epoch, stop)
        if not proceed:
            return 0
    Worker(r, plan, args.operator, args.instance, args.metrics_host, args.metrics_port, args.advertise_host,
           prestaged).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
