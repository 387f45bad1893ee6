"""Every Event reason the operator or the autoscaler emits is listed in docs/kubernetes.md: users write alerts
and `kubectl get events --field-selector reason=...` against that list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EMITTED = re.compile(r"""reason=["']([A-Za-z]+)["']|(?:emit|report)\(\s*["']([A-Za-z]+)["']|["'](Scaled(?:Up|Down))["']""")


def test_every_event_reason_emitted_is_documented():
    sources = [p for folder in ("operator", "autoscaler") for p in (ROOT / folder).rglob("*.py")]
    reasons = {m for p in sources for found in EMITTED.findall(p.read_text()) for m in found if m}
    assert {"InvalidSpec", "JobFailed", "Rescaled", "ScaledUp", "RescaleFailed"} <= reasons  # the pattern finds them
    table = (ROOT / "docs/kubernetes.md").read_text().split("### Events", 1)[1].split("###", 1)[0]
    assert sorted(r for r in reasons if f"`{r}`" not in table) == []
