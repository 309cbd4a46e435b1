"""The common tester must fail on models that break the contract; each broken model here has one planted fault."""

import pytest
import torch
from torch import nn

from tf_family import TffDecisionTransformerModel, TffTransfoXLLMHeadModel
from tf_family.registry import get_arch

from . import tester


class UnusedParameterLM(TffTransfoXLLMHeadModel):
    """Has a parameter that never takes part in the forward pass, so it gets no gradient."""

    def __init__(self, config):
        super().__init__(config)
        self.orphan = nn.Linear(4, 4)
        self.post_init()


class GlobalRNGLM(TffTransfoXLLMHeadModel):
    """Draws from the global RNG in forward (BigBird's and Reformer's old sin)."""

    def forward(self, *args, **kwargs):
        outputs = super().forward(*args, **kwargs)
        if outputs.logits is not None:
            outputs.logits = outputs.logits + 0.0 * torch.rand(())
        return outputs


class FutureLeakLM(TffTransfoXLLMHeadModel):
    """Lets every position see the mean of all positions, the future included."""

    def forward(self, *args, **kwargs):
        outputs = super().forward(*args, **kwargs)
        if outputs.logits is not None:
            outputs.logits = outputs.logits + 1e-2 * outputs.logits.mean(dim=1, keepdim=True)
        return outputs


class ForgetfulLM(TffTransfoXLLMHeadModel):
    """Drops the memory it is given."""

    def forward(self, input_ids=None, mems=None, **kwargs):
        return super().forward(input_ids, mems=None, **kwargs)


class RecomputingLM(TffTransfoXLLMHeadModel):
    """Generates correctly but drops its memory between steps, re-reading the whole prefix every step."""

    def prepare_inputs_for_generation(self, input_ids, mems=None, **kwargs):
        return super().prepare_inputs_for_generation(input_ids, mems=None, **kwargs)


class PaddingBlindLM(TffTransfoXLLMHeadModel):
    """Ignores the attention mask."""

    def forward(self, input_ids=None, mems=None, attention_mask=None, **kwargs):
        return super().forward(input_ids, mems=mems, attention_mask=None, **kwargs)


BROKEN = [
    (UnusedParameterLM, tester.check_gradients, "without gradient"),
    (GlobalRNGLM, tester.check_determinism_and_rng, "global RNG"),
    (FutureLeakLM, tester.check_causality, "depend on tokens after"),
    (ForgetfulLM, tester.check_memory_equivalence, "not close"),
    (ForgetfulLM, tester.check_generation_cache, "differ|not close"),
    (RecomputingLM, tester.check_generation_cache, "does not carry its cache"),
    (PaddingBlindLM, tester.check_padding_equivalence, "padding"),
    (UnusedParameterLM, tester.check_save_load, "Auto gave"),
]


@pytest.mark.parametrize(("model_class", "check", "message"), BROKEN, ids=lambda x: getattr(x, "__name__", ""))
def test_tester_flags_broken_model(model_class, check, message):
    broken = tester.with_model_class(get_arch("transfo_xl"), "causal_lm", model_class)
    with pytest.raises(AssertionError, match=message):
        check(broken)


@pytest.mark.parametrize(("model_class", "check", "message"), BROKEN, ids=lambda x: getattr(x, "__name__", ""))
def test_tester_passes_the_healthy_model_on_the_same_check(model_class, check, message):
    check(tester.with_model_class(get_arch("transfo_xl"), "causal_lm", TffTransfoXLLMHeadModel))


class LabelLeakDT(TffDecisionTransformerModel):
    """Lets the prediction of a_t see a_t itself (the label)."""

    def forward(self, *args, **kwargs):
        outputs = super().forward(*args, **kwargs)
        actions = kwargs.get("actions")
        outputs.action_preds = outputs.action_preds + 1e-2 * self.action_features(actions)
        return outputs


class PaddingBlindDT(TffDecisionTransformerModel):
    """Ignores the attention mask (attends to padded steps)."""

    def forward(self, *args, attention_mask=None, **kwargs):
        return super().forward(*args, **kwargs)


class CroppingBlindDT(TffDecisionTransformerModel):
    """get_action drops the history and acts on the newest step alone."""

    def get_action(self, states, actions, returns_to_go, timesteps, attention_mask=None, **kwargs):
        return super().get_action(states[:, -1:], actions[:, -1:], returns_to_go[:, -1:], timesteps[:, -1:], **kwargs)


BROKEN_DT = [
    (LabelLeakDT, tester.check_causality, "depends on a_t"),
    (PaddingBlindDT, tester.check_padding_equivalence, "padding"),
    (CroppingBlindDT, tester.check_generation_cache, "step"),
]


@pytest.mark.parametrize(("model_class", "check", "message"), BROKEN_DT, ids=lambda x: getattr(x, "__name__", ""))
def test_tester_flags_broken_decision_transformer(model_class, check, message):
    broken = tester.with_model_class(get_arch("decision_transformer"), "action", model_class)
    with pytest.raises(AssertionError, match=message):
        check(broken)
