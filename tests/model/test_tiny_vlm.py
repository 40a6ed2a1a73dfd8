"""The tiny random VLM: a loadable Qwen2-VL folder whose greedy replies do not depend on batch size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def tiny_vlm_dir(tmp_path_factory) -> Path:
    from rlvr.training.tiny import save_tiny_vlm

    torch.set_num_threads(2)
    return save_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm") / "model")


def _prompts(processor, n: int) -> tuple[list[str], list]:
    colours = ["red", "blue", "green", "white", "black"]
    questions = [
        "How many?",
        "How many red squares are there?",
        "Count.",
        "Which shape is largest here?",
    ]
    texts, images = [], []
    for i in range(n):
        content = [{"type": "image"}, {"type": "text", "text": questions[i % len(questions)]}]
        messages = [{"role": "user", "content": content}]
        texts.append(
            processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        )
        images.append(PIL.new("RGB", (40 + 8 * i, 56), colours[i % len(colours)]))
    return texts, images


def test_folder_loads_with_processor_and_image_tokens(tiny_vlm_dir):
    from transformers import AutoModelForImageTextToText

    from rlvr.model.vlm import load_processor

    processor = load_processor(tiny_vlm_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir)
    texts, images = _prompts(processor, 1)
    enc = processor(text=texts, images=images, return_tensors="pt")
    grid = enc["image_grid_thw"]
    n_image_tokens = int((enc["input_ids"] == model.config.image_token_id).sum())
    # one image token per merged 2x2 patch group, as the grid says
    assert n_image_tokens == int(grid.prod(-1).sum()) // 4 > 0
    assert enc["pixel_values"].shape[0] == int(grid.prod(-1).sum())
    out = model(**enc)
    assert out.logits.shape[:2] == enc["input_ids"].shape
    assert torch.isfinite(out.logits).all()


def test_greedy_image_replies_do_not_depend_on_batch_size(tiny_vlm_dir):
    from transformers import AutoModelForImageTextToText

    from rlvr.model.vlm import load_processor

    processor = load_processor(tiny_vlm_dir)
    processor.tokenizer.padding_side = "left"
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()
    texts, images = _prompts(processor, 4)

    def generate(idx: list[int]) -> list[str]:
        enc = processor(
            text=[texts[i] for i in idx],
            images=[images[i] for i in idx],
            return_tensors="pt",
            padding=True,
        )
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=8, do_sample=False)
        start = enc["input_ids"].shape[1]
        return [processor.tokenizer.decode(row[start:], skip_special_tokens=True) for row in out]

    batch4 = generate([0, 1, 2, 3])
    batch1 = [generate([i])[0] for i in range(4)]
    assert batch4 == batch1
    assert len(set(batch1)) > 1, (
        "replies identical for every prompt: the test would not see a mix-up"
    )
