"""What `streamjobs run` says while a job runs: every rescale once it ended, whoever asked for it; the view drawn
while a rescale holds the loop; report times in seconds since the start and as wall time."""

from __future__ import annotations

import io

from rich.console import Console
from streamjobs.run import _Drawing, _rescaled, _timed
from streamjobs_core.control import Phase, RescaleRecord, RescaleState, Strategy
from streamjobs_core.jobstore import MemoryJobStore


class _Runtime:
    def __init__(self) -> None:
        self.jobs = MemoryJobStore()


def _ended(jobs: MemoryJobStore, op: str, to: int, rolled_back: bool = False) -> None:
    state = RescaleState(op, 1, to, Strategy.BATCHED, 2, Phase.RETIRE, 0.0)
    jobs.end_rescale(RescaleRecord.of(state, 250.0, None if rolled_back else 12.3, rolled_back=rolled_back))


def test_each_rescale_is_said_once_when_it_ended_whoever_asked_for_it():
    runtime, out = _Runtime(), io.StringIO()
    console = Console(file=out, width=200)
    seen = _rescaled(runtime, console, 0)
    _ended(runtime.jobs, "count", 4)  # the autoscaler's: no request printed it
    seen = _rescaled(runtime, console, seen)
    _ended(runtime.jobs, "join", 3, rolled_back=True)
    seen = _rescaled(runtime, console, seen)
    assert _rescaled(runtime, console, seen) == seen == 2
    assert out.getvalue().splitlines() == [
        "rescaled count 1 -> 4 (batched) in 12.3 s: key groups paused 250 ms at most",
        "rescale of join 1 -> 3 rolled back"]


def test_the_view_is_drawn_from_a_controller_wait_at_most_twice_a_second():
    class View:
        calls = 0

        def rows(self):
            View.calls += 1
            return [{"operator": "count", "parallelism": "2/4", "in_per_s": 10.0, "lag": 5}]

    out = io.StringIO()
    draw = _Drawing(View(), Console(file=out, width=200), None)
    for _ in range(5):
        draw.now()
    assert View.calls == 1 and out.getvalue().strip() == "count inst 2/4 in 10/s lag 5"


def test_report_times_are_seconds_since_the_start_and_wall_time():
    timed = _timed({"operator": "count"}, 112.5, 100.0, 1_767_225_600_000)
    assert timed["t_s"] == 12.5 and timed["at"] == "2026-01-01T00:00:12.500+00:00"
