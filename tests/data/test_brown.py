"""The bundled Brown Corpus loads, is untagged, and splits the same way every time, stratified by genre."""

import collections
import hashlib
import lzma

from tf_family.data import BROWN_CORPUS_FILE, BROWN_GENRES, load_brown
from tf_family.data.brown import brown_splits, read_brown_records, strip_tags

JSONL_SHA256 = "c64180677e7011acfba0191c6f85c2fa7482a93ff7244ff8703d6318d9545381"


def test_bundled_file_is_the_documented_one():
    with lzma.open(BROWN_CORPUS_FILE) as handle:
        assert hashlib.sha256(handle.read()).hexdigest() == JSONL_SHA256
    assert BROWN_CORPUS_FILE.stat().st_size < 2_500_000


def test_load_brown_splits_and_fields():
    corpus = load_brown()
    assert {name: len(split) for name, split in corpus.items()} == {"train": 396, "validation": 52, "test": 52}
    assert corpus["train"].features["genre"].names == list(BROWN_GENRES)
    ids = [sample_id for split in corpus.values() for sample_id in split["id"]]
    assert len(ids) == len(set(ids)) == 500
    for split in corpus.values():
        assert set(split["genre"]) == set(range(15))  # every genre in every split
    first = next(row for row in corpus["train"] if row["id"] == "ca01")
    assert first["text"].startswith("The Fulton County Grand Jury said Friday an investigation of Atlanta's recent")
    assert '"no evidence"' in first["text"] and "/at" not in first["text"]
    assert min(len(text.split()) for split in corpus.values() for text in split["text"]) > 1900


def test_split_is_fixed_and_stratified():
    records = read_brown_records()
    split = brown_splits(records)
    assert split == brown_splits(list(reversed(records)))
    counts = collections.Counter((r["genre"], split[r["id"]]) for r in records)
    assert counts[("learned", "test")] == counts[("learned", "validation")] == 8
    assert counts[("science_fiction", "test")] == counts[("science_fiction", "validation")] == 1


def test_strip_tags():
    tagged = "\n\n\tHe/pps said/vbd ``/`` yes/rb ''/'' ,/, then/rb left/vbd ./.\n\n\n\tNew/jj para/nn ./.\n"
    assert strip_tags(tagged) == 'He said "yes", then left.\n\nNew para.'
    assert strip_tags(tagged, detokenize=False) == "He said `` yes '' , then left .\n\nNew para ."
