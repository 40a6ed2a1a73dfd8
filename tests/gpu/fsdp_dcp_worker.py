"""Run by test_cuda_fsdp_dcp.py under ``torchrun --nproc-per-node 1``: FSDP2 on one process
(NCCL on CUDA, gloo on the CPU), then rlvr's sharded (DCP) checkpoint written and restored.

rlvr itself wraps and writes DCP only with several processes, and NCCL refuses two ranks on one
GPU, so this drives the same functions (``wrap_model``, ``save_sharded_checkpoint``,
``restore_sharded_checkpoint``) in a one-rank group. Writes its findings to ``OUT/result.json``.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from rlvr.checkpoint.sharded import is_sharded, restore_sharded_checkpoint, save_sharded_checkpoint
from rlvr.distributed import group_backend, wrap_model
from rlvr.training.batching import PromptSampler
from rlvr.training.tiny import build_char_tokenizer, build_tiny_model


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def train_step(model, opt, ids, device) -> float:
    """One bf16-autocast forward/backward and AdamW step; the loss."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits
    loss = -torch.log_softmax(logits.float(), -1)[..., 5].mean()
    loss.backward()
    opt.step()
    return float(loss.detach())


def state_of(model, opt, step: int):
    """The train state as checkpoint I/O sees it (checkpoint/protocol.Checkpointable)."""
    return SimpleNamespace(
        model=model,
        optimizer=opt,
        scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
        sampler=PromptSampler(10, 2, seed=0),
        kl_ctl=SimpleNamespace(value=0.0),
        objective=SimpleNamespace(
            modules=lambda: {}, state_dict=lambda: {}, load_state_dict=lambda s: None
        ),
        step=step,
        policy_version=step,
    )


def sharded_model(tok, seed: int, device):
    model = build_tiny_model(tok, seed=seed, heads=4, kv_heads=2).to(device)
    # rlvr's FSDP2 wrapping as under several processes (wrap_model reads only `enabled`)
    wrap_model(model, SimpleNamespace(enabled=True, rank=0, world_size=1, local_rank=0), "fsdp2")
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def main(out: Path, device_name: str) -> None:
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(group_backend(device.type == "cuda"))  # rlvr's own group
    tok = build_char_tokenizer()
    ids = torch.randint(0, len(tok), (4, 16), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    result: dict = {"backend": str(dist.get_backend())}
    flag = torch.tensor([1.0])  # a CPU tensor, as the checkpoint's agreement flag is
    dist.all_reduce(flag)
    result["cpu_tensor_reduced"] = float(flag)

    # FSDP2 against the plain model: same init, same batch, one step
    plain = build_tiny_model(tok, seed=0, heads=4, kv_heads=2).to(device)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    model, opt = sharded_model(tok, 0, device)
    result["dtensor_params"] = all(type(p).__name__ == "DTensor" for p in model.parameters())
    loss_plain = train_step(plain, plain_opt, ids, device)
    loss_sharded = train_step(model, opt, ids, device)
    result["loss_plain"], result["loss_sharded"] = loss_plain, loss_sharded
    ref = dict(plain.named_parameters())
    result["max_weight_diff_vs_plain"] = max(
        float((full(p) - ref[n].detach()).abs().max()) for n, p in model.named_parameters()
    )

    # a sharded checkpoint of that state, restored into a differently initialised model
    state = state_of(model, opt, step=1)
    path = save_sharded_checkpoint(state, out / "run", tokenizer=tok, config_yaml="{}\n")
    result["is_sharded"] = is_sharded(path)
    saved_w = {n: full(p) for n, p in model.named_parameters()}
    saved_o = copy.deepcopy(
        {n: {k: full(v) for k, v in opt.state[p].items()} for n, p in model.named_parameters()}
    )
    fresh, fresh_opt = sharded_model(tok, 7, device)
    fresh_state = state_of(fresh, fresh_opt, step=0)
    restore_sharded_checkpoint(fresh_state, path)
    result["step_restored"] = fresh_state.step
    result["weights_bitwise"] = all(
        torch.equal(full(p), saved_w[n]) for n, p in fresh.named_parameters()
    )
    result["optimizer_bitwise"] = all(
        set(fresh_opt.state[p]) == set(saved_o[n])
        and all(torch.equal(full(v), saved_o[n][k]) for k, v in fresh_opt.state[p].items())
        for n, p in fresh.named_parameters()
    )
    # the next step from the restored state lands where the original's does
    train_step(model, opt, ids, device)
    train_step(fresh, fresh_opt, ids, device)
    result["next_step_bitwise"] = all(
        torch.equal(full(p), full(q))
        for p, q in zip(model.parameters(), fresh.parameters(), strict=True)
    )
    (out / "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
