"""Rollouts with the trainer's own transformers module: always available, nothing to sync.

Because this engine generates with the very module being trained, there is nothing to
synchronise: ``load_weights`` is a no-op and the sampler's log-probs come from the same weights.
Text prompts go through our decoding loop (``rollout/decode.py``: faster sampling, finished rows
leave the batch; the linear layers on oneDNN-packed weights on a CPU, ``rollout/packed_linears.py``)
unless ``decoder="generate"`` (``rollout.hf_decoder``) asks for transformers' ``generate``, the
reference the loop is tested against. Image prompts (a vision-language model)
always go through ``generate`` and carry their pixel inputs per prompt (``vision``); each chunk
feeds its own prompts' images, concatenated in row order, with left padding like text."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from rlvr.data.multimodal import PromptVision, collate_vision, vision_token_ids
from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.decode import decode
from rlvr.rollout.packed_linears import packed_linears

# 'loop': rollout/decode.py; 'generate': transformers' generate (what image prompts always use)
DECODERS = ("loop", "generate")


class HFEngine:
    name = "hf"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        batch_size: int = 64,
        autocast: bool = False,
        synced: bool = False,
        autocast_dtype: torch.dtype = torch.bfloat16,
        decoder: str = "loop",
    ):
        if decoder not in DECODERS:
            raise ValueError(f"decoder={decoder!r}: known: {', '.join(DECODERS)}")
        self.decoder = decoder
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.autocast = autocast
        self.autocast_dtype = autocast_dtype  # eval.dtype when evaluating (rlvr.eval.engine)
        # FSDP: every rank must run the same number of forward passes (HF's synced_gpus).
        self.synced = synced
        # The trainer's module is this engine's: whatever version the trainer records is held.
        self.policy_version = 0
        # generate() runs the trainer's module itself: sync_engine never pushes weights here and
        # labels every completion with the current policy version
        self.shares_weights = True
        # a VLM's image placeholders are never sampled (see vision_token_ids)
        self.suppress = vision_token_ids(getattr(model, "config", None))

    def _autocast(self):
        if not self.autocast:
            return contextlib.nullcontext()
        device = next(self.model.parameters()).device.type
        return torch.autocast(device_type=device, dtype=self.autocast_dtype)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        vision: list[PromptVision] | None = None,
    ) -> list[list[Completion]]:
        """``params.n`` completions per prompt; ``vision[i]``: prompt i's images (VLM only)."""
        if vision is not None and len(vision) != len(prompt_ids):
            raise ValueError(f"{len(vision)} vision inputs for {len(prompt_ids)} prompts")
        flat = [(i, ids) for i, ids in enumerate(prompt_ids) for _ in range(params.n)]
        out: list[list[Completion]] = [[] for _ in prompt_ids]
        was_training = self.model.training
        self.model.eval()
        rows = params.n if params.prompt_seeds is not None else min(len(flat), self.batch_size)
        try:
            with self._packed(rows, vision):
                self._generate_into(out, prompt_ids, flat, params, vision)
        finally:
            self.model.train(was_training)
        return out

    def _packed(
        self, rows: int, vision: list[PromptVision] | None
    ) -> contextlib.AbstractContextManager:
        """The linear layers on weights packed once for the rollout (``rollout/packed_linears.py``)
        where our loop decodes text on a CPU; not under FSDP, whose sharded weights the module's
        own hooks gather, nor for transformers' ``generate`` (images, ``decoder="generate"``)."""
        if vision or self.decoder != "loop" or self.synced:
            return contextlib.nullcontext(0)
        dtype = self.autocast_dtype if self.autocast else next(self.model.parameters()).dtype
        return packed_linears(self.model, dtype, rows)

    def _generate_into(
        self,
        out: list[list[Completion]],
        prompt_ids: list[list[int]],
        flat: list[tuple[int, list[int]]],
        params: SamplingParams,
        vision: list[PromptVision] | None,
    ) -> None:
        """Fill ``out[i]`` with prompt i's completions: per prompt with its own seed, or in
        chunks of ``batch_size`` rows of ``flat`` (prompt index, ids)."""
        if params.prompt_seeds is not None:
            if len(params.prompt_seeds) != len(prompt_ids):
                raise ValueError(
                    f"{len(params.prompt_seeds)} prompt seeds for {len(prompt_ids)} prompts"
                )
            for i, ids in enumerate(prompt_ids):
                torch.manual_seed(params.prompt_seeds[i])
                images = None if vision is None else [vision[i]] * params.n
                for comp in self._generate_chunk([ids] * params.n, params, images):
                    comp.prompt_index = i
                    out[i].append(comp)
            return
        if params.seed is not None:
            torch.manual_seed(params.seed)
        for start in range(0, len(flat), self.batch_size):
            chunk = flat[start : start + self.batch_size]
            images = None if vision is None else [vision[c[0]] for c in chunk]
            for (idx, _), comp in zip(
                chunk, self._generate_chunk([c[1] for c in chunk], params, images), strict=True
            ):
                comp.prompt_index = idx
                out[idx].append(comp)

    def _vision_kwargs(self, ids: torch.Tensor, vision: list[PromptVision] | None) -> dict:
        """Pixel inputs of the chunk's prompts in row order, and which tokens are image tokens
        (Qwen2-VL computes its multimodal positions from them)."""
        inputs = collate_vision(vision) if vision else {}
        if not inputs:
            return {}
        is_image = ids == self.model.config.image_token_id
        return {**inputs, "mm_token_type_ids": is_image.long()}

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        vision: list[PromptVision] | None = None,
    ) -> list[Completion]:
        tok = self.tokenizer
        pad = tok.pad_token_id
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        if not vision and self.decoder == "loop":
            return self._decode_text(ids.to(device), mask.to(device), params)
        return self._generate_hf(ids, mask, params, vision)

    def _decode_text(
        self, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams
    ) -> list[Completion]:
        """Text prompts: our own loop (``rollout/decode.py``), where finished rows leave."""
        tok = self.tokenizer
        stop = tuple(params.stop)
        with self._autocast():
            replies = decode(
                self.model,
                ids,
                mask,
                params,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                ends_with_stop=(lambda row: self._ends_with_stop(row, len(row) - 1, stop))
                if stop
                else None,
                suppress=self.suppress,
                synced=self.synced,
            )
        return [
            Completion(
                prompt_index=-1,
                token_ids=r.token_ids,
                logprobs=r.logprobs,
                text=tok.decode(r.token_ids, skip_special_tokens=True),
                finish_reason=r.finish_reason,
            )
            for r in replies
        ]

    def _generate_hf(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        params: SamplingParams,
        vision: list[PromptVision] | None,
    ) -> list[Completion]:
        """transformers' ``generate``: always for image prompts, which lets the model derive its
        own multimodal positions (rows cannot leave the batch early here), and for text prompts
        with ``decoder="generate"``."""
        tok = self.tokenizer
        pad = tok.pad_token_id
        device = next(self.model.parameters()).device
        width = ids.shape[1]
        greedy = params.temperature <= 0
        kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            do_sample=not greedy,
            pad_token_id=pad,
            eos_token_id=tok.eos_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if not greedy:
            kwargs.update(
                temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or None
            )
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=tok)
        if self.synced:
            kwargs["synced_gpus"] = True
        if self.suppress:  # raw logits (the log-probs below) keep the policy's own distribution
            kwargs["suppress_tokens"] = self.suppress
        images = {k: v.to(device) for k, v in self._vision_kwargs(ids, vision).items()}
        with self._autocast():
            res = self.model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), **images, **kwargs
            )
        new = res.sequences[:, width:].cpu()
        # Sampler log-probs: the temperature-scaled distribution the tokens were drawn from
        # (top-p/top-k truncation aside), matching how the trainer scores them.
        # one decoding step at a time: never a stacked [B, T, V] float32 copy
        scale = 1.0 if greedy else params.temperature
        logp = torch.stack(
            [
                torch.gather(
                    F.log_softmax(step.float().cpu() / scale, -1), -1, new[:, t : t + 1]
                ).squeeze(-1)
                for t, step in enumerate(res.logits)
            ],
            dim=1,
        )
        comps = []
        for row, lp in zip(new.tolist(), logp.tolist(), strict=True):
            n, reason = self._cut(row, params)
            token_ids = row[:n]
            comps.append(
                Completion(
                    prompt_index=-1,
                    token_ids=token_ids,
                    logprobs=lp[:n],
                    text=tok.decode(token_ids, skip_special_tokens=True),
                    finish_reason=reason,
                )
            )
        return comps

    def _cut(self, row: list[int], params: SamplingParams) -> tuple[int, str]:
        """Length of the real completion (EOS included) and why it ended."""
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        for j, t in enumerate(row):
            if t == eos:
                return j + 1, "stop"
            if pad == eos and params.stop and self._ends_with_stop(row, j, params.stop):
                # the pads after a stop string are EOS tokens here: in a batch they would count
                # as the model's own EOS, and the reply would differ from the same prompt alone
                return j + 1, "stop"
        n = len(row)
        if pad != eos:
            while n > 0 and row[n - 1] == pad:
                n -= 1
        if n < len(row):  # generation stopped early: a stop string ended it
            return n, "stop"
        if params.stop:
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            if any(text.endswith(s) for s in params.stop):
                return n, "stop"
        return n, "length"

    def _ends_with_stop(self, row: list[int], j: int, stop: tuple[str, ...]) -> bool:
        """Whether the reply's text up to token ``j`` ends with a stop string (decoding only the
        last tokens: a stop string of L characters spans at most L tokens)."""
        tail = row[max(0, j + 1 - max(len(s) for s in stop)) : j + 1]
        text = self.tokenizer.decode(tail, skip_special_tokens=True)
        return any(text.endswith(s) for s in stop)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """No-op: this engine samples from the trainer's own module."""

    def close(self) -> None:
        self.model = None
