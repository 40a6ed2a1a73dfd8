"""The OpenAI-compatible endpoint over vLLM in the trainer's process: an unmodified `openai`
client's calls (chat and completions, several episodes at once) are served by the session's
vLLM engine, and each episode's sequence holds the sampled ids with the engine's log-probs, equal
to the trainer's log-probs of them in that sequence's context (token-exact extension)."""

from __future__ import annotations

import threading

import pytest
import torch
from vllm_support import LOGPROB_TOL, base_model, trained_copy, trainer_logprobs

from rlvr.rollout.base import SamplingParams
from rlvr.rollout.endpoint import Endpoint, EndpointLimits

pytestmark = pytest.mark.vllm
openai = pytest.importorskip("openai")


def completions_agent(url: str) -> None:
    """Two calls: the second prompt is the first prompt, the reply's text and one more word."""
    client = openai.OpenAI(base_url=url, api_key="rlvr", max_retries=0)
    first = client.completions.create(model="policy", prompt="q", max_tokens=6)
    text = "q" + first.choices[0].text + "y"
    client.completions.create(model="policy", prompt=text, max_tokens=6)


def chat_agent(url: str) -> None:
    client = openai.OpenAI(base_url=url, api_key="rlvr", max_retries=0)
    client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=6
    )


def test_the_endpoint_serves_the_vllm_engine_token_exact(holder, tok):
    engine = holder.get()
    model = trained_copy(base_model(tok), tok)  # says "xyz" then EOS
    engine.load_weights(model.state_dict().items())
    limits = EndpointLimits(
        max_new_tokens=6, max_sequence_tokens=24, max_prompt_tokens=40, max_calls=3
    )
    ep = Endpoint(engine, tok, SamplingParams(temperature=1.0, max_new_tokens=6, seed=3), limits)
    try:
        opened = [ep.open() for _ in range(4)]
        agents = [completions_agent] * 3 + [chat_agent]
        threads = [
            threading.Thread(target=a, args=(u,)) for a, (u, _) in zip(agents, opened, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        logs = [ep.finish(log.key) for _, log in opened]
    finally:
        ep.close()
    assert [log.calls for log in logs] == [2, 2, 2, 1] and not any(log.refused for log in logs)
    assert all(log.splits == 0 and len(log.sequences) == 1 for log in logs)
    assert ep.generate_calls < 7  # some calls were served together (timing decides which)
    seqs = [log.sequences[0] for log in logs]
    trainer = trainer_logprobs(
        model, [s.prompt for s in seqs], [s.ids for s in seqs], tok.pad_token_id
    )
    for s, t in zip(seqs, trainer, strict=True):
        mask = torch.tensor(s.mask, dtype=torch.bool)
        assert mask.any()
        diff = (t[mask] - torch.tensor(s.logprobs)[mask]).abs().max()
        assert float(diff) < LOGPROB_TOL
    # the second call's prompt continued the first reply's ids: "y" is the only masked token
    for s in seqs[:3]:
        assert s.mask.count(0) == 1 and tok.decode([s.ids[s.mask.index(0)]]) == "y"
