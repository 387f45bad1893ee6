"""The same cores for every system a benchmark compares, and the CPU each of them really uses.

`pinned(cores)` puts every thread of this process, and of every process it has
started, on the first `cores` cores it may use, until the block ends; threads
and processes started meanwhile inherit that. Pinning every existing thread
matters: `os.sched_setaffinity(0, ...)` sets the calling thread only, so a JVM
or a redis-server started earlier would go on using every core.

`CpuClock` samples, every few milliseconds, the CPU-seconds (user + system,
from /proc/PID/stat, all threads) summed over this process and every process
it has started, with the wall time and the progress a caller reads. A stretch
of a run is then read off at its own bounds: its records, its seconds and its
CPU-seconds. A process that exits keeps its last sample in the sum.
"""

from __future__ import annotations

import bisect
import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


def first_cores(cores: int) -> set[int]:
    allowed = sorted(os.sched_getaffinity(0))
    if not 1 <= cores <= len(allowed):
        raise ValueError(f"cores must be in [1, {len(allowed)}] (the cores this process may use), got {cores}")
    return set(allowed[:cores])


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (which may hold spaces and parentheses)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2:].split()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU-seconds of a process, all its threads; None once it is gone."""
    fields = _stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime (fields 14 and 15 of stat)


def family(root: int | None = None) -> list[int]:
    """`root` (this process by default) and every process descended from it."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _command(pid: int) -> list[str] | None:
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError):
        return None


def role(pid: int) -> str | None:
    """What a process is, for a profile: a worker and its operator, a JVM and whose, or its command's name; None
    when that cannot be told (it exited, has not exec'd yet, or is a JVM whose parent is gone)."""
    args, fields = _command(pid), _stat(pid)
    if args in (None, [""]) or fields is None or _command(int(fields[1])) == args:
        return None  # exited (a zombie has no command line left), or forked and not yet exec'd
    if "streamjobs_worker" in args and "--operator" in args[:-1]:
        return f"worker {args[args.index('--operator') + 1]}"
    if pid == os.getpid():
        return "this process"
    if any("multiprocessing" in arg for arg in args):
        return "a process this one spawned"  # a peer's driver, or a run of ours with its oracle
    name = Path(args[0]).name.split()[0]
    if name == "java":
        parent = role(int(fields[1]))
        return None if parent is None else f"jvm of {parent}"  # None: its parent is gone, so is what it was
    return name


def _pin_family(cores: set[int]) -> None:
    for pid in family():
        with contextlib.suppress(FileNotFoundError):
            for task in (_PROC / str(pid) / "task").iterdir():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.sched_setaffinity(int(task.name), cores)


@contextlib.contextmanager
def pinned(cores: int) -> Iterator[set[int]]:
    """This process and its descendants, every thread, on the first `cores` allowed cores; the set of them."""
    allowed = os.sched_getaffinity(0)
    chosen = first_cores(cores)
    _pin_family(chosen)
    try:
        yield chosen
    finally:
        _pin_family(allowed)


@dataclass(frozen=True)
class Stretch:
    """A measured part of a run: `records` in `seconds` of wall time, using `cpu_seconds` of CPU."""

    records: int
    seconds: float
    cpu_seconds: float
    start: float  # time.time() at its beginning

    @property
    def end(self) -> float:
        return self.start + self.seconds

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_s_per_million(self) -> float:
        return self.cpu_seconds / self.records * 1e6

    def as_dict(self) -> dict:
        return {"records_per_s": self.records_per_s, "cpu_s_per_million": self.cpu_s_per_million,
                "records": self.records, "seconds": self.seconds, "cpu_seconds": self.cpu_seconds}


class CpuClock:
    """`with CpuClock(progress) as clock:` samples (wall time, CPU-seconds of this process's family, progress())."""

    def __init__(self, progress: Callable[[], int] | None = None, interval_s: float = 0.05,
                 family_every_s: float = 0.5) -> None:
        self._progress = progress or (lambda: 0)
        self._interval_s = interval_s
        # Finding the family walks all of /proc, and naming its processes reads their command lines: both
        # less often than the samples, which read the known processes' stat files only (the clock's own CPU
        # is counted against whatever it measures).
        self._family_every_s = family_every_s
        self._family: list[int] = []
        self._family_at = float("-inf")
        self._last: dict[int, float] = {}  # per process: its latest CPU-seconds (kept once it exits)
        self._roles: dict[int, str] = {}
        self.per_process: list[dict[int, float]] = []
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.progress: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu clock", daemon=True)

    def __enter__(self) -> CpuClock:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        self._family_at = float("-inf")
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()

    def sample(self) -> None:
        named = time.monotonic() >= self._family_at + self._family_every_s
        if named:
            self._family, self._family_at = family(), time.monotonic()
        for pid in self._family:
            if (seconds := cpu_seconds(pid)) is not None:
                self._last[pid] = seconds
                if named and (now := role(pid)) is not None:  # again: a process may exec another (bash -> java)
                    self._roles[pid] = now
        progress = self._progress()
        self.times.append(time.time())
        self.cpu.append(sum(self._last.values()))
        self.per_process.append(dict(self._last))
        self.progress.append(progress)

    def profile(self, start: float, end: float) -> dict[str, float]:
        """CPU-seconds per kind of process (role) between the samples nearest two moments, largest first."""
        first, last = (self.per_process[self._nearest(moment)] for moment in (start, end))
        used: dict[str, float] = {}
        for pid, seconds in last.items():
            label = self._roles.get(pid, "gone")
            used[label] = used.get(label, 0.0) + seconds - first.get(pid, 0.0)
        return dict(sorted(((k, round(v, 3)) for k, v in used.items() if v > 0), key=lambda kv: -kv[1]))

    def _nearest(self, moment: float) -> int:
        i = bisect.bisect_left(self.times, moment)
        if i == len(self.times) or (i > 0 and moment - self.times[i - 1] < self.times[i] - moment):
            return i - 1
        return i

    def cpu_at(self, moment: float) -> float:
        """CPU-seconds used by the family up to `moment` (time.time()), interpolated between samples."""
        i = bisect.bisect_left(self.times, moment)
        if i == 0:
            return self.cpu[0]
        if i == len(self.times):
            return self.cpu[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        share = (moment - t0) / (t1 - t0) if t1 > t0 else 1.0
        return self.cpu[i - 1] + share * (self.cpu[i] - self.cpu[i - 1])

    def stretch(self, start: float, end: float, records: int) -> Stretch:
        """`records` done between two moments (time.time()), with the CPU used in between."""
        if end <= start:
            raise ValueError(f"a stretch must end after it starts ({start} .. {end})")
        return Stretch(records, end - start, self.cpu_at(end) - self.cpu_at(start), start)

    def progress_stretch(self, total: int, skip_fraction: float = 0.25) -> Stretch:
        """From the first sample past `skip_fraction` of `total` (warm-up left out) to the first that saw all of it."""
        begin = next((i for i, done in enumerate(self.progress) if done >= total * skip_fraction), None)
        end = next((i for i, done in enumerate(self.progress) if done >= total), None)
        if begin is None or end is None or end <= begin:
            raise ValueError(f"the progress never went from {skip_fraction:.0%} to all of {total} between two "
                             f"samples (last seen: {self.progress[-1] if self.progress else None})")
        return Stretch(self.progress[end] - self.progress[begin], self.times[end] - self.times[begin],
                       self.cpu[end] - self.cpu[begin], self.times[begin])


def spread(values: list[float]) -> dict:
    """Median and range of runs, and the runs themselves."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {"median": median, "min": ordered[0], "max": ordered[-1], "runs": values}


MEASURES = ("records_per_s", "cpu_s_per_million")


def summary(runs: list[dict]) -> dict:
    """Median and range of each measure over the runs; a run's error, when one failed, is the summary."""
    if any("error" in run for run in runs):
        return {"error": next(run["error"] for run in runs if "error" in run)}
    return {key: spread([run[key] for run in runs]) for key in MEASURES} | {"runs": runs}


def ratios(ours: dict, peer: dict) -> dict:
    """Ours over the peer in rate, the peer over ours in CPU per record (summaries): >= 1 when ours is better."""
    return {"rate": ours["records_per_s"]["median"] / peer["records_per_s"]["median"],
            "cpu": peer["cpu_s_per_million"]["median"] / ours["cpu_s_per_million"]["median"]}


def apart(function: Callable, *args):
    """`function(*args)` in a spawned process of its own, which inherits this one's cores: a JVM it starts, and
    the error handling PySpark installs in Py4J, stay out of this process and go with the call."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()
