"""resize_token_embeddings on the models with an adaptive input and softmax (Transformer-XL, Compressive,
Memorizing): the last cluster grows or shrinks, the other clusters and the tying are kept, and the result saves and
loads (transformers' own resizing needs one embedding matrix and used to fail on them)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tf_family import create_model

LAYOUTS = {  # tiny: cutoffs [32, 64] with div_val 2 (one matrix per cluster)
    "clusters": {},
    "one_matrix_with_cutoffs": {"div_val": 1},
    "plain_softmax": {"div_val": 1, "cutoffs": []},
}
OLD, NEW = 128, 140


def _clusters(model):
    return list(zip(model.lm_head.bounds[:-1], model.lm_head.bounds[1:], strict=True))


@pytest.mark.parametrize("arch", ["transfo_xl", "compressive", "memorizing"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_resize_token_embeddings_grows_and_shrinks_the_last_cluster(arch, layout, tmp_path):
    torch.manual_seed(0)
    model = create_model(arch, "causal_lm", "tiny", **LAYOUTS[layout]).eval()
    clusters = _clusters(model)
    ids = torch.randint(0, 100, (2, 6))
    with torch.no_grad():
        embedded = model.get_input_embeddings()(torch.arange(OLD))
        before = model(ids).logits  # (B, T, V) log-probabilities
    model.resize_token_embeddings(NEW)
    embeddings, head = model.get_input_embeddings(), model.lm_head
    assert model.config.vocab_size == NEW and head.bounds[-1] == NEW == embeddings.bounds[-1]
    assert _clusters(model)[:-1] == clusters[:-1]  # the cutoffs stay
    assert head.out_layers[-1].weight is embeddings.layers[-1].weight  # tiny ties the input and output embeddings
    with torch.no_grad():
        torch.testing.assert_close(embeddings(torch.arange(OLD)), embedded, rtol=0, atol=0)
        new_rows = embeddings.layers[-1].weight[-(NEW - OLD) :]
        after = model(ids).logits
    # new rows drawn as _init_weights draws them (normal, std config.init_std), output biases zero
    assert 0.3 * model.config.init_std < new_rows.std() < 3 * model.config.init_std
    assert torch.count_nonzero(head.out_layers[-1].bias[-(NEW - OLD) :]) == 0
    assert after.shape == (2, 6, NEW)
    # every cluster but the last is untouched; in the last, the old tokens keep their relative probabilities
    for low, high in clusters[:-1]:
        torch.testing.assert_close(after[..., low:high], before[..., low:high], rtol=1e-5, atol=1e-5)
    low = clusters[-1][0]
    torch.testing.assert_close(
        after[..., low:OLD].log_softmax(-1), before[..., low:OLD].log_softmax(-1), rtol=1e-5, atol=1e-5
    )
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.vocab_size == NEW
    assert loaded.lm_head.out_layers[-1].weight is loaded.get_input_embeddings().layers[-1].weight
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, after)
    model.resize_token_embeddings(100, pad_to_multiple_of=8)  # shrinking: down to 104
    assert model.config.vocab_size == 104
    with torch.no_grad():
        torch.testing.assert_close(embeddings(torch.arange(104)), embedded[:104], rtol=0, atol=0)
        assert model(ids).logits.shape == (2, 6, 104)


@pytest.mark.parametrize("arch", ["transfo_xl", "compressive"])
def test_resizing_into_the_frequent_clusters_is_refused(arch):
    model = create_model(arch, "causal_lm", "tiny")
    with pytest.raises(ValueError, match=r"new_num_tokens=64: .* must be an int > 64.*smaller `cutoffs`"):
        model.resize_token_embeddings(64)
    assert model.config.vocab_size == OLD and model.lm_head.bounds[-1] == OLD
    base = create_model(arch, "base", "tiny")
    base.resize_token_embeddings(130)  # a model without a head resizes its input embeddings
    assert base.config.vocab_size == 130 and base.get_input_embeddings().layers[-1].num_embeddings == 130 - 64
