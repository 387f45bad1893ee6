"""What a spec's SQL cannot reach on the worker's SparkSession."""

from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException


def test_sql_reads_no_file_by_path(spark, tmp_path):
    secret = tmp_path / "password"
    secret.write_text("hunter2\n")
    with pytest.raises(AnalysisException):
        spark.sql(f"SELECT * FROM text.`{secret}`").collect()
    assert spark.conf.get("spark.sql.runSQLOnFiles") == "false"
