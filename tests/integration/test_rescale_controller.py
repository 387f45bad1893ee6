"""`streamjobs status` reads the rescale in progress from a real Redis (the controller's own tests run against
the in-memory store: tests/unit/test_rescale_controller.py)."""

from __future__ import annotations

import json

from streamjobs_core.control import Phase, RescaleState, Strategy


def test_status_command_shows_the_rescale_in_progress_and_its_standbys(jobs, redis_server, capsys):
    from streamjobs.cli import main

    state = RescaleState("agg", 2, 3, Strategy.ALL_AT_ONCE, 2, Phase.PRESTAGE, 10.0)
    jobs.save_rescale(state)
    for instance, lag in ((0, 12), (1, 340)):
        jobs.report_standby("agg", instance, 2)
        jobs.report_standby_lag("agg", instance, lag)
    assert main(["status", "--job", "ctl", "--redis-url", redis_server.url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    agg = next(op for op in shown["operators"] if op["operator"] == "agg")
    assert (agg["parallelism"], agg["epoch"]) == (2, 1)
    assert shown["rescale_in_progress"] == {**state.as_dict(), "standbys_ready": 2, "standby_lag": 340}
