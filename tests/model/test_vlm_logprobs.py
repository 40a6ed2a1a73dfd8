"""Multimodal rows through the processor and the trainer's log-prob pass on the tiny VLM."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

Image = pytest.importorskip("PIL.Image")

from rlvr.data.multimodal import collate_vision, render_multimodal_rows, row_images  # noqa: E402
from rlvr.model.forward import build_sequence_batch, completion_outputs  # noqa: E402
from rlvr.model.logprobs import logprobs_and_entropy  # noqa: E402


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from transformers import AutoModelForImageTextToText

    from rlvr.model.vlm import load_processor
    from rlvr.training.tiny import save_tiny_vlm

    torch.set_num_threads(2)
    path = save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")
    processor = load_processor(path)
    processor.tokenizer.padding_side = "left"
    return AutoModelForImageTextToText.from_pretrained(path).eval(), processor


def _rows(tmp_path: Path) -> list[dict]:
    png = io.BytesIO()
    Image.new("RGB", (60, 50), "blue").save(png, format="PNG")
    path = tmp_path / "green.png"
    Image.new("RGB", (56, 56), "green").save(path)
    return [
        {"prompt": "How many red squares?", "images": [Image.new("RGB", (56, 56), "red")]},
        {
            "prompt": "Count the shapes, please.",
            "images": [{"bytes": png.getvalue(), "path": None}],
        },
        {"prompt": "Which?", "images": str(path)},
    ]


def test_log_probs_match_the_generated_scores(vlm, tmp_path):
    model, processor = vlm
    rows = _rows(tmp_path)
    texts, prompt_ids, vision = render_multimodal_rows(rows, processor)
    assert all(t.count("<|image_pad|>") == 1 for t in texts)  # unexpanded in the text
    assert all(ids.count(model.config.image_token_id) == 4 for ids in prompt_ids)  # expanded
    enc = processor(
        text=texts,
        images=[row_images(r, i)[0] for i, r in enumerate(rows)],
        return_tensors="pt",
        padding=True,
    )
    with torch.no_grad():
        gen = model.generate(
            **enc,
            max_new_tokens=6,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    start = enc["input_ids"].shape[1]
    completions = [row[start:].tolist() for row in gen.sequences]
    want = torch.stack(gen.scores, 1).log_softmax(-1)
    want = want.gather(-1, gen.sequences[:, start:].unsqueeze(-1)).squeeze(-1)

    batch = build_sequence_batch(
        prompt_ids,
        completions,
        processor.tokenizer.pad_token_id,
        vision=collate_vision(vision),
        image_token_id=model.config.image_token_id,
    )
    with torch.no_grad():
        logits, _ = completion_outputs(model, batch)
        logp, _ = logprobs_and_entropy(logits, batch.completion_ids)
    assert torch.allclose(logp, want, atol=1e-4), (logp - want).abs().max()

    # the pixels matter: another image for row 0 changes its log-probs
    other = dict(rows[0], images=[Image.new("RGB", (56, 56), "white")])
    _, ids2, vision2 = render_multimodal_rows([other, *rows[1:]], processor)
    batch2 = build_sequence_batch(
        ids2,
        completions,
        processor.tokenizer.pad_token_id,
        vision=collate_vision(vision2),
        image_token_id=model.config.image_token_id,
    )
    with torch.no_grad():
        logp2, _ = logprobs_and_entropy(completion_outputs(model, batch2)[0], batch2.completion_ids)
    assert not torch.allclose(logp2[0], logp[0], atol=1e-4)
    assert torch.allclose(logp2[1:], logp[1:], atol=1e-4)

    # misaligned logits are still refused
    with pytest.raises(ValueError, match="log-prob shape mismatch"):
        logprobs_and_entropy(logits[:, 1:], batch.completion_ids)


def test_images_that_do_not_match_the_prompts_are_refused(vlm, tmp_path):
    model, processor = vlm
    rows = _rows(tmp_path)
    _, prompt_ids, vision = render_multimodal_rows(rows, processor)
    with pytest.raises(ValueError, match="image tokens per row"):
        build_sequence_batch(
            prompt_ids,
            [[5]] * 3,
            1,
            vision=collate_vision(vision[:2]),
            image_token_id=model.config.image_token_id,
        )


def test_bad_images_name_the_row_and_field(tmp_path):
    with pytest.raises(ValueError, match=r"row 2: field 'images'\[0\].*URLs are not fetched"):
        row_images({"images": ["https://example.com/a.png"]}, 2)
    with pytest.raises(ValueError, match=r"row 0: field 'images'\[1\]"):
        row_images({"images": [Image.new("RGB", (4, 4)), 3]}, 0)
    with pytest.raises(ValueError, match=r"row 1: field 'images'\[0\]"):
        row_images({"images": str(tmp_path / "missing.png")}, 1)


def test_a_reply_holding_an_image_token_is_refused(vlm, tmp_path):
    """The model would read it as one more image placeholder: named, not a shape error later."""
    model, processor = vlm
    _, prompt_ids, vision = render_multimodal_rows(_rows(tmp_path), processor)
    with pytest.raises(ValueError, match="a reply holds the image token"):
        build_sequence_batch(
            prompt_ids,
            [[5], [6, model.config.image_token_id], [7]],
            processor.tokenizer.pad_token_id,
            vision=collate_vision(vision),
            image_token_id=model.config.image_token_id,
        )


def test_image_rows_need_a_processor_and_the_chat_template(vlm, tmp_path):
    from rlvr.data.multimodal import render_inputs

    _, processor = vlm
    rows, tok = _rows(tmp_path), processor.tokenizer
    with pytest.raises(ValueError, match="no image processor.*vision-language model"):
        render_inputs(rows, "chat", tok, None, None)
    with pytest.raises(ValueError, match="data.template='r1': rows with images need"):
        render_inputs(rows, "r1", tok, None, processor)
    texts, ids, vision = render_inputs(rows, "chat", tok, "Be brief.", processor)
    assert vision is not None and [len(v.images) for v in vision] == [1, 1, 1]
    assert all("Be brief." in t for t in texts)
    # text rows on a VLM take the text path: no vision inputs at all
    _, _, none = render_inputs([{"prompt": "2+2?"}], "chat", tok, None, processor)
    assert none is None


def test_prompt_token_counts_match_the_rendered_prompts(vlm, tmp_path):
    """The pre-run length check counts image tokens from image sizes alone: the counts equal the
    processor's own token ids for images of several shapes, two images in a row, and a row
    without images."""
    from rlvr.data.multimodal import prompt_token_counts, render_inputs

    _, processor = vlm
    rows = [
        *_rows(tmp_path),
        {"prompt": "Wide.", "images": [Image.new("RGB", (200, 40), "red")]},
        {"prompt": "Tall.", "images": [Image.new("RGB", (30, 160), "red")]},
        {
            "prompt": "Two.",
            "images": [Image.new("RGB", (56, 56)), Image.new("RGB", (120, 56))],
            "system_prompt": "Look closely.",
        },
        {"prompt": "No image here."},
    ]
    tok = processor.tokenizer
    _, ids, _ = render_inputs(rows, "chat", tok, "Be brief.", processor)
    counts = prompt_token_counts(rows, "chat", tok, "Be brief.", processor)
    assert counts == [len(i) for i in ids]
    assert len(set(counts)) >= 5  # the shapes really give different numbers of image tokens
