"""GTrXL's gated residual (`tf_family.layers.gated_residual`) and the Transformer-XL option that uses it
(``gating="gru"``): the gate's equations, the near-identity start, and the common tester's checks on a GTrXL."""

import dataclasses
from types import MappingProxyType

import pytest
import torch

from tests.common import tester
from tf_family.layers.gated_residual import GatedRelativeDecoderLayer, GRUGate
from tf_family.models.transfo_xl.modeling_transfo_xl import TffTransfoXLLMHeadModel
from tf_family.registry import get_arch

TRANSFO_XL = get_arch("transfo_xl")
GTRXL = dataclasses.replace(
    TRANSFO_XL,
    name="gtrxl",
    variants=MappingProxyType({"tiny": {**TRANSFO_XL.variants["tiny"], "gating": "gru", "pre_lnorm": True}}),
)


def test_gate_follows_the_papers_equations():
    torch.manual_seed(0)
    gate = GRUGate(6, gate_bias=2.0)
    x, y = torch.randn(3, 6), torch.randn(3, 6)
    r = torch.sigmoid(gate.reset_y(y) + gate.reset_x(x))
    z = torch.sigmoid(gate.update_y(y) + gate.update_x(x) - 2.0)
    h = torch.tanh(gate.candidate_y(y) + gate.candidate_x(r * x))
    torch.testing.assert_close(gate(x, y), (1 - z) * x + z * h)


def test_a_fresh_model_starts_near_the_identity():
    """The gate bias is subtracted: a fresh gate lets through about sigmoid(-b_g) of its update; with a large b_g a
    GTrXL layer is the identity on the residual stream."""
    model = TffTransfoXLLMHeadModel(GTRXL.tiny_config())
    gate = model.transformer.layers[0].attention_gate
    torch.testing.assert_close(gate.gate_bias, torch.full_like(gate.gate_bias, 2.0))  # _init_weights keeps b_g
    x, y = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    with torch.no_grad():
        keep = torch.sigmoid(gate.update_y(y) + gate.update_x(x) - gate.gate_bias)
    assert 0.05 < float(keep.mean()) < 0.25
    closed = TRANSFO_XL.model_classes["base"](GTRXL.tiny_config(gate_bias=60.0))
    assert all(isinstance(layer, GatedRelativeDecoderLayer) for layer in closed.layers)
    with torch.no_grad():
        ids = torch.randint(0, 128, (2, 5))
        torch.testing.assert_close(closed(ids).last_hidden_state, closed.word_embeddings(ids), rtol=1e-5, atol=1e-6)


def test_gate_matrices_start_xavier_not_at_the_models_small_normal_init():
    """`_init_weights` gives every linear layer N(0, init_std = 0.02); the gate's six matrices are then reset to
    Xavier-uniform (RLlib's choice; std 1/sqrt(d)), so a fresh gate does not shrink a sublayer's output by ~0.02*sqrt(d)
    (bench/bench_gtrxl_memory.py). The model's other linear layers keep the normal init."""
    d_model = 64
    model = TffTransfoXLLMHeadModel(GTRXL.tiny_config(d_model=d_model, d_embed=d_model, d_inner=128))
    layer = model.transformer.layers[0]
    for name in ("reset_y", "reset_x", "update_y", "update_x", "candidate_y", "candidate_x"):
        weight = getattr(layer.attention_gate, name).weight
        assert abs(float(weight.std()) - d_model**-0.5) < 0.15 * d_model**-0.5, name
        assert float(weight.abs().max()) <= (6 / (2 * d_model)) ** 0.5 + 1e-6, name  # uniform on +-sqrt(6/(2d))
    assert float(layer.feed_forward.fc_in.weight.std()) < 0.03


def test_gating_needs_pre_norm():
    with pytest.raises(ValueError, match="pre_lnorm"):
        TRANSFO_XL.tiny_config(gating="gru")
    with pytest.raises((ValueError, TypeError), match="gating"):
        TRANSFO_XL.tiny_config(gating="lstm", pre_lnorm=True)


def test_episode_boundary_resets_the_memory():
    """``reset_mems`` (a new episode starts in that row) makes the row read no memory: it equals a fresh start."""
    model = tester.build(GTRXL, "causal_lm")
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first = model(ids[:, :6])
        reset = model(ids[:, 6:], mems=first.mems, reset_mems=torch.tensor([True, False]))
        fresh = model(ids[:, 6:])
        carried = model(ids[:, 6:], mems=first.mems)
    torch.testing.assert_close(reset.logits[0], fresh.logits[0])
    torch.testing.assert_close(reset.logits[1], carried.logits[1])
    assert not torch.allclose(carried.logits[0], fresh.logits[0])


@pytest.mark.parametrize(
    "check",
    [
        tester.check_forward_shapes,
        tester.check_save_load,
        tester.check_gradients,
        tester.check_overfit,
        tester.check_padding_equivalence,
        tester.check_causality,
        tester.check_memory_equivalence,
        tester.check_generation_cache,
        tester.check_gradient_checkpointing,
    ],
    ids=lambda check: check.__name__.removeprefix("check_"),
)
def test_gtrxl_passes_the_common_checks(check):
    check(GTRXL)
