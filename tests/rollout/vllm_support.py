"""Shared pieces of the vLLM tests: the tiny models, a trained copy, trainer-side log-probs.

Models are Llama-shaped with head_dim 64 (hidden 128, 2 heads, 1 KV head): vLLM's CPU attention
kernels refuse smaller heads. Everything is float32 with autocast off, so the engine computes in
float32 too (``engine_dtype``) and engine and trainer agree to float32 rounding.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from rlvr.config import load_config
from rlvr.model.forward import build_sequence_batch, sequence_logprobs
from rlvr.training.tiny import build_tiny_model

TINY = dict(hidden=128, heads=2, kv_heads=1, layers=2, intermediate=128)
# float32 engine vs float32 trainer: measured differences were below 2e-6 (different kernels sum
# in different orders); 1e-4 leaves a 50x margin and is still far below the 0.1-2 nats a stale
# weight or a wrong merge produces (the "stale" checks below assert that gap).
LOGPROB_TOL = 1e-4
STALE_MIN = 0.05
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def engine_config():
    """Run config of the session engine: float32 numerics, short sequences (max_model_len 48)."""
    return load_config(
        None,
        [
            "model.autocast='off'",
            "rollout.engine=vllm",
            "data.max_prompt_tokens=32",
            "rollout.max_new_tokens=16",
            "algo.prompts_per_step=4",
            "algo.group_size=8",
            "train.seed=0",
            # the session engine takes plain and peft state dicts alike: LoRA merged on the fly
            # (adapter-only sync has its own engine: test_vllm_adapter_sync.py)
            "rollout.lora_sync=merged",
        ],
    )


def base_model(tok) -> torch.nn.Module:
    return build_tiny_model(tok, seed=0, **TINY).eval()


def peft_model(tok) -> torch.nn.Module:
    """The base model under a fresh LoRA adapter (B = 0, so it computes exactly the base model)."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, lora_dropout=0.0)
    return get_peft_model(base_model(tok), cfg).eval()


def pattern_ids(tok, text: str, repeats: int) -> list[int]:
    """``text`` then EOS, ``repeats`` times: a sequence that teaches the model to stop."""
    one = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]
    return one * repeats


def trained_copy(model: torch.nn.Module, tok, steps: int = 30) -> torch.nn.Module:
    """A copy of ``model`` after ``steps`` AdamW steps of next-token loss on "xyz<eos>" repeated.

    Only parameters with ``requires_grad`` move, so on a peft model only the adapter trains.
    """
    torch.manual_seed(1)
    out = copy.deepcopy(model).train()
    params = [p for p in out.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    ids = torch.tensor([pattern_ids(tok, "xyz", 6)] * 2)
    for _ in range(steps):
        loss = out(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return out.eval()


def trainer_logprobs(
    model: torch.nn.Module,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    temperature: float = 1.0,
) -> list[torch.Tensor]:
    """The trainer's log-prob of each completion token (``sequence_logprobs``), one tensor each."""
    with torch.no_grad():
        lp, _ = sequence_logprobs(
            model, build_sequence_batch(prompts, completions, pad_id), temperature=temperature
        )
    return [lp[i, : len(c)] for i, c in enumerate(completions)]


def max_abs_diff(trainer: list[torch.Tensor], engine: list[list[float]]) -> float:
    diffs = [(t - torch.tensor(e)).abs() for t, e in zip(trainer, engine, strict=True) if len(e)]
    return float(torch.cat(diffs).max())


@contextlib.contextmanager
def rollout_server(model_dir: Path, args: list[str], log: Path) -> Iterator[str]:
    """`rlvr rollout-server` for ``model_dir`` with ``args`` (config overrides, flags) on a free
    127.0.0.1 port, in a process group of its own, its output in ``log``; yields its URL. Its
    token is in this process's environment while it runs (the trainers here and their children
    read it there). Stopped with its whole group (vLLM's engine process included): SIGTERM, then
    SIGKILL after 60 s, so a failing test leaves no process behind for the next ones."""
    from rlvr.rollout.server_auth import TOKEN_ENV, new_token
    from rlvr.rollout.server_launch import free_port, wait_healthy

    os.environ[TOKEN_ENV] = new_token()
    port = free_port("127.0.0.1")
    cmd = [sys.executable, "-m", "rlvr", "rollout-server", f"model.name_or_path={model_dir}"]
    cmd += [*args, "--port", str(port), "--host", "127.0.0.1"]
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 300, log)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        with contextlib.suppress(ProcessLookupError):  # what SIGTERM left: the group's others
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        os.environ.pop(TOKEN_ENV, None)
