"""Push a trained folder to the Hugging Face Hub: weights, config, tokenizer, card and run record, nothing else."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi

from .cards import write_model_card


def files_to_push(folder: str | Path) -> list[str]:
    """The files of ``folder`` that a push uploads: every top-level file except hidden ones.

    Subfolders (training checkpoints, tracker logs) stay local.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; pass the output folder of a training run.")
    return sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "Upload model trained with tf_family",
    refresh_card: bool = True,
) -> list[str]:
    """Create ``repo_id`` if needed and upload `files_to_push` in one commit; returns the uploaded paths.

    With ``refresh_card`` the card is rendered again for ``repo_id`` (so its usage snippet names the repository)
    when the folder holds a recipe's ``training_run.json``.
    """
    folder = Path(folder)
    if "/" not in repo_id and not repo_id.strip():
        raise ValueError(f"repo_id={repo_id!r} is empty; pass 'user/name' or 'org/name'.")
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        raise ValueError(f"{folder} has no config.json or adapter_config.json; it is not a saved model folder.")
    if refresh_card and (folder / "training_run.json").is_file():
        write_model_card(folder, repo_id)
    paths = files_to_push(folder)
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in paths]
    api.create_commit(repo_id, operations, commit_message=commit_message, repo_type="model")
    return paths


__all__ = ["files_to_push", "push_folder"]
