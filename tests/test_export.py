"""torch.export of every architecture's eval forward (non-strict): the exported program gives the eager outputs,
also on other inputs of the same shape (so no branch on the data was baked in: the adaptive embedding's clusters,
Longformer's number of global tokens, the Memorizing Transformer's memory mask, input checks).

Models that return a transformers KV cache (``DynamicCache``: CALM, kNN-LM, Longformer, Reformer) are exported with
``use_cache=False``, as transformers' own decoders are (a ``DynamicCache`` is not a pytree type); the Memorizing
Transformer's kNN memory (a searchable store) neither. Transformer-XL's and the Compressive Transformer's memories
are pytree nodes (``import tf_family`` registers them): they export with their memory."""

import inspect

import pytest
import torch

from tests.common.tester import build, main_output, make_inputs, without_labels
from tf_family.registry import ARCHITECTURES

# (architecture, task): every architecture's language-model (or action) head, and the heads with global tokens
CASES = [
    (arch, next(task for task in ("causal_lm", "masked_lm", "action") if task in spec.model_classes))
    for arch, spec in ARCHITECTURES.items()
] + [("longformer", "sequence_classification"), ("big_bird", "question_answering")]
CARRIED_STATE_EXPORTS = {"transfo_xl", "compressive", "spalm"}  # their memory objects are pytree nodes


def _inputs(spec, model, task, seed):
    inputs = without_labels(make_inputs(spec, model.config, task, seed=seed))
    if "global_attention_mask" in inputs and seed:  # another number of global tokens than at export time
        inputs["global_attention_mask"][0, 1:4] = 1
    if spec.name not in CARRIED_STATE_EXPORTS and "use_cache" in inspect.signature(model.forward).parameters:
        inputs["use_cache"] = False
    return inputs


@pytest.mark.parametrize(("arch", "task"), CASES, ids=[f"{arch}-{task}" for arch, task in CASES])
def test_the_eval_forward_exports(arch, task):
    spec = ARCHITECTURES[arch]
    model = build(spec, task)
    if (
        getattr(model, "datastore", None) is not None
    ):  # SPALM: its search is refused (test_spalm_...), the rest exports
        model.set_datastore(None)
    exported = torch.export.export(model, args=(), kwargs=_inputs(spec, model, task, seed=0), strict=False)
    for seed in (0, 1):
        inputs = _inputs(spec, model, task, seed)
        with torch.no_grad():
            expected = model(**inputs)
            got = exported.module()(**inputs)
        torch.testing.assert_close(main_output(task, got), main_output(task, expected), rtol=1e-4, atol=1e-5)
        if arch in CARRIED_STATE_EXPORTS:  # the memory comes back too
            got_leaves = torch.utils._pytree.tree_leaves(got.mems)
            expected_leaves = torch.utils._pytree.tree_leaves(expected.mems)
            assert len(got_leaves) == len(expected_leaves) > 0
            for a, b in zip(got_leaves, expected_leaves, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_spalm_with_a_datastore_refuses_to_export_and_says_why():
    spec = ARCHITECTURES["spalm"]
    model = build(spec, "causal_lm")
    assert model.datastore is not None
    inputs = _inputs(spec, model, "causal_lm", seed=0)
    with pytest.raises(NotImplementedError, match="cannot trace SPALM's retrieval"):
        torch.export.export(model, args=(), kwargs=inputs, strict=False)
