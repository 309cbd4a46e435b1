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


def _layer_norm(x, norm):  # LayerNorm written out: (x - mean) / sqrt(var + eps) * weight + bias
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def _gate(gate, x, y):  # section 3, eq. 5-8, on the gate's weights, without calling the gate
    r = torch.sigmoid(y @ gate.reset_y.weight.T + x @ gate.reset_x.weight.T)
    z = torch.sigmoid(y @ gate.update_y.weight.T + x @ gate.update_x.weight.T - gate.gate_bias)
    h = torch.tanh(y @ gate.candidate_y.weight.T + (r * x) @ gate.candidate_x.weight.T)
    return (1 - z) * x + z * h


def _gtrxl_layer_by_hand(layer, hidden, memory, inputs):
    """One GTrXL layer from the paper's equations (section 3 and Figure 1, right), on the layer's own weights:

        Ybar = MHA(LN([StopGrad(M), E]))       Y = g_MHA(E, ReLU(Ybar))
        Ebar = FF(LN(Y))                       E' = g_MLP(Y, ReLU(Ebar))

    The relative attention core (scores with u, v and the relative positions, softmax, values) is Transformer-XL's,
    checked against transformers 4.x elsewhere; everything around it is written out here."""
    attention, ff = layer.attention, layer.feed_forward
    heads, head_dim = attention.num_heads, attention.head_dim
    batch, length, _ = hidden.shape
    normed = _layer_norm(torch.cat([memory, hidden], dim=1), attention.layer_norm)  # LN of memory and segment
    query, key, value = (normed @ attention.qkv.weight.T).chunk(3, dim=-1)
    split = lambda t: t.reshape(batch, t.shape[1], heads, head_dim).transpose(1, 2)  # noqa: E731
    attended, _ = attention.local_attention(split(query[:, -length:]), split(key), split(value), inputs)
    y_bar = attended.transpose(1, 2).reshape(batch, length, -1) @ attention.out_proj.weight.T
    y = _gate(layer.attention_gate, hidden, torch.relu(y_bar))  # the ReLU before the gate, not after
    e_bar = torch.relu(_layer_norm(y, ff.layer_norm) @ ff.fc_in.weight.T + ff.fc_in.bias) @ ff.fc_out.weight.T
    return _gate(layer.feed_forward_gate, y, torch.relu(e_bar + ff.fc_out.bias))


def test_a_gtrxl_layer_follows_the_papers_equations_written_out():
    """Every layer of a GTrXL with memory, against `_gtrxl_layer_by_hand` on the same weights: the layer norm at the
    sublayer input (applied to the memory too), a ReLU on each sublayer's output before its gate, the GRU gates in
    place of both residuals. The layer norms' affine weights and the gate biases are randomised so that each term
    shows; the memory is what the model kept from a first segment."""
    torch.manual_seed(0)
    model = TffTransfoXLLMHeadModel(GTRXL.tiny_config(cutoffs=[], div_val=1)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" in name or "gate_bias" in name:
                parameter.add_(0.5 * torch.randn_like(parameter))
    seen = []

    def record(layer, args, kwargs, output):
        seen.append((layer, args, kwargs, output[0]))

    for layer in model.transformer.layers:
        layer.register_forward_hook(record, with_kwargs=True)
    ids = torch.randint(0, 128, (2, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first = model(ids[:, :7])
        seen.clear()
        model(ids[:, 7:], mems=first.mems)
        assert len(seen) == 2
        for layer, (hidden, memory), kwargs, output in seen:
            assert memory is not None and memory.shape[1] == 7
            torch.testing.assert_close(output, _gtrxl_layer_by_hand(layer, hidden, memory, kwargs["inputs"]))


def test_gtrxl_keeps_the_layer_inputs_as_memory_and_has_no_final_layer_norm():
    """The memory of layer l is that layer's input E^(l-1) (Transformer-XL's recurrence, which GTrXL keeps), and the
    model's output is the last gate's output: the paper's GTrXL, like TrXL-I, adds no layer norm after the last
    layer (the identity path from the input embedding to the output is the point of the reordering)."""
    torch.manual_seed(0)
    model = TRANSFO_XL.model_classes["base"](GTRXL.tiny_config()).eval()
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(2))
    inputs = _inputs_of(model, ids)
    with torch.no_grad():
        out = model(ids)
        hidden = model.word_embeddings(ids)
        for index, layer in enumerate(model.layers):
            torch.testing.assert_close(out.mems.states[index][:, -6:], hidden)  # the layer's input is kept
            hidden = layer(hidden, None, inputs=inputs)[0]
    torch.testing.assert_close(out.last_hidden_state, hidden)  # no layer norm after the last gate


def _inputs_of(model, ids):
    """The `RelativeAttentionInputs` the model passes its layers for ``ids`` (no memory)."""
    captured = []

    def capture(module, args, kwargs):
        captured.append(kwargs["inputs"])

    handle = model.layers[0].register_forward_pre_hook(capture, with_kwargs=True)
    with torch.no_grad():
        model(ids)
    handle.remove()
    return captured[0]
