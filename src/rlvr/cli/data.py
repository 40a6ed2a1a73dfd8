"""`rlvr data ...` commands. The top-level `rlvr.cli.main` calls `register(subparsers)`.

Flags mirror `PrepareConfig`; a flag left out falls back to the config's default, so the
defaults live in one place.
"""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from rlvr.data.prepare import PrepareConfig, run_prepare
from rlvr.data.records import DataError

PREPARE_EXAMPLE = """\
example:
  rlvr data prepare --input numina.parquet --out data/math \\
      --prompt-field problem --answer-field answer \\
      --exclude-sources 'AMC|AIME' --min-chars 20 \\
      --splits train=1000,test=200 --seed 42

  writes data/math/train.jsonl, data/math/test.jsonl and data/math/manifest.json
  (counts per stage and split, sha256 of each file, seed, options). The splits share
  no problem: rows are deduplicated by a hash of the normalised problem text, and the
  split files are checked for overlap before they are written.
"""


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add the `data` command and its subcommands; return the `data` subcommand group.

    Each subcommand parser sets `func`, so the caller runs `args.func(args)`.
    """
    data = subparsers.add_parser(
        "data",
        help="prepare datasets (filter, dedupe, split)",
        description="Dataset preparation commands.",
    )
    commands = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    _add_prepare(commands)
    _add_filter_difficulty(commands)
    return commands


def _add_prepare(commands: argparse._SubParsersAction) -> None:
    fields = PrepareConfig.model_fields

    def default(name: str) -> str:
        return f"(default: {fields[name].default!r})"

    parser = commands.add_parser(
        "prepare",
        help="filter, deduplicate and split a dataset into JSONL files with a manifest",
        description=(
            "Load a .jsonl/.json/.csv/.parquet file or a datasets folder, keep integer answers, "
            "drop excluded sources and short problems, deduplicate by problem hash, split "
            "deterministically and verify the splits share no problem."
        ),
        epilog=PREPARE_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--input", required=True, help="input file or datasets folder")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--splits",
        required=True,
        type=parse_splits,
        metavar="NAME=SIZE,...",
        help="row counts (train=1000,test=200) or fractions of the filtered rows "
        "(train=0.9,test=0.1); an integer is a count, so 1 is one row and 1.0 is all",
    )
    parser.add_argument("--prompt-field", help=f"field with the problem {default('prompt_field')}")
    parser.add_argument("--answer-field", help=f"field with the answer {default('answer_field')}")
    parser.add_argument("--input-split", help="split to read from a DatasetDict folder")
    parser.add_argument("--seed", type=int, help=f"split seed {default('seed')}")
    parser.add_argument(
        "--exclude-sources",
        action="append",
        metavar="REGEX",
        help="drop rows whose source field matches (case-insensitive); repeatable",
    )
    parser.add_argument(
        "--source-field", help=f"field --exclude-sources matches {default('source_field')}"
    )
    parser.add_argument(
        "--min-chars", type=int, help=f"drop shorter problems {default('min_chars')}"
    )
    parser.add_argument(
        "--any-answer",
        action="store_true",
        help="keep every answer, not only bare integers",
    )
    parser.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="skip and count malformed rows instead of stopping at the first",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace existing output files")
    parser.set_defaults(func=cmd_prepare)


FILTER_EXAMPLE = """\
example:
  rlvr data filter-difficulty --model runs/RUN --data data/math/train.jsonl --k 8 \\
      --out data/math/train_mixed.jsonl

  samples 8 responses per prompt with the run's final model, template, rollout settings
  and reward, keeps the prompts solved by some but not all samples (0 < rate < 1), and
  writes them with their solve_rate, plus train_mixed.jsonl.summary.json with the counts.
"""


def _add_filter_difficulty(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "filter-difficulty",
        help="keep prompts the model solves sometimes but not always (mixed-outcome groups)",
        description=(
            "Sample K responses per prompt through the training path (template, rollout "
            "engine, reward) and keep prompts whose solve rate lies strictly between "
            "--min-rate and --max-rate."
        ),
        epilog=FILTER_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="run directory, model or LoRA adapter folder")
    p.add_argument("--data", required=True, help="JSONL/JSON/CSV/Parquet file of problems")
    p.add_argument("--out", required=True, help="kept rows (JSONL)")
    p.add_argument("--k", type=int, default=8, help="samples per prompt (default 8)")
    p.add_argument("--min-rate", type=float, default=0.0, help="keep rate > this (default 0)")
    p.add_argument("--max-rate", type=float, default=1.0, help="keep rate < this (default 1)")
    p.add_argument(
        "-c", "--config", help="config YAML for template/reward/rollout (default: the run's)"
    )
    p.add_argument("--base", help="base model of a LoRA adapter")
    p.add_argument("--temperature", type=float, help="default: rollout.temperature")
    p.add_argument("--seed", type=int, help="sampling seed (default: train.seed)")
    p.add_argument("--records", help="also write every prompt's responses and grades (JSON)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    p.set_defaults(func=cmd_filter_difficulty)


def cmd_filter_difficulty(args: argparse.Namespace) -> int:
    """Imported on use: the filter needs torch and the rollout engine, `prepare` does not."""
    from rlvr.eval.filter_difficulty import cmd_filter_difficulty as run

    return run(args)


def parse_splits(text: str) -> dict[str, int | float]:
    """Parse "train=1000,test=200" or "train=0.9,test=0.1" (integers are counts)."""
    splits: dict[str, int | float] = {}
    for item in text.split(","):
        name, sep, size = (part.strip() for part in item.partition("="))
        if not sep or not name or not size:
            raise argparse.ArgumentTypeError(
                f"bad split {item!r}: write NAME=SIZE, e.g. train=1000"
            )
        if name in splits:
            raise argparse.ArgumentTypeError(f"split {name!r} given twice")
        try:
            splits[name] = int(size)
        except ValueError:
            try:
                splits[name] = float(size)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"bad size {size!r} for split {name!r}: a row count or a fraction"
                ) from None
    return splits


def config_from_args(args: argparse.Namespace) -> PrepareConfig:
    """Build a PrepareConfig from parsed flags; flags left out keep the config's defaults."""
    values = {
        "input": args.input,
        "out": args.out,
        "splits": args.splits,
        "prompt_field": args.prompt_field,
        "answer_field": args.answer_field,
        "input_split": args.input_split,
        "seed": args.seed,
        "exclude_sources": args.exclude_sources,
        "source_field": args.source_field,
        "min_chars": args.min_chars,
    }
    values = {key: value for key, value in values.items() if value is not None}
    if args.any_answer:
        values["answers"] = "any"
    if args.skip_bad_rows:
        values["on_bad_row"] = "skip"
    if args.overwrite:
        values["overwrite"] = True
    return PrepareConfig(**values)


def cmd_prepare(args: argparse.Namespace) -> int:
    """Run `rlvr data prepare`; print the stage counts and output files. Returns the exit code."""
    try:
        cfg = config_from_args(args)
        manifest = run_prepare(cfg)
    except ValidationError as err:
        for problem in err.errors():
            where = ".".join(str(part) for part in problem["loc"])
            print(f"rlvr data prepare: {where}: {problem['msg']}", file=sys.stderr)
        return 2
    except (DataError, OSError) as err:
        print(f"rlvr data prepare: {err}", file=sys.stderr)
        return 1
    width = max(len(stage["name"]) for stage in manifest["stages"])
    for stage in manifest["stages"]:
        print(f"{stage['name']:<{width}}  kept {stage['kept']:>8}  dropped {stage['dropped']:>8}")
    for name, info in manifest["splits"].items():
        print(f"{name}: {info['rows']} rows -> {cfg.out / info['file']}")
    print(f"manifest: {cfg.out / 'manifest.json'}")
    return 0
