"""The kernelised models (Performer, Linear Transformer, RFA) beyond the common tester: the projection buffer and its
redraw schedule, generation with a constant-size state in every `generate` mode, config errors."""

import tempfile

import pytest
import torch

from tf_family import TffPerformerCache
from tf_family.registry import get_arch

PROMPT = torch.tensor([[5, 9, 17, 3, 44, 2], [0, 0, 7, 21, 8, 60]])
PROMPT_MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])  # the second row left-padded


def _model(name="performer", task="causal_lm", seed=0, **overrides):
    torch.manual_seed(seed)
    model = get_arch(name).model_classes[task](get_arch(name).tiny_config(**overrides)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def test_projection_is_saved_and_reloaded():
    model = _model(feature_redraw_interval=1)
    model.train()
    model(input_ids=PROMPT)  # a redraw: the saved projection is no longer the initial one
    model.eval()
    assert int(model.performer.layers[0].attention.redraws) == 1
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        loaded = type(model).from_pretrained(folder).eval()
    for ours, theirs in zip(model.performer.layers, loaded.performer.layers, strict=True):
        assert torch.equal(ours.attention.projection, theirs.attention.projection)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=PROMPT).logits, model(input_ids=PROMPT).logits, rtol=0, atol=0)


def test_projection_is_redrawn_on_schedule_in_training_only_and_reproducibly():
    model = _model(feature_redraw_interval=2)
    attention = model.performer.layers[1].attention
    initial = attention.projection.clone()
    with torch.no_grad():
        for _ in range(3):
            model(input_ids=PROMPT)  # eval: never
    assert torch.equal(attention.projection, initial)
    model.train()
    state = torch.random.get_rng_state()
    model(input_ids=PROMPT)
    assert torch.equal(attention.projection, initial), "redrawn before the interval"
    model(input_ids=PROMPT)
    assert not torch.equal(attention.projection, initial), "not redrawn after the interval"
    assert torch.equal(torch.random.get_rng_state(), state), "a redraw used the global RNG"
    other = _model(seed=1, feature_redraw_interval=2).train()
    other(input_ids=PROMPT)
    other(input_ids=PROMPT)
    assert torch.equal(other.performer.layers[1].attention.projection, attention.projection)
    assert not torch.equal(model.performer.layers[0].attention.projection, attention.projection), "layers share"


@pytest.mark.parametrize(
    ("name", "overrides"),
    [("performer", {}), ("linear_transformer", {}), ("rfa", {})],
)
def test_generation_modes_equal_with_and_without_the_state(name, overrides):
    model = _model(name, **overrides)
    settings = [
        {"do_sample": False},
        {"do_sample": True, "top_k": 0, "temperature": 1.5},
        {"do_sample": False, "num_beams": 3, "num_return_sequences": 2},
    ]
    for kwargs in settings:
        outputs = []
        for use_cache in (True, False):
            torch.manual_seed(7)
            outputs.append(
                model.generate(
                    PROMPT,
                    attention_mask=PROMPT_MASK,
                    max_new_tokens=6,
                    min_new_tokens=6,
                    use_cache=use_cache,
                    **kwargs,
                )
            )
        assert torch.equal(outputs[0], outputs[1]), f"{name} {kwargs}: cached and uncached generation differ"


def test_the_state_does_not_grow_with_the_length():
    model = _model()
    sizes = []
    for length in (4, 40):
        ids = torch.randint(1, 128, (2, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            cache = model(input_ids=ids, use_cache=True).cache
        assert isinstance(cache, TffPerformerCache) and cache.get_seq_length() == length
        sizes.append(sum(part.numel() for state in cache.states for part in state))
    assert sizes[0] == sizes[1]


def test_left_padded_batch_equals_rows_alone_with_the_gate():
    model = _model("rfa")
    with torch.no_grad():
        batched = model(input_ids=PROMPT, attention_mask=PROMPT_MASK).logits
        alone = model(input_ids=PROMPT[1:, 2:]).logits
    torch.testing.assert_close(batched[1, 2:], alone[0], rtol=1e-4, atol=1e-5)


def test_float16_autocast_keeps_prefix_sums_in_float32():
    model = _model()
    ids = torch.randint(1, 128, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(input_ids=ids).logits
    error = float((got.float() - expected).norm() / expected.norm())
    assert error < 0.02, error


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"rfa_gate": True, "feature_map": "favor", "causal": True}, "rfa_gate"),
        ({"rfa_gate": True, "feature_map": "rfa", "causal": False}, "rfa_gate"),
        ({"num_random_features": 0}, "num_random_features"),
        ({"feature_map": "softmax"}, "feature_map"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises((ValueError, TypeError), match=field):
        get_arch("performer").tiny_config(**overrides)


def test_inputs_longer_than_the_positions_are_refused_naming_the_field():
    model = _model()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=torch.ones(1, 65, dtype=torch.long))


def test_a_bidirectional_model_refuses_a_cache():
    model = _model(task="masked_lm")
    with pytest.raises(ValueError, match="causal"):
        model(input_ids=PROMPT, use_cache=True)
