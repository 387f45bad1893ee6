"""The stateless stages: a SQL query or a PySpark function over the batch."""

from __future__ import annotations

import re

import pyarrow as pa

from .. import phases
from ..state import KeyGroupStore
from .base import _SparkStage, collect, load_function, mentioned, view_name


class SqlStage(_SparkStage):
    _pushes_down = True

    def _views(self) -> set[str]:
        names = {"input", *(view_name(u) for u in self.spec.inputs)}
        return {name for name in names if re.search(rf"\b{re.escape(name)}\b", self.spec.query, re.IGNORECASE)}

    def _columns(self, names: list[str]) -> list[str]:
        return mentioned(names, f"{self.spec.query}\n{self.spec.where or ''}")

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if not batch.records:
            return None, watermark
        return self._query(batch, self.spec.query), watermark


class PySparkStage(_SparkStage):
    def __init__(self, spec, store: KeyGroupStore) -> None:
        super().__init__(spec, store)
        self._fn = load_function(spec.function)

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        if not batch.records:
            return None, watermark
        df = self._register_inputs(batch)
        with phases.phase("plan"):
            result = self._fn(df)
        return collect(result), watermark
