"""One loader for every text source a recipe accepts: the bundled corpus, a Hub dataset, or local files."""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset, DatasetDict, IterableDataset, load_dataset

from .brown import load_brown
from .sotu import load_sotu

BUNDLED_DATASETS = {"sotu": load_sotu, "brown": load_brown}
# file suffix -> `datasets` builder
_BUILDERS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def _builder_for(path: str, argument: str) -> str:
    if not Path(path).is_file():
        raise ValueError(
            f"{argument}={path!r}: no such file. Pass the path of an existing text/JSON/CSV/parquet file."
        )
    suffix = Path(path).suffix.lower()
    if suffix not in _BUILDERS:
        raise ValueError(f"{argument}={path!r}: unsupported suffix {suffix!r}; use one of {sorted(_BUILDERS)}.")
    return _BUILDERS[suffix]


def load_text_datasets(
    dataset_name: str | None = "sotu",
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    text_column: str | None = None,
    validation_split_percentage: int = 5,
    sample_by: str | None = None,
) -> tuple[DatasetDict, str]:
    """Load ``train`` and ``validation`` splits and name the text column.

    ``dataset_name`` is ``"sotu"`` or ``"brown"`` (the bundled corpora) or a Hub dataset id; local files take precedence when given.
    Plain-text files are read ``sample_by`` ``"document"`` (a file is one document), ``"paragraph"`` or ``"line"``;
    by default (``None``) a lone plain-text training file (no validation file) is read by paragraph, so that a
    validation part can be held out of it, and otherwise a file is one document.
    Without a validation split the last ``validation_split_percentage`` % of the training rows are held out (rows
    keep their order, so a later part of an ordered corpus is held out, not a random sample).

    Returns the `DatasetDict` and the name of the text column.
    """
    if train_file is not None:
        builder = _builder_for(train_file, "--train_file")
        data_files = {"train": train_file}
        if validation_file is not None:
            if _builder_for(validation_file, "--validation_file") != builder:
                raise ValueError(
                    f"--train_file={train_file!r} and --validation_file={validation_file!r} have different formats; "
                    "give both as the same kind of file."
                )
            data_files["validation"] = validation_file
        if sample_by is None:
            sample_by = "paragraph" if validation_file is None else "document"
        kwargs = {"sample_by": sample_by} if builder == "text" else {}
        raw = load_dataset(builder, data_files=data_files, **kwargs)
    elif dataset_name in BUNDLED_DATASETS:
        raw = BUNDLED_DATASETS[dataset_name]()
    elif dataset_name:
        raw = load_dataset(dataset_name, dataset_config_name)
    else:
        raise ValueError("No data: pass --dataset_name (a Hub id, or 'sotu' for the bundled corpus) or --train_file.")
    if "train" not in raw:
        raise ValueError(
            f"the dataset has no 'train' split (it has {list(raw)}); pass --train_file or another dataset."
        )

    if "validation" not in raw:
        if not 0 < validation_split_percentage < 100:
            raise ValueError(
                f"--validation_split_percentage={validation_split_percentage} must be in (0, 100) when the data has "
                "no validation split."
            )
        rows = len(raw["train"])
        held_out = max(1, rows * validation_split_percentage // 100)
        if rows < 2:
            raise ValueError(
                f"the training data has {rows} row(s), too few to hold out a validation part; pass --validation_file "
                "or split the text into more documents (--sample_by paragraph)."
            )
        raw = DatasetDict(
            {
                "train": raw["train"].select(range(rows - held_out)),
                "validation": raw["train"].select(range(rows - held_out, rows)),
            }
        )

    columns = raw["train"].column_names
    if text_column is None:
        text_column = "text" if "text" in columns else None
        if text_column is None:
            string_columns = [
                name
                for name, f in raw["train"].features.items()
                if getattr(f, "dtype", None) in ("string", "large_string")
            ]
            if not string_columns:
                raise ValueError(f"no text column among {columns}; pass --text_column.")
            text_column = string_columns[0]
    elif text_column not in columns:
        raise ValueError(f"--text_column={text_column!r} is not a column of the data; its columns are {columns}.")
    return raw, text_column


def load_text_streams(
    dataset_name: str | None = "sotu",
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    text_column: str | None = None,
    sample_by: str | None = None,
) -> tuple[IterableDataset, Dataset, str]:
    """The training split as a stream (`datasets.IterableDataset`, read as it is consumed: a corpus larger than
    memory trains), the validation split loaded whole, and the text column.

    A local ``train_file`` is read with ``load_dataset(..., streaming=True)`` and needs a ``validation_file`` (a stream
    cannot hold out its last rows); a Hub dataset streams its ``train`` split and loads its ``validation`` split;
    a bundled corpus (``"sotu"``, ``"brown"``) is small and held in memory, streamed all the same
    (`Dataset.to_iterable_dataset`) so that every source resumes the same way. Plain-text files are read
    ``sample_by`` ``"document"`` (the default here), ``"paragraph"`` or ``"line"``.
    """
    if train_file is not None:
        if validation_file is None:
            raise ValueError(
                "--streaming with --train_file needs --validation_file: a streamed file cannot hold out its last rows."
            )
        builder = _builder_for(train_file, "--train_file")
        if _builder_for(validation_file, "--validation_file") != builder:
            raise ValueError(
                f"--train_file={train_file!r} and --validation_file={validation_file!r} have different formats; "
                "give both as the same kind of file."
            )
        kwargs = {"sample_by": sample_by or "document"} if builder == "text" else {}
        train = load_dataset(builder, data_files={"train": train_file}, split="train", streaming=True, **kwargs)
        validation = load_dataset(builder, data_files={"validation": validation_file}, split="validation", **kwargs)
    elif dataset_name in BUNDLED_DATASETS:
        raw, text_column = load_text_datasets(dataset_name, text_column=text_column)
        return raw["train"].to_iterable_dataset(), raw["validation"], text_column
    elif dataset_name:
        train = load_dataset(dataset_name, dataset_config_name, split="train", streaming=True)
        try:
            validation = load_dataset(dataset_name, dataset_config_name, split="validation")
        except ValueError as error:
            raise ValueError(
                f"--streaming: {dataset_name} has no 'validation' split to evaluate on ({error}); pass "
                "--validation_file."
            ) from None
    else:
        raise ValueError("No data: pass --dataset_name (a Hub id, or 'sotu' for the bundled corpus) or --train_file.")
    columns = validation.column_names
    if text_column is None:
        text_column = "text" if "text" in columns else None
        if text_column is None:
            strings = [
                n for n, f in validation.features.items() if getattr(f, "dtype", None) in ("string", "large_string")
            ]
            if not strings:
                raise ValueError(f"no text column among {columns}; pass --text_column.")
            text_column = strings[0]
    elif text_column not in columns:
        raise ValueError(f"--text_column={text_column!r} is not a column of the data; its columns are {columns}.")
    return train, validation, text_column


__all__ = ["BUNDLED_DATASETS", "load_text_datasets", "load_text_streams"]
