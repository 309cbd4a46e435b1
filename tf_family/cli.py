"""The ``tf-family`` command: the main training job, model cards, Hub pushes, the zoo table, checkpoint conversion.

tf-family train [RECIPE ARGS]                    the causal-LM recipe; with no arguments, the main job: a small
                                                 Transformer-XL on the bundled State of the Union corpus (~5 min on
                                                 2 CPU cores), then reload, perplexity vs unigram, and a sample
tf-family card DIR [--repo_id ID]                render (or refresh) DIR/README.md from DIR/training_run.json
tf-family push DIR REPO_ID [--private] [--remote_code]
                                                 upload a trained folder (weights, config, tokenizer, card)
tf-family export DIR                             add the model's code to a saved folder, so that plain transformers
                                                 loads it with trust_remote_code=True where tf_family is not installed
tf-family export --format onnx DIR OUT           write OUT/model.onnx (the eval forward, dynamic batch and length)
                                                 with the config and tokenizer, for onnxruntime
tf-family list                                   the zoo as a table
tf-family compare [--quick] [OPTIONS]            the family side by side against dense baselines on one corpus:
                                                 tables, plots and an HTML report (tf_family.compare)
tf-family build-kernels                          compile the native CPU attention kernel now (else on first use)
tf-family convert transfo-xl IN_DIR OUT_DIR      a transformers 4.x transfo-xl checkpoint -> tf_family format
tf-family convert longformer IN_DIR OUT_DIR      a transformers 5 longformer checkpoint -> tf_family format
tf-family convert big-bird IN_DIR OUT_DIR        a transformers 5 big_bird checkpoint -> tf_family format
tf-family convert transfo-xl-vocab VOCAB_PKL OUT_DIR
                                                 a 4.x vocab.pkl -> tokenizer.json (restricted unpickler)
tf-family convert decision-transformer IN_DIR OUT_DIR
                                                 a transformers decision_transformer checkpoint -> tf_family format
(the kinds come from the architectures' specs; every checkpoint kind takes --config-overrides JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .registry import ARCHITECTURES
from .spec import ArchSpec

if TYPE_CHECKING:  # the conversion machinery imports torch: `tf-family --help` and `list` must not
    from .conversion import ForeignFormat, ForeignTokenizer


def zoo_table() -> str:
    """The zoo as a Markdown table: architecture (with the systems that are options of it, and their config
    setting), model_type, tasks, reference implementation, parity status."""
    rows = [
        "| architecture | model_type | tasks | reference implementation | parity |",
        "| --- | --- | --- | --- | --- |",
    ]
    for spec in ARCHITECTURES.values():
        model_types = ", ".join(f"`{t}`" for t in spec.model_types)
        options = "".join(f"; option: {name}, `{setting}`" for name, setting in spec.options)
        rows.append(
            f"| {spec.title} (`{spec.name}`){options} | {model_types} | {', '.join(spec.tasks)} | {spec.reference} | "
            f"{spec.parity} |"
        )
    return "\n".join(rows)


def convert_kinds() -> dict[str, tuple[ArchSpec, ForeignFormat | ForeignTokenizer]]:
    """Every ``tf-family convert`` kind: its name -> (architecture, record), from the specs' ``foreign_formats``."""
    return {record.name: (spec, record) for spec in ARCHITECTURES.values() for record in spec.foreign_formats}


def _check_source(source: str, kind: str) -> None:
    """A missing local source is said as such, not as a malformed Hub id (what transformers would say)."""
    path = Path(source).expanduser()
    if path.exists():
        return
    looks_local = source.startswith(("/", ".", "~")) or source.count("/") > 1 or "\\" in source or path.suffix
    if looks_local:
        raise ValueError(
            f"tf-family convert {kind}: no such file or folder {source!r}; pass the folder of the checkpoint to "
            "convert (or the Hub id of one already in the cache)."
        )


def _convert(args: argparse.Namespace) -> int:
    from .conversion import ForeignTokenizer, convert_folder

    spec, record = convert_kinds()[args.kind]
    _check_source(args.source, args.kind)
    overrides = json.loads(args.config_overrides) if args.config_overrides else {}
    if not isinstance(overrides, dict):
        raise ValueError(
            f"--config-overrides={args.config_overrides!r} is not a JSON object; pass '{{\"field\": value}}'."
        )
    if isinstance(record, ForeignTokenizer):
        if overrides:
            raise ValueError(f"--config-overrides applies to checkpoints, not to {args.kind}; leave it out.")
        path = record.convert(args.source, args.output_dir)
        sys.stdout.write(f"wrote {path}\n")
        return 0
    model = convert_folder(args.source, args.output_dir, spec.model_classes, record, **overrides)
    sys.stdout.write(
        f"wrote a tf_family {type(model).__name__} checkpoint ({model.config.model_type}) to {args.output_dir}\n"
    )
    return 0


# The main job: what `tf-family train` runs when it is given no arguments. Its model belongs to it alone: it applies
# when no other model is asked for (no --arch, or --arch transfo_xl, and no --model_name_or_path).
MAIN_JOB_MODEL = {
    "arch": "transfo_xl",
    "variant": "small",
    # pre-LN: at this size and step budget post-LN Transformer-XL stalls near the unigram loss; pre-LN learns
    "config_overrides": ["pre_lnorm=true"],
    "block_size": 128,
}
# What every `tf-family train` run starts from, whatever the model: a short run (the main job takes about five
# minutes on 2 CPU cores). Each is a default of the recipe's option of the same name: the command line overrides it.
TRAIN_DEFAULTS = {
    "max_train_steps": 400,
    "per_device_train_batch_size": 8,
    "learning_rate": 1e-3,
    "num_warmup_steps": 20,
    "logging_steps": 20,
}
SAMPLE_PROMPT = "Fellow-Citizens of the Senate and House of Representatives:"


def train_defaults(recipe_args: Sequence[str]) -> dict[str, object]:
    """The recipe defaults `tf-family train` uses for ``recipe_args``: `TRAIN_DEFAULTS`, the main job's model
    (`MAIN_JOB_MODEL`) unless another model is asked for, and a fresh ``runs/<model>-<time>`` output folder."""
    probe = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    probe.add_argument("--arch")
    probe.add_argument("--model_name_or_path")
    try:
        known, _ = probe.parse_known_args(list(recipe_args))
    except argparse.ArgumentError:  # e.g. --arch without a value: the recipe's parser says so
        known = argparse.Namespace(arch=None, model_name_or_path=None)
    defaults: dict[str, object] = dict(TRAIN_DEFAULTS)
    if known.model_name_or_path is None and known.arch in (None, MAIN_JOB_MODEL["arch"]):
        defaults.update(MAIN_JOB_MODEL)
    if known.model_name_or_path is not None:
        model = Path(known.model_name_or_path.rstrip("/")).name or "model"
    else:
        model = known.arch or str(MAIN_JOB_MODEL["arch"])
    from .training.arguments import timestamped_run_dir

    defaults["output_dir"] = timestamped_run_dir(model)  # the same folder in every process of a launch
    return defaults


def _train(recipe_args: list[str]) -> int:
    from .allocator import keep_freed_memory

    keep_freed_memory()  # before the first large allocation (TF_FAMILY_KEEP_FREED_MEMORY=0 opts out)
    from .recipes import causal_lm

    results = causal_lm.main(list(recipe_args), prog="tf-family train", defaults=train_defaults(recipe_args))
    if not _is_main_process():
        return 0

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .training.language_modeling import max_positions

    folder = results["output_dir"]
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer(SAMPLE_PROMPT, return_tensors="pt")
    # models with absolute positions cannot generate past their last one
    positions = max_positions(model.config)
    new_tokens = 60 if positions is None else max(1, min(60, positions - prompt["input_ids"].shape[1]))
    torch.manual_seed(0)
    with torch.no_grad():
        sample = model.generate(
            **prompt, max_new_tokens=new_tokens, do_sample=True, top_k=40, pad_token_id=tokenizer.eos_token_id
        )
    write = sys.stdout.write
    write("\n")
    write("".join(line + "\n" for line in evaluation_summary(results)))
    write(f"bits per character     {results['bits_per_character']:.3f}\n")
    write(
        f"saved to               {folder}  (weights, config, tokenizer, model card; push with "
        f"`tf-family push {folder} USER/NAME`)\n"
    )
    write(f"reloaded with          AutoModelForCausalLM.from_pretrained -> {type(model).__name__}\n")
    write(f"sample                 {tokenizer.decode(sample[0], skip_special_tokens=True)}\n")
    return 0


def evaluation_summary(results: dict) -> list[str]:
    """The lines `tf-family train` ends with about the evaluation: the perplexity beside the unigram perplexity of
    the same data (and a kNN-LM's base model's), and, for a short run, that it is one and what it scored."""
    from .training.arguments import SMOKE_RUN_STEPS

    lines = [f"validation perplexity  {results['perplexity']:.1f}"]
    if "unigram_perplexity" in results:
        lines[0] += f"   (unigram perplexity of the same data: {results['unigram_perplexity']:.1f})"
    if "base_perplexity" in results:
        lines.append(f"base model perplexity  {results['base_perplexity']:.1f}   (the kNN-LM without its datastore)")
    steps, scored, available = (
        results.get("train_steps"),
        results.get("eval_documents"),
        results.get("validation_documents"),
    )
    if steps is not None and steps < SMOKE_RUN_STEPS:
        of = f"the first {scored} of {available} validation documents" if scored != available else "every document"
        lines.append(
            f"{'short run':<23}{steps} steps (under {SMOKE_RUN_STEPS}): a smoke test, not a trained model; "
            f"scored on {of} (--max_eval_samples 0: all)"
        )
    elif scored is not None and available is not None and scored < available:
        lines.append(f"{'scored on':<23}the first {scored} of {available} validation documents")
    return lines


def _build_kernels() -> int:
    from .attention import native

    already = native.is_built()
    started = time.perf_counter()
    module = native.extension()
    if module is None:
        reason = (
            "TF_FAMILY_NATIVE=0 turns it off"
            if os.environ.get("TF_FAMILY_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")
            else "see the warning above; CPU training falls back to the slower PyTorch path"
        )
        sys.stderr.write(f"tf-family build-kernels: the native attention kernel is not available ({reason}).\n")
        return 1
    how = "already built" if already else f"built in {time.perf_counter() - started:.0f} s"
    sys.stdout.write(f"native attention kernel: {how}, in {native.build_directory()}\n")
    return 0


def export_summary(folder: str, written: Sequence[str]) -> str:
    """What `tf-family export` says it did, and why the code files lie beside the weights."""
    return (
        f"wrote {len(written)} code files and auto_map into {folder}: AutoModel*.from_pretrained(folder, "
        "trust_remote_code=True) loads it without tf_family.\n"
        "  (They must lie beside config.json, one flat file per module: transformers' remote-code loader copies only "
        "files named by `from .module import` in the same folder, never a sub-folder.)\n"
    )


def _is_main_process() -> bool:
    from accelerate import PartialState

    return PartialState().is_main_process


def build_parser(convert_kinds_listed: bool = True) -> argparse.ArgumentParser:
    """The ``tf-family`` parser. ``convert_kinds_listed=False`` leaves the kinds of ``convert`` unchecked and
    unlisted: reading them imports the conversion machinery (torch), which ``--help`` and the other commands skip."""
    parser = argparse.ArgumentParser(
        prog="tf-family",
        description=__doc__.split("\n")[0],
        epilog="A mistake in the arguments prints one line (error: ...); --debug anywhere shows the full traceback.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "train",
        help="run the causal-LM recipe (no arguments: the main job); every option goes to the recipe",
        add_help=False,
    )
    card = commands.add_parser("card", help="render or refresh the model card of a trained folder")
    card.add_argument("folder")
    card.add_argument("--repo_id", help="the Hub repository the card's usage snippet names")
    push = commands.add_parser("push", help="push a trained folder to the Hugging Face Hub")
    push.add_argument("folder")
    push.add_argument("repo_id")
    push.add_argument("--private", action="store_true")
    push.add_argument("--token")
    push.add_argument(
        "--remote_code",
        action="store_true",
        help="export the model's code into the folder first (tf-family export), so it loads without tf_family",
    )
    export = commands.add_parser(
        "export",
        help="add the model's code and auto_map to a saved folder: AutoModel*.from_pretrained(folder, "
        "trust_remote_code=True) then loads it where tf_family is not installed",
    )
    export.add_argument("folder")
    export.add_argument("output_dir", nargs="?", help="--format onnx: the folder to write model.onnx into")
    export.add_argument(
        "--format",
        choices=["remote-code", "onnx"],
        default="remote-code",
        help="remote-code (default): the code into DIR; onnx: OUT/model.onnx, config and tokenizer",
    )
    export.add_argument(
        "--with-datastore",
        action="store_true",
        help="--format onnx, kNN-LM: include the datastore search (refused: it cannot be exported; without this "
        "flag the base LM path, lmbda=0, is exported)",
    )
    commands.add_parser("list", help="print the zoo as a table")
    commands.add_parser(
        "compare",
        help="measure the family side by side against dense baselines (--quick: ~15 min on 2 CPU cores); every "
        "option goes to tf_family.compare",
        add_help=False,
    )
    commands.add_parser(
        "build-kernels",
        help=(
            "compile the native CPU kernels (attention for Longformer, BigBird training; the Memorizing "
            "Transformer's kNN search) now instead of on first use"
        ),
    )
    convert = commands.add_parser("convert", help="convert a checkpoint or tokenizer of another implementation")
    if convert_kinds_listed:
        kinds = convert_kinds()
        convert.add_argument(
            "kind",
            choices=list(kinds),
            help="; ".join(f"{name}: {record.description}" for name, (_, record) in kinds.items()),
        )
    else:
        convert.add_argument("kind", help="what to convert (`tf-family convert --help` lists the kinds)")
    convert.add_argument("source", help="checkpoint folder (or Hub id already in the cache), or a vocab.pkl file")
    convert.add_argument("output_dir")
    convert.add_argument(
        "--config-overrides",
        default=None,
        help='checkpoints: JSON of config fields to set or store, e.g. for decision-transformer \'{"state_mean": '
        '[...], "state_std": [...], "return_scale": 1000.0, "target_return": 3600.0}\' (transformers keeps them in '
        "the model card)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tf-family`` command: a user's mistake prints one line ``error: ...`` and exits with 2 (the traceback
    only with ``--debug``; `tf_family.utils.user_errors.run_main`)."""
    from .utils.user_errors import run_main

    return run_main(_run, list(sys.argv[1:] if argv is None else argv), prog="tf-family")


def _check_folder(args: argparse.Namespace) -> None:
    """The saved folder a command reads exists (else one clear error naming it)."""
    from .utils.user_errors import check_local_path

    if getattr(args, "folder", None) is not None:
        check_local_path(args.folder, f"tf-family {args.command}", always_local=True)


def _run(argv: list[str]) -> int:
    if argv[:1] == ["train"]:  # the recipe parses its own options (and its own --help, --debug)
        return _train(argv[1:])
    if argv[:1] == ["compare"]:  # the comparison parses its own options (and its own --help)
        from .compare import main as compare

        return compare([arg for arg in argv[1:] if arg != "--debug"])
    argv = [arg for arg in argv if arg != "--debug"]
    args = build_parser(convert_kinds_listed=argv[:1] == ["convert"]).parse_args(argv)
    _check_folder(args)
    if args.command == "card":
        from .shipping.cards import write_model_card

        path = write_model_card(args.folder, args.repo_id)
        sys.stdout.write(f"wrote {path}\n")
        return 0
    if args.command == "push":
        from .shipping.hub import HubPushError, push_folder

        try:
            pushed = push_folder(
                args.folder, args.repo_id, token=args.token, private=args.private or None, remote_code=args.remote_code
            )
        except HubPushError as error:
            sys.stderr.write(f"tf-family push: {error}\n")
            return 1
        sys.stdout.write(f"pushed {', '.join(pushed)} to https://huggingface.co/{args.repo_id}\n")
        return 0
    if args.command == "export" and args.format == "onnx":
        from .shipping.onnx_export import OnnxExportError, export_onnx

        if args.output_dir is None:
            sys.stderr.write("tf-family export --format onnx: pass the output folder: DIR OUT.\n")
            return 2
        try:
            path = export_onnx(args.folder, args.output_dir, include_datastore=args.with_datastore)
        except OnnxExportError as error:
            sys.stderr.write(f"tf-family export --format onnx: {error}\n")
            return 1
        sys.stdout.write(f"wrote {path} (with its config and tokenizer); run it with onnxruntime.InferenceSession\n")
        return 0
    if args.command == "export":
        from .shipping.remote_code import export_remote_code

        if args.output_dir is not None:
            sys.stderr.write("tf-family export: the remote-code export writes into DIR; OUT is for --format onnx.\n")
            return 2

        written = export_remote_code(args.folder)
        sys.stdout.write(export_summary(args.folder, written))
        return 0
    if args.command == "list":
        sys.stdout.write(zoo_table() + "\n")
        return 0
    if args.command == "build-kernels":
        return _build_kernels()
    return _convert(args)


if __name__ == "__main__":
    raise SystemExit(main())
