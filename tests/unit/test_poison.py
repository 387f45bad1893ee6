"""Isolating the records a stage fails on, with a stage stand-in that fails on marked records; and how a
probe reads Spark's error (which expression, and whether it runs on every record)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.errors import QueryContextType
from streamjobs_core.spec import SqlStage
from streamjobs_core.watermarks import MIN_WATERMARK
from streamjobs_worker import poison, probes
from streamjobs_worker.inputs import InputBatch


class Picky:
    """Doubles `v`; raises on a batch holding a negative `v` (or on every record when broken)."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken
        self.calls: list[tuple[int, int]] = []  # (records, watermark) per call

    def process(self, batch: InputBatch, watermark: int):
        self.calls.append((batch.records, watermark))
        values = [v for u in batch.tables for v in batch.table(u).column("v").to_pylist()]
        if (self.broken and values) or any(v < 0 for v in values):
            raise ValueError(f"cannot take {min(values)}")
        return (pa.table({"v": [2 * v for v in values]}) if values else None), watermark


def make_batch(*parts: tuple[str, list[int]]) -> InputBatch:
    batch = InputBatch(watermarks={3: 500})
    for upstream, values in parts:
        batch.tables.setdefault(upstream, []).append(pa.table({"v": pa.array(values, pa.int64())}))
        batch.records += len(values)
    return batch


def test_a_good_batch_runs_once() -> None:
    stage = Picky()
    output, watermark, rejected = poison.process(stage, make_batch(("a", [1, 2])), 700)
    assert output.column("v").to_pylist() == [2, 4] and watermark == 700 and rejected == []
    assert stage.calls == [(2, 700)]


def test_the_records_that_fail_alone_are_rejected_and_the_rest_processed() -> None:
    stage = Picky()
    batch = make_batch(("a", [1, -2, 3, 4, 5]), ("b", [6, 7, -8]))
    output, watermark, rejected = poison.process(stage, batch, 700)
    assert sorted(output.column("v").to_pylist()) == [2, 6, 8, 10, 12, 14]
    assert [(r.upstream, r.record, r.error) for r in rejected] == [
        ("a", {"v": -2}, "ValueError: cannot take -2"), ("b", {"v": -8}, "ValueError: cannot take -8")]
    assert watermark == 700
    # Parts run at MIN (the watermark stays), then one empty call advances it with the batch's watermarks.
    assert all(w == MIN_WATERMARK for _, w in stage.calls[1:-1]) and stage.calls[-1] == (0, 700)


def test_group_testing_costs_far_fewer_runs_than_halving_the_batch() -> None:
    stage = Picky()
    bad = {37, 150, 151, 402, 555, 610, 777, 780, 901, 998}
    values = [-i if i in bad else i for i in range(1000)]
    output, _, rejected = poison.process(stage, make_batch(("a", values)), 700)
    assert sorted(-r.record["v"] for r in rejected) == sorted(bad)
    assert sorted(output.column("v").to_pylist()) == [2 * i for i in range(1000) if i not in bad]
    assert sum(records for records, _ in stage.calls[:-1]) < 10 * 1000  # no record is run over and over
    # Halving the batch down to each bad record costs ~2 x log2(n) runs per record: 133 runs here.
    assert len(stage.calls) <= 100


def test_a_stage_that_fails_on_every_record_dead_letters_each() -> None:
    stage = Picky(broken=True)
    output, _, rejected = poison.process(stage, make_batch(("a", list(range(64)))), 700)
    assert output is None and sorted(r.record["v"] for r in rejected) == list(range(64))
    assert all(r.error.startswith("ValueError") for r in rejected)
    assert len(stage.calls) <= 64 + 8  # once it meets only bad records it tests each alone (halving: 127)


def test_a_single_bad_record_is_rejected() -> None:
    output, _, rejected = poison.process(Picky(), make_batch(("a", [-1])), 700)
    assert output is None and [r.record for r in rejected] == [{"v": -1}]


def test_a_python_worker_traceback_is_reduced_to_its_last_line() -> None:
    error = RuntimeError("An exception was thrown from the Python worker.\nTraceback (most recent call last):\n"
                         '  File "udfs.py", line 3, in f\nValueError: no price for 7\n')
    assert poison.describe(error) == "RuntimeError: ValueError: no price for 7"


def test_a_lost_jvm_is_raised_at_once_not_blamed_on_records() -> None:
    from py4j.protocol import Py4JNetworkError

    class Gone(Picky):
        def process(self, batch, watermark):
            self.calls.append((batch.records, watermark))
            raise Py4JNetworkError("Answer from Java side is empty")

    stage = Gone()
    with pytest.raises(Py4JNetworkError):
        poison.process(stage, make_batch(("a", [1])), 700)
    assert len(stage.calls) == 1


# --- how a probe reads Spark's error ----------------------------------------------------------------------


class Context:
    def __init__(self, text: str, fragment: str, kind=QueryContextType.SQL) -> None:
        self._start = text.index(fragment)
        self._fragment = fragment
        self._kind = kind

    def contextType(self):
        return self._kind

    def fragment(self):
        return self._fragment

    def startIndex(self):
        return self._start

    def stopIndex(self):
        return self._start + len(self._fragment) - 1


class SparkError(Exception):
    def __init__(self, *contexts: Context) -> None:
        super().__init__("[CAST_INVALID_INPUT] ...")
        self._contexts = list(contexts)

    def getQueryContext(self):
        return self._contexts

    def getCondition(self):
        return "CAST_INVALID_INPUT"


class Sql:
    def __init__(self, query: str, where: str | None = None, inputs=("src",)) -> None:
        self.spec = SqlStage.model_validate({"name": "s", "type": "sql", "inputs": list(inputs), "query": query,
                                             "where": where})


def probe_of(query: str, fragment: str = "CAST(n AS INT)", where: str | None = None, inputs=("src",)):
    stage = Sql(query, where, inputs)
    text = where if where and fragment in where else query
    return probes.from_error(stage, SparkError(Context(text, fragment)))


@pytest.mark.parametrize("query", [
    "SELECT k, CAST(n AS INT) * 2 AS twice FROM input",
    "select k, sum(CAST(n AS INT)) AS total from input as i group by k",
    "SELECT 'case when' AS label, `and`, CAST(n AS INT) FROM input -- or where\n",
])
def test_a_fragment_every_record_reaches_is_trusted(query: str) -> None:
    probe = probe_of(query)
    assert probe.trusted and probe.source == "query" and probe.upstreams is None
    assert probe.error == "SparkError: [CAST_INVALID_INPUT] CAST(n AS INT) raises on this record"


@pytest.mark.parametrize("query", [
    "SELECT CASE WHEN n = 'n/a' THEN NULL ELSE CAST(n AS INT) END FROM input",
    "SELECT if(n = '', 0, CAST(n AS INT)) FROM input",
    "SELECT coalesce(m, CAST(n AS INT)) FROM input",
    "SELECT CAST(n AS INT) FROM input WHERE k = 'ride'",
    "SELECT CAST(n AS INT) FROM input LIMIT 5",
    "WITH t AS (SELECT k, regexp_replace(n, ',', '.') AS n FROM input) SELECT CAST(n AS INT) FROM t",
    "SELECT CAST(n AS INT) FROM (SELECT * FROM input)",
    "SELECT CAST(n AS INT) FROM input, other",
    "SELECT CAST(n AS INT) FROM input JOIN other USING (k)",
    "SELECT CAST(n AS INT) FROM elsewhere",
])
def test_a_fragment_some_records_may_skip_only_narrows_the_search(query: str) -> None:
    probe = probe_of(query)
    assert probe is not None and not probe.trusted


@pytest.mark.parametrize("fragment", ["assert_true(rand() > 0.01)", "assert_true(hash(*) > 0)"])
def test_a_fragment_not_of_the_record_s_named_columns_alone_is_not_trusted(fragment: str) -> None:
    probe = probe_of(f"SELECT k, {fragment} FROM input", fragment=fragment)
    assert probe.source == "query" and not probe.trusted
    assert probe_of("SELECT k, CAST(n AS INT) * 2 AS x FROM input", fragment="CAST(n AS INT) * 2").trusted


def test_a_query_over_one_input_s_view_probes_that_input_only() -> None:
    probe = probe_of("SELECT CAST(n AS INT) FROM rides_v2", inputs=("rides-v2", "other"))
    assert probe.trusted and probe.upstreams == ("rides-v2",)


def test_a_fragment_of_the_where_is_trusted_unless_guarded_there() -> None:
    probe = probe_of("SELECT * FROM input", where="CAST(n AS INT) >= 0")
    assert probe.trusted and probe.source == "where" and not probe.after_where
    assert not probe_of("SELECT * FROM input", where="k = 'a' AND CAST(n AS INT) >= 0").trusted


def test_an_error_without_a_sql_fragment_gives_no_probe() -> None:
    stage = Sql("SELECT k FROM input")
    assert probes.from_error(stage, ValueError("no context")) is None
    assert probes.from_error(stage, SparkError()) is None
    dataframe = Context("cast", "cast", QueryContextType.DataFrame)
    assert probes.from_error(stage, SparkError(dataframe)) is None


def test_a_fragment_found_in_neither_text_is_not_trusted() -> None:
    stage = Sql("SELECT k FROM input")
    probe = probes.from_error(stage, SparkError(Context("SELECT CAST(n AS INT) FROM x", "CAST(n AS INT)")))
    assert probe.source is None and not probe.trusted and probe.upstreams is None
