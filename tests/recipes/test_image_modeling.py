"""The image-modelling recipe end to end on tiny Sparse Transformers (1-D and 2-D local patterns) and a few of
scikit-learn's 8x8 digits (seconds each): the run reports bits per dimension, and the saved folder reloads through
the Auto classes and gives the same figure over the same pixels in the same order."""

import math

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from tf_family.attention.image_local import Local2DPattern, block_raster_order
from tf_family.recipes import image_modeling

pytest.importorskip("sklearn")
pytestmark = pytest.mark.recipe

STEPS = ["--max_train_steps", "3", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "3"]
DATA = ["--max_train_samples", "24", "--max_eval_samples", "5"]


def _bits_per_dim(model, images):
    with torch.no_grad():
        logits = model(input_ids=images).logits[:, :-1]
    nats = torch.nn.functional.cross_entropy(logits.transpose(1, 2), images[:, 1:])
    return nats.item() / math.log(2)


@pytest.mark.parametrize(
    "variant, overrides, order",
    [
        ("tiny-local-1d", [], None),
        ("tiny-local-2d", ["image_width=8"], Local2DPattern(8, 2, 2, 1, 1)),
    ],
    ids=["1d", "2d"],
)
def test_image_modeling_recipe_reports_bits_per_dim(tmp_path, variant, overrides, order):
    from sklearn.datasets import load_digits

    output = tmp_path / "run"
    args = ["--arch", "sparse_transformer", "--variant", variant, "--config_overrides", *overrides]
    results = image_modeling.main([*args, *DATA, *STEPS, "--output_dir", str(output)])
    assert results["train_steps"] == 3
    assert 0 < results["bits_per_dim"] < 8  # 128 tokens at most: 7 bits per pixel when uniform
    assert results["eval_loss"] == pytest.approx(results["bits_per_dim"] * math.log(2))

    model = AutoModelForCausalLM.from_pretrained(output).eval()
    images = torch.tensor(load_digits().images, dtype=torch.long).flatten(1)[-297:][:5]
    if order is not None:
        images = images[:, block_raster_order(order, 8)]
    assert _bits_per_dim(model, images) == pytest.approx(results["bits_per_dim"], rel=1e-5)
    card = (output / "README.md").read_text()
    metrics = {
        m["type"]: m["value"]
        for m in yaml.safe_load(card.split("---\n")[1])["model-index"][0]["results"][0]["metrics"]
    }
    assert metrics["loss"] == pytest.approx(results["eval_loss"], rel=1e-5)
    assert "8x8 digits" in card


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--variant", "tiny-local-2d"], "image_width=4"),  # a 4-wide model on 8-wide images
        (["--variant", "tiny-local-1d", "--num_validation", "1797"], "num_validation"),
        (["--variant", "tiny-local-1d", "--config_overrides", "vocab_size=16"], "vocab_size=16"),
    ],
)
def test_image_modeling_recipe_refuses_what_cannot_run(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        image_modeling.main(["--arch", "sparse_transformer", *extra, *STEPS, "--output_dir", str(tmp_path / "run")])
