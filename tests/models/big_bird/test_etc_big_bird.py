"""BigBird's ETC mode (``attention_type="etc"``; Ainslie et al. 2020) in the model: the radius and the global input
end to end, the global embeddings as saved parameters, the heads that read the first global token, the config's
errors, and the common tester, remote-code export and PEFT on an ETC config. The kernel's rules and its dense twin:
tests/attention/test_etc.py."""

import copy
from types import MappingProxyType

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tests.common import tester
from tests.test_remote_code import _export_and_expect, _load_without_tf_family
from tf_family import TffBigBirdConfig, TffBigBirdForSequenceClassification, TffBigBirdModel
from tf_family.registry import get_arch

SPEC = get_arch("big_bird")
# positions clipped at the radius (the default); as initialised, the sequence-level heads' few logits are a
# cancelling sum, so the bf16 check's relative error depends on the draw (tests/common/tester.py, BF16_ONE_SEED_TASKS)
ETC = {"attention_type": "etc", "num_global_tokens": 2, "local_radius": 2, "max_relative_position": 2}


def _etc_spec():
    """The registry's BigBird with an ETC tiny variant (2 global tokens, radius 2: the common tester's 12-token
    inputs have long tokens outside each other's radius)."""
    spec = copy.copy(SPEC)
    variants = dict(SPEC.variants)
    variants["tiny"] = MappingProxyType({**SPEC.variants["tiny"], **ETC})
    object.__setattr__(spec, "variants", MappingProxyType(variants))
    return spec


def _model(layers=2, **overrides) -> TffBigBirdModel:
    values = dict(  # noqa: C408
        vocab_size=61, hidden_size=24, num_hidden_layers=layers, num_attention_heads=3, intermediate_size=40,
        max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **ETC,
    )  # fmt: skip
    torch.manual_seed(0)
    model = TffBigBirdModel(TffBigBirdConfig(**{**values, **overrides}))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


# -------------------------------------------------------------------------------------------------------- the model
def test_one_layer_long_outputs_ignore_long_tokens_beyond_the_radius_and_the_global_ones_do_not():
    """In one layer the global input is the learned table alone, so a long token's state depends only on the long
    tokens within ``local_radius`` (and the global table); the global states depend on every token."""
    model = _model(layers=1)
    ids = torch.randint(3, 61, (1, 16), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, 12] = (ids[0, 12] + 1) % 61
    with torch.no_grad():
        before, after = model(ids), model(changed)
    near = (torch.arange(16) - 12).abs() <= 2
    assert torch.equal(before.last_hidden_state[0, ~near], after.last_hidden_state[0, ~near])
    assert not torch.allclose(before.last_hidden_state[0, near], after.last_hidden_state[0, near])
    assert not torch.allclose(before.global_last_hidden_state, after.global_last_hidden_state)
    assert before.global_last_hidden_state.shape == (1, 2, 24) and before.last_hidden_state.shape == (1, 16, 24)


def test_output_attentions_runs_the_dense_twin_and_equals_the_efficient_path():
    model = _model().double()
    ids = torch.randint(3, 61, (2, 70), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 50:] = 0
    with torch.no_grad():
        fast = model(ids, attention_mask=mask)
        dense = model(ids, attention_mask=mask, output_attentions=True)
    torch.testing.assert_close(fast.last_hidden_state, dense.last_hidden_state, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fast.global_last_hidden_state, dense.global_last_hidden_state, rtol=1e-10, atol=1e-10)
    assert dense.attentions[0].shape == (2, 3, 72, 72)


def test_the_global_embeddings_and_relative_keys_are_parameters_that_are_saved_loaded_and_trained(tmp_path):
    model = _model()
    state = model.state_dict()
    assert state["embeddings.global_embeddings.weight"].shape == (2, 24)
    assert state["layers.0.attention.relative_keys.weight"].shape == (2 * 2 + 3, 24)
    model.save_pretrained(tmp_path)
    loaded = TffBigBirdModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(loaded.embeddings.global_embeddings.weight, model.embeddings.global_embeddings.weight)
    ids = torch.randint(3, 61, (2, 20))
    with torch.no_grad():
        expected = model(ids)
        torch.testing.assert_close(loaded(ids).global_last_hidden_state, expected.global_last_hidden_state)
        loaded.embeddings.global_embeddings.weight.add_(1.0)
        assert not torch.allclose(loaded(ids).last_hidden_state, expected.last_hidden_state)
    model.train()
    model(ids).last_hidden_state.pow(2).mean().backward()
    assert model.embeddings.global_embeddings.weight.grad.abs().sum() > 0
    assert model.layers[1].attention.relative_keys.weight.grad.abs().sum() > 0


def test_sequence_classification_and_the_pooler_read_the_first_global_token():
    config = _model().config
    torch.manual_seed(0)
    model = TffBigBirdForSequenceClassification(config).eval()
    ids = torch.randint(3, 61, (2, 20))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        base = model.bert(ids)
        torch.testing.assert_close(out.logits, model.classifier(base.global_last_hidden_state[:, 0]))
        pooled = TffBigBirdModel(config).eval()
        result = pooled(ids)
        torch.testing.assert_close(
            result.pooler_output, torch.tanh(pooled.pooler(result.global_last_hidden_state[:, 0]))
        )
    assert len(out.hidden_states) == 3 and out.hidden_states[0].shape == (2, 20, 24)  # the long input's


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_global_tokens": 4}, "num_global_tokens=4 is used only by ETC attention"),
        ({"local_radius": 3, "attention_type": "original_full"}, "local_radius=3 is used only by ETC"),
        ({**ETC, "num_global_tokens": 0}, "num_global_tokens must be >= 1, got 0"),
        ({**ETC, "local_radius": -1}, "local_radius must be >= 0, got -1"),
        ({**ETC, "max_relative_position": -2}, "max_relative_position must be >= 0, got -2"),
        ({**ETC, "local_radius": 2.5}, "local_radius must be int"),
    ],
)
def test_config_errors_name_the_field_the_value_and_the_fix(overrides, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TffBigBirdConfig(**overrides)


def test_config_defaults_of_etc():
    config = TffBigBirdConfig(attention_type="etc")
    assert (config.num_global_tokens, config.local_radius, config.max_relative_position) == (16, 84, 84)
    assert TffBigBirdConfig(attention_type="etc", local_radius=5).max_relative_position == 5
    assert TffBigBirdConfig().num_global_tokens is None


# ------------------------------------------------------------------------------------ the house's checks on ETC
@pytest.mark.parametrize("check", tester.ALL_CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
def test_common_checks_with_etc_attention(check):
    check(_etc_spec())


def test_etc_exports_with_its_code_and_loads_without_tf_family(tmp_path):
    spec = _etc_spec()
    manifest = {
        task: _export_and_expect(spec, task, tmp_path / task / "model", tmp_path / f"{task}.safetensors", tmp_path)
        for task in ("masked_lm", "sequence_classification")
    }
    _load_without_tf_family(manifest, tmp_path)


def test_lora_trains_the_etc_attention_projections():
    model = tester.build(_etc_spec(), "masked_lm").train()
    lora = get_peft_model(model, LoraConfig(r=2, lora_alpha=4))
    inputs = tester.make_inputs(SPEC, model.config, "masked_lm")
    before = {key: value.detach().clone() for key, value in lora.named_parameters()}
    optimizer = torch.optim.SGD([p for p in lora.parameters() if p.requires_grad], lr=0.5)
    lora(**inputs).loss.backward()
    optimizer.step()
    changed = {key for key, value in lora.named_parameters() if not torch.equal(value, before[key])}
    assert any("lora_B" in key for key in changed) and all("lora_" in key for key in changed), sorted(changed)


@pytest.mark.parametrize("page", ["model_cards/big_bird.md", "docs/architectures/big_bird.md"])
def test_the_etc_snippets_of_the_card_and_the_docs_run(page):
    import re
    from pathlib import Path

    text = (Path(__file__).parents[3] / page).read_text()
    snippet = re.search(r"## ETC mode\n.*?```python\n(.*?)```", text, re.S)[1]
    namespace = {"__name__": "etc_snippet"}
    exec(compile(snippet, f"{page} ETC snippet", "exec"), namespace)
    assert namespace["model"].config.attention_type == "etc"
