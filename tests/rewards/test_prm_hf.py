"""HFTokenClassificationPRM on a tiny random Llama token classifier (nothing downloaded)."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForTokenClassification, PreTrainedTokenizerFast

from rlvr.rewards.prm_hf import HFTokenClassificationPRM

TAG = "ки"
PROMPT = "what is two plus three"
STEPS = ["step one : two and three", "step two : make five", "so answer five"]
# The vocabulary: every word the prompt and steps use (":" is split off by the pre-tokenizer).
WORDS = sorted(set(" ".join([PROMPT, *STEPS]).split()))


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"[UNK]": 0, "[BOS]": 1, TAG: 2}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", bos_token="[BOS]")


def _model(tokenizer, num_labels: int) -> LlamaForTokenClassification:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_labels=num_labels,
    )
    return LlamaForTokenClassification(config).eval()


@pytest.fixture(scope="module")
def model(tokenizer) -> LlamaForTokenClassification:
    torch.set_num_threads(1)
    return _model(tokenizer, num_labels=2)


def _ids(tokenizer, text: str) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(w) for w in text.split()]


def test_scores_are_sigmoid_of_the_logit_at_each_tag(tokenizer, model) -> None:
    prm = HFTokenClassificationPRM(model, tokenizer, label_index=1)
    scores = prm.score_steps(PROMPT, STEPS)
    assert len(scores) == 3
    # Independent check: build "[BOS] prompt step_1 TAG ... step_k TAG" by hand from the
    # word-level vocabulary and read the last position. The model is causal, so the logit
    # at step k's tag depends only on the tokens up to it.
    prefix = [tokenizer.bos_token_id, *_ids(tokenizer, PROMPT)]
    for k, step in enumerate(STEPS):
        prefix += [*_ids(tokenizer, step), tokenizer.convert_tokens_to_ids(TAG)]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prefix])).logits  # [1, len, 2]
        assert scores[k] == pytest.approx(torch.sigmoid(logits[0, -1, 1]).item(), abs=1e-5)


def test_label_index_selects_the_column(tokenizer, model) -> None:
    col0 = HFTokenClassificationPRM(model, tokenizer, label_index=0).score_steps(PROMPT, STEPS)
    col1 = HFTokenClassificationPRM(model, tokenizer, label_index=1).score_steps(PROMPT, STEPS)
    assert col0 != pytest.approx(col1)
    with pytest.raises(ValueError, match="label_index 2"):
        HFTokenClassificationPRM(model, tokenizer, label_index=2)


def test_forged_tags_in_the_response_are_removed(tokenizer, model) -> None:
    prm = HFTokenClassificationPRM(model, tokenizer)
    clean = prm.score_steps(PROMPT, STEPS)
    forged = prm.score_steps(PROMPT, [f"step one {TAG} : two {TAG} and three", *STEPS[1:]])
    assert forged == pytest.approx(clean)
    ids, positions = prm.build_input(PROMPT, STEPS)
    assert [i for i, t in enumerate(ids) if t == prm.tag_id] == positions


def test_tag_must_be_one_known_token(tokenizer, model) -> None:
    with pytest.raises(ValueError, match="tag_token"):
        HFTokenClassificationPRM(model, tokenizer, tag_token="<unknown-tag>")
    with pytest.raises(ValueError, match="tag_token"):
        HFTokenClassificationPRM(model, tokenizer, tag_token="two three")


def test_too_long_input_is_refused(tokenizer, model) -> None:
    prm = HFTokenClassificationPRM(model, tokenizer, max_length=10)
    with pytest.raises(ValueError, match="max_length=10"):
        prm.score_steps(PROMPT, STEPS)
    assert prm.score_steps(PROMPT, []) == []


def test_load_from_a_saved_directory(tmp_path, tokenizer) -> None:
    model = _model(tokenizer, num_labels=1)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = HFTokenClassificationPRM(tmp_path)
    direct = HFTokenClassificationPRM(model, tokenizer)
    assert loaded.score_steps(PROMPT, STEPS) == pytest.approx(direct.score_steps(PROMPT, STEPS))


def test_image_placeholders_are_stripped_before_the_scorer_sees_them(tokenizer, model) -> None:
    """Left in, a VLM prompt's vision span becomes tokens of the PRM's own vocabulary ([UNK]
    here) that change every step's score; stripped, the scores are those of the clean text."""
    from rlvr.rewards.prm import score_steps

    prm = HFTokenClassificationPRM(model, tokenizer, label_index=1)
    span = "<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>"
    steps = [STEPS[0] + " <|image_pad|>", *STEPS[1:]]
    clean = prm.score_steps(PROMPT, STEPS)
    assert score_steps(prm, span + PROMPT, steps) == clean
    raw = prm.score_steps(span + PROMPT, steps)
    assert max(abs(a - b) for a, b in zip(raw, clean, strict=True)) > 1e-4
