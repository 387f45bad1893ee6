"""A lookup stage in a running job: enrichment from a Redis table, exact through a SIGKILL of its worker."""

from __future__ import annotations

from .conftest import assert_exact, killer


def _table(r, plan) -> None:
    """Categories for the 100 most frequent of the 200 words; the rest have no row and are dropped (inner)."""
    pipe = r.pipeline()
    for rank in range(1, 101):
        pipe.hset(f"categories:w{rank}", mapping={"category": f"c{rank % 7}", "weight": str(rank % 5)})
    pipe.execute()


def test_an_enriched_job_survives_a_sigkill_of_its_lookup_worker_exactly(run_in_process):
    kills = killer([(6.0, "words", 1)])  # the source's chain runs the lookup
    report = run_in_process("tests/jobs/enriched-words.yaml", 16, during=kills, prepare=_table)
    assert kills.killed == ["words/1"] and report["restarts"] >= 1
    assert_exact(report)
    counts = report["operators"]
    # Zipf: the top 100 of 200 words are most of the records, never all of them.
    assert 0.5 * counts["words"]["records_out"] < counts["enrich"]["records_out"] < counts["words"]["records_out"]
    assert report["verification"]["sinks"]["totals"]["expected"] > 7  # several windows of seven categories
