"""model.freeze by name prefix: the VLM's vision tower by default, typos refused."""

from __future__ import annotations

import pytest
import torch

from rlvr.model.freeze import default_freeze, freeze_prefixes, parameter_counts
from rlvr.training.tiny import (
    build_char_tokenizer,
    build_tiny_model,
    build_tiny_vlm,
    build_vlm_tokenizer,
)


def test_vision_tower_frozen_by_default_and_counted():
    model = build_tiny_vlm(build_vlm_tokenizer())
    before = parameter_counts(model)
    assert before["params_trainable"] == before["params_total"]
    prefixes = default_freeze(model)
    assert prefixes == ["model.visual."]
    counts = freeze_prefixes(model, prefixes)
    vision = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.visual."))
    assert vision > 0
    assert counts["params_trainable"] == before["params_total"] - vision
    for name, p in model.named_parameters():
        assert p.requires_grad == (not name.startswith("model.visual."))
    # a backward through an image prompt leaves the frozen tower without gradients
    ids = torch.tensor(
        [[model.config.vision_start_token_id] + [model.config.image_token_id] * 4 + [10]]
    )
    out = model(
        input_ids=ids,
        pixel_values=torch.randn(16, 3 * 2 * 14 * 14),
        image_grid_thw=torch.tensor([[1, 4, 4]]),
        mm_token_type_ids=(ids == model.config.image_token_id).long(),
    )
    out.logits.sum().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if n.startswith("model.visual."))
    assert any(p.grad is not None for n, p in model.named_parameters() if "language_model" in n)


def test_text_model_has_no_default_and_a_typo_is_named():
    model = build_tiny_model(build_char_tokenizer())
    assert default_freeze(model) == []
    with pytest.raises(
        ValueError, match="model.freeze: prefix 'model.vison.' matches no parameter"
    ):
        freeze_prefixes(model, ["model.vison."])
