"""Parity with routing-transformer 1.6.1 (MIT, lucidrains; PyPI ``routing-transformer``, with ``local-attention``):
its causal ``RoutingTransformerLM`` (shared QK, two local and two routing heads per layer, the first layer local only
through ``n_local_attn_heads=(4, 2, 2)``, tied embeddings) with its weights *and its k-means centroids* copied into
tf_family's Routing Transformer (``routing_membership="balanced"``: the reference's top-k clusters) gives the same
logits in eval, the same loss gradients in a training step, and the same centroids after that step's EMA update, in
float64, on unpadded inputs whose length is a multiple of the local block (the reference needs one).

What is patched or left out, and why:

- ``scatter_mean``: the reference averages a token's outputs over its clusters as ``sum / (count + 1e-5)``, so a token
  in one cluster gets ``0.99999`` of its output; tf_family divides by the count. The test replaces the reference's
  ``scatter_mean`` with the exact mean (the only patch).
- the auxiliary commitment loss (``1e-4 * MSE(x, its centroid)``, returned beside the reference's logits for the user
  to add) has no counterpart: the gradients compared are those of the language-model loss alone.
- the reference initialises its centroids by k-means on its first batch (global RNG); here both models hold the same
  copied centroids (``initted`` set), so nothing random remains.
- the reference applies the EMA step from a backward hook; tf_family at the end of the training forward: the
  centroids are compared after forward and backward, with ``kmeans_ema_decay=0.5`` so that the move is large.
- the local heads' rotary angles: the reference rotates by positions inside each pair of blocks (``0 .. 2w - 1``, in
  the model's dtype), tf_family by absolute positions (in float32, as every tf_family rotary table). Rotary scores
  depend on the offset only, so the two agree in exact arithmetic; the float32 angles leave about ``1e-7`` relative
  differences, hence the ``1e-6`` tolerances (the routing heads' tables are the same float32 values in both).
"""

import pytest
import torch
import torch.nn.functional as F

from tf_family import create_model

routing_transformer = pytest.importorskip("routing_transformer")
reference_module = pytest.importorskip("routing_transformer.routing_transformer")

pytestmark = pytest.mark.parity

VOCAB, LENGTH, WIDTH, HEADS, LAYERS, WINDOW, LOCAL = 64, 24, 32, 4, 3, 8, 4
LOCAL_HEADS = (4, 2, 2)  # sparsity_skip_first=1, num_local_heads=2


def _exact_scatter_mean(src, t, index, dim, eps=1e-5):
    numer = src.scatter_add(dim, index, t)
    denom = src.scatter_add(dim, index, torch.ones_like(t))
    return numer / denom.clamp(min=1.0)


def _models(decay=0.999):
    torch.manual_seed(0)
    reference = routing_transformer.RoutingTransformerLM(
        num_tokens=VOCAB,
        dim=WIDTH,
        depth=LAYERS,
        max_seq_len=LENGTH,
        heads=HEADS,
        dim_head=WIDTH // HEADS,
        window_size=WINDOW,  # LENGTH // WINDOW = 3 clusters of 8 tokens
        local_attn_window_size=LOCAL,
        causal=True,
        n_local_attn_heads=LOCAL_HEADS,
        tie_embedding=True,
        kmeans_ema_decay=decay,
    )
    with torch.no_grad():  # move every weight away from its init so that each one matters; unit-length centroids
        for parameter in reference.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
        for name, buffer in reference.named_buffers():
            if name.endswith("kmeans.means"):
                buffer.copy_(F.normalize(torch.randn_like(buffer), dim=-1))
            elif name.endswith("kmeans.initted"):
                buffer.fill_(True)
    reference = reference.double().eval()
    ours = create_model(
        "routing_transformer",
        "causal_lm",
        "tiny",
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * WIDTH,
        num_local_heads=2,
        local_window=LOCAL,
        sparsity_skip_first=1,
        num_clusters=LENGTH // WINDOW,
        cluster_size=WINDOW,
        routing_membership="balanced",
        kmeans_ema_decay=decay,
    ).double()
    _copy_weights(reference, ours)
    return reference, ours.eval()


def _copy_weights(reference, ours) -> None:
    """The reference's state dict (weights and centroids) into tf_family's names, key by key and shape by shape."""
    theirs = reference.state_dict()
    mapping = {"model.embed_tokens.weight": "token_emb.weight", "model.norm.weight": "norm.weight"}
    mapping["model.norm.bias"] = "norm.bias"
    for layer in range(LAYERS):
        prefix, source = f"model.layers.{layer}.", f"routing_transformer.layers.layers.{layer}."
        pairs = {
            "input_layernorm.weight": "0.norm.weight",
            "input_layernorm.bias": "0.norm.bias",
            "self_attn.local_qkv.weight": "0.fn.local_to_qkv.weight",
            "self_attn.local_qkv.bias": "0.fn.local_to_qkv.bias",
            "self_attn.q_proj.weight": "0.fn.to_q.weight",
            "self_attn.v_proj.weight": "0.fn.to_v.weight",
            "self_attn.centroids": "0.fn.global_attn.kmeans.means",
            "self_attn.o_proj.weight": "0.fn.to_out.weight",
            "post_attention_layernorm.weight": "1.norm.weight",
            "post_attention_layernorm.bias": "1.norm.bias",
            "mlp.fc_in.weight": "1.fn.fn.w1.weight",
            "mlp.fc_in.bias": "1.fn.fn.w1.bias",
            "mlp.fc_out.weight": "1.fn.fn.w2.weight",
            "mlp.fc_out.bias": "1.fn.fn.w2.bias",
        }
        mapping.update({prefix + mine: source + their for mine, their in pairs.items()})
    state = ours.state_dict()
    copied = set()
    with torch.no_grad():
        for name, tensor in state.items():
            if name == "lm_head.weight":  # tied to the embeddings
                continue
            source = theirs[mapping[name]]
            assert source.shape == tensor.shape, f"{name}: {tuple(source.shape)} vs {tuple(tensor.shape)}"
            tensor.copy_(source)
            copied.add(mapping[name])
    left = {
        k
        for k, v in theirs.items()
        if k not in copied and v.numel() and not k.endswith(("inv_freq", "initted", "sinu_pos_emb.emb"))
    }
    assert left <= {"out.tensor"}, f"reference tensors not copied: {sorted(left)}"  # out.tensor: the tied embedding


def _ids(batch=2, seed=1):
    return torch.randint(0, VOCAB, (batch, LENGTH), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def _exact_mean(monkeypatch):
    monkeypatch.setattr(reference_module, "scatter_mean", _exact_scatter_mean)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_logits_match_the_reference(implementation):
    reference, ours = _models()
    ours.config._attn_implementation = implementation  # the gathered kernel and the dense twin
    ids = _ids()
    with torch.no_grad():
        expected, _ = reference(ids)
        got = ours(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_training_step_matches_the_reference_gradients_and_centroids():
    reference, ours = _models(decay=0.5)
    initial = [layer.self_attn.centroids.clone() for layer in ours.model.layers[1:]]
    reference.train(), ours.train()
    ids = _ids()
    logits, _aux_loss = reference(ids)  # the auxiliary commitment loss is not compared (module docstring)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    loss.backward()  # the reference's backward hook moves its centroids here
    ours_loss = ours(input_ids=ids, labels=ids).loss
    ours_loss.backward()
    torch.testing.assert_close(ours_loss.double(), loss, rtol=1e-6, atol=1e-6)
    theirs = dict(reference.named_parameters())
    mapping = _mapping(reference, ours)
    for name, parameter in ours.named_parameters():
        expected = theirs[mapping[name]].grad
        torch.testing.assert_close(parameter.grad, expected, rtol=1e-5, atol=1e-7, msg=name)
    buffers = dict(reference.named_buffers())
    for layer, old in zip(range(1, LAYERS), initial, strict=True):
        got = ours.model.layers[layer].self_attn.centroids
        expected = buffers[f"routing_transformer.layers.layers.{layer}.0.fn.global_attn.kmeans.means"]
        torch.testing.assert_close(got, expected, rtol=1e-7, atol=1e-7)
        assert float((got - old).abs().max()) > 1e-2, "the training step did not move the centroids"


def _mapping(reference, ours) -> dict:
    """tf_family parameter name -> reference parameter name, matched by `_copy_weights`' values."""
    theirs = dict(reference.named_parameters())
    result = {}
    for name, parameter in ours.named_parameters():
        matches = [k for k, v in theirs.items() if v.shape == parameter.shape and torch.equal(v.detach(), parameter)]
        assert len(matches) == 1, f"{name}: {matches}"
        result[name] = matches[0]
    return result


def test_eval_forward_moves_no_centroids_in_either():
    reference, ours = _models(decay=0.5)
    before = [a.self_attn.centroids.clone() for a in ours.model.layers[1:]]
    with torch.no_grad():
        reference(_ids())
        ours(input_ids=_ids())
    for layer, old in zip(ours.model.layers[1:], before, strict=True):
        assert torch.equal(layer.self_attn.centroids, old)
