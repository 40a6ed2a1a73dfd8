"""Adapter-only LoRA sync (``rollout.lora_sync``): the vLLM engine serves the base model and
loads the trained adapter as a vLLM LoRA, so a sync moves the adapter's tensors only.

At start the engine gets the base weights (the adapters left out, not merged); each sync writes
the active adapter as a peft folder (``adapter_config.json`` once, ``adapter_model.safetensors``
rewritten atomically; under ``/dev/shm`` where it exists, so nothing touches a disk) and has vLLM
reload it in place (``LoRARequest(load_inplace=True)``, one reload per sync; the generation
requests name the same adapter without ``load_inplace``, which would reload it at every
scheduling step). vLLM computes ``x W + scaling * x A^T B^T`` instead of ``x (W + scaling B A)``:
the same function, rounded differently (the tests bound the log-prob difference).

Where vLLM cannot serve the adapter (a LoRA on the embeddings or a GPT-2 Conv1D, peft's
``modules_to_save``, a rank above vLLM's largest), ``lora_sync=auto`` merges as before and
``lora_sync=adapter`` is refused, naming the reason. The server client (`rlvr.rollout.server`)
registers the folder once (``/v1/load_lora_adapter``) and reloads it in place in the worker
(``server_worker.rlvr_reload_adapter``). Pure torch and peft; no vLLM import.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr.rollout.weight_sync import _LORA, LoraMerge, full_tensors

ADAPTER_NAME = "rlvr-policy"  # the adapter's name in vLLM (one per engine)
ADAPTER_ID = 1
# vLLM's max_lora_rank takes these values only (vllm.config.lora.MaxLoRARanks)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM can be started with that holds an adapter of ``rank``."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(
        f"LoRA rank {rank} is above vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}"
    )


def adapter_problems(model: torch.nn.Module, plan: dict[str, LoraMerge], adapter: str) -> list[str]:
    """Why vLLM cannot serve this peft model's adapter as a LoRA ([] when it can)."""
    out = [f"{m}: LoRA on an embedding" for m, lm in plan.items() if lm.embedding]
    out += [f"{m}: fan_in_fan_out (Conv1D) LoRA" for m, lm in plan.items() if lm.fan_in_fan_out]
    config = getattr(model, "peft_config", {}).get(adapter)
    if config is not None:
        if getattr(config, "modules_to_save", None):
            out.append(f"modules_to_save={config.modules_to_save}: full modules beside the adapter")
        if config.r > VLLM_LORA_RANKS[-1]:
            out.append(f"rank {config.r} > vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")
    return out


def sync_mode(cfg, model: torch.nn.Module, plan: dict[str, LoraMerge], adapter: str) -> str:
    """``full`` (no LoRA), ``adapter`` or ``merged``, from ``rollout.lora_sync``: ``auto`` is the
    adapter wherever vLLM can serve it; ``adapter`` where it cannot is an error naming why."""
    if not plan:
        return "full"
    choice = cfg.rollout.lora_sync
    if choice == "merged":
        return "merged"
    problems = adapter_problems(model, plan, adapter)
    if problems and choice == "adapter":
        raise ValueError(
            f"rollout.lora_sync=adapter: vLLM cannot serve this adapter ({'; '.join(problems)}); "
            "set rollout.lora_sync=merged (or auto)"
        )
    return "merged" if problems else "adapter"


def without_adapters(
    named: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """A peft state dict without its LoRA tensors: with an empty merge plan,
    ``checkpoint_weights`` turns the rest into the base model's checkpoint."""
    return ((n, t) for n, t in named if not _LORA.match(n))


def adapter_tensors(
    named: Iterable[tuple[str, torch.Tensor]], adapter: str, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """The active adapter's LoRA tensors under the names peft saves them with (the adapter's name
    dropped: ``base_model.model.<module>.lora_A.weight``), in ``dtype``. FSDP2 shards of these
    tensors are gathered (every rank calls this with the same stream); base weights are not."""
    picked = []
    for name, tensor in named:
        m = _LORA.match(name)
        if m is None:
            continue
        own, _, param = name[m.end() :].partition(".")
        if own == adapter:
            picked.append((f"{m['module']}.{m['kind']}.{param}", tensor))
    return {
        n: t.detach().to(device="cpu", dtype=dtype).contiguous() for n, t in full_tensors(picked)
    }


def adapter_root() -> Path:
    """Where adapter folders go: shared memory (tmpfs) where the machine has it."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


@dataclass
class AdapterFolder:
    """The adapter as a peft folder vLLM loads from; ``write`` replaces its weights."""

    path: Path
    rank: int

    @classmethod
    def create(cls, model: torch.nn.Module, adapter: str) -> AdapterFolder:
        path = Path(tempfile.mkdtemp(prefix="rlvr-adapter-", dir=adapter_root()))
        config = model.peft_config[adapter]
        config.save_pretrained(str(path))  # adapter_config.json: rank, alpha, targets, rsLoRA
        data = json.loads((path / "adapter_config.json").read_text())
        return cls(path, int(data["r"]))

    def write(self, tensors: dict[str, torch.Tensor]) -> int:
        """Write the adapter's tensors (atomically: vLLM never reads half a file); their bytes."""
        from safetensors.torch import save_file

        tmp = self.path / "adapter_model.safetensors.tmp"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, self.path / "adapter_model.safetensors")
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
