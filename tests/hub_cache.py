"""A local stand-in for the Hugging Face Hub: a folder laid out as huggingface_hub's cache holds a download."""

import hashlib
import os


def as_hub_cache(folder, cache_dir, repo_id: str):
    """Lay ``folder`` out as huggingface_hub's cache holds a downloaded snapshot of ``repo_id`` (blobs, a snapshot of
    links, refs/main): what a user has after fetching the repository, read here with no network."""
    repo = cache_dir / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
