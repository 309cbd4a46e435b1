"""The shared adaptive input / softmax and feed-forward modules of the Transformer-XL family (tf_family.layers)."""

import pytest
import torch

from tf_family.layers import AdaptiveEmbedding, PositionwiseFeedForward, ProjectedAdaptiveLogSoftmax

SHAPES = [  # (vocab_size, d_embed, d_model, cutoffs, div_val)
    (40, 16, 16, [10, 20], 2),
    (40, 16, 8, [10, 20], 1),
    (40, 8, 8, [], 1),
]


def initialised(module):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return module


@pytest.mark.parametrize("shape", SHAPES)
def test_log_softmax_is_normalised_and_its_nll_path_matches_the_full_distribution(shape):
    head = initialised(ProjectedAdaptiveLogSoftmax(*shape))
    hidden = torch.randn(7, shape[2])
    logprobs = head(hidden)  # (N, V)
    assert logprobs.shape == (7, shape[0])
    torch.testing.assert_close(logprobs.exp().sum(-1), torch.ones(7))
    labels = torch.tensor([0, 9, 10, 19, 20, 39, -100])
    nll = head(hidden, labels)
    expected = -logprobs[torch.arange(6), labels[:6]]
    torch.testing.assert_close(nll[:6], expected)
    assert nll[6] == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_embedding_gives_each_token_its_clusters_projected_vector(shape):
    vocab_size, d_embed, d_model, cutoffs, div_val = shape
    embedding = initialised(AdaptiveEmbedding(*shape))
    ids = torch.tensor([[0, 15, 39], [25, 5, 12]])
    out = embedding(ids)
    assert out.shape == (2, 3, d_model)
    bounds = [0, *cutoffs, vocab_size]
    for token, vector in zip(ids.flatten().tolist(), out.view(-1, d_model), strict=True):
        cluster = 0 if div_val == 1 else sum(token >= bound for bound in bounds[1:-1])
        local = token - (0 if div_val == 1 else bounds[cluster])
        raw = embedding.layers[cluster].weight[local]
        projected = raw @ embedding.projections[cluster].t() if len(embedding.projections) else raw
        torch.testing.assert_close(vector, projected * d_model**0.5)


def test_tied_weights_keys():
    embedding, head = AdaptiveEmbedding(40, 16, 16, [10, 20], 2), ProjectedAdaptiveLogSoftmax(40, 16, 16, [10, 20], 2)
    tied = head.tied_weights_keys(embedding, True, [False, True, True], prefix="head", embedding_prefix="emb")
    assert tied == {
        "head.out_layers.0.weight": "emb.layers.0.weight",
        "head.out_layers.1.weight": "emb.layers.1.weight",
        "head.out_layers.2.weight": "emb.layers.2.weight",
        "head.projections.1": "emb.projections.1",
        "head.projections.2": "emb.projections.2",
    }
    shared = ProjectedAdaptiveLogSoftmax(40, 16, 8, [10, 20], 1)  # one input projection serves every cluster
    tied = shared.tied_weights_keys(AdaptiveEmbedding(40, 16, 8, [10, 20], 1), False, [False, True, True], "h", "e")
    assert tied == {"h.projections.1": "e.projections.0", "h.projections.2": "e.projections.0"}


@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_feed_forward_residual_and_norm_placement(pre_lnorm):
    block = initialised(PositionwiseFeedForward(8, 16, 0.0, pre_lnorm, 1e-5))
    hidden = torch.randn(2, 3, 8)
    inner = block.layer_norm(hidden) if pre_lnorm else hidden
    update = block.fc_out(torch.relu(block.fc_in(inner)))
    expected = hidden + update if pre_lnorm else block.layer_norm(hidden + update)
    torch.testing.assert_close(block(hidden), expected)


@pytest.mark.parametrize("shape", SHAPES)
def test_causal_lm_outputs_shift_the_labels_and_skip_the_full_logits_only_with_tail_clusters(shape):
    head = initialised(ProjectedAdaptiveLogSoftmax(*shape))
    hidden, labels = torch.randn(2, 4, shape[2]), torch.tensor([[1, 12, 25, 39], [3, -100, 7, 30]])
    logits, losses, loss = head.causal_lm_outputs(hidden, labels)
    full = head(hidden.view(8, -1)).view(2, 4, -1)
    expected = -full[:, :-1].gather(2, labels[:, 1:].clamp(min=0)[..., None]).squeeze(2) * (labels[:, 1:] != -100)
    torch.testing.assert_close(losses, expected)
    torch.testing.assert_close(loss, expected.sum() / 5)
    assert (logits is None) == bool(shape[3])
    assert torch.equal(head.causal_lm_outputs(hidden)[0], full) and head.causal_lm_outputs(hidden)[1:] == (None, None)
    with pytest.raises(ValueError, match="labels must have shape"):
        head.causal_lm_outputs(hidden, labels[:, :3])
