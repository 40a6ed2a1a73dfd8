"""The `rlvr` command: train | eval | data | preflight | report | merge | config | doctor |
rollout-server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXAMPLES = """\
examples:
  rlvr train                                    # Dr.GRPO on the built-in arithmetic task, default model
  rlvr train -c run.yaml algo.group_size=4 train.lr=2e-6
  rlvr train algo.objective=maxent_listwise algo.maxent.tau=0.5
  rlvr train -c run.yaml --dry-run              # the plan, checked; no weights loaded
  rlvr train --resume runs/drgrpo-arithmetic-...  # continue from its newest complete checkpoint
  rlvr train -c run.yaml train.run_name=r1 --resume auto  # first start and every requeue alike
  rlvr merge runs/NAME                          # LoRA adapter + base -> one HF model
  rlvr preflight -c run.yaml --nproc 8          # the LR schedule, the memory plan, their checks
  rlvr eval runs/drgrpo-arithmetic-.../final --run runs/drgrpo-arithmetic-...
  rlvr report runs/a runs/b                     # plots + one HTML page, runs overlaid
  rlvr data prepare --input raw.jsonl --out data/ --splits train=1000,test=200
  rlvr doctor                                   # what is installed and usable here
  rlvr config -c run.yaml                       # every key: its value, default and meaning

exit codes: 0 ok, 1 error, 2 bad config or input, 3 stopped by the health gate,
  4 preempted (SIGTERM/SIGUSR1, train.stop_signals: the last finished step checkpointed),
  130 interrupted (Ctrl-C)
"""


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c",
        "--config",
        help="YAML config file (sections: model, data, rollout, algo, "
        "reward, train, eval, logging, health)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="section.key=value",
        help="dotted overrides applied after the file, e.g. algo.group_size=4 train.lr=2e-6",
    )


def cmd_train(args: argparse.Namespace) -> int:
    from rlvr.offline import go_offline_if_unreachable

    cfg = _train_config(args)
    go_offline_if_unreachable()  # before the hub libraries are imported (rlvr.offline)
    if args.dry_run:
        from rlvr.training.preflight.dry_run import run_dry

        return run_dry(cfg, resuming=args.resume is not None)
    # before torch is imported: the restart (if any) does not pay for it twice
    _start_with_allocator(args, cfg.train.allocator)
    from rlvr.telemetry.health import HealthStop
    from rlvr.training.preempt import PREEMPTED_EXIT_CODE, Preempted
    from rlvr.training.trainer import Trainer

    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        from rlvr.training.preflight.checks import check_config

        check_config(cfg)  # fail here, not once per spawned process (setup_run checks otherwise)
        return _relaunch_with_torchrun(args.nproc)
    from rlvr.distributed import shutdown

    try:
        Trainer(cfg).fit()
    except HealthStop as stop:
        ev = stop.event
        if int(os.environ.get("RANK", "0")) == 0:
            print(
                f"\n[rlvr] stopped by the health gate: rule {ev.rule!r} at step {ev.step}\n"
                f"  values: {ev.values}\n  advice: {ev.advice}\n"
                f"  kept: {stop.checkpoint} (`rlvr train --resume RUN_DIR` "
                "continues from it, `rlvr eval` reads it)",
                file=sys.stderr,
            )
        return 3
    except Preempted:
        return PREEMPTED_EXIT_CODE  # the trainer said where the checkpoint is
    finally:
        shutdown()
    return 0


def _start_with_allocator(args: argparse.Namespace, choice: str) -> None:
    """Start this command again with tcmalloc/jemalloc preloaded (``train.allocator``, see
    ``rlvr.allocator``), only when ``rlvr`` runs as its own process: ``main(argv)`` called from
    Python keeps the caller's process and its malloc."""
    if getattr(args, "own_process", False):
        from rlvr.allocator import reexec_with

        reexec_with(choice)


def _relaunch_with_torchrun(nproc: int) -> int:
    """`rlvr train --nproc N ...` is `torchrun --nproc-per-node N -m rlvr train ...` on this machine."""
    import subprocess

    argv = [a for a in sys.argv[1:]]
    i = argv.index("--nproc") if "--nproc" in argv else None
    if i is not None:
        del argv[i : i + 2]
    else:
        argv = [a for a in argv if not a.startswith("--nproc=")]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "rlvr",
        *argv,
    ]
    print("[rlvr] " + " ".join(cmd[1:]), flush=True)
    return subprocess.call(cmd)


def _train_config(args: argparse.Namespace):
    """The config of ``rlvr train``; with ``--resume RUN_DIR`` the run's own config.yaml (or -c),
    then the overrides, then ``train.resume=RUN_DIR``."""
    from rlvr.config import ConfigError, load_config

    path = args.config
    if args.resume == "auto":  # the run named by the config, if it has started; else fresh
        cfg = load_config(path, args.overrides)
        cfg.train.resume = "auto"
        return cfg
    if args.resume:
        run_dir = Path(args.resume)
        if not run_dir.is_dir():
            raise ConfigError(f"--resume {run_dir}: no such run directory")
        path = path or run_dir / "config.yaml"
    cfg = load_config(path, args.overrides)
    if args.resume:
        cfg.train.resume = str(args.resume)
    return cfg


def cmd_merge(args: argparse.Namespace) -> int:
    from rlvr.cli.merge import run_merge

    return run_merge(args)


def cmd_preflight(args: argparse.Namespace) -> int:
    from rlvr.offline import go_offline_if_unreachable

    go_offline_if_unreachable()
    from rlvr.config import load_config
    from rlvr.data.rows import load_rows_for
    from rlvr.training.preflight.checks import config_problems
    from rlvr.training.schedule import format_preflight, run_preflight

    cfg = load_config(args.config, args.overrides)
    problems = config_problems(cfg)
    t = cfg.train
    rows, _ = load_rows_for(cfg)
    epochs = t.max_steps * cfg.algo.prompts_per_step / max(1, len(rows))
    print(
        f"train rows: {len(rows)}; prompts/step: {cfg.algo.prompts_per_step}; group size: "
        f"{cfg.algo.group_size}; sequences/step: {cfg.rollout_batch_sequences()}"
    )
    print(
        f"steps: {t.max_steps} (= {epochs:.2f} epochs over the train rows); optimizer steps/step: "
        f"{cfg.algo.minibatches * cfg.algo.epochs_per_batch}"
    )
    res = run_preflight(t)
    print(format_preflight(res))
    from rlvr.training.preflight.memory_check import memory_preflight

    problems += memory_preflight(cfg, world_size=args.nproc)[0]
    for p in problems:
        print(f"config problem: {p}")
    return 0 if res.ok and not problems else 2


def cmd_eval(args: argparse.Namespace) -> int:
    from rlvr.cli.eval import run_eval

    return run_eval(args)


def cmd_report(args: argparse.Namespace) -> int:
    from rlvr.telemetry.report import SUMMARY_FILE, write_report

    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "report"
    html = write_report([Path(d) for d in args.run_dirs], out)
    print((out / SUMMARY_FILE).read_text(), end="")  # the first table: did it work?
    print(f"report: {html}")
    return 0


def cmd_rollout_server(args: argparse.Namespace) -> int:
    from rlvr.config import load_config
    from rlvr.rollout.server_launch import serve_forever

    cfg = load_config(args.config, args.overrides or [])
    token_file = Path(args.token_file) if args.token_file else None
    return serve_forever(cfg, port=args.port, host=args.host, token_file=token_file)


def cmd_config(args: argparse.Namespace) -> int:
    from rlvr.config import load_config
    from rlvr.config.reference import reference_markdown, reference_text

    if args.markdown:
        print(reference_markdown(), end="")
        return 0
    from rlvr.training.preflight.checks import apply_engine_defaults, apply_objective_defaults

    cfg = load_config(args.config, args.overrides)
    for note in cfg.inferred().values():
        print(f"# inferred: {note}")
    # what the run trains with where the config leaves a knob to the objective or the engine
    for key, value in apply_objective_defaults(cfg).items():
        print(f"# algo.objective={cfg.algo.objective}'s default: {key}={value:g}")
    for key, value in apply_engine_defaults(cfg).items():
        print(f"# off-policy rollouts' default: {key}={value}")
    print(reference_text(cfg))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from rlvr.cli.doctor import run_doctor

    return run_doctor()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlvr",
        description="RL fine-tuning of language models with verifiable rewards.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "train",
        help="train a policy (no config: the embedded default demo)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_config_args(p)
    p.add_argument(
        "--resume",
        metavar="RUN_DIR|auto",
        help="continue RUN_DIR from its newest complete checkpoint (its config.yaml, then "
        "overrides); auto: the run train.run_name names, from its newest complete checkpoint "
        "if it has one, else from the start (one command line for a job and its requeues)",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        metavar="N",
        help="train with N processes on this machine (shortcut for torchrun --nproc-per-node N -m rlvr train)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config, resolve the data, print the plan (steps, samples, tokens, "
        "LR schedule) and exit without loading model weights",
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "preflight",
        help="print the LR schedule, step count and memory plan; fail on a bad schedule or a "
        "plan that cannot fit the GPU",
    )
    _add_config_args(p)
    p.add_argument("--nproc", type=int, default=1, metavar="N", help="plan for N processes")
    p.set_defaults(func=cmd_preflight)

    p = sub.add_parser(
        "eval", help="evaluate a model or checkpoint (greedy_pass@1, sampling_pass@k, maj@k)"
    )
    from rlvr.cli.eval import add_eval_args

    add_eval_args(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("report", help="plots and an HTML page for one or more run directories")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", help="output folder (default RUN_DIR/report)")
    p.set_defaults(func=cmd_report)

    # (its arguments live here: importing rlvr.checkpoint.merge imports torch, which `rlvr train` must not
    # pay for before it may start itself again with another malloc)
    p = sub.add_parser("merge", help="merge a LoRA checkpoint into its base model (HF folder)")
    p.add_argument(
        "checkpoint",
        help="a LoRA run's directory (its final/ adapter, else its newest checkpoint), "
        "RUN_DIR/final or RUN_DIR/checkpoints/step_N",
    )
    p.add_argument("--out", help="output folder (default RUN_DIR/merged/<checkpoint name>)")
    p.add_argument("--base", help="base model (default: model.name_or_path of the run's config)")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser(
        "rollout-server",
        help="serve rollouts for rollout.mode=server: vLLM's OpenAI-compatible server for the "
        "config's model, receiving weights from trainers (docs/rollout.md)",
    )
    _add_config_args(p)
    p.add_argument("--port", type=int, help="port (default rollout.server_port)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface, for trainers "
        "on other machines)",
    )
    p.add_argument(
        "--token-file",
        help="where a new token goes when RLVR_ROLLOUT_TOKEN is unset (default "
        "rollout-server-PORT.token here, mode 0600); every request but GET /health needs it",
    )
    p.set_defaults(func=cmd_rollout_server)

    p = sub.add_parser(
        "config",
        help="every config key with its value (the defaults, or -c run.yaml and overrides "
        "resolved), its default and its meaning; --markdown: the reference page "
        "(docs/config.md)",
    )
    _add_config_args(p)
    p.add_argument("--markdown", action="store_true", help="the defaults as a Markdown table")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser(
        "doctor", help="what is installed and usable here, and what to do about the rest"
    )
    p.set_defaults(func=cmd_doctor)

    from rlvr.cli.data import register as register_data

    register_data(sub)
    return parser


def _dashed_hint(stray: list[str], argv: list[str]) -> str:
    """How to write a setting given as a dashed option (TRL's ``--learning_rate 1e-6``; its
    value is the token after it on the command line)."""
    import re

    for token in stray:
        found = re.fullmatch(r"--([A-Za-z_][\w.]*)(?:=(.*))?", token)
        if found is None:
            continue
        from rlvr.config import known_keys
        from rlvr.config.peer_names import peer_entry
        from rlvr.config.sections import Config

        name, value = found.group(1), found.group(2)
        if value is None:
            at = argv.index(token) + 1 if token in argv else len(argv)
            following = argv[at] if at < len(argv) else ""
            value = following if following and not following.startswith("-") else "VALUE"
        if name in known_keys(Config):
            return f"; settings take no dashes: write it as {name}={value}"
        peer = peer_entry(name)
        if peer is not None and peer[1] is not None:
            note = f" ({peer[2]})" if peer[2] else ""
            return f"; settings take no dashes: write it as {peer[1]}={value}{note}"
        if peer is not None:
            return f"; rlvr has no such knob: {peer[2]}"
        return "; settings are written section.key=value, without dashes (rlvr config lists them)"
    return ""


def parse_args_any_order(parser: argparse.ArgumentParser, argv: list[str] | None):
    """``parse_args``, except that ``section.key=value`` overrides may come before, between or
    after the options (``rlvr train a=1 --resume RUN b=2``); their order is kept, later wins.
    argparse stops a ``nargs="*"`` positional at the first option, and its intermixed parsing
    does not support sub-commands."""
    args, extra = parser.parse_known_args(argv)
    stray = [x for x in extra if x.startswith("-") or "=" not in x]
    if stray or (extra and not hasattr(args, "overrides")):
        hint = _dashed_hint(stray, list(sys.argv[1:] if argv is None else argv))
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}{hint}")
    if extra:
        args.overrides = [*(args.overrides or []), *extra]
    return args


def _search_the_working_directory() -> None:
    """A reward or environment named ``my_module:fn`` is found in the directory rlvr runs in,
    as ``python -m rlvr`` finds it (the ``rlvr`` script puts only its own folder on the path).
    Appended, so it never shadows an installed package; sandbox workers inherit the path."""
    cwd = os.getcwd()
    if cwd not in [os.path.abspath(p or ".") for p in sys.path]:
        sys.path.append(cwd)


def main(argv: list[str] | None = None) -> int:
    _search_the_working_directory()
    parser = build_parser()
    args = parse_args_any_order(parser, argv)
    args.own_process = argv is None  # the command line of this process, not a call from Python
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("rlvr: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        code = _exit_code(exc)
        if code is None:
            raise
        return code


def _exit_code(exc: Exception) -> int | None:
    """The exit code and one-line message of an error rlvr explains (None: a bug, re-raised).

    The error types are imported here, not at start-up: ``rlvr train`` may start itself again
    (``rlvr.allocator``) before anything imports torch, and should not pay for torch twice."""
    from rlvr.allocator import AllocatorError
    from rlvr.checkpoint.full import CheckpointError
    from rlvr.config import ConfigError
    from rlvr.model.loading import ModelLoadError
    from rlvr.rewards.runner import RewardFailureError

    if isinstance(exc, ConfigError | AllocatorError):
        print(f"rlvr: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, RewardFailureError):
        print(f"rlvr: stopped: {exc}", file=sys.stderr)
        return 1
    if isinstance(
        exc, FileNotFoundError | ValueError | ModelLoadError | CheckpointError | ConnectionError
    ):
        print(f"rlvr: error: {exc}", file=sys.stderr)
        return 2
    return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["main", "build_parser"]
