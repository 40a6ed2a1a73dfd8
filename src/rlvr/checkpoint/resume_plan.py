"""Where a run resumes from (``train.resume``), and the settings a resume may not change."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlvr.checkpoint.full import checkpoints_dir, latest_checkpoint
from rlvr.config import Config, ConfigError

# Config keys a resumed run must share with its checkpoint: they shape the weights, the optimizer
# state or the data order, so changing them would not continue the same run.
RESUME_FIXED_KEYS = ("model.name_or_path", "model.dtype", "model.lora", "algo.objective", "data")
# a staleness-1 checkpoint holds the next step's batch, its prompts already drawn
RESUME_FIXED_KEYS += ("rollout.max_staleness",)
# the prompt sampler's position counts prompts drawn per step: another group size or number of
# prompts per step would not continue the same data order
RESUME_FIXED_KEYS += ("algo.group_size", "algo.prompts_per_step")


@dataclass(frozen=True)
class ResumePlan:
    run_dir: Path
    checkpoint: Path | None  # None: the run has no complete checkpoint yet; start it over
    step: int


def _dig(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data.get(part, {}) if isinstance(data, dict) else {}
    return data


def check_resume_config(cfg: Config, checkpoint: Path) -> None:
    """ConfigError naming every key in RESUME_FIXED_KEYS (and train.seed) that differs."""
    import yaml

    saved = yaml.safe_load((checkpoint / "config.yaml").read_text()) or {}
    now = cfg.model_dump(mode="json")
    diffs = [
        f"{key}: checkpoint {_dig(saved, key)!r}, now {_dig(now, key)!r}"
        for key in (*RESUME_FIXED_KEYS, "train.seed")
        if _dig(saved, key) != _dig(now, key)
    ]
    if diffs:
        raise ConfigError(
            f"cannot resume from {checkpoint}: these settings differ from the checkpoint's "
            "config:\n  - " + "\n  - ".join(diffs) + "\n(`rlvr train --resume RUN_DIR` reuses "
            "the run's own config.yaml)"
        )


def plan_resume(cfg: Config, run_dir: Path | None = None) -> ResumePlan | None:
    """Where ``train.resume`` continues from; None when the run starts fresh.

    ``auto``: the run ``run_dir`` (else ``train.output_dir/train.run_name``) if it exists; a run
    without a complete checkpoint starts over in its directory. A path: that run directory,
    which must hold a complete checkpoint.
    """

    resume = cfg.train.resume
    if not resume:
        return None
    if resume == "auto":
        if run_dir is None:
            if not cfg.train.run_name:
                raise ConfigError(
                    "train.resume=auto needs train.run_name (the run to continue, or to start "
                    "under that name)"
                )
            run_dir = Path(cfg.train.output_dir) / cfg.train.run_name
        run_dir = Path(run_dir)
        if not (run_dir / "metrics.jsonl").exists() and latest_checkpoint(run_dir) is None:
            return None  # nothing there yet: a fresh run
    else:
        run_dir = Path(resume).expanduser()
        if not run_dir.is_dir():
            raise ConfigError(f"train.resume={resume!r}: no such run directory")
    found = latest_checkpoint(run_dir)
    if found is None:
        if resume != "auto":
            seen = sorted(p.name for p in checkpoints_dir(run_dir).glob("*"))
            raise ConfigError(
                f"train.resume={resume!r}: no complete checkpoint under "
                f"{checkpoints_dir(run_dir)} (found: {seen or 'nothing'}); was train.save_every "
                "set in that run?"
            )
        print(f"[rlvr] {run_dir} has no complete checkpoint: starting it over", flush=True)
        return ResumePlan(run_dir, None, 0)
    check_resume_config(cfg, found.path)
    print(f"[rlvr] resuming {run_dir} from {found.path.name} (step {found.step})", flush=True)
    return ResumePlan(run_dir, found.path, found.step)
