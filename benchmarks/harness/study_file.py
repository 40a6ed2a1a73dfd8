"""A study that outlives one sitting: the JSON it goes on with, and whether new runs pool with it.

A five-seed study on a 2-core machine takes longer than a session, so the studies write their
JSON after every run and take it back with ``--study PATH``. Runs pool only when what they
measured is the same: the machine (CPU, cores, ISA limits), the study's own settings (steps,
threads, ...), each arm's overrides and the training code (a hash of the paths a run executes).
``--any-code`` pools runs of other code all the same (a study outlives commits that may not touch
what it measures); each run's code state is then recorded and the report counts them.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterable
from pathlib import Path


def src_state(repo: Path, code: Iterable[str]) -> str | None:
    """The code a run uses (the paths ``code`` under ``repo``): a hash of their git trees at HEAD
    and of their uncommitted edits; None outside a git checkout. Commits that change nothing
    there (docs, results) keep it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        ).stdout

    try:
        present = [p for p in code if (repo / p).exists()]
        trees = git("rev-parse", *(f"HEAD:{p}" for p in present))
        edits = git("diff", "HEAD", "--", *present)
    except (OSError, subprocess.CalledProcessError):
        return None
    return hashlib.sha256(f"{trees}\n{edits}".encode()).hexdigest()[:16]


def check_compatible(
    old: dict, new: dict, path: Path, *, keys: Iterable[str], any_code: bool = False
) -> None:
    """Raise ``SystemExit`` naming each setting where the study in ``path`` (``old``) differs
    from this call's (``new``): its runs would not be comparable with the ones this call adds.
    ``keys`` are the study's own settings (top-level fields of both); ``any_code`` pools runs of
    other code (``src``) all the same."""
    if not old.get("runs"):
        return
    diffs = [f"{k} {old.get(k)!r} there, {new[k]!r} here" for k in keys if old.get(k) != new[k]]
    # other training code (files written before it was recorded carry no "src": not checked)
    if "src" in old and old["src"] != new.get("src") and not any_code:
        diffs.append(f"src {old['src']!r} there, {new.get('src')!r} here")
    for k in ("cpu", "cores", "isa_limits"):  # an ISA-limited CPU runs other kernels
        if old.get("machine", {}).get(k) != new["machine"].get(k):
            diffs.append(
                f"machine {k} {old.get('machine', {}).get(k)!r} there, {new['machine'].get(k)!r} here"
            )
    # an arm whose overrides changed is another arm under the same name (files written before
    # the overrides were recorded carry no "arms": not checked; an arm no longer defined gets
    # no runs added)
    for arm in sorted(set(old["runs"]) & set(new.get("arms", {}))) if "arms" in old else []:
        if old["arms"].get(arm) != new["arms"][arm]:
            diffs.append(f"arm {arm} {old['arms'].get(arm)!r} there, {new['arms'].get(arm)!r} here")
    if diffs:
        raise SystemExit(
            f"{path}: its runs do not pool with this call's ({'; '.join(diffs)}); "
            "pass another --study or --out, or the same settings (--any-code pools runs of other "
            "code, each run's code state recorded)"
        )


def code_line(result: dict) -> list[str]:
    """The report's line on code: said only when the runs come from more than one code state
    (``--any-code``) or from code not recorded (files from before ``run_src``)."""
    states = {
        result.get("run_src", {}).get(a, {}).get(s)
        for a, per in result["runs"].items()
        for s in per
    }
    if len(states) <= 1 and None not in states:
        return []
    known = len(states - {None})
    unknown = " and runs whose code was not recorded" if None in states else ""
    return [f"Code: runs from {known} recorded code state(s){unknown} (`run_src` in the JSON)."]
