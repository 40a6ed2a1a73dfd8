"""PS-GRPO variant 2 in the loop: steps are found in the text and mapped onto the right tokens."""

from rlvr.objectives.psgrpo_steps import StepScorer, step_spans, token_step_ids
from rlvr.training.tiny import build_char_tokenizer

STEP, ANSWER = r"^Step \d+:", r"^†Answer:"


def test_step_spans_and_token_ids_on_a_char_tokenizer():
    tok = build_char_tokenizer()
    text = "ok\nStep 1: a\nStep 2: bc\nAnswer: 3"
    spans = step_spans(text, STEP, r"^Answer:")
    # "ok\n" is 3 chars, so step 1 starts at 3 and is "Step 1: a" (9 chars) -> [3, 12);
    # "\n" at 12; step 2 starts at 13: "Step 2: bc" (10 chars) -> [13, 23); then "\nAnswer: 3".
    assert [(s, e) for s, e, _ in spans] == [(3, 12), (13, 23)]
    ids = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]
    steps = token_step_ids(tok, ids, spans)
    # one char per token: chars 0-2 -> -1, 3..12 (incl. the newline before step 2) -> 0,
    # 13..22 -> 1, the answer line and EOS -> -1
    assert steps == [-1] * 3 + [0] * 10 + [1] * 10 + [-1] * (len(text) - 23) + [-1]


def test_step_scorer_asks_the_prm_for_each_step():
    tok = build_char_tokenizer()
    seen = []

    class FakePRM:
        def score_steps(self, prompt, steps):
            seen.append((prompt, steps))
            return [0.9 - 0.1 * i for i in range(len(steps))]

    texts = ["Step 1: x\nStep 2: y", "no steps"]
    comp = [tok(t, add_special_tokens=False).input_ids for t in texts]
    scores, ids = StepScorer(FakePRM(), STEP, ANSWER)(tok, ["p1", "p2"], texts, comp)
    assert scores == [[0.9, 0.8], []]
    assert seen == [("p1", ["Step 1: x", "Step 2: y"])]  # a response without steps is not scored
    assert ids.shape == (2, len(texts[0]))
    assert ids[0].tolist() == [0] * 10 + [1] * 9
    assert ids[1].tolist() == [-1] * ids.shape[1]


def test_step_scorer_strips_image_placeholders_from_what_the_prm_sees():
    tok = build_char_tokenizer()
    seen = []

    class FakePRM:
        def score_steps(self, prompt, steps):
            seen.append((prompt, steps))
            return [0.5] * len(steps)

    text = "Step 1: x<|image_pad|>\nStep 2: y"
    comp = [tok(text, add_special_tokens=False).input_ids]
    prompt = "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>Count."
    scores, ids = StepScorer(FakePRM(), STEP, ANSWER)(tok, [prompt], [text], comp)
    assert seen == [("Count.", ["Step 1: x", "Step 2: y"])]
    assert scores == [[0.5, 0.5]]
    # the token-to-step map still follows the reply as generated (placeholder chars included)
    assert ids[0].tolist() == [0] * len("Step 1: x<|image_pad|>\n") + [1] * len("Step 2: y")
