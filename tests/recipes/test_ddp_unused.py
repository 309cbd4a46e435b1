"""DDP searches for unused parameters (``find_unused_parameters``) only for models that can leave some: a real training
step of every registry task must never leave a parameter without gradient where `may_leave_parameters_unused` says
it cannot (that would hang or break the collectives of a two-process run)."""

import pytest
import torch
from accelerate.utils import DistributedDataParallelKwargs
from transformers import AutoModelForCausalLM

from tf_family.registry import ARCHITECTURES
from tf_family.training import configure_ddp, may_leave_parameters_unused

LABELS = {
    "causal_lm": lambda ids: {"labels": ids},
    "masked_lm": lambda ids: {"labels": ids},
    "sequence_classification": lambda ids: {"labels": torch.tensor([0, 1])},
    "token_classification": lambda ids: {"labels": torch.zeros_like(ids)},
    "question_answering": lambda ids: {"start_positions": torch.tensor([1, 2]), "end_positions": torch.tensor([3, 4])},
}
CASES = [
    (name, task)
    for name, spec in ARCHITECTURES.items()
    for task in spec.model_classes
    if task in LABELS and "base_config" not in spec.variants["tiny"]  # a kNN-LM wraps a trained model
]


def unused_parameters(model, task: str) -> list[str]:
    torch.manual_seed(0)
    vocab = getattr(model.config, "vocab_size", 100)
    ids = torch.randint(5, min(vocab, 200), (2, 32))
    out = model.train()(input_ids=ids, **LABELS[task](ids))
    loss = out.loss + (out.aux_loss if getattr(out, "aux_loss", None) is not None else 0)
    loss.backward()
    return [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]


@pytest.mark.parametrize(("arch", "task"), CASES)
def test_a_model_said_to_use_every_parameter_does(arch, task):
    spec = ARCHITECTURES[arch]
    config = spec.tiny_config(task=task, **({"num_labels": 2} if task == "sequence_classification" else {}))
    model = spec.model_classes[task](config)
    unused = unused_parameters(model, task)
    if unused:
        assert may_leave_parameters_unused(model), f"{arch} {task} left {unused[:4]} without gradient"


def test_the_main_jobs_model_and_plain_models_skip_the_search(tiny_gpt2):
    from tf_family.registry import get_arch

    main_job = get_arch("transfo_xl").make_config("small", pre_lnorm=True)
    for model in (
        get_arch("transfo_xl").model_classes["causal_lm"](main_job),
        AutoModelForCausalLM.from_pretrained(tiny_gpt2),
    ):
        assert not may_leave_parameters_unused(model)
        assert unused_parameters(model, "causal_lm") == []
    longformer = get_arch("longformer").model_classes["causal_lm"](get_arch("longformer").make_config("tiny"))
    assert may_leave_parameters_unused(longformer)  # no global tokens: the global projections get no gradient

    class Accelerator:  # what `configure_ddp` touches
        ddp_handler = DistributedDataParallelKwargs(find_unused_parameters=True)

    configure_ddp(Accelerator, AutoModelForCausalLM.from_pretrained(tiny_gpt2))
    assert Accelerator.ddp_handler.to_kwargs() == {}  # find_unused_parameters=False is DDP's default
