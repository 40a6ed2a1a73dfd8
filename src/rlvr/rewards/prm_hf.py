"""A process reward model backed by a Hugging Face token-classification model (URSA style).

The scorer's input is ``[BOS] prompt \\n step_1 TAG \\n step_2 TAG \\n ...``: a tag token
after every step. One forward pass gives logits of shape ``[1, seq_len, num_labels]``;
step k's score is ``sigmoid(logits[0, pos_k, label_index])`` where ``pos_k`` is the
position of the k-th tag.

Each piece is tokenised separately and the ids are concatenated, so the tag is always
exactly one token at a known position (a BPE tokenizer cannot merge it with the text
around it). Tag strings already present in the prompt or steps are removed first, so a
response cannot forge extra scoring positions.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer

__all__ = ["HFTokenClassificationPRM"]


class HFTokenClassificationPRM:
    """Scores steps with ``AutoModelForTokenClassification``; see the module docstring.

    ``model_path_or_model`` is a local directory / hub id (the tokenizer is then loaded
    from it unless given) or an already built model (``tokenizer`` required).
    ``label_index`` picks the logit column; ``max_length`` (default: the model's
    ``max_position_embeddings``) bounds the input, longer inputs raise ValueError.
    """

    def __init__(
        self,
        model_path_or_model: str | os.PathLike[str] | torch.nn.Module,
        tokenizer: Any = None,
        *,
        tag_token: str = "ки",
        label_index: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        step_separator: str = "\n",
        max_length: int | None = None,
    ) -> None:
        if isinstance(model_path_or_model, (str, os.PathLike)):
            path = os.fspath(model_path_or_model)
            model = AutoModelForTokenClassification.from_pretrained(path, dtype=dtype)
            tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
        else:
            model = model_path_or_model
            if tokenizer is None:
                raise ValueError("tokenizer is required when passing a model object")
        num_labels = int(getattr(model.config, "num_labels", 1))
        if not 0 <= label_index < num_labels:
            raise ValueError(f"label_index {label_index} out of range for num_labels={num_labels}")
        tag_ids = tokenizer.encode(tag_token, add_special_tokens=False)
        if len(tag_ids) != 1 or tag_ids[0] == tokenizer.unk_token_id:
            raise ValueError(
                f"tag_token {tag_token!r} must be one known token of the tokenizer, "
                f"it encodes to {tag_ids}"
            )
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.tag_token = tag_token
        self.tag_id = tag_ids[0]
        self.label_index = label_index
        self.step_separator = step_separator
        self.max_length = max_length or getattr(model.config, "max_position_embeddings", None)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text.replace(self.tag_token, ""), add_special_tokens=False)

    def build_input(self, prompt: str, steps: list[str]) -> tuple[list[int], list[int]]:
        """Token ids of the scorer input and the positions of the tags (one per step)."""
        bos = self.tokenizer.bos_token_id
        ids: list[int] = [bos] if bos is not None else []
        ids += self._encode(prompt + self.step_separator)
        positions: list[int] = []
        for step in steps:
            ids += self._encode(step)
            positions.append(len(ids))
            ids.append(self.tag_id)
            ids += self._encode(self.step_separator)
        return ids, positions

    @torch.inference_mode()
    def score_steps(self, prompt: str, steps: list[str]) -> list[float]:
        """One score in (0, 1) per step, from a single forward pass."""
        if not steps:
            return []
        ids, positions = self.build_input(prompt, steps)
        if self.max_length is not None and len(ids) > self.max_length:
            raise ValueError(
                f"PRM input has {len(ids)} tokens, more than max_length={self.max_length}"
            )
        input_ids = torch.tensor([ids], device=self.device)  # [1, seq_len]
        logits = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
        tag_logits = logits[0, positions, self.label_index]  # [num_steps]
        return torch.sigmoid(tag_logits.float()).tolist()
