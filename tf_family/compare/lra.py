"""The Long Range Arena's five tasks (Tay et al. 2021, arXiv 2011.04006), made here from what is installed, at the
lengths a run affords, each example a ``{"text": ..., "label": int}`` read character by character (`char_tokenizer`):

- ``listops``: nested MIN / MAX / MED / SM expressions (`tf_family.compare.listops`), brackets kept as tokens (the
  original release stripped them; aliutkus/spe's ``lra/README.md`` reports the bug, fixed upstream in c209b2a4);
- ``text``: byte-level classification of passages of the bundled Brown Corpus, imaginative prose (fiction,
  mystery, science fiction, adventure, romance, humour) against informative prose, classes balanced (LRA: IMDb
  sentiment, 1k-4k bytes);
- ``retrieval``: two passages, both from one State of the Union address or from two addresses (LRA: whether two
  ACL papers cite each other, 4k bytes each);
- ``image``: scikit-learn's handwritten digits (8 x 8, 17 grey levels) upscaled to ``side`` x ``side`` and read
  pixel by pixel in 16 grey levels (LRA: CIFAR-10, 32 x 32 = 1,024 pixels, 256 levels);
- ``pathfinder``: two marked dots on a ``side`` x ``side`` grid with two snaking paths; are the dots on one path
  (LRA: Pathfinder-32, 1,024 pixels; Linsley et al. 2018).

Every generator is seeded and deterministic; a split is ``generate(task, count, seed, size)``.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .listops import generate as generate_listops

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
NUM_LABELS = {"listops": 10, "text": 2, "retrieval": 2, "image": 10, "pathfinder": 2}
TITLES = {
    "listops": "ListOps",
    "text": "Text",
    "retrieval": "Retrieval",
    "image": "Image",
    "pathfinder": "Pathfinder",
}
GREY_LEVELS = "abcdefghijklmnop"  # 16 grey levels, one character each
PATH, BACKGROUND, DOT = "#", ".", "o"
PAIR_SEPARATOR = "|"
IMAGINATIVE = frozenset({"fiction", "mystery", "science_fiction", "adventure", "romance", "humor"})

# the published table (google-research/long-range-arena README, leaderboard of 8 November 2020; paper Table 1):
# accuracy in %, Path-X left out (every model fails it)
PUBLISHED: dict[str, dict[str, float]] = {
    "Transformer": {"listops": 36.37, "text": 64.27, "retrieval": 57.46, "image": 42.44, "pathfinder": 71.40},
    "Sparse Trans.": {"listops": 17.07, "text": 63.58, "retrieval": 59.59, "image": 44.24, "pathfinder": 71.71},
    "Longformer": {"listops": 35.63, "text": 62.85, "retrieval": 56.89, "image": 42.22, "pathfinder": 69.71},
    "BigBird": {"listops": 36.05, "text": 64.02, "retrieval": 59.29, "image": 40.83, "pathfinder": 74.87},
    "Reformer": {"listops": 37.27, "text": 56.10, "retrieval": 53.40, "image": 38.07, "pathfinder": 68.50},
    "Linformer": {"listops": 35.70, "text": 53.94, "retrieval": 52.27, "image": 38.56, "pathfinder": 76.34},
    "Performer": {"listops": 18.01, "text": 65.40, "retrieval": 53.82, "image": 42.77, "pathfinder": 77.05},
    "Sinkhorn Trans.": {"listops": 33.67, "text": 61.20, "retrieval": 53.83, "image": 41.23, "pathfinder": 67.45},
    "Synthesizer": {"listops": 36.99, "text": 61.68, "retrieval": 54.67, "image": 41.61, "pathfinder": 69.45},
    "Linear Trans.": {"listops": 16.13, "text": 65.90, "retrieval": 53.09, "image": 42.34, "pathfinder": 75.30},
}
PUBLISHED_SCALE = (
    "LRA trains for 5k-50k steps at lengths 2k (ListOps), 4k (Text), 8k (Retrieval, two 4k documents), 1k (Image, "
    "Pathfinder), with 4-6 layers of width 256-512 and 256 grey levels; its ListOps scores of 16-18 % come from "
    "the bracket-stripping bug. Ours: the lengths, steps and widths of this run's settings, digits not CIFAR-10, "
    "Brown genres not IMDb, SOTU addresses not ACL citations, 16 grey levels, Pathfinder without LRA's dashed "
    "distractor curves."
)


# ------------------------------------------------------------------------------------------------------- tokenizer
def char_tokenizer(folder: Path):
    """A fast tokenizer with one token per printable ASCII character (and newline), ``<unk>``, ``<pad>``, ``<cls>``,
    ``<sep>``, ``<mask>``; saved to ``folder`` and returned. The byte-level reading LRA prescribes, for the texts
    here (other characters read as ``<unk>``)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<cls>", "<sep>", "<mask>"]
    characters = ["\n", *(chr(c) for c in range(32, 127))]
    vocab = {token: i for i, token in enumerate([*specials, *characters])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<cls>",
        sep_token="<sep>",
        mask_token="<mask>",
    )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    return tokenizer


# ------------------------------------------------------------------------------------------------------------ tasks
def _passage(text: str, length: int, rng: random.Random) -> str:
    start = rng.randrange(max(1, len(text) - length + 1))
    return text[start : start + length]


def _brown(split: str) -> list[dict]:
    from ..data import load_brown

    rows = load_brown()[split]
    names = rows.features["genre"].names
    return [{"text": r["text"], "imaginative": names[r["genre"]] in IMAGINATIVE} for r in rows]


def text_examples(count: int, seed: int, length: int, split: str = "train") -> list[dict]:
    """Passages of ``length`` characters of Brown documents of ``split``; label 1: imaginative prose. The classes
    alternate, so each holds half the examples."""
    rng = random.Random(seed)
    documents = _brown(split)
    by_class = [[d["text"] for d in documents if d["imaginative"] == bool(label)] for label in (0, 1)]
    out = []
    for i in range(count):
        label = i % 2
        out.append({"text": _passage(rng.choice(by_class[label]), length, rng), "label": label})
    rng.shuffle(out)
    return out


def _sotu(split: str) -> list[str]:
    from ..data import load_sotu

    return list(load_sotu()[split]["text"])


def retrieval_examples(count: int, seed: int, length: int, split: str = "train") -> list[dict]:
    """Two passages of ``(length - 1) // 2`` characters joined by ``|``; label 1: both from one address of
    ``split`` (the bundled SOTU split), 0: from two addresses. Classes alternate."""
    rng = random.Random(seed)
    documents = _sotu(split)
    if len(documents) < 2:
        raise ValueError(f"the SOTU {split!r} split holds {len(documents)} address(es); retrieval needs two.")
    half = (length - 1) // 2
    out = []
    for i in range(count):
        label = i % 2
        first = rng.randrange(len(documents))
        second = first if label else rng.choice([j for j in range(len(documents)) if j != first])
        pair = _passage(documents[first], half, rng), _passage(documents[second], half, rng)
        out.append({"text": pair[0] + PAIR_SEPARATOR + pair[1], "label": label})
    return out


def _digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError(
            "the LRA image task reads scikit-learn's digits: pip install 'tf-family[compare]' (scikit-learn)."
        ) from error
    return load_digits()


def upscale(image: list[list[float]], side: int) -> list[list[float]]:
    """Bilinear resize of a square grey image to ``side`` x ``side`` (corners aligned)."""
    size = len(image)
    out = []
    for i in range(side):
        y = i * (size - 1) / max(1, side - 1)
        y0 = min(int(y), size - 2)
        fy = y - y0
        line = []
        for j in range(side):
            x = j * (size - 1) / max(1, side - 1)
            x0 = min(int(x), size - 2)
            fx = x - x0
            top = image[y0][x0] * (1 - fx) + image[y0][x0 + 1] * fx
            bottom = image[y0 + 1][x0] * (1 - fx) + image[y0 + 1][x0 + 1] * fx
            line.append(top * (1 - fy) + bottom * fy)
        out.append(line)
    return out


def image_examples(count: int, seed: int, side: int, split: str = "train") -> list[dict]:
    """Digits of the first 80 % (``train``) or the last 20 % (``validation``) of scikit-learn's 1,797, upscaled to
    ``side`` x ``side`` and written row by row in 16 grey levels; drawn with replacement when ``count`` exceeds
    the split."""
    digits = _digits()
    cut = int(0.8 * len(digits.images))
    indices = list(range(cut)) if split == "train" else list(range(cut, len(digits.images)))
    rng = random.Random(seed)
    chosen = rng.sample(indices, count) if count <= len(indices) else [rng.choice(indices) for _ in range(count)]
    out = []
    for index in chosen:
        pixels = upscale(digits.images[index].tolist(), side)
        levels = len(GREY_LEVELS) - 1
        text = "".join(GREY_LEVELS[min(levels, round(v / 16 * levels))] for row in pixels for v in row)
        out.append({"text": text, "label": int(digits.target[index])})
    return out


def _walk(grid: list[list[str]], start: tuple[int, int], steps: int, rng: random.Random, forbidden: set) -> list:
    """A self-avoiding 4-connected walk from ``start`` that keeps one cell away from ``forbidden`` cells; it turns
    with probability 0.3 per step (a snaking path)."""
    side = len(grid)
    path = [start]
    taken = {start}
    direction = rng.choice([(0, 1), (1, 0), (0, -1), (-1, 0)])
    for _ in range(steps):
        options = [direction] * 3 + [(direction[1], direction[0]), (-direction[1], -direction[0])]
        if rng.random() < 0.3:
            rng.shuffle(options)
        moved = False
        for dy, dx in options:
            y, x = path[-1][0] + dy, path[-1][1] + dx
            if not (0 <= y < side and 0 <= x < side) or (y, x) in taken:
                continue
            near = {(y + a, x + b) for a in (-1, 0, 1) for b in (-1, 0, 1)}
            if near & forbidden:
                continue
            # no touching its own earlier cells except the one it came from
            if any(n in taken and n != path[-1] for n in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1))):
                continue
            path.append((y, x))
            taken.add((y, x))
            direction = (dy, dx)
            moved = True
            break
        if not moved:
            break
    return path


def connected(text: str, side: int) -> bool:
    """Whether the two dots of a pathfinder image are joined by path cells (4-connected flood fill)."""
    cells = [text[i * side : (i + 1) * side] for i in range(side)]
    dots = [(y, x) for y in range(side) for x in range(side) if cells[y][x] == DOT]
    if len(dots) != 2:
        raise ValueError(f"a pathfinder image holds {len(dots)} dots, not 2.")
    seen = {dots[0]}
    queue = deque([dots[0]])
    while queue:
        y, x = queue.popleft()
        for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
            if 0 <= ny < side and 0 <= nx < side and (ny, nx) not in seen and cells[ny][nx] != BACKGROUND:
                seen.add((ny, nx))
                queue.append((ny, nx))
    return dots[1] in seen


def _pathfinder_image(side: int, label: int, rng: random.Random) -> str | None:
    grid = [[BACKGROUND] * side for _ in range(side)]
    length = max(4, side * 3 // 2)
    first = _walk(grid, (rng.randrange(side), rng.randrange(side)), length, rng, set())
    second_start = (rng.randrange(side), rng.randrange(side))
    second = _walk(grid, second_start, length, rng, set(first))
    if len(first) < length // 2 or len(second) < length // 2 or set(first) & set(second):
        return None
    for y, x in first + second:
        grid[y][x] = PATH
    ends = [first[0], first[-1]] if label else [first[rng.randrange(2) * -1], second[rng.randrange(2) * -1]]
    for y, x in ends:
        grid[y][x] = DOT
    return "".join("".join(row) for row in grid)


def pathfinder_examples(count: int, seed: int, side: int, split: str = "train") -> list[dict]:
    """``side`` x ``side`` images, row by row: two snaking paths (``#``) that do not touch, two dots (``o``) at the
    two ends of one path (label 1) or at one end of each (label 0). Classes alternate; ``split`` seeds apart."""
    if side < 6:
        raise ValueError(f"pathfinder side {side} is too small for two paths; use 6 or more.")
    rng = random.Random(f"{seed}-{split}")
    out = []
    while len(out) < count:
        label = len(out) % 2
        image = _pathfinder_image(side, label, rng)
        if image is not None:
            out.append({"text": image, "label": label})
    return out


def listops_examples(count: int, seed: int, words: tuple[int, int], max_depth: int, split: str = "train"):
    """ListOps expressions (`tf_family.compare.listops.generate`) of ``words`` words, seeded per split."""
    offset = 0 if split == "train" else 1
    return generate_listops(count, seed + offset, min_length=words[0], max_length=words[1], max_depth=max_depth)


def generate(task: str, count: int, seed: int, settings: dict[str, Any], split: str = "train") -> list[dict]:
    """``count`` examples of ``task`` for ``split`` (``train`` or ``validation``) at the run's ``settings``
    (``task_length``, ``listops_words``, ``listops_max_depth``, ``image_side``, ``pathfinder_side``)."""
    makers: dict[str, Callable[[], list[dict]]] = {
        "listops": lambda: listops_examples(
            count, seed, tuple(settings["listops_words"]), settings["listops_max_depth"], split
        ),
        "text": lambda: text_examples(count, seed, settings["task_length"] - 2, split),
        "retrieval": lambda: retrieval_examples(count, seed, settings["task_length"] - 2, split),
        "image": lambda: image_examples(count, seed, settings["image_side"], split),
        "pathfinder": lambda: pathfinder_examples(count, seed, settings["pathfinder_side"], split),
    }
    if task not in makers:
        raise ValueError(f"unknown LRA task {task!r}; choose from {TASKS}.")
    return makers[task]()


def input_length(task: str, settings: dict[str, Any]) -> int:
    """Tokens an example of ``task`` takes (characters plus <cls> and <sep>) at ``settings``."""
    if task == "image":
        return settings["image_side"] ** 2 + 2
    if task == "pathfinder":
        return settings["pathfinder_side"] ** 2 + 2
    if task == "listops":
        return 5 * settings["listops_words"][1] + 2  # at most four characters and a space a word ("[MAX ")
    return settings["task_length"]


__all__ = [
    "NUM_LABELS",
    "PUBLISHED",
    "PUBLISHED_SCALE",
    "TASKS",
    "TITLES",
    "char_tokenizer",
    "connected",
    "generate",
    "image_examples",
    "input_length",
    "listops_examples",
    "pathfinder_examples",
    "retrieval_examples",
    "text_examples",
    "upscale",
]
