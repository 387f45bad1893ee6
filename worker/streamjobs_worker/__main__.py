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

from .worker import Worker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamjobs_worker")
    parser.add_argument("--redis-url", default=os.environ.get("STREAMJOBS_REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument("--job", required=True)
    parser.add_argument("--operator", required=True)
    parser.add_argument("--instance", type=int, default=int(os.environ.get("STREAMJOBS_INSTANCE", "0")))
    parser.add_argument("--metrics-host", default=os.environ.get("STREAMJOBS_METRICS_HOST", "127.0.0.1"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    r = connect(args.redis_url)
    plan = JobPlan.from_json(r.get(JobKeys(args.job).plan))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    Worker(r, plan, args.operator, args.instance, args.metrics_host).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
