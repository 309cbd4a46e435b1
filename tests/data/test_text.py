"""`load_text_datasets`: the bundled corpus, local files of every supported kind, and clear errors."""

import json

import pytest
from datasets import Dataset

from tf_family.data import load_text_datasets

DOCUMENTS = [f"Document number {i}. " * (i + 1) for i in range(10)]


def test_bundled_default():
    raw, column = load_text_datasets()
    assert column == "text" and set(raw) >= {"train", "validation"} and len(raw["train"]) == 206


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet", ".txt"])
def test_local_files(tmp_path, suffix):
    path = tmp_path / f"train{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(DOCUMENTS)))
    elif suffix == ".csv":
        Dataset.from_dict({"body": DOCUMENTS}).to_csv(str(path), index=False)
    elif suffix == ".parquet":
        Dataset.from_dict({"body": DOCUMENTS}).to_parquet(str(path))
    else:
        path.write_text("\n\n".join(DOCUMENTS))
    kwargs = {"sample_by": "paragraph"} if suffix == ".txt" else {}
    raw, column = load_text_datasets(train_file=str(path), validation_split_percentage=20, **kwargs)
    assert column == ("text" if suffix == ".txt" else "body")
    assert (len(raw["train"]), len(raw["validation"])) == (8, 2)
    # the later rows are held out, in order
    assert raw["validation"][column][0].startswith("Document number 8")


def test_errors_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match=r"--train_file='.*missing.txt': no such file"):
        load_text_datasets(train_file=str(tmp_path / "missing.txt"))
    (tmp_path / "a.xml").write_text("<a/>")
    with pytest.raises(ValueError, match="unsupported suffix '.xml'"):
        load_text_datasets(train_file=str(tmp_path / "a.xml"))
    (tmp_path / "one.txt").write_text("a single document")
    with pytest.raises(ValueError, match="--validation_file"):
        load_text_datasets(train_file=str(tmp_path / "one.txt"))
    with pytest.raises(ValueError, match="--text_column='body' is not a column"):
        load_text_datasets(text_column="body")


def test_a_lone_text_file_of_one_document_is_read_by_paragraph(tmp_path):
    # the README's `--train_file notes.txt`: a single plain-text file, no validation file
    notes = tmp_path / "notes.txt"
    notes.write_text("\n\n".join(f"Paragraph {i}: some notes of mine." for i in range(40)) + "\n")
    raw, column = load_text_datasets(None, train_file=str(notes))
    assert len(raw["train"]) == 38 and len(raw["validation"]) == 2 and column == "text"
    whole, _ = load_text_datasets(None, train_file=str(notes), validation_file=str(notes))
    assert len(whole["train"]) == 1  # with a validation file, a file is one document
