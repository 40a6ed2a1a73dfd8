"""Rollout throughput, vLLM vs transformers, on the same batch in the same process.

    python -m benchmarks.studies.rollout_engines                      # default model, 32 prompts x 8 x 48
    python -m benchmarks.studies.rollout_engines --prompts 8 --repeats 3 --model /path/to/hf/folder
    python -m benchmarks.studies.rollout_engines --prompts 4 --repeats 9 --vllm-compiled  # + compiled vLLM

Both engines are built the way ``rlvr train`` builds them (``build_engine`` with
``rollout.engine=hf`` / ``vllm``): float32 master weights, bf16 autocast for transformers where the
CPU supports it, a bf16 vLLM engine started from the trainer's weights. Each engine gets one
warm-up call, then ``--repeats`` timed calls on the same prompts (arithmetic-task prompts under
the chat template) with the same sampling parameters. Tokens/s counts generated tokens (EOS
included) over wall time. The load average before and after is printed: on a shared machine the
absolute numbers are noise, the ratio less so. Needs vLLM (``make setup-vllm``).

``--vllm-compiled`` adds a third engine, vLLM with ``rollout.enforce_eager=false`` (torch.compile
of the model; rlvr's default is eager), and prints its start-up and tokens/s against eager vLLM's:
what a run gains per step against what it pays once at start.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.harness.machine import load_average


def _config(args, engine: str, *, eager: bool = True):
    from rlvr.config import load_config

    return load_config(
        None,
        [
            f"rollout.engine={engine}",
            f"model.name_or_path={args.model}",
            f"algo.prompts_per_step={args.prompts}",
            f"algo.group_size={args.samples}",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            f"rollout.batch_size={args.hf_batch_size}",
            f"data.max_prompt_tokens={args.max_prompt_tokens}",
            f"train.seed={args.seed}",
            f"rollout.enforce_eager={str(eager).lower()}",
        ],
    )


def _prompts(cfg, tokenizer, n: int) -> list[list[int]]:
    from rlvr.data.tasks import task_rows
    from rlvr.data.templates import render_prompt

    d = cfg.data
    rows, _ = task_rows(d.task, num_train=n, num_eval=1, seed=d.seed, **d.task_kwargs)
    texts = [render_prompt(d.template, r["prompt"], tokenizer, d.system_prompt) for r in rows[:n]]
    return [tokenizer(t, add_special_tokens=False).input_ids for t in texts]


def _time_engine(engine, prompts, params, repeats: int) -> dict:
    engine.generate(prompts, params)  # warm-up
    seconds, tokens = 0.0, 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        groups = engine.generate(prompts, params)
        seconds += time.perf_counter() - t0
        tokens += sum(len(c.token_ids) for g in groups for c in g)
    sequences = repeats * sum(len(g) for g in groups)
    return {"tokens": tokens, "sequences": sequences, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (n)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-prompt-tokens", type=int, default=128)
    p.add_argument(
        "--hf-batch-size", type=int, default=64, help="sequences per hf generate() (config default)"
    )
    p.add_argument("--repeats", type=int, default=1, help="timed calls per engine")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--vllm-compiled",
        action="store_true",
        help="also time vLLM with rollout.enforce_eager=false (torch.compile; slower start-up)",
    )
    args = p.parse_args(argv)

    import torch

    from rlvr.model.loading import load_model_and_tokenizer
    from rlvr.model.precision import bf16_supported
    from rlvr.rollout.base import SamplingParams
    from rlvr.rollout.builder import build_engine

    torch.set_num_threads(args.threads)
    load_before = load_average()
    cfg = _config(args, "hf")
    model, tok = load_model_and_tokenizer(cfg.model.name_or_path, dtype=torch.float32)
    model.eval()
    prompts = _prompts(cfg, tok, args.prompts)
    params = SamplingParams(
        n=args.samples, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    autocast = bf16_supported("cpu")
    results = {}

    hf = build_engine(cfg, model, tok, autocast)
    results["hf"] = _time_engine(hf, prompts, params, args.repeats)
    results["hf"]["dtype"] = "bf16 autocast" if autocast else "float32"
    hf.close()

    arms = {"vllm": True, "vllm-compiled": False} if args.vllm_compiled else {"vllm": True}
    for name, eager in arms.items():
        t0 = time.perf_counter()
        vllm = build_engine(_config(args, "vllm", eager=eager), model, tok, autocast)
        start_s = time.perf_counter() - t0
        try:
            results[name] = _time_engine(vllm, prompts, params, args.repeats)
            results[name]["dtype"] = str(vllm.dtype).removeprefix("torch.")
            results[name]["startup_s"] = start_s
            if eager:  # the sync figure printed below is the default (eager) engine's
                vllm.load_weights(model.state_dict().items())
                sync = vllm.last_sync_stats
        finally:
            vllm.close()
    load_after = load_average()

    print(
        f"\nrollout engines: {len(prompts)} prompts x {args.samples} samples x "
        f"<= {args.max_new_tokens} new tokens, {args.repeats} timed call(s) each, "
        f"{torch.get_num_threads()} torch threads"
    )
    print(f"model: {cfg.model.name_or_path}")

    def rate(name: str) -> float:
        return results[name]["tokens"] / results[name]["seconds"]

    print(
        f"{'engine':<15}{'dtype':<16}{'sequences':>10}{'tokens':>9}{'seconds':>9}{'tokens/s':>10}"
    )
    for name, r in results.items():
        print(
            f"{name:<15}{r['dtype']:<16}{r['sequences']:>10}{r['tokens']:>9}"
            f"{r['seconds']:>9.1f}{rate(name):>10.1f}"
        )
    print(f"ratio vllm / hf tokens/s: {rate('vllm') / rate('hf'):.2f}x")
    if "vllm-compiled" in results:
        extra = results["vllm-compiled"]["startup_s"] - results["vllm"]["startup_s"]
        per_call = (results["vllm"]["seconds"] - results["vllm-compiled"]["seconds"]) / args.repeats
        print(
            f"ratio vllm-compiled / vllm tokens/s: {rate('vllm-compiled') / rate('vllm'):.2f}x; "
            f"start-up {results['vllm-compiled']['startup_s']:.1f} s against "
            f"{results['vllm']['startup_s']:.1f} s"
            + (f", paid back after {extra / per_call:.0f} calls" if per_call > 0 else "")
        )
    print(
        f"vllm start-up {results['vllm']['startup_s']:.1f} s; full weight sync "
        f"{sync.bytes / 2**20:.0f} MiB in {sync.buckets} bucket(s), {sync.seconds:.2f} s"
    )
    print(
        "load average (1/5/15 min) before: "
        + "/".join(f"{x:.2f}" for x in load_before)
        + ", after: "
        + "/".join(f"{x:.2f}" for x in load_after)
    )


if __name__ == "__main__":
    main()
