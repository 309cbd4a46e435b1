"""The bundled State of the Union corpus and its tokenizer."""

import hashlib
import lzma

import pytest
from transformers import AutoTokenizer

from tf_family.data import SOTU_CORPUS_FILE, SOTU_TOKENIZER_DIR, load_sotu, sotu_split


@pytest.fixture(scope="module")
def sotu():
    return load_sotu()


def test_file_matches_provenance():
    payload = lzma.decompress(SOTU_CORPUS_FILE.read_bytes())
    assert hashlib.sha256(payload).hexdigest() == "a0df50c6d33f7dcee610967d971a261c8641498fb3b78a0c5311969fb46e5e38"


def test_split_by_year_with_later_years_held_out(sotu):
    assert {name: len(split) for name, split in sotu.items()} == {"train": 206, "validation": 15, "test": 12}
    assert sotu["train"].column_names == ["year", "president", "party", "text"]
    train_years, validation_years, test_years = (set(sotu[s]["year"]) for s in ("train", "validation", "test"))
    assert max(train_years) < min(validation_years) <= max(validation_years) < min(test_years)
    assert (min(train_years), max(test_years)) == (1790, 2021)
    assert sotu_split(1994) == "train" and sotu_split(1995) == "validation" and sotu_split(2010) == "test"
    first = sotu["train"][0]
    assert (first["year"], first["president"]) == (1790, "George Washington")
    assert first["text"].startswith("Fellow-Citizens of the Senate and House of Representatives")
    assert sum(len(t) for s in sotu.values() for t in s["text"]) == 10_759_831


def test_tokenizer_loads_with_auto_and_round_trips():
    tokenizer = AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR)
    assert len(tokenizer) == 8192
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 0
    text = "The state of the Union is strong — 1,234 Ünïcode words & tabs\tand\nnewlines."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text  # byte-level: nothing is lost
    assert len(tokenizer("Fellow-Citizens of the Senate")["input_ids"]) <= 6  # it learned the corpus' words
