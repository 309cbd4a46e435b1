"""The Depth-Adaptive Transformer's exits as CALM confidence measures (``"halting"``, ``"multinomial"``): the halting
classifier learns the oracle exits on detached states, decoding leaves where it says, the skipped layers' keys and
values come from CALM's state propagation (so a token that left at k layers equals a forced exit at k), and it
saves, loads and passes the common tester's checks."""

import copy
from types import MappingProxyType

import pytest
import torch

from tests.common import tester
from tf_family import TffCalmConfig, TffCalmForCausalLM
from tf_family.early_exit import geometric_halting_loss, multinomial_halting_loss, oracle_exits
from tf_family.registry import get_arch

SPEC = get_arch("calm")
GREEDY = {"do_sample": False, "return_dict_in_generate": True, "output_exit_layers": True}


def _spec(measure: str):
    spec = copy.copy(SPEC)
    variants = dict(SPEC.variants)
    variants["tiny"] = MappingProxyType({**SPEC.variants["tiny"], "confidence_measure": measure})
    object.__setattr__(spec, "variants", MappingProxyType(variants))
    return spec


def build(measure: str, seed: int = 0, **overrides) -> TffCalmForCausalLM:
    torch.manual_seed(seed)
    model = TffCalmForCausalLM(SPEC.tiny_config(confidence_measure=measure, **overrides)).eval().double()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def prompt(batch=3, length=5, seed=0):
    return torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("check", tester.ALL_CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
def test_common_checks_with_halting_classifiers(check):
    check(_spec("halting"))


@pytest.mark.parametrize("measure", ["halting", "multinomial"])
def test_the_halting_loss_is_the_oracles_cross_entropy_on_detached_states(measure):
    model = build(measure, halting_depth_penalty=0.05).train()
    ids = prompt(2, 7)
    out = model(ids, labels=ids, output_hidden_states=True)
    targets = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=-100)
    valid = targets != -100
    points = model.config.exit_points()
    normed = [model.model.norm(out.hidden_states[p]) for p in points[:-1]]
    logits = [model.lm_head(state) for state in normed] + [out.logits]
    log_probs = torch.stack([lg.log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0] for lg in logits])
    correct = torch.stack([lg.argmax(-1) == targets for lg in logits])
    oracle = oracle_exits(log_probs, correct, points, "likelihood", 0.05)
    if measure == "multinomial":
        expected = multinomial_halting_loss(model.halting_classifier(normed[0]), oracle, valid)
    else:
        per_exit = torch.stack([model.halting_classifier(s)[..., i] for i, s in enumerate(normed)], -1)
        expected = geometric_halting_loss(per_exit, oracle, valid)
    torch.testing.assert_close(out.halting_loss, expected.to(out.halting_loss.dtype))
    # the halting loss trains the classifier only
    model.zero_grad()
    out.halting_loss.backward()
    assert model.halting_classifier.weight.grad.abs().sum() > 0
    assert all(p.grad is None for n, p in model.named_parameters() if not n.startswith("halting_classifier"))


@pytest.mark.parametrize("measure", ["halting", "multinomial"])
def test_a_certain_classifier_exits_at_the_first_exit_and_equals_the_forced_exit(measure):
    model = build(measure, exit_threshold=0.5, position_temperature=0.0)
    with torch.no_grad():  # every token is sure to leave at the first exit
        model.halting_classifier.weight.zero_()
        model.halting_classifier.bias.fill_(-30.0)
        model.halting_classifier.bias[0] = 30.0
        ids = prompt()
        early = model.generate(ids, max_new_tokens=5, **GREEDY)
        # CALM with a threshold every token reaches: each generated token leaves after 1 layer too
        calm = TffCalmForCausalLM(copy.deepcopy(model.config)).double().eval()
        calm.config.confidence_measure, calm.config.exit_threshold = "softmax_max", 0.0
        calm.load_state_dict(
            {k: v for k, v in model.state_dict().items() if not k.startswith("halting")}, strict=False
        )
        reference = calm.generate(ids, max_new_tokens=5, **GREEDY)
    assert (early.exit_layers[:, 1:] == 1).all() and (reference.exit_layers[:, 1:] == 1).all()
    assert torch.equal(early.sequences, reference.sequences)


def test_geometric_halting_leaves_at_the_first_confident_exit_row_by_row():
    model = build("halting", exit_threshold=0.5, position_temperature=0.0)
    with torch.no_grad():  # χ ≈ 0 at the first exit, ≈ 1 at the second: every generated token leaves after 2 layers
        model.halting_classifier.weight.zero_()
        model.halting_classifier.bias.copy_(torch.tensor([-30.0, 30.0, -30.0, -30.0]))
        out = model.generate(prompt(), max_new_tokens=4, **GREEDY)
    assert (out.exit_layers[:, 1:] == 2).all()


def test_the_classifier_exists_only_for_the_halting_measures_and_survives_save_and_load(tmp_path):
    assert build("softmax_diff").halting_classifier is None
    model = build("multinomial")
    assert model.halting_classifier.out_features == len(model.config.exit_points())
    model.save_pretrained(tmp_path)
    loaded = TffCalmForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    torch.testing.assert_close(loaded.halting_classifier.weight, model.halting_classifier.weight)


def test_config_names_the_bad_field():
    with pytest.raises((TypeError, ValueError), match="halting_oracle"):
        TffCalmConfig(confidence_measure="halting", halting_oracle="sequence")
    with pytest.raises(ValueError, match="halting_depth_penalty"):
        TffCalmConfig(confidence_measure="halting", halting_depth_penalty=-1.0)


def test_a_model_without_the_classifier_refuses_the_halting_measures_by_name():
    model = build("softmax_diff", exit_threshold=0.5)
    model.config.confidence_measure = "halting"
    with pytest.raises(ValueError, match="built without"):
        model.generate(prompt(), max_new_tokens=2, do_sample=False)
