"""BigBird-specific behaviour: per-call path choice without mutation, seeded random blocks, degenerate settings."""

import pytest
import torch

from tf_family import TffBigBirdConfig, TffBigBirdModel


def _model(**overrides):
    values = dict(  # noqa: C408
        vocab_size=61, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
        block_size=4, num_random_blocks=2, max_position_embeddings=128, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = TffBigBirdModel(TffBigBirdConfig(**{**values, **overrides}))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model.eval()


def test_a_short_batch_does_not_switch_the_model_to_full_attention():
    """transformers #20031: one short batch made transformers' BigBird dense for good."""
    model = _model()
    config_before = model.config.to_dict()
    ids = torch.randint(3, 61, (1, 70))
    with torch.no_grad():
        before = model(ids).last_hidden_state
        model(ids[:, :20])
        after = model(ids).last_hidden_state
    assert torch.equal(before, after) and model.config.to_dict() == config_before
    assert model.layers[0].attention.uses_sparse(70) and not model.layers[0].attention.uses_sparse(20)


def test_random_blocks_are_seeded_and_leave_the_global_rng_alone():
    model = _model().train()
    ids = torch.randint(3, 61, (2, 70))
    state = torch.random.get_rng_state()
    first, again = model(ids).last_hidden_state, model(ids).last_hidden_state
    other_seed = model(ids, random_seed=5).last_hidden_state
    assert torch.equal(state, torch.random.get_rng_state())
    assert torch.equal(first, again) and not torch.allclose(first, other_seed)
    model.eval()
    with torch.no_grad():
        # eval_random_blocks="same" (training computes attention with masked_attention, eval with PyTorch's SDPA)
        torch.testing.assert_close(model(ids).last_hidden_state, first.detach(), rtol=1e-5, atol=1e-5)


def test_eval_random_block_choices():
    ids = torch.randint(3, 61, (1, 70))
    outputs = {}
    for choice in ("same", "none", "first_block"):
        with torch.no_grad():
            outputs[choice] = _model(eval_random_blocks=choice)(ids).last_hidden_state
    with torch.no_grad():
        no_random = _model(num_random_blocks=0)(ids).last_hidden_state
    torch.testing.assert_close(outputs["none"], no_random)
    assert not torch.allclose(outputs["same"], outputs["none"])
    assert not torch.allclose(outputs["first_block"], outputs["none"])


def test_short_inputs_equal_original_full_attention():
    """Inputs with too few blocks run full attention: the same as attention_type="original_full"."""
    ids = torch.randint(3, 61, (2, 30))
    mask = torch.ones_like(ids)
    mask[1, 22:] = 0
    with torch.no_grad():
        sparse, full = _model(), _model(attention_type="original_full")
        assert not sparse.layers[0].attention.uses_sparse(30)
        torch.testing.assert_close(sparse(ids, attention_mask=mask).last_hidden_state,
                                   full(ids, attention_mask=mask).last_hidden_state)  # fmt: skip


def test_output_attentions_match_the_sparse_path():
    model = _model()
    ids = torch.randint(3, 61, (2, 70))
    with torch.no_grad():
        out = model(ids, output_attentions=True)
        plain = model(ids)
    torch.testing.assert_close(out.last_hidden_state, plain.last_hidden_state, rtol=1e-5, atol=1e-5)
    probs = out.attentions[0]
    assert probs.shape == (2, 3, 70, 70)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, 70))
    assert (probs[:, :, 20, 40:44] == 0).any()  # a middle block does not see every block


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="num_random_blocks must be >= 0"):
        TffBigBirdConfig(num_random_blocks=-1)
    with pytest.raises(TypeError, match="eval_random_blocks"):
        TffBigBirdConfig(eval_random_blocks="sometimes")
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        TffBigBirdConfig(block_size=0)
