"""BigBird's position options (``position_embedding_type``): rotary on every attention type, ALiBi on full attention;
each kernel path equals its dense twin with them, they make the outputs depend on relative positions only, ALiBi's
bias is ``-m_h * |i - j|`` with the paper's slopes, and the common tester passes on both."""

import copy
from types import MappingProxyType

import pytest
import torch

from tests.common import tester
from tf_family import TffBigBirdConfig, TffBigBirdModel
from tf_family.attention.alibi import alibi_slopes
from tf_family.registry import get_arch

SPEC = get_arch("big_bird")
ROTARY = {"position_embedding_type": "rotary"}
ALIBI = {"position_embedding_type": "alibi", "attention_type": "original_full"}
ETC = {"attention_type": "etc", "num_global_tokens": 2, "local_radius": 3}


def _spec(overrides):
    spec = copy.copy(SPEC)
    variants = dict(SPEC.variants)
    variants["tiny"] = MappingProxyType({**SPEC.variants["tiny"], **overrides})
    object.__setattr__(spec, "variants", MappingProxyType(variants))
    return spec


def _model(**overrides) -> TffBigBirdModel:
    values = dict(  # noqa: C408
        vocab_size=61, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
        block_size=4, num_random_blocks=2, max_position_embeddings=128, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = TffBigBirdModel(TffBigBirdConfig(**{**values, **overrides}))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval().double()


@pytest.mark.parametrize("overrides", [ROTARY, {**ROTARY, **ETC}, ALIBI], ids=["rotary", "rotary-etc", "alibi"])
def test_each_path_equals_its_dense_twin_with_the_position_option(overrides):
    """70 tokens: BigBird's block-sparse path (ETC's chunked path) against the dense twin that output_attentions
    runs, float64, with right and left padding."""
    model = _model(**overrides)
    ids = torch.randint(3, 61, (2, 70), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :9] = 0
    mask[1, 53:] = 0
    assert overrides is not ROTARY or model.layers[0].attention.uses_sparse(70)
    with torch.no_grad():
        fast = model(ids, attention_mask=mask).last_hidden_state
        dense = model(ids, attention_mask=mask, output_attentions=True).last_hidden_state
        absolute = _model(**{**overrides, "position_embedding_type": "absolute"})(ids, attention_mask=mask)
    torch.testing.assert_close(fast, dense, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(fast, absolute.last_hidden_state)
    assert model.embeddings.position_embeddings is None
    assert not any("position_embeddings" in name for name in model.state_dict())


@pytest.mark.parametrize("overrides", [ROTARY, {**ROTARY, "attention_type": "original_full"}, ALIBI])
def test_rotary_and_alibi_outputs_depend_on_relative_positions_only(overrides):
    model = _model(**overrides)
    ids = torch.randint(3, 61, (2, 40), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(40).expand(2, 40)
    with torch.no_grad():
        here = model(ids, position_ids=positions).last_hidden_state
        shifted = model(ids, position_ids=positions + 17).last_hidden_state
        swapped = model(ids, position_ids=positions[:, [*range(3), 20, *range(4, 20), 3, *range(21, 40)]])
    torch.testing.assert_close(here, shifted, rtol=1e-6, atol=1e-6)  # rotary tables are float32
    assert not torch.allclose(here, swapped.last_hidden_state, atol=1e-3)  # two tokens' positions exchanged


def test_alibi_bias_is_minus_slope_times_distance_with_the_papers_slopes():
    """With zero query weights every score is the bias alone: probabilities softmax(-m_h |i - j|) over real keys."""
    model = _model(**ALIBI)
    with torch.no_grad():
        for layer in model.layers:
            layer.attention.query.weight.zero_()
            layer.attention.query.bias.zero_()
    ids = torch.randint(3, 61, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    with torch.no_grad():
        probs = model(ids, attention_mask=mask, output_attentions=True).attentions[0]  # (B, H, T, T)
    distance = (torch.arange(11)[:, None] - torch.arange(11)[None, :]).abs().double()
    slopes = alibi_slopes(3).double()
    scores = -slopes[:, None, None] * distance  # (H, T, T)
    expected = torch.stack([scores.softmax(-1), scores.masked_fill(~mask[1].bool(), float("-inf")).softmax(-1)])
    torch.testing.assert_close(probs, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"position_embedding_type": "alibi"}, "attention_type='block_sparse' does not take"),
        ({"position_embedding_type": "alibi", **ETC}, "attention_type='etc' does not take"),
        ({**ROTARY, "hidden_size": 30, "num_attention_heads": 2}, "head width .* 15 is odd"),
        ({**ROTARY, "rope_base": 0.0}, "rope_base must be > 0"),
    ],
)
def test_position_option_errors_name_the_field_and_the_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        TffBigBirdConfig(**overrides)


@pytest.mark.parametrize("check", tester.ALL_CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
@pytest.mark.parametrize("overrides", [ROTARY, ALIBI], ids=["rotary", "alibi"])
def test_common_checks_with_the_position_options(overrides, check):
    check(_spec(overrides))
