"""A forked run's own resource limits, set before it starts (``forkserver`` "hooks")."""

from __future__ import annotations

import os
import resource

FILE_SIZE_ENV = "RLVR_TEST_MAX_FILE_BYTES"


def limit_file_size() -> None:
    """No file this process writes may grow past ``$RLVR_TEST_MAX_FILE_BYTES`` bytes: a write
    beyond it fails with EFBIG ("File too large"), as on a full disk. Python ignores SIGXFSZ, so
    the process gets the error instead of being killed."""
    limit = int(os.environ[FILE_SIZE_ENV])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
