"""The prompts a run will really send, counted before it starts: a row's prompt after the template
(image tokens included) or, with episodes (``env.name``), the first prompt of its episodes, which
the environment's ``reset(row)`` gives (a few-shot conversation, instructions, a remote
environment's observation) rendered as the episodes render it. `rlvr train --dry-run` and setup
check them against ``data.max_prompt_tokens``; the memory plan sizes its rows by the longest.
"""

from __future__ import annotations

from rlvr.config import Config, ConfigError
from rlvr.data.multimodal import prompt_token_counts
from rlvr.rollout.agents import is_agent_env
from rlvr.rollout.episodes import EpisodeRunner


def prompt_lengths(cfg: Config, tokenizer, rows: list[dict], processor=None) -> list[int]:
    """Each row's prompt length in tokens as the run will send it. With episodes: a fresh
    environment of ``env.name`` per row, reset and closed (`EpisodeRunner.first_prompts`); a row
    whose reset fails counts its own prompt, as the episodes then start from it. ValueError:
    rows the template or the model cannot render (image rows for a text model)."""
    # an agent writes its own requests: before it runs, the row's prompt is all there is to count
    if not cfg.episodes or is_agent_env(cfg.env.name):
        d = cfg.data
        return prompt_token_counts(rows, d.template, tokenizer, d.system_prompt, processor)
    runner = EpisodeRunner.from_config(cfg, tokenizer, warn=False)
    texts = runner.first_prompts(rows)
    render = runner.renderer
    return [
        len(render.encode(t if t is not None else render.prompt_text(str(r.get("prompt", "")))))
        for t, r in zip(texts, rows, strict=True)
    ]


def too_long(cfg: Config, rows: list[dict], lengths: list[int], split: str) -> str | None:
    """The first row over ``data.max_prompt_tokens`` and what it is (None: every row fits),
    e.g. "train row 3: its episodes' first prompt (env.reset of env.name=calculator) has 121
    tokens"."""
    limit = cfg.data.max_prompt_tokens
    for i, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        if length > limit:
            where = row.get("_source", f"{split} row {i}")
            what = (
                f"its episodes' first prompt (env.reset of env.name={cfg.env.name}) has"
                if cfg.episodes
                else "the prompt has"
            )
            return f"{where}: {what} {length} tokens after the template"
    return None


def check_prompt_lengths(
    cfg: Config, tokenizer, rows: list[dict], split: str, processor=None
) -> int:
    """The longest prompt of ``rows`` in tokens (0 for none); ConfigError, before the first
    step, on a row over data.max_prompt_tokens (image tokens included), or rows with images for
    a model that cannot see them."""
    try:
        lengths = prompt_lengths(cfg, tokenizer, rows, processor)
    except ValueError as exc:
        raise ConfigError(f"{split} rows (data.task={cfg.data.task}): {exc}") from None
    if (row := too_long(cfg, rows, lengths, split)) is not None:
        raise ConfigError(
            f"{row}, more than data.max_prompt_tokens={cfg.data.max_prompt_tokens}; raise the "
            "limit or drop the row"
        )
    return max(lengths, default=0)
