"""`bench nexmark`'s pieces that need no JVM: the jobs it runs, the Flink SQL it writes, the events file it feeds."""

from __future__ import annotations

import numpy as np
import pyarrow.csv as pacsv
import pytest
from streamjobs.bench import nexmark
from streamjobs.bench.flink import nexmark_sql
from streamjobs_core import generators
from streamjobs_core.loading import load_document


@pytest.mark.parametrize("query", nexmark.QUERIES)
def test_every_query_is_its_example_bounded_fast_into_its_own_sinks_with_flink_sql_and_a_note(query, tmp_path):
    job = nexmark.bench_job(query, 50_000, tmp_path / "out")
    source = job.spec.sources[0]
    assert source.total_records == 50_000 and source.rate.records_per_second == nexmark.EVENT_RATE
    assert [sink.type for sink in job.spec.sinks] == [sink["type"] for sink in
                                                      load_document(nexmark.example(query))["spec"]["sinks"]]
    assert all(sink.path == str(tmp_path / "out") for sink in job.spec.sinks if sink.type == "parquet")
    assert job.spec.batching.max_lag_records == nexmark.MAX_LAG_RECORDS
    assert all(op.parallelism == 1 for op in job.spec.operators)  # as Flink's
    flink = nexmark_sql.query_job(query, str(tmp_path / "events.csv"), source.out_of_order_ms, 50_000,
                                  campaigns_csv=str(tmp_path / "campaigns.csv"))
    assert flink.inserts[0].startswith(f"INSERT INTO nexmark_{query} SELECT")
    assert "MOD(seq, 2500) = 0" in flink.inserts[1]  # a progress point every 5%
    assert nexmark.NOTES[query]


def test_the_events_file_holds_the_generators_events_for_the_runs_origin_in_order(tmp_path):
    job = nexmark.bench_job("q3", 2_500)
    path = tmp_path / "events.csv"
    nexmark.write_events(job, 1_700_000_000_000, path)
    spec = job.spec.sources[0]
    names = ["seq", *generators.schema(spec).names]
    read = pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=names))
    expected = generators.generate(spec, 1_700_000_000_000, np.arange(2_500, dtype=np.int64))
    assert read["seq"].to_pylist() == list(range(2_500))
    assert read["event_time"].to_pylist() == expected["event_time"].to_pylist()
    assert read["bid_price"].to_pylist() == expected["bid_price"].to_pylist()  # nulls (empty fields) included
    assert len(names) == 1 + len(nexmark_sql.NEXMARK_COLUMNS)


def test_ysb_reads_its_campaigns_table_beside_the_events(tmp_path):
    job = nexmark.bench_job("ysb", 1_000)
    nexmark.write_campaigns(job, tmp_path / "campaigns.csv")
    lines = (tmp_path / "campaigns.csv").read_text().splitlines()
    assert len(lines) == 1_000 and lines[0] == "ad-0,campaign-0"  # 100 campaigns x 10 ads
    with pytest.raises(ValueError, match="campaigns table"):
        nexmark_sql.query_job("ysb", "events.csv", 200, 1_000)
    assert len(nexmark_sql.YSB_COLUMNS) == len(generators.schema(job.spec.sources[0]))


def test_the_probe_gives_events_read_against_wall_time_and_unknown_queries_are_refused():
    rows = [["100", "2026-11-27 13:00:01.500Z"], ["0", "2026-11-27 13:00:00.000Z"]]
    assert nexmark_sql.progress(rows) == [(1, 1_795_784_400_000), (101, 1_795_784_401_500)]
    with pytest.raises(ValueError, match="unknown query"):
        nexmark_sql.query_job("q9", "events.csv", 0, 100)
