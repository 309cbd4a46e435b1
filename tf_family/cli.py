"""The ``tf-family`` command: the zoo table and checkpoint conversion.

tf-family list                                   the zoo as a table
tf-family convert transfo-xl IN_DIR OUT_DIR      a transformers 4.x transfo-xl checkpoint -> tf_family format
tf-family convert longformer IN_DIR OUT_DIR      a transformers 5 longformer checkpoint -> tf_family format
tf-family convert big-bird IN_DIR OUT_DIR        a transformers 5 big_bird checkpoint -> tf_family format
tf-family convert transfo-xl-vocab VOCAB_PKL OUT_DIR
                                                 a 4.x vocab.pkl -> tokenizer.json (restricted unpickler)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .registry import ARCHITECTURES


def zoo_table() -> str:
    """The zoo as a Markdown table: architecture, model_type, tasks, reference implementation, parity status."""
    rows = [
        "| architecture | model_type | tasks | reference implementation | parity |",
        "| --- | --- | --- | --- | --- |",
    ]
    for spec in ARCHITECTURES.values():
        model_types = ", ".join(f"`{t}`" for t in (spec.model_type, *spec.legacy_model_types))
        rows.append(
            f"| {spec.title} (`{spec.name}`) | {model_types} | {', '.join(spec.tasks)} | {spec.reference} | "
            f"{spec.parity} |"
        )
    return "\n".join(rows)


def _convert(args: argparse.Namespace) -> int:
    if args.kind in ("longformer", "big-bird"):
        if args.kind == "longformer":
            from .models.longformer.convert_longformer import convert_folder
        else:
            from .models.big_bird.convert_big_bird import convert_folder

        model = convert_folder(args.source, args.output_dir)
        sys.stdout.write(f"wrote a tf_family {type(model).__name__} checkpoint to {args.output_dir}\n")
    elif args.kind == "transfo-xl":
        from .models.transfo_xl.modeling_transfo_xl import TffTransfoXLLMHeadModel

        model = TffTransfoXLLMHeadModel.from_pretrained(args.source)
        model.save_pretrained(args.output_dir)
        sys.stdout.write(f"wrote a tf_family {model.config.model_type} checkpoint to {args.output_dir}\n")
    else:
        from .models.transfo_xl.convert_vocab import convert_transfo_xl_vocab

        path = convert_transfo_xl_vocab(args.source, args.output_dir)
        sys.stdout.write(f"wrote {path}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tf-family", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="print the zoo as a table")
    convert = commands.add_parser("convert", help="convert a checkpoint or tokenizer of another implementation")
    convert.add_argument("kind", choices=["transfo-xl", "transfo-xl-vocab", "longformer", "big-bird"])
    convert.add_argument("source", help="checkpoint folder (or Hub id already in the cache), or a vocab.pkl file")
    convert.add_argument("output_dir")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        sys.stdout.write(zoo_table() + "\n")
        return 0
    return _convert(args)


if __name__ == "__main__":
    raise SystemExit(main())
