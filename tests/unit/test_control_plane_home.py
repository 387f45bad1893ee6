"""The control plane has one home: no module but the job store spells a control key or field (a second writer
or reader of a control record would be a protocol without a home again)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTROL_KEYS = ("plan", "deployed_by", "control", "metrics_endpoints", "assignment", "next_assignment", "standby",
                "standby_lag", "spares", "promotion", "demotion", "moved", "releases", "acquired", "incarnation",
                "rescale_requests", "rescale_current", "rescale_history", "offsets", "watermarks", "attempts",
                "failure", "plans", "versions", "cut", "aligned", "reset", "reconfigure_requests",
                "reconfigure_current", "reconfigure_history", "replies", "control_requests", "control_history",
                "autoscaler_decisions")
SPELLED = re.compile(rf"(?<![A-Za-z])_?keys\.({'|'.join(CONTROL_KEYS)})\b|JobKeys\([^)]*\)\.({'|'.join(CONTROL_KEYS)})\b"
                     r"|[\"']generation[\"']", re.IGNORECASE)
HOME = {*(ROOT / "core/streamjobs_core/jobstore").glob("*.py"), ROOT / "core/streamjobs_core/layout.py"}


def test_no_control_key_or_field_is_spelled_outside_the_job_store():
    sources = [p for folder in ("core", "worker", "runtime", "operator", "autoscaler", "tests")
               for p in (ROOT / folder).rglob("*.py") if p not in HOME and p != Path(__file__).resolve()]
    assert len(sources) > 50
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sources
             for n, line in enumerate(p.read_text().splitlines(), 1) if SPELLED.search(line)]
    assert found == []
