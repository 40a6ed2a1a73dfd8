"""The suite's figures (inputs tried, failures contained, kills survived, bytes lost), as measured.

Tests call ``record("hostile_outputs", inputs=462, ...)``; when the environment variable
``RLVR_RELIABILITY_FIGURES`` names a file, ``conftest.py`` writes everything recorded in the
session there as JSON at the end, which is where ``README.md``'s table comes from:

    RLVR_RELIABILITY_FIGURES=/tmp/figures.json python -m pytest tests/reliability -m "slow or not slow"
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV_VAR = "RLVR_RELIABILITY_FIGURES"
FIGURES: dict[str, dict[str, Any]] = {}


def record(category: str, **values: Any) -> None:
    """Set ``values`` under ``category`` (a later value of the same name replaces the earlier)."""
    FIGURES.setdefault(category, {}).update(values)


def add(category: str, **counts: int | float) -> None:
    """Add ``counts`` to the totals under ``category`` (for figures several tests contribute to)."""
    slot = FIGURES.setdefault(category, {})
    for key, value in counts.items():
        slot[key] = slot.get(key, 0) + value


def write_if_requested() -> Path | None:
    """Write the figures to ``$RLVR_RELIABILITY_FIGURES`` if it is set; returns the path."""
    target = os.environ.get(ENV_VAR)
    if not target:
        return None
    path = Path(target)
    path.write_text(json.dumps(FIGURES, indent=1, sort_keys=True) + "\n")
    return path
