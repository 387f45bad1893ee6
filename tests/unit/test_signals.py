"""What stops a worker: a stop asked before its first life began holds (a pod deleted as it starts must not
leave a worker running); a demotion gives the next life, as a spare, fresh events."""

from __future__ import annotations

from streamjobs_worker.__main__ import Signals


def test_a_stop_before_the_first_life_holds():
    signals = Signals()
    signals.terminate()  # SIGTERM while the process was still connecting
    stop, demoted = signals.next_life()
    assert stop.is_set() and not demoted.is_set()


def test_a_demoted_worker_serves_again_with_fresh_events_and_a_stop_then_reaches_it():
    signals = Signals()
    stop, _ = signals.next_life()
    signals.demote()
    assert stop.is_set()
    again, demoted = signals.next_life()
    assert not again.is_set() and not demoted.is_set() and again is not stop
    signals.terminate()
    assert again.is_set()


def test_a_stop_right_after_a_demotion_ends_the_worker_instead_of_its_next_life_as_a_spare():
    signals = Signals()
    signals.next_life()
    signals.demote()  # a pod's scale-in: it saw it is no longer an instance ...
    signals.terminate()  # ... and the StatefulSet removes it at once
    stop, _ = signals.next_life()
    assert stop.is_set()
