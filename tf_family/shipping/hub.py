"""Push a trained folder to the Hugging Face Hub: weights, config, tokenizer, card and run record, nothing else."""

from __future__ import annotations

import json
import re
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi

from ..utils.files import atomic_write_text
from .cards import HUB_ID_PATTERN, RUN_INFO_FILE, write_model_card

# subfolders a saved model loads from (a kNN-LM's datastore): pushed with the folder; other subfolders (training
# checkpoints, tracker logs) stay local
MODEL_SUBFOLDERS = ("datastore",)


def hub_id_of(name_or_path: str | Path) -> str | None:
    """The Hub repository a model reference stands for, when it is known: the reference itself when it is no local
    path, the repository of a Hub cache snapshot, or the one a tf_family folder was pushed to (``hub_model_id`` in
    its ``training_run.json``); None for a local folder of unknown origin."""
    path = Path(name_or_path)
    if not path.exists():
        return str(name_or_path) if HUB_ID_PATTERN.fullmatch(str(name_or_path)) else None
    resolved = path.resolve()
    snapshot = re.search(r"/models--([^/]+?)--([^/]+)/snapshots/", resolved.as_posix() + "/")
    if snapshot:
        return f"{snapshot[1]}/{snapshot[2]}"
    run = resolved / RUN_INFO_FILE
    if run.is_file():
        pushed = json.loads(run.read_text(encoding="utf-8")).get("hub_model_id")
        if pushed:
            return str(pushed)
    return None


def portable_reference(name_or_path: str | Path) -> str:
    """What a saved folder should record to find ``name_or_path`` again from anywhere: its Hub id when known
    (`hub_id_of`), else its absolute path."""
    return hub_id_of(name_or_path) or str(Path(name_or_path).resolve())


def files_to_push(folder: str | Path) -> list[str]:
    """The files of ``folder`` that a push uploads: every top-level file except hidden ones, and the files of the
    subfolders a model loads from (`MODEL_SUBFOLDERS`). Other subfolders (training checkpoints, tracker logs)
    stay local."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; pass the output folder of a training run.")
    files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    for name in MODEL_SUBFOLDERS:
        if (folder / name).is_dir():
            files += [p for p in (folder / name).rglob("*") if p.is_file() and not p.name.startswith(".")]
    return sorted(p.relative_to(folder).as_posix() for p in files)


class HubPushError(ValueError):
    """A push that cannot happen, said in one line: offline, not logged in, a token refused, the Hub unreachable."""


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def check_push_access(repo_id: str | None, token: str | None = None) -> None:
    """Before any work: refuse (`HubPushError`, one line) a push to ``repo_id`` that would fail at the end of the
    run: offline mode, no token, a token the Hub refuses, or a Hub that cannot be reached."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import HfHubHTTPError

    later = "or leave out --push_to_hub and push the folder later with `tf-family push DIR USER/NAME`"
    if not repo_id or "/" not in repo_id:
        raise HubPushError(f"--push_to_hub needs --hub_model_id user/name (got {repo_id!r}).")
    if _offline():
        raise HubPushError(f"cannot push to {repo_id}: HF_HUB_OFFLINE is set; unset it, {later}.")
    token = token or get_token()
    if token is None:
        raise HubPushError(
            f"cannot push to {repo_id}: not logged in to the Hugging Face Hub; run `hf auth login` (or set HF_TOKEN, "
            f"or pass --hub_token), {later}."
        )
    try:
        HfApi(token=token).whoami()
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status in (401, 403):
            raise HubPushError(
                f"cannot push to {repo_id}: the Hub refused the token (HTTP {status}); log in again with "
                f"`hf auth login`, {later}."
            ) from None
        raise HubPushError(f"cannot push to {repo_id}: the Hub answered {_one_line(error)}; {later}.") from None
    except Exception as error:  # httpx / OS network errors: no route, DNS, timeout
        raise HubPushError(
            f"cannot push to {repo_id}: the Hub is unreachable ({_one_line(error)}); check the network, {later}."
        ) from None


def _record_hub_id(folder: Path, repo_id: str) -> None:
    """Note in ``training_run.json`` where the folder was pushed, so that runs fine-tuned from it name the Hub id."""
    path = folder / RUN_INFO_FILE
    if not path.is_file():
        return
    run = json.loads(path.read_text(encoding="utf-8"))
    if run.get("hub_model_id") == repo_id:
        return
    run["hub_model_id"] = repo_id
    atomic_write_text(path, json.dumps(run, indent=2) + "\n")


def _push_error(error: BaseException, folder: Path, repo_id: str, outcome: str) -> HubPushError | None:
    """The one-line `HubPushError` for a failed Hub call (offline, refused token, unreachable, an HTTP error),
    ending with ``outcome`` (what was left as it was), or None for an error that is no Hub failure (raised as it
    is)."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(error, OfflineModeIsEnabled) or _offline():
        reason = "HF_HUB_OFFLINE is set; unset it to push"
    elif isinstance(error, HfHubHTTPError):
        status = getattr(getattr(error, "response", None), "status_code", None)
        reason = (
            f"the Hub refused the token (HTTP {status}); log in with `hf auth login` or pass --token"
            if status in (401, 403)
            else f"the Hub answered {_one_line(error)}"
        )
    elif isinstance(error, (OSError, ConnectionError)) or "httpx" in type(error).__module__:
        reason = f"the Hub is unreachable ({_one_line(error)}); check the network"
    else:
        return None
    return HubPushError(f"could not push {folder} to {repo_id}: {reason}; {outcome}.")


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "Upload model trained with tf_family",
    refresh_card: bool = True,
    remote_code: bool = False,
) -> list[str]:
    """Create ``repo_id`` if needed and upload `files_to_push` in one commit; returns the uploaded paths.

    The repository is created (which checks that the Hub is reachable and the token may write there) before
    anything in the folder changes: offline, unreachable or refused, a `HubPushError` says so in one line and the
    folder is left byte for byte as it was. Then, with ``refresh_card``, the card is rendered again for ``repo_id``
    (so its usage snippet names the repository) when the folder holds a recipe's ``training_run.json``, and with
    ``remote_code`` the folder is exported for loading without tf_family (`tf_family.shipping.remote_code.export_remote_code`:
    code files and ``auto_map``).
    """
    folder = Path(folder)
    if "/" not in repo_id and not repo_id.strip():
        raise ValueError(f"repo_id={repo_id!r} is empty; pass 'user/name' or 'org/name'.")
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        raise ValueError(f"{folder} has no config.json or adapter_config.json; it is not a saved model folder.")
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    except Exception as error:  # network, auth, offline mode: one line that says which, not a long traceback
        failure = _push_error(error, folder, repo_id, "the folder was left unchanged")
        if failure is None:
            raise
        raise failure from None
    if remote_code:
        from .remote_code import export_remote_code

        export_remote_code(folder)
    if refresh_card and (folder / "training_run.json").is_file():
        write_model_card(folder, repo_id)
    paths = files_to_push(folder)
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in paths]
    try:
        api.create_commit(repo_id, operations, commit_message=commit_message, repo_type="model")
    except Exception as error:
        failure = _push_error(error, folder, repo_id, "nothing was uploaded")
        if failure is None:
            raise
        raise failure from None
    _record_hub_id(folder, repo_id)
    return paths


__all__ = [
    "MODEL_SUBFOLDERS",
    "HubPushError",
    "check_push_access",
    "files_to_push",
    "hub_id_of",
    "portable_reference",
    "push_folder",
]
