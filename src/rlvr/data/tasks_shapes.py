"""The built-in visual task ``shapes``: PIL-drawn scenes of coloured shapes with a counting question.

Each row carries ``images`` (one PIL image), ``prompt`` (the question) and ``answer`` (the count as
a string, graded by the exact-match/math reward), plus ``scene`` (the cells as text) for audits.
Every distinct scene lands in exactly one split, so the held-out split shares no image with the
train split.
"""

from __future__ import annotations

import random

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 170, 60)}
SHAPES = ("square", "circle", "triangle")
QUESTION = "How many {colour} {shape}s are in the image? Answer with a number."


def draw_scene(cells: tuple, *, grid: int, cell: int):
    """One RGB image of ``grid x grid`` cells; ``cells[i]`` is ``None`` or ``(colour, shape)``."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (grid * cell, grid * cell), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    pad = max(1, cell // 6)
    for i, item in enumerate(cells):
        if item is None:
            continue
        colour, shape = item
        x0, y0 = (i % grid) * cell + pad, (i // grid) * cell + pad
        x1, y1 = x0 + cell - 2 * pad, y0 + cell - 2 * pad
        fill = COLOURS[colour]
        if shape == "square":
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        elif shape == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        else:
            draw.polygon(((x0 + x1) // 2, y0, x1, y1, x0, y1), fill=fill)
    return image


def shapes_rows(
    *,
    num_train: int,
    num_eval: int,
    seed: int = 0,
    grid: int = 3,
    cell: int = 28,
    fill: float = 0.5,
) -> tuple[list[dict], list[dict]]:
    """Scenes of up to ``grid * grid`` shapes (each cell filled with probability ``fill``).

    The question asks for one (colour, shape) pair, chosen so that the answer is 0 a third of the
    time at most. Scenes are distinct across and within splits.
    """
    if grid < 1 or cell < 8:
        raise ValueError(f"data.task_kwargs: grid={grid} must be >= 1 and cell={cell} >= 8")
    if not 0.0 < fill <= 1.0:
        raise ValueError(f"data.task_kwargs.fill={fill}: must be in (0, 1]")
    rng = random.Random(seed)
    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    seen: set[tuple] = set()
    rows: list[dict] = []
    attempts = 0
    while len(rows) < num_train + num_eval:
        attempts += 1
        if attempts > 100 * (num_train + num_eval) + 1000:
            raise ValueError(
                f"data.task_kwargs: too few distinct shapes scenes (grid={grid}) for "
                f"num_train={num_train} + num_eval={num_eval}"
            )
        cells = tuple(
            rng.choice(pairs) if rng.random() < fill else None for _ in range(grid * grid)
        )
        if cells in seen:
            continue
        seen.add(cells)
        present = [p for p in cells if p is not None]
        colour, shape = (
            rng.choice(present) if present and rng.random() < 0.67 else rng.choice(pairs)
        )
        count = sum(1 for p in cells if p == (colour, shape))
        rows.append(
            {
                "prompt": QUESTION.format(colour=colour, shape=shape),
                "answer": str(count),
                "images": [draw_scene(cells, grid=grid, cell=cell)],
                "scene": ";".join("-" if p is None else f"{p[0]} {p[1]}" for p in cells),
            }
        )
    return rows[num_eval:], rows[:num_eval]
