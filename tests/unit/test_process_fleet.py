"""The local Fleet and its Supervisor over the in-memory job store, with processes the test plays: a scale-in
keeps the instances it removes as warm spares while the pool has room, a scale-out promotes them first, and a
spare that dies is replaced without counting as a worker's restart."""

from __future__ import annotations

import signal
from itertools import count

from streamjobs.process_fleet import ProcessFleet
from streamjobs.supervisor import Supervisor
from streamjobs_core.control import InstanceAddress, Promotion
from streamjobs_core.jobstore import MemoryJobStore

from ..jobs.control import control_plan

_PIDS = count(1000)


class Process:
    def __init__(self, argv: list[str]) -> None:
        self.argv, self.pid, self.returncode, self.signals = argv, next(_PIDS), None, []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def terminate(self) -> None:
        self.signals.append(signal.SIGTERM)
        self.returncode = -signal.SIGTERM

    def kill(self) -> None:
        self.returncode = -signal.SIGKILL

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


class Launcher:
    """Starts a Process that registers as its worker would: an instance its endpoint, a spare as ready."""

    def __init__(self, store: MemoryJobStore) -> None:
        self.store, self.started = store, []

    def start(self, log, argv: list[str], redis_url: str, spare: bool) -> Process:
        process, op = Process(argv), argv[argv.index("--operator") + 1]
        if "--spare" in argv:
            self.store.spare_ready(op, argv[argv.index("--spare") + 1])
        elif "--await-epoch" not in argv:
            self.store.register(InstanceAddress(op, int(argv[argv.index("--instance") + 1]), "127.0.0.1:1"))
        self.started.append((log.name, spare))
        return process

    def full_priority(self, worker) -> None:
        pass

    def kill_group(self, worker) -> None:
        worker.kill()


class Store(MemoryJobStore):
    def promote(self, op: str, spare: str, promotion: Promotion) -> None:
        super().promote(op, spare, promotion)
        self.register(InstanceAddress(op, promotion.instance, "127.0.0.1:1"))  # as the promoted spare does


def _fleet(tmp_path, spares: int):
    plan = control_plan(spareInstances=spares)
    store = Store()
    store.deploy(plan)
    launcher = Launcher(store)
    processes = Supervisor(store, lambda: plan.job, "redis://127.0.0.1:1", tmp_path, launcher)
    fleet = ProcessFleet(processes, lambda: plan, ready_timeout_s=5.0)
    fleet.parallelism = {"src": 1, "agg": 3}
    fleet.start_all(with_spares=True)
    return fleet, processes, launcher


def test_a_scale_in_keeps_removed_instances_as_spares_and_a_scale_out_promotes_them_first(tmp_path):
    fleet, processes, launcher = _fleet(tmp_path, spares=2)
    [first_spare] = processes.spares.pools["agg"][:1]
    fleet.remove_instances("agg", 1)  # room for none: the pool holds its 2
    assert sorted(k for k in processes.instances if k[0] == "agg") == [("agg", 0)]
    assert len(processes.spares.pools["agg"]) == 2
    assert not processes.spares.pools["src"]  # a generator runs no Spark: no spares

    fleet.add_instances("agg", 3)  # the two warm spares, oldest first; no new process
    assert processes.instances[("agg", 1)].process is first_spare.process
    assert processes.spares.promoted == 2 and not processes.spares.pools["agg"]
    started = len(launcher.started)

    second = processes.instances[("agg", 2)].process
    fleet.remove_instances("agg", 2)  # the pool is empty: instance 2 becomes a spare in place
    assert processes.spares.pools["agg"][0].process is second and second.signals == [signal.SIGUSR1]
    assert ("agg", 2) not in processes.instances and len(launcher.started) == started


def test_instances_beyond_the_pools_room_are_stopped(tmp_path):
    fleet, processes, _ = _fleet(tmp_path, spares=1)
    processes.spares.pools["agg"][0].process.kill()
    processes.spares.pools["agg"].clear()  # promoted elsewhere: the pool has room for one
    removed = [processes.instances[("agg", i)].process for i in (1, 2)]
    fleet.remove_instances("agg", 1)
    assert removed[0].signals == [signal.SIGUSR1] and removed[0].returncode is None  # a spare now
    assert removed[1].signals == [signal.SIGTERM] and removed[1].returncode is not None  # stopped
    assert (("agg", 2) in processes.jobs.registered()) is False


def test_a_dead_spare_is_replaced_on_idle_cpu_and_is_no_restart(tmp_path):
    fleet, processes, launcher = _fleet(tmp_path, spares=1)
    processes.spares.pools["agg"][0].process.kill()
    assert processes.supervise() == []
    assert processes.spares.pools["agg"][0].process.returncode is None
    assert launcher.started[-1] == ("agg-spare-s2.log", True) and processes.total_restarts == 0
