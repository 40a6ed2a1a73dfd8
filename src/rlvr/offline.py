"""Compute nodes without internet (the usual case on clusters): probe the Hugging Face hub once,
with a short timeout, and if it cannot be reached run the rest of the process offline through the
libraries' own switches (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``, ``TRANSFORMERS_OFFLINE``).
Without this every hub call (a dataset's README, a tokenizer's config) waits out its own retries
before falling back to the cache: a dry run that reads nothing from the hub took over a minute.

The switches are read when huggingface_hub, datasets and transformers are imported, so the CLI
probes before it imports them; in a process that already imported them (``rlvr.cli.main.main``
called from Python) the caller's settings stay and nothing is probed. The environment is
inherited: a process started again (``rlvr.allocator``) or by the run (torchrun's ranks, a rollout
server) does not probe again. Imports nothing of rlvr.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
PROBED_VAR = "RLVR_HUB_PROBED"  # set once probed, so that child processes do not probe again
PROBE_TIMEOUT_S = 3.0
HUB_LIBRARIES = ("huggingface_hub", "datasets", "transformers")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def probe_hub(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the hub answers (any HTTP status counts: it is reachable), else the reason.
    Goes through the proxies the environment names, as the hub libraries do."""
    req = urllib.request.Request(hub_endpoint(), method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason) or type(exc).__name__


def hub_libraries_imported() -> bool:
    return any(name in sys.modules for name in HUB_LIBRARIES)


def offline_if_unreachable(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Probe the hub once per process tree; when it cannot be reached, set the offline switches
    and return the one line to print (None: online, already offline, or already decided)."""
    if os.environ.get(PROBED_VAR) or any(_truthy(os.environ.get(v)) for v in OFFLINE_VARS):
        return None
    if hub_libraries_imported():
        return None  # too late to switch: the libraries read the variables at import
    os.environ[PROBED_VAR] = "1"
    reason = probe_hub(timeout_s)
    if reason is None:
        return None
    for var in OFFLINE_VARS:
        os.environ[var] = "1"
    return (
        f"[rlvr] the Hugging Face hub ({hub_endpoint()}) is not reachable ({reason}): offline "
        "for this run (HF_HUB_OFFLINE=1); models and data come from local folders and the cache"
    )


def go_offline_if_unreachable() -> None:
    """``offline_if_unreachable`` for a command's start, its line printed once (rank 0)."""
    line = offline_if_unreachable()
    if line is not None and os.environ.get("RANK", "0") == "0":
        print(line, flush=True)
