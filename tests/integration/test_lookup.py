"""The lookup stage on a real SparkSession against a table in a real Redis (and in Parquet)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from streamjobs_core.spec import LookupStage as LookupSpec
from streamjobs_worker.inputs import InputBatch
from streamjobs_worker.stages.lookup import LookupStage
from streamjobs_worker.state import open_store


def spec(**overrides) -> LookupSpec:
    table = {"redisKeyPrefix": "ads:", "key": "ad_id", "schema": "campaign_id string, budget double"}
    return LookupSpec.model_validate({"name": "enrich", "type": "lookup", "inputs": ["views"], "by": "ad",
                                      "table": {**table, **overrides.pop("table", {})}, **overrides})


def views(*ads: int) -> InputBatch:
    table = pa.table({"ad": pa.array(ads, pa.int64()), "event_time": pa.array(range(len(ads)), pa.int64())})
    return InputBatch(tables={"views": [table]}, records=table.num_rows)


def rows(stage: LookupStage, batch: InputBatch) -> list[tuple]:
    out, _ = stage.process(batch, 0)
    return sorted((r["ad"], r["campaign_id"], r["budget"]) for r in out.to_pylist())


@pytest.fixture
def ads(r):
    r.hset("ads:1", mapping={"campaign_id": "c1", "budget": "2.5"})
    r.hset("ads:2", mapping={"campaign_id": "c2", "budget": "4"})
    r.hset("other:3", mapping={"campaign_id": "c3"})  # another prefix: not the table's
    return r


def test_inner_drops_records_without_a_row_and_left_keeps_them_with_nulls(spark, ads):
    store = open_store("memory", range(12), "")
    inner = LookupStage(spec(), store, ads)
    assert rows(inner, views(1, 2, 2, 3)) == [(1, "c1", 2.5), (2, "c2", 4.0), (2, "c2", 4.0)]
    left = LookupStage(spec(how="left", columns=["campaign_id"]), store, ads)
    out, _ = left.process(views(1, 3), 0)
    assert out.column_names == ["ad", "event_time", "campaign_id"]
    assert sorted(out.to_pylist(), key=lambda row: row["ad"]) == [
        {"ad": 1, "event_time": 0, "campaign_id": "c1"}, {"ad": 3, "event_time": 1, "campaign_id": None}]


def test_a_table_is_loaded_again_once_older_than_refresh_ms(spark, ads):
    now = [0.0]
    stage = LookupStage(spec(table={"refreshMs": 1000}), open_store("memory", range(12), ""), ads, lambda: now[0])
    assert rows(stage, views(1)) == [(1, "c1", 2.5)]
    ads.hset("ads:1", "campaign_id", "c9")
    now[0] = 0.5
    assert rows(stage, views(1)) == [(1, "c1", 2.5)]  # the table as loaded when the batch ran
    now[0] = 1.0
    assert rows(stage, views(1)) == [(1, "c9", 2.5)]
    static = LookupStage(spec(), open_store("memory", range(12), ""), ads, lambda: now[0])
    assert rows(static, views(1)) == [(1, "c9", 2.5)]
    ads.hset("ads:1", "campaign_id", "c10")
    now[0] = 99.0
    assert rows(static, views(1)) == [(1, "c9", 2.5)]  # refreshMs 0: loaded once


def test_a_parquet_table_and_clear_errors_for_a_missing_or_clashing_column(spark, r, tmp_path):
    path = tmp_path / "ads.parquet"
    pq.write_table(pa.table({"ad_id": [1, 2], "campaign_id": ["p1", "p2"], "budget": [1.0, 2.0]}), path)
    stage = LookupStage(spec(table={"redisKeyPrefix": None, "parquetPath": str(path), "schema": None}),
                        open_store("memory", range(12), ""), r)
    assert rows(stage, views(2, 5)) == [(2, "p2", 2.0)]
    missing = LookupStage(spec(by="nope"), open_store("memory", range(12), ""), r)
    with pytest.raises(ValueError, match="enrich: input has no column 'nope' \\(by\\)"):
        missing.process(views(1), 0)
    clash = LookupStage(spec(columns=["event_time"], table={"schema": "event_time long"}),
                        open_store("memory", range(12), ""), r)
    with pytest.raises(ValueError, match="table columns event_time clash with the input's"):
        clash.process(views(1), 0)
