"""Makes the toy reward module `difficulty_rewards` importable here and in reward sandboxes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DATA_TESTS_DIR = Path(__file__).parent
sys.path.insert(0, str(DATA_TESTS_DIR))
os.environ["PYTHONPATH"] = os.pathsep.join([str(DATA_TESTS_DIR), os.environ.get("PYTHONPATH", "")])
