"""`rlvr eval`: evaluate a model, checkpoint or run directory with named modes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        help="run directory (uses its final model and config), model folder, "
        "LoRA adapter folder, .gguf file or hub id",
    )
    p.add_argument(
        "--run",
        help="run directory whose config gives task, template and reward "
        "(default: MODEL itself when it is a run directory)",
    )
    p.add_argument("-c", "--config", help="config YAML for data/template/reward (instead of --run)")
    p.add_argument(
        "--data", help="JSONL/CSV/Parquet file to evaluate (default: the config's held-out split)"
    )
    p.add_argument(
        "--modes", default="greedy", help="comma list of greedy, sampling (default greedy)"
    )
    p.add_argument("--k", type=int, default=8, help="samples per problem for sampling mode")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling mode temperature")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-problems", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--out", help="results JSON (default: RUN/eval/offline.json or ./eval.json)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")


def _resolve(args) -> tuple[str, Path | None]:
    model = Path(args.model)
    run = Path(args.run) if args.run else None
    if run is None and (model / "config.yaml").exists() and (model / "final").exists():
        run, model = model, model / "final"
    return str(model), run


def run_eval(args: argparse.Namespace) -> int:
    from rlvr.config import load_config
    from rlvr.data.loaders import load_rows
    from rlvr.eval.evaluator import EvalMode, evaluate
    from rlvr.eval.metrics import format_table
    from rlvr.rewards.runner import RewardRunner
    from rlvr.rollout.hf import HFEngine
    from rlvr.training.policy import bf16_supported, load_model_and_tokenizer
    from rlvr.training.run_setup import load_rows_for, reward_specs

    model_path, run = _resolve(args)
    cfg_path = args.config or (run / "config.yaml" if run else None)
    cfg = load_config(cfg_path, args.overrides)
    if args.data:
        rows = load_rows(
            args.data,
            prompt_field=cfg.data.prompt_field,
            answer_field=cfg.data.answer_field,
            system_prompt=cfg.data.system_prompt,
        )
    else:
        _, rows = load_rows_for(cfg)
    rows = rows[: args.max_problems or cfg.eval.max_problems]
    model, tok = load_model_and_tokenizer(model_path)
    engine = HFEngine(model, tok, batch_size=cfg.rollout.batch_size, autocast=bf16_supported("cpu"))
    rewards = RewardRunner(
        reward_specs(cfg), timeout_s=cfg.reward.timeout_s, max_failure_fraction=1.0
    )
    results, all_records = {}, {}
    max_new = args.max_new_tokens or cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    try:
        for name in [m.strip() for m in args.modes.split(",") if m.strip()]:
            if name not in ("greedy", "sampling"):
                raise ValueError(f"--modes: unknown mode {name!r}; known: greedy, sampling")
            mode = EvalMode(
                name,
                k=1 if name == "greedy" else args.k,
                temperature=args.temperature,
                top_p=args.top_p,
            )
            scores, records = evaluate(
                engine,
                tok,
                rows,
                rewards,
                template=cfg.data.template,
                system_prompt=cfg.data.system_prompt,
                mode=mode,
                max_new_tokens=max_new,
                stop=tuple(cfg.rollout.stop),
            )
            results.update(scores)
            all_records[name] = records
    finally:
        rewards.close()
    out = (
        Path(args.out)
        if args.out
        else ((run / "eval" / "offline.json") if run else Path("eval.json"))
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"model": model_path, "results": results, "records": all_records}, indent=1)
    )
    print(format_table(results))
    print(f"records: {out}")
    return 0
