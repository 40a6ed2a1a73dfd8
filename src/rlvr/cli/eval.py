"""`rlvr eval`: evaluate a run, checkpoint, model or LoRA adapter with named modes.

Results go to one JSON file in the format the in-training evaluator writes (provenance, modes,
results per set, per-problem records per set and mode) and to a printed table with one row per
set and metric, naming the mode, k, temperature and top-p beside each number, so modes are never
conflated. A run's own last in-training eval measured differently (another dtype, engine, token
limit, machine) is named in a warning.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EVAL_EXAMPLES = """\
metrics (each row of the table names its mode, k, temperature and top-p):
  greedy_pass@1        temperature 0, one reply per problem: share of problems answered right
  sampling_pass@k      k samples: chance that ANY of k is right (unbiased estimator, arXiv:2107.03374)
  maj@k                k samples: the MAJORITY-VOTE answer of the k is right (not any-of-k)
  mean_acc@k           k samples: mean share of right samples per problem
  nondet_proxy_pass@k  k temperature-0 replies: any-of-k over repeated greedy decoding; measures
                       only nondeterminism of batched decoding (a diagnostic, not a skill score)
  truncated            share of replies that hit the token limit (max new tokens)
  mean_len             mean reply length in tokens
precision: eval.dtype (default auto = float32 on the CPU), independent of model.autocast;
batching: eval.batch_size=N (records do not depend on it). Both are recorded in the JSON.

examples:
  rlvr eval runs/drgrpo-arithmetic-20250101-120000          # its final model, sets and modes
  rlvr eval runs/RUN/best --sets heldout,ood_probe           # the best eval's saved model
  rlvr eval runs/RUN --modes greedy,sampling --k 8 --temperature 0.6
  rlvr eval path/to/model --data probe.jsonl -c run.yaml     # any model on any file
  rlvr eval path/to/lora_adapter --base path/to/base --data probe.jsonl
  rlvr eval runs/RUN --modes greedy,nondet_proxy --k 4 eval.batch_size=1 eval.dtype=float32
"""


def add_eval_args(p: argparse.ArgumentParser) -> None:
    p.description = "Evaluate a model with the same template, generation and grading as training."
    p.epilog = EVAL_EXAMPLES
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "model",
        help="run directory (uses its final model and config), a folder inside one, model "
        "folder, LoRA adapter folder, .gguf file or hub id",
    )
    p.add_argument(
        "--run",
        help="run directory whose config.yaml gives data, template and reward "
        "(default: the run MODEL is in, if any)",
    )
    p.add_argument("-c", "--config", help="config YAML for data/template/reward (instead of --run)")
    p.add_argument("--base", help="base model of a LoRA adapter (default: see rlvr.eval.loading)")
    p.add_argument(
        "--data", help="JSONL/JSON/CSV/Parquet file to evaluate (default: the config's eval sets)"
    )
    p.add_argument("--name", help="set name for --data (default: the file's stem)")
    p.add_argument("--sets", help="comma list of the config's eval sets to run (default: all)")
    p.add_argument(
        "--modes",
        help="comma list of greedy, sampling, nondet_proxy (default: the config's eval.modes)",
    )
    p.add_argument("--k", type=int, help="samples (sampling) or greedy repeats (nondet_proxy)")
    p.add_argument("--temperature", type=float, help="sampling mode temperature")
    p.add_argument("--top-p", type=float, help="sampling mode top-p")
    p.add_argument("--max-problems", type=int, help="problems per set (default eval.max_problems)")
    p.add_argument("--max-new-tokens", type=int, help="default: eval.max_new_tokens")
    p.add_argument(
        "--out", help="results JSON (default: RUN/eval/offline_<model>.json, else ./eval.json)"
    )
    p.add_argument("overrides", nargs="*", metavar="section.key=value")


def _cli_overrides(args: argparse.Namespace) -> list[str]:
    """Flags that restate config knobs become dotted overrides, validated with the rest.

    Offline evaluation records no best step, so best_metric / early_stop.metric are cleared
    (they may name sets or modes that --data / --modes replace).
    """
    out = ["eval.best_metric=null", "eval.early_stop.metric=null"]
    if args.max_problems is not None:
        out.append(f"eval.max_problems={args.max_problems}")
    if args.max_new_tokens is not None:
        out.append(f"eval.max_new_tokens={args.max_new_tokens}")
    flags = {"k": args.k, "temperature": args.temperature, "top_p": args.top_p}
    sampling = {"kind": "sampling", **{key: v for key, v in flags.items() if v is not None}}
    nondet = {"kind": "nondet_proxy", **({"k": args.k} if args.k is not None else {})}
    if args.modes is not None:
        modes: list[object] = []
        for kind in (m.strip() for m in args.modes.split(",") if m.strip()):
            if kind not in ("greedy", "sampling", "nondet_proxy"):
                raise ValueError(
                    f"--modes: unknown mode {kind!r}; known: greedy, sampling, nondet_proxy"
                )
            modes.append({"greedy": "greedy", "sampling": sampling, "nondet_proxy": nondet}[kind])
        out.append(f"eval.modes={json.dumps(modes)}")  # JSON is YAML: parsed like any override
    elif len(sampling) > 1:
        raise ValueError("--k / --temperature / --top-p need --modes with sampling")
    return out


def run_provenance_warnings(run_dir: Path | None, provenance: dict) -> list[str]:
    """Warnings naming each field in which this evaluation differs from the run's last
    in-training eval (``RUN/eval/step_*.json``), whose numbers sit beside it in the run."""
    if run_dir is None:
        return []
    from rlvr.eval.provenance import warn_if_different

    files = sorted((Path(run_dir) / "eval").glob("step_*.json"))
    if not files:
        return []
    recorded = json.loads(files[-1].read_text()).get("provenance") or {}
    return warn_if_different(
        {f"in-training eval {files[-1].name}": recorded, "this rlvr eval": provenance}
    )


def _offline_sets(args: argparse.Namespace, cfg) -> list:
    """One set from --data, else the config's sets (all, or those named by --sets)."""
    from rlvr.config import ConfigError
    from rlvr.data.rows import load_rows_for
    from rlvr.eval.evaluator import EvalSet
    from rlvr.eval.sets import build_eval_sets

    if args.data:
        from rlvr.data.loaders import load_rows

        rows = load_rows(
            args.data,
            prompt_field=cfg.data.prompt_field,
            answer_field=cfg.data.answer_field,
            system_prompt=cfg.data.system_prompt,
            limit=cfg.eval.max_problems,
            answer_extract=cfg.data.answer_extract,
        )
        modes = tuple(cfg.eval.modes)
        return [EvalSet(args.name or Path(args.data).stem, rows, modes)]
    cache: dict[str, tuple[list[dict], list[dict]]] = {}

    def split(index: int) -> list[dict]:  # 0 train, 1 held-out; built once, only if needed
        if "rows" not in cache:
            cache["rows"] = load_rows_for(cfg)
        return cache["rows"][index]

    only = [s.strip() for s in args.sets.split(",") if s.strip()] if args.sets else None
    sets = build_eval_sets(
        cfg, heldout_rows=lambda: split(1), train_rows=lambda: split(0), only=only
    )
    if not sets:
        raise ConfigError("nothing to evaluate: the config has no held-out split; pass --data FILE")
    return sets


def _out_path(args: argparse.Namespace, source) -> Path:
    """--out, else RUN/eval/offline_<what>.json (final, best, step_000020), else ./eval.json."""
    if args.out:
        return Path(args.out)
    if source.run_dir is None:
        return Path("eval.json")
    model = Path(source.model).resolve()
    run = source.run_dir.resolve()
    parts = model.relative_to(run).parts if model.is_relative_to(run) else (model.name,)
    name = "_".join(p for p in parts if p not in ("checkpoints", "model")) or model.name
    return source.run_dir / "eval" / f"offline_{name}.json"


def run_eval(args: argparse.Namespace) -> int:
    """`rlvr eval`: load, evaluate every set in every mode, write the JSON, print the table."""
    from rlvr.offline import go_offline_if_unreachable

    go_offline_if_unreachable()  # before the hub libraries are imported (rlvr.offline)
    from rlvr.config import load_config
    from rlvr.data.rows import reward_specs
    from rlvr.eval.engine import evaluate_config_sets
    from rlvr.eval.evaluator import eval_payload, write_eval_file
    from rlvr.eval.loading import eval_engine, load_policy, resolve_source
    from rlvr.eval.table import eval_table
    from rlvr.rewards.runner import RewardRunner

    if args.data and args.sets:
        raise ValueError("--sets picks the config's eval sets; it cannot be used with --data")
    source = resolve_source(args.model, args.run)
    cfg_path = args.config or source.config_file  # the run's, or a merged folder's copy
    overrides = [*args.overrides, *_cli_overrides(args)]
    if args.data:
        overrides.append("eval.sets=[]")  # --data replaces the config's sets by one set
    cfg = load_config(cfg_path, overrides)
    sets = _offline_sets(args, cfg)  # data errors surface before a model loads
    if getattr(args, "own_process", False):  # `rlvr eval` as a command: see rlvr.allocator
        from rlvr.allocator import reexec_with

        reexec_with(cfg.train.allocator)
    model, tokenizer, base, processor = load_policy(
        source, cfg, base=args.base, config_given=cfg_path is not None
    )
    engine = eval_engine(cfg, model, tokenizer)
    rewards = RewardRunner(
        reward_specs(cfg), timeout_s=cfg.reward.timeout_s, max_failure_fraction=1.0
    )
    try:
        outcome = evaluate_config_sets(engine, tokenizer, sets, rewards, cfg, processor)
    finally:
        rewards.close()
        engine.close()
    out = write_eval_file(
        _out_path(args, source),
        eval_payload(
            outcome,
            model=source.model,
            base=base,
            run=str(source.run_dir) if source.run_dir else None,
        ),
    )
    print(eval_table(outcome.results, outcome.modes, {s.name: len(s.rows) for s in sets}))
    p = outcome.provenance
    print(
        f"measured with: {p['engine']} engine, {p['dtype']}, batch {p['batch_size']}, "
        f"max new tokens {p['max_new_tokens']}, template {p['template']}, on {p['device_name']}"
    )
    for warning in run_provenance_warnings(source.run_dir, outcome.provenance):
        print(f"[rlvr] warning: {warning}", file=sys.stderr)
    print(f"records: {out}")
    return 0
