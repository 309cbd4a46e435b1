"""Image modelling with accelerate: a causal LM over pixels, one token per intensity, trained and evaluated in bits
per dimension (the Image Transformer's measure, Parmar et al. 2018, arXiv:1802.05751) — for comparing the Sparse
Transformer house's 1-D and 2-D local patterns (or any causal LM of the zoo) on real images.

    accelerate launch recipes/image_modeling.py --arch sparse_transformer --variant image-local-1d
    accelerate launch recipes/image_modeling.py --arch sparse_transformer --variant image-local-2d
    accelerate launch -m tf_family.recipes.image_modeling --model_name_or_path runs/my-digits-model

Data: scikit-learn's 8x8 digits (`sklearn.datasets.load_digits`, shipped with scikit-learn, nothing is downloaded):
1,797 grey images with 17 intensities (tokens 0 .. 16); the first 1,500 train, the last 297 are the validation split
(``--num_validation``). Pixel order: raster order, or, for a model with ``sparsity_pattern="local_2d"``, the
block-raster order its 2-D query blocks are generated in (`tf_family.attention.image_local.block_raster_order`).

Bits per dimension: the mean negative log2-likelihood of pixels 2 .. 64 of the validation images (the first pixel
has no context in a causal LM without a start token; the same for every model, so the figures compare). Same
conventions as the encoder recipes (a `DataLoader` prepared by accelerate, the loop written out below in the named
steps of `tf_family.training.encoder`): gradient accumulation, clipping, atomic checkpoints with exact
``--resume_from_checkpoint``, model card, push to the Hub. No tokenizer is saved: a pixel's
intensity is its token id.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
from accelerate.logging import get_logger
from transformers import AutoModelForCausalLM

from tf_family import create_model
from tf_family.attention.image_local import Local2DPattern, block_raster_order
from tf_family.training import apply_lora, encoder, parse_config_overrides
from tf_family.training.arguments import (
    add_lora_and_hub_arguments,
    add_optimisation_arguments,
    add_run_arguments,
    architectures_with,
    check_at_least,
    check_model_source,
    timestamped_run_dir,
    validate_run_args,
)
from tf_family.training.run import prepare, start_run
from tf_family.utils.user_errors import run_main

logger = get_logger(__name__)

TASK = "causal_lm"
IMAGE_SIZE = 8  # the digits are 8 x 8
INTENSITIES = 17  # 0 .. 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a causal LM on images, in bits per dimension (tf_family).")
    model = parser.add_argument_group("model")
    model.add_argument("--arch", help=f"train from scratch: one of {architectures_with(TASK)}")
    model.add_argument("--variant", default="image-local-1d", help="named size of --arch")
    model.add_argument(
        "--config_overrides", nargs="*", default=[], metavar="KEY=VALUE", help="config fields for --arch"
    )
    model.add_argument("--model_name_or_path", help="fine-tune a saved folder or Hub id")
    data = parser.add_argument_group("data")
    data.add_argument("--dataset_name", choices=["digits"], default="digits", help="scikit-learn's 8x8 digits")
    data.add_argument("--num_validation", type=int, default=297, help="the last N images are the validation split")
    data.add_argument("--max_train_samples", type=int, help="use only the first N training images")
    data.add_argument(
        "--max_eval_samples",
        type=int,
        help="use only the first N validation images (0: all; default: all, or 4 in a run of under 100 steps)",
    )
    add_optimisation_arguments(
        parser,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        per_device_train_batch_size=32,
        num_train_epochs=None,
        max_train_steps=600,
    )
    add_run_arguments(parser, default_output_dir="runs/<model>-image-digits-<time>", logging_steps=50)
    add_lora_and_hub_arguments(parser)
    return parser.parse_args(argv)


def validate_args(args: argparse.Namespace) -> None:
    check_model_source(args, TASK, "--arch {arch} has no causal_lm model; architectures with one: {able}.")
    check_at_least(args, ("per_device_train_batch_size", "per_device_eval_batch_size", "num_validation"))
    check_at_least(args, ("max_train_samples",))
    check_at_least(args, ("max_eval_samples",), minimum=0)
    if args.learning_rate <= 0:
        raise ValueError(f"--learning_rate={args.learning_rate} must be positive.")
    validate_run_args(args)


def load_images(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Train and validation images, ``(N, 64)`` intensities in raster order."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError("the digits ship with scikit-learn: pip install scikit-learn.") from error
    images = torch.tensor(load_digits().images, dtype=torch.long).flatten(1)  # (1797, 64), 0 .. 16
    if args.num_validation >= len(images):
        raise ValueError(f"--num_validation={args.num_validation} leaves no training image of {len(images)}.")
    split = len(images) - args.num_validation
    train = images[:split][: args.max_train_samples or None]
    validation = images[split:][: args.max_eval_samples or None]
    return {"train": train, "validation": validation}


def pixel_order(config) -> torch.Tensor | None:
    """The generation order of a 2-D local model (block-raster), or None for raster order."""
    if getattr(config, "sparsity_pattern", None) != "local_2d":
        return None
    fields = ("image_width", "block_height", "block_width", "memory_height", "memory_width")
    pattern = Local2DPattern(*(getattr(config, name) for name in fields))
    if pattern.image_width != IMAGE_SIZE:
        raise ValueError(
            f"the model's image_width={pattern.image_width} is not the digits' width {IMAGE_SIZE}; set "
            f"--config_overrides image_width={IMAGE_SIZE}."
        )
    return block_raster_order(pattern, IMAGE_SIZE)  # ValueError when block_height does not divide 8


def check_model(model) -> None:
    """The model reads 17 intensities and 64 positions."""
    config = model.config
    if config.vocab_size < INTENSITIES:
        raise ValueError(f"the model's vocab_size={config.vocab_size} is below the {INTENSITIES} intensities.")
    positions = getattr(config, "max_position_embeddings", None)
    absolute = getattr(config, "position_embedding_type", "absolute") == "absolute"
    if absolute and positions is not None and positions < IMAGE_SIZE * IMAGE_SIZE:
        raise ValueError(f"the model's max_position_embeddings={positions} is below the {IMAGE_SIZE**2} pixels.")


def evaluate(accelerator, model, eval_dataloader, num_pixels: int) -> dict[str, float]:
    """Bits per dimension of pixels 2 .. ``num_pixels`` over the validation images (their prepared loader), and the
    loss in nats."""

    def read(outputs, batch, indices):
        logits = outputs.logits[:, :-1].float()  # (B, 63, V): pixel t + 1 from pixels <= t
        targets = batch["input_ids"][:, 1:]
        nats = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").sum(-1)
        return list(zip(indices, nats.tolist(), strict=True))

    per_image = encoder.gather_predictions(accelerator, model, eval_dataloader, read)
    loss = sum(per_image) / (len(per_image) * (num_pixels - 1))
    return {"bits_per_dim": loss / math.log(2), "eval_loss": loss, "perplexity": math.exp(loss)}


def train(run, train_dataloader, run_evaluation, num_epochs: int, described: str) -> list[dict[str, float]]:
    """The training loop: epochs of micro-batches (`encoder.epoch_batches`, resumed with ``skip_first_batches``),
    each an `encoder.training_step`, and after each optimizer step the log, evaluations and checkpoints
    (`encoder.after_optimizer_step`); returns the logged history."""
    accumulation = run.args.gradient_accumulation_steps
    start_epoch, resume_update = encoder.resume_position(run)
    progress, log = run.start_training(
        "examples_per_second", f"{described}, {run.max_train_steps} steps on {run.world} process(es)"
    )
    for epoch in range(start_epoch, num_epochs):
        if run.completed_steps >= run.max_train_steps:
            break
        first_update = resume_update if epoch == start_epoch else 0
        batches, updates_in_epoch = encoder.epoch_batches(run, train_dataloader, epoch, first_update)
        for micro_index, batch in enumerate(batches, start=first_update * accumulation):
            loss, examples = encoder.training_step(run, batch)
            log.add(loss, 1, examples)
            if not run.accelerator.sync_gradients:
                continue
            run.completed_steps += 1
            progress.update(1)
            position = (epoch, (micro_index + 1) // accumulation, updates_in_epoch)
            record = encoder.after_optimizer_step(run, log, run_evaluation, position)
            if record is not None:
                progress.set_postfix(loss=f"{record['train_loss']:.3f}")
            if run.completed_steps >= run.max_train_steps:
                break
    progress.close()
    return log.history


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse → images → model → train → evaluate (bits per dimension) → save."""
    args = parse_args(argv)
    validate_args(args)
    config_overrides = parse_config_overrides(args.config_overrides, args.arch)
    run = start_run(args, lambda: timestamped_run_dir(f"{args.arch or 'model'}-image-digits"))
    images = load_images(args)
    if args.arch:
        torch.manual_seed(args.seed)  # the initial weights
        model = create_model(args.arch, TASK, args.variant, **config_overrides)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    check_model(model)
    order = pixel_order(model.config)
    order_name = "raster" if order is None else "block-raster"
    if order is not None:
        images = {split: pixels[:, order] for split, pixels in images.items()}
    train_images = images["train"]
    updates = encoder.updates_per_epoch(
        run, len(train_images), f"{len(train_images)} training images make", "the batch size or "
        "--gradient_accumulation_steps",
    )  # fmt: skip
    model = apply_lora(model, args, task_type="CAUSAL_LM")
    max_train_steps = args.max_train_steps or updates
    prepare(run, model, max_train_steps, "tf_family_image_modeling", pixel_order=order_name)

    def collate(indices: list[int], epoch: int) -> dict:
        batch = train_images[indices]
        return {"input_ids": batch, "labels": batch}

    def eval_collate(indices: list[int], epoch: int) -> dict:
        return {"input_ids": images["validation"][indices]}

    train_dataloader, eval_dataloaders = encoder.example_loaders(
        run, collate, len(train_images), {"validation": (eval_collate, len(images["validation"]))}
    )

    def run_evaluation() -> dict[str, float]:
        return evaluate(run.accelerator, run.model, eval_dataloaders["validation"], images["validation"].shape[1])

    described = f"{len(train_images)} training images of {IMAGE_SIZE}x{IMAGE_SIZE} pixels"
    history = train(run, train_dataloader, run_evaluation, math.ceil(max_train_steps / updates), described)
    metrics = run_evaluation()
    run.log_metrics(metrics, label="evaluation")
    data = {
        "name": None,
        "title": "scikit-learn 8x8 digits",
        "description": (
            f"scikit-learn's 8x8 digits (`sklearn.datasets.load_digits`, no download): {len(train_images)} training "
            f"and {len(images['validation'])} validation images, one token per pixel intensity (0-16), "
            f"{order_name} order."
        ),
        "on_hub": False,
        "train_documents": len(train_images),
        "train_tokens": train_images.numel(),
        "eval_documents": len(images["validation"]),
        "eval_tokens": images["validation"].numel(),
        "eval_split": "validation",
    }
    return run.finish(None, recipe="image_modeling", task=TASK, dataset=data, metrics=metrics, history=history)


if __name__ == "__main__":
    raise SystemExit(run_main(main))
