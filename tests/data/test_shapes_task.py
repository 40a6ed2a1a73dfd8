"""The built-in visual task: images that match their answers, splits with no shared scene."""

from __future__ import annotations

import pytest

pytest.importorskip("PIL.Image")

from rlvr.data.tasks import DEFAULT_REWARD, task_rows  # noqa: E402
from rlvr.data.tasks_shapes import COLOURS  # noqa: E402
from rlvr.rewards.math import grade  # noqa: E402


def _count_in_image(image, *, grid: int, cell: int, colour: str) -> int:
    """Cells whose centre pixel has the colour (every shape covers its cell's centre)."""
    rgb = COLOURS[colour]
    return sum(
        image.getpixel(((i % grid) * cell + cell // 2, (i // grid) * cell + cell // 2 + 2)) == rgb
        for i in range(grid * grid)
    )


def test_splits_share_no_scene_and_have_the_sizes_asked():
    train, held = task_rows("shapes", num_train=40, num_eval=10, seed=3)
    assert (len(train), len(held)) == (40, 10)
    assert not {r["scene"] for r in train} & {r["scene"] for r in held}
    assert len({r["scene"] for r in train}) == 40
    # a different seed draws different scenes
    other, _ = task_rows("shapes", num_train=40, num_eval=10, seed=4)
    assert [r["scene"] for r in other] != [r["scene"] for r in train]


def test_answers_are_the_counts_drawn_in_the_image():
    train, _ = task_rows("shapes", num_train=30, num_eval=5, seed=0)
    nonzero = 0
    for row in train:
        (image,) = row["images"]
        assert image.size == (84, 84) and image.mode == "RGB"
        words = row["prompt"].split()
        colour, shape = words[2], words[3].rstrip("s")
        cells = row["scene"].split(";")
        assert row["answer"] == str(cells.count(f"{colour} {shape}"))
        # the colour of the pixels agrees with the scene text, whatever the shape
        assert _count_in_image(image, grid=3, cell=28, colour=colour) == sum(
            c.startswith(colour + " ") for c in cells
        )
        nonzero += row["answer"] != "0"
    assert nonzero >= len(train) // 2


def test_graded_by_the_math_reward():
    assert DEFAULT_REWARD["shapes"] == "math"
    _, held = task_rows("shapes", num_train=2, num_eval=2, seed=0)
    answer = held[0]["answer"]
    assert grade(f"The answer is \\boxed{{{answer}}}", answer).score == 1.0
    assert grade(f"The answer is \\boxed{{{int(answer) + 1}}}", answer).score == 0.0


def test_bad_kwargs_name_the_field():
    with pytest.raises(ValueError, match="data.task_kwargs.fill"):
        task_rows("shapes", num_train=2, num_eval=1, seed=0, fill=0.0)
    with pytest.raises(ValueError, match="too few distinct shapes scenes"):
        task_rows("shapes", num_train=50, num_eval=1, seed=0, grid=1)


def test_config_takes_shapes_with_the_chat_template_only():
    from rlvr.config import Config
    from rlvr.training.preflight.checks import config_problems as problems

    cfg = Config()
    cfg.data.task = "shapes"
    assert not [p for p in problems(cfg) if "data.task" in p]
    cfg.data.template = "r1"
    assert any(
        "data.task=shapes with data.template=r1" in p and "data.template=chat" in p
        for p in problems(cfg)
    )
