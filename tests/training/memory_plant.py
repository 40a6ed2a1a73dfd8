"""``python memory_plant.py train key=value...``: `rlvr train` whose scoring phase holds a buffer
that grows by ``MEMORY_PLANT_MIB`` MiB every step in the trainer process, on the ranks listed in
``MEMORY_PLANT_RANKS`` (default "0"), so the memory metrics have a known growth to show.

A user reward (``module:function``) would run in a sandbox worker process, whose memory is not the
trainer's: the buffer is held by a wrapped `Step.score` instead (the same phase). Runs the CLI as
``main(argv)``, so no allocator re-exec drops the wrapper.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from rlvr.cli.main import main
from rlvr.training.step import Step

HELD: list[np.ndarray] = []
SIZE = int(os.environ["MEMORY_PLANT_MIB"]) * 2**20
RANKS = {int(r) for r in os.environ.get("MEMORY_PLANT_RANKS", "0").split(",")}
_score = Step.score


def score(self, batch):
    if int(os.environ.get("RANK", "0")) in RANKS:
        HELD.append(np.ones(SIZE, dtype=np.uint8))  # every page written: resident
    return _score(self, batch)


Step.score = score

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
