"""The update of one micro-batch with a real vocabulary: log-probs from the hidden states a chunk
at a time (``algo.logprob_chunk_tokens``), rlvr's full-logits path (knob 0) and TRL's loss path.

    python -m benchmarks.studies.logprob_chunks --tokens 512,2048 --out benchmarks/results/

A Qwen2-shaped model built from a config (Qwen's 151,936-token vocabulary, hidden 256, 2 layers,
random weights, float32, sdpa attention for every side), 8 replies of ``T`` tokens after one
64-token prompt. Each (side, length) runs once in a process of its own, the sides alternating
per length; a process builds the model and the batch, resets its peak RSS
(``/proc/self/clear_refs``), then times one update: forward, log-probs (and entropies, as each
side's update computes them), a Dr.GRPO clipped loss, backward. Peak memory is the process's
``VmHWM`` after that reset (what the update added on top of the model and the batch is
``peak - before``).

TRL's side is TRL's loss path reproduced from its source (``GRPOTrainer._get_per_token_logps_
and_entropies``: the model's logits for the last ``T + 1`` positions, the last dropped, divided by
the temperature, ``selective_log_softmax`` (gather, then a ``logsumexp`` per row) and, under no
gradient, ``entropy_from_logits`` (128-row chunks); ``trl/trainer/grpo_trainer.py`` and
``trl/trainer/utils.py``), since TRL's venv is not built on every machine. A side whose full
``[8, T, 151936]`` float32 logits would not fit beside the others (``--max-full-tokens``) is not
run at that length: its peak is extrapolated from the shorter lengths (linear in T, as its
logits term is) and marked so.

On a GPU (``--device cuda``) every (side, length) runs in one process, the sides alternating per
length: peak memory is ``torch.cuda.max_memory_allocated`` after a reset just before the update
(exact per update, unlike a process's RSS), times are synchronised, and each side's log-probs and
LM-head gradient are compared with the full path's (the same model and batch: the three paths
compute the same numbers, so a difference beyond rounding is a bug).

Writes ``<out>/<date>-logprob-chunks[-SHAPE][-DEVICE].{json,md}`` (DEVICE: the single-process mode's
``--device``, e.g. ``cuda``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VOCAB = 151_936
ROWS = 8
PROMPT = 64
SIDES = ("chunked", "full", "trl")


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _cpu_seconds() -> float:
    """User + system CPU time of this process: on a machine shared with other work, less
    sensitive than wall time to how many cores the others leave free."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# Model shapes, all with Qwen's vocabulary. "toy" is head-dominated (the head holds ~97% of the
# weights): the memory study's worst case for the logits term, and the worst case for the chunked
# path's time (its backward recomputes each chunk's logits: one more head matmul than the full
# path's three). "qwen2.5-0.5b" is Qwen2.5-0.5B's shape (head = tied embeddings, ~27% of the
# matmul work): the time ratio a real model of that size sees.
SHAPES = {
    "toy": dict(
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}


def build_model(seed: int = 0, shape: str = "toy"):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=8192, **SHAPES[shape])
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).float().train()


def trl_logps(model, input_ids, attention_mask, completion_ids, temperature: float):
    """TRL's ``_get_per_token_logps_and_entropies`` (training: ``compute_entropy=True``)."""
    import torch
    import torch.nn.functional as F

    keep = completion_ids.shape[1]
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep + 1
    ).logits
    logits = logits[:, :-1, :]
    logits = logits[:, -keep:, :]
    logits = logits / temperature
    # selective_log_softmax, float32 branch: gather, then logsumexp one row at a time
    selected = torch.gather(logits, dim=-1, index=completion_ids.unsqueeze(-1)).squeeze(-1)
    lse = torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])
    logps = selected - lse
    with torch.no_grad():  # entropy_from_logits, 128-row chunks
        flat = logits.reshape(-1, logits.shape[-1])
        ents = []
        for chunk in flat.split(128):
            lp = F.log_softmax(chunk, dim=-1)
            ents.append(-(lp.exp() * lp).sum(-1))
        entropies = torch.cat(ents).reshape(logits.shape[:-1])
    return logps, entropies


def make_batch(tokens: int, rows: int, device: str = "cpu"):
    """One prompt repeated ``rows`` times, random replies of ``tokens`` tokens, advantages."""
    import torch

    from rlvr.model.forward import build_sequence_batch

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(10, VOCAB, (PROMPT,), generator=g).tolist()
    comps = [torch.randint(10, VOCAB, (tokens,), generator=g).tolist() for _ in range(rows)]
    sb = build_sequence_batch([prompt] * rows, comps, pad_id=0)
    return sb.to(device), torch.randn(rows, generator=g).to(device)


def update_once(model, side: str, sb, adv, tokens: int, chunk: int):
    """One side's update of the micro-batch: log-probs (and entropies, as each side's update
    computes them), the Dr.GRPO clipped loss, backward. Returns (loss, log-probs, seconds to the
    log-probs)."""
    from rlvr.algorithms import policy_loss
    from rlvr.model.forward import policy_outputs

    t0 = time.perf_counter()
    if side == "trl":
        logp, _ = trl_logps(model, sb.input_ids, sb.attention_mask, sb.completion_ids, 1.0)
    else:
        out, _ = policy_outputs(model, sb, chunk_tokens=chunk if side == "chunked" else 0)
        logp, _ = out.logprobs(sb, 1.0)
        del out
    t_fwd = time.perf_counter() - t0
    # Dr.GRPO: both sides' clipped surrogate, sum over tokens / (rows x max length)
    loss, _ = policy_loss(
        logp,
        logp.detach(),
        adv,
        sb.completion_mask,
        agg_mode="seq_mean_token_sum_norm",
        max_len=tokens,
    )
    loss.backward()
    return loss, logp.detach(), t_fwd


def child(side: str, tokens: int, chunk: int, threads: int, rows: int, shape: str) -> dict:
    import torch

    torch.set_num_threads(threads)
    model = build_model(shape=shape)
    sb, adv = make_batch(tokens, rows)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM) to now
    before = _status_kib("VmRSS")
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    loss, _, t_fwd = update_once(model, side, sb, adv, tokens, chunk)
    total = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    return {
        "side": side,
        "tokens": tokens,
        "rows": rows,
        "shape": shape,
        "chunk": chunk if side == "chunked" else 0,
        "seconds": total,
        "forward_seconds": t_fwd,
        "cpu_seconds": cpu,
        "rss_before_mib": before / 1024,
        "peak_rss_mib": _status_kib("VmHWM") / 1024,
        "update_added_mib": (_status_kib("VmHWM") - before) / 1024,
        "loss": float(loss.detach()),
    }


def on_device(device: str, sides: list[str], lengths: list[int], chunk: int, rows: int, shape: str):
    """Every (side, length) in this process on ``device``, one update each, the sides
    alternating per length; yields each row as it is measured. The peak is
    ``max_memory_allocated`` after a reset just before the update ('added' = peak minus what
    was allocated then: the model and the batch); each side's log-probs and LM-head gradient
    against the full path's at the same length (or the first side's, without a full side)."""
    import torch

    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    model = build_model(shape=shape).to(device)
    head = model.get_output_embeddings().weight
    for tokens in lengths:
        sb, adv = make_batch(tokens, rows, device)
        ref: dict = {}
        for side in sorted(sides, key=lambda s: s != "full"):  # the reference first
            model.zero_grad(set_to_none=True)
            sync()
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device) if cuda else 0
            t0 = time.perf_counter()
            loss, logp, t_fwd = update_once(model, side, sb, adv, tokens, chunk)
            sync()
            seconds = time.perf_counter() - t0
            peak = torch.cuda.max_memory_allocated(device) if cuda else 0
            grad = head.grad.detach().float()
            if not ref:
                ref = {"side": side, "logp": logp.float(), "grad": grad}
            yield {
                "side": side,
                "tokens": tokens,
                "rows": rows,
                "shape": shape,
                "device": device,
                "chunk": chunk if side == "chunked" else 0,
                "seconds": seconds,
                "forward_seconds": t_fwd,
                "cpu_seconds": seconds,  # the report's columns: no separate CPU time here
                "peak_rss_mib": peak / 2**20,  # the device's peak, in the report's column
                "update_added_mib": (peak - before) / 2**20,
                "loss": float(loss.detach()),
                "compared_with": ref["side"],
                "logp_max_abs_diff": float((logp.float() - ref["logp"]).abs().max()),
                "head_grad_rel_diff": float(
                    (grad - ref["grad"]).norm() / ref["grad"].norm().clamp_min(1e-30)
                ),
            }
            del loss, logp, grad


MEASURED = ("seconds", "forward_seconds", "cpu_seconds", "peak_rss_mib", "update_added_mib")


def median_row(runs: list[dict]) -> dict:
    """One (side, length) over its repeated runs: the median of each measured figure (a run
    slowed by other work on the machine moves a median of three less than a mean)."""
    import statistics

    out = dict(runs[0])
    for key in MEASURED:
        out[key] = statistics.median(r[key] for r in runs)
    out["repeats"] = len(runs)
    return out


def run_one(side: str, tokens: int, chunk: int, threads: int, rows: int, shape: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.studies.logprob_chunks", "--child", side]
    cmd += ["--tokens", str(tokens), "--chunk", str(chunk), "--threads", str(threads)]
    cmd += ["--rows", str(rows), "--shape", shape]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def slope_mib_per_1k(rows: list[dict], key: str = "update_added_mib") -> float | None:
    """Least-squares slope of ``key`` against tokens per reply, per 1,000 tokens."""
    pts = [(r["tokens"], r[key]) for r in rows if not r.get("extrapolated")]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    num = sum((x - mx) * (y - my) for x, y in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return 1000 * num / den


def extrapolate(rows: list[dict], tokens: int) -> dict | None:
    """A side's peak at ``tokens`` from its measured lengths, linear in tokens."""
    pts = sorted((r["tokens"], r) for r in rows if not r.get("extrapolated"))
    if len(pts) < 2:
        return None
    (x0, a), (x1, b) = pts[-2], pts[-1]
    out = {"side": a["side"], "tokens": tokens, "rows": a.get("rows", ROWS), "extrapolated": True}
    for key in ("peak_rss_mib", "update_added_mib", "seconds", "cpu_seconds"):
        out[key] = a[key] + (b[key] - a[key]) * (tokens - x0) / (x1 - x0)
    return out


def render(payload: dict) -> str:
    if payload.get("device", "cpu") != "cpu":  # the single-process mode
        return render_device(payload)
    lines = [
        f"# Log-probs without the full logits ({payload['date']})",
        "",
        f"{payload['machine']}; torch {payload['torch']}; {payload['threads']} threads. One update "
        f"of {payload['rows_per_batch']} replies x T tokens (+{PROMPT}-token prompt), "
        f"Qwen2-shaped model '{payload['shape']}' ({_shape_text(payload['shape'])}, vocab {VOCAB}, "
        f"float32, random weights); median of {payload.get('repeats', 1)} run(s) each; chunked: "
        f"algo.logprob_chunk_tokens={payload['chunk']}. Peak = the process's VmHWM after a reset "
        "just before the update; 'added' = peak minus RSS before the update. "
        "CPU seconds: user + system time of the update (wall time moves with the load "
        f"others put on the machine: load average {payload.get('load', '?')} at the start). "
        "(x) = extrapolated linearly from the two longest measured lengths (not run: its full "
        "logits would not fit on this machine beside the others).",
        "",
        "| T | side | peak RSS MiB | added MiB | seconds | CPU seconds | peak / TRL | peak / full "
        "| time / full | CPU time / full |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["rows"]:
        mark = " (x)" if r.get("extrapolated") else ""
        lines.append(
            f"| {r['tokens']} | {r['side']}{mark} | {r['peak_rss_mib']:.0f} | "
            f"{r['update_added_mib']:.0f} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | "
            f"{r.get('peak_vs_trl', '')} | {r.get('peak_vs_full', '')} | "
            f"{r.get('time_vs_full', '')} | {r.get('cpu_vs_full', '')} |"
        )
    lines += [
        "",
        "Slope of the update's added memory per 1k tokens per reply (measured points):",
        "",
    ]
    for side, s in payload["slopes_mib_per_1k"].items():
        lines.append(f"- {side}: {s:.0f} MiB" if s is not None else f"- {side}: n/a")
    return "\n".join(lines) + "\n"


def render_device(payload: dict) -> str:
    lines = [
        f"# Log-probs without the full logits on {payload['device']} ({payload['date']})",
        "",
        f"{payload['machine']}; torch {payload['torch']}. One update of "
        f"{payload['rows_per_batch']} replies x T tokens (+{PROMPT}-token prompt), Qwen2-shaped "
        f"model '{payload['shape']}' ({_shape_text(payload['shape'])}, vocab {VOCAB}, float32, "
        f"random weights), all in one process; chunked: algo.logprob_chunk_tokens="
        f"{payload['chunk']}. Peak = torch.cuda.max_memory_allocated after a reset just before "
        "the update; 'added' = peak minus what the model and the batch held then. Differences "
        "against the full path on the same model and batch: the largest |log-prob| difference "
        "and the LM-head gradient's relative difference (norm of the difference / norm).",
        "",
        "| T | side | peak MiB | added MiB | seconds | peak / TRL | added / TRL | time / full "
        "| max logp diff | head grad rel diff |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["rows"]:
        added = r.get("added_vs_trl") or ""
        lines.append(
            f"| {r['tokens']} | {r['side']} | {r['peak_rss_mib']:.0f} | "
            f"{r['update_added_mib']:.0f} | {r['seconds']:.3f} | {r.get('peak_vs_trl') or ''} | "
            f"{added} | {r.get('time_vs_full') or ''} | {r.get('logp_max_abs_diff', 0):.2e} | "
            f"{r.get('head_grad_rel_diff', 0):.2e} |"
        )
    return "\n".join(lines) + "\n"


def _shape_text(shape: str) -> str:
    c = SHAPES[shape]
    tied = "tied head" if c["tie_word_embeddings"] else "untied head"
    return f"hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, {tied}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=SIDES)
    p.add_argument("--tokens", default="512,2048")
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-full-tokens", type=int, default=1024, help="longest T the full sides run")
    p.add_argument("--rows", type=int, default=ROWS, help="replies in the micro-batch")
    p.add_argument("--repeats", type=int, default=1, help="runs per (side, length): medians")
    p.add_argument("--shape", choices=sorted(SHAPES), default="toy", help="the model's shape")
    p.add_argument("--sides", default=",".join(SIDES), help=f"which of {','.join(SIDES)} to run")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu: a process per (side, length), peaks by RSS; cuda: one process, peaks by "
        "torch.cuda.max_memory_allocated, every side's numbers compared with the full path's",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="the cuda mode's single process on any device (on the CPU: the GPU call's rehearsal)",
    )
    args = p.parse_args(argv)
    if args.child:
        r = child(args.child, int(args.tokens), args.chunk, args.threads, args.rows, args.shape)
        print(json.dumps(r))
        return 0
    sides = [s for s in SIDES if s in args.sides.split(",")]
    import platform

    import torch

    lengths = [int(t) for t in args.tokens.split(",")]
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    rows: list[dict] = []
    t0 = time.perf_counter()
    runs: list[dict] = []
    gpu = args.device != "cpu" or args.in_process  # one process, the device's own counters
    for _ in range(args.repeats):  # rounds: each side once per length, alternating, per round
        if gpu:
            for r in on_device(args.device, sides, lengths, args.chunk, args.rows, args.shape):
                print(json.dumps(r), flush=True)
                runs.append(r)
            continue
        for tokens in lengths:
            for side in sides:
                if side != "chunked" and tokens > args.max_full_tokens:
                    continue
                r = run_one(side, tokens, args.chunk, args.threads, args.rows, args.shape)
                print(json.dumps(r), flush=True)
                runs.append(r)
    for key in dict.fromkeys((r["side"], r["tokens"]) for r in runs):
        rows.append(median_row([r for r in runs if (r["side"], r["tokens"]) == key]))
    for tokens in lengths:
        for side in ("full", "trl"):
            if tokens > args.max_full_tokens and not gpu:
                est = extrapolate([r for r in rows if r["side"] == side], tokens)
                if est:
                    rows.append(est)
    by = {(r["side"], r["tokens"]): r for r in rows}

    def ratio(a: float, b: float) -> float | None:  # None: no measure (the CPU in process)
        return round(a / b, 3) if b else None

    for r in rows:
        trl, full = by.get(("trl", r["tokens"])), by.get(("full", r["tokens"]))
        if trl:
            r["peak_vs_trl"] = ratio(r["peak_rss_mib"], trl["peak_rss_mib"])
            r["added_vs_trl"] = ratio(r["update_added_mib"], trl["update_added_mib"])
        if full:
            r["peak_vs_full"] = ratio(r["peak_rss_mib"], full["peak_rss_mib"])
            r["time_vs_full"] = ratio(r["seconds"], full["seconds"])
            r["cpu_vs_full"] = ratio(r["cpu_seconds"], full["cpu_seconds"])
    rows.sort(key=lambda r: (r["tokens"], SIDES.index(r["side"])))
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except StopIteration:
        cpu = platform.processor()
    if args.device.startswith("cuda"):
        cpu = f"{torch.cuda.get_device_name(args.device)} (host: {cpu})"
    payload = {
        "date": dt.date.today().isoformat(),
        "machine": cpu,
        "device": args.device if not gpu else f"{args.device} (in process)",
        "torch": torch.__version__,
        "threads": args.threads,
        "chunk": args.chunk,
        "shape": args.shape,
        "rows_per_batch": args.rows,
        "load": load,
        "rows": rows,
        "runs": runs,
        "repeats": args.repeats,
        "slopes_mib_per_1k": {
            s: slope_mib_per_1k([r for r in rows if r["side"] == s]) for s in SIDES
        },
        "wall_seconds": time.perf_counter() - t0,
        "command": "python -m benchmarks.studies.logprob_chunks " + " ".join(argv or sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = ("" if args.shape == "toy" else f"-{args.shape}") + (
        f"-{args.device.replace(':', '')}" if gpu else ""
    )
    stem = args.out / f"{payload['date']}-logprob-chunks{suffix}"
    # the stem may hold dots (qwen2.5-0.5b): append, never with_suffix
    stem.parent.joinpath(stem.name + ".json").write_text(json.dumps(payload, indent=2) + "\n")
    stem.parent.joinpath(stem.name + ".md").write_text(render(payload))
    print(render(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
