"""PEFT's conventions hold for every architecture of the registry.

- ``LoraConfig(task_type=...)`` without ``target_modules`` works: importing tf_family registers each spec's
  ``lora_target_modules`` as PEFT's default for its model types; the adapters sit on the attention projections
  (and, by the registry's choice, the Decision Transformer's MLP), one step trains them and nothing else of the body.
- Sequence-classification heads are called ``classifier`` (``score`` for Transformer-XL) as in transformers, so
  ``task_type="SEQ_CLS"`` trains and saves them (PEFT's default ``modules_to_save``); folders saved before the rename
  (``dense.*`` / ``out_proj.*`` on the model) still load, with equal outputs, and save under the new names.
- A kNN-LM whose base weights changed under a merged LoRA refuses to save its now mismatched datastore.
"""

from __future__ import annotations

import re

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.utils import ModulesToSaveWrapper
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from tests.models.knn_lm.test_knn_lm import base_llama, batches_of, token_blocks
from tests.test_trainer import _collate, _examples, _tiny_model
from tf_family.models.knn_lm.modeling_knn_lm import TffKNNLMForCausalLM
from tf_family.registry import ARCHITECTURES
from tf_family.retrieval.datastore import build_datastore

# PEFT's task wrappers; the other tasks get the plain PeftModel (no task_type)
PEFT_TASK_TYPES = {
    "causal_lm": "CAUSAL_LM",
    "sequence_classification": "SEQ_CLS",
    "token_classification": "TOKEN_CLS",
    "question_answering": "QUESTION_ANS",
}
CASES = [(name, task) for name, spec in ARCHITECTURES.items() for task in spec.tasks]
# a wrapped module is an attention projection when it sits in an attention block
ATTENTION = re.compile(r"(^|\.)(attention|self_attn)\.")


@pytest.mark.parametrize(("name", "task"), CASES, ids=[f"{name}-{task}" for name, task in CASES])
def test_lora_without_target_modules_adapts_the_attention_projections(name, task):
    spec = ARCHITECTURES[name]
    model = _tiny_model(name, task, **({"meta_loss_weight": 0.0} if name == "calm" else {}))
    task_type = PEFT_TASK_TYPES.get(task)
    config = LoraConfig(r=2, lora_alpha=4, **({"task_type": task_type} if task_type else {}))
    lora = get_peft_model(model, config)
    assert set(lora.peft_config["default"].target_modules) == set(spec.lora_target_modules)

    wrapped = sorted(module_name for module_name, module in lora.named_modules() if isinstance(module, LoraLayer))
    assert wrapped and all(module_name.rsplit(".", 1)[-1] in spec.lora_target_modules for module_name in wrapped)
    outside_attention = [module_name for module_name in wrapped if not ATTENTION.search(module_name)]
    if name == "decision_transformer":  # its registry targets include the MLP
        assert all(".mlp." in module_name for module_name in outside_attention), outside_attention
        assert len(outside_attention) < len(wrapped)
    else:
        assert not outside_attention, outside_attention

    # one step trains the adapters (and a task head PEFT keeps trainable), never the frozen body
    batch = _collate(_examples(name, task, model))
    before = {key: value.detach().clone() for key, value in lora.named_parameters()}
    trainable = [parameter for parameter in lora.parameters() if parameter.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.5)
    lora.train()
    lora(**batch).loss.backward()
    optimizer.step()
    changed = {key for key, value in lora.named_parameters() if not torch.equal(value, before[key])}
    assert any("lora_B" in key for key in changed)
    assert all("lora_" in key or "modules_to_save" in key for key in changed), sorted(changed)


SEQUENCE_CLASSIFIERS = [name for name, spec in ARCHITECTURES.items() if "sequence_classification" in spec.tasks]


@pytest.mark.parametrize("name", SEQUENCE_CLASSIFIERS)
def test_lora_seq_cls_trains_and_saves_the_classification_head(name, tmp_path):
    model = _tiny_model(name, "sequence_classification")
    head = [key for key, _ in model.named_parameters() if not key.startswith(f"{model.base_model_prefix}.")]
    targets = list(ARCHITECTURES[name].lora_target_modules)  # given: this test is about the head only
    lora = get_peft_model(model, LoraConfig(r=2, task_type="SEQ_CLS", target_modules=targets))
    trained_in_full = [key for key, p in lora.named_parameters() if p.requires_grad and "lora_" not in key]
    assert len(trained_in_full) == len(head), (trained_in_full, head)  # the head's copy PEFT trains
    assert all(".modules_to_save." in key for key in trained_in_full), trained_in_full
    assert all(key.startswith(("classifier.", "score.")) for key in head), head  # transformers' names
    saved = [key for key, module in lora.named_modules() if isinstance(module, ModulesToSaveWrapper)]
    assert {key.rsplit(".", 1)[-1] for key in saved} & {"classifier", "score"}, saved
    # the head's own out_proj is saved whole, not given an adapter (Longformer's and BigBird's attention
    # projections are also called out_proj)
    assert not [key for key, module in lora.named_modules() if isinstance(module, LoraLayer) and "classifier" in key]
    lora.save_pretrained(tmp_path)
    with safe_open(tmp_path / "adapter_model.safetensors", "pt") as adapter:
        stored = list(adapter.keys())
    for key in head:
        assert any(stored_key.endswith(key) for stored_key in stored), (key, stored)


RENAMED = [name for name in SEQUENCE_CLASSIFIERS if name != "transfo_xl"]  # Transformer-XL's head was always `score`


@pytest.mark.parametrize("name", RENAMED)
def test_a_folder_saved_before_the_classifier_rename_loads(name, tmp_path):
    model = _tiny_model(name, "sequence_classification").eval()
    old_names = {
        re.sub(r"^classifier\.(dense|out_proj)\.", r"\1.", key): value.contiguous()
        for key, value in model.state_dict().items()
    }
    assert "dense.weight" in old_names and not any(key.startswith("classifier.") for key in old_names)
    model.config.save_pretrained(tmp_path / "old")
    save_file(old_names, str(tmp_path / "old" / "model.safetensors"), metadata={"format": "pt"})
    batch = _collate(_examples(name, "sequence_classification", model))
    batch.pop("labels")
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "old").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits, rtol=0, atol=0)
    loaded.save_pretrained(tmp_path / "new")
    with safe_open(tmp_path / "new" / "model.safetensors", "pt") as saved:
        names = saved.keys()  # a safetensors file is not iterable itself
    head = sorted(key for key in names if not key.startswith(f"{model.base_model_prefix}."))
    assert head == ["classifier.dense.bias", "classifier.dense.weight", "classifier.out_proj.bias",
                    "classifier.out_proj.weight"]  # fmt: skip


def test_knn_lm_with_a_merged_lora_refuses_to_save_its_old_datastore(tmp_path):
    base = base_llama()
    blocks = token_blocks()
    datastore = build_datastore(base, batches_of(blocks), None, show_progress=False)
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=4, lmbda=0.25)
    # init_lora_weights=False: B is not zero, so merging changes the base weights
    merged = get_peft_model(model, LoraConfig(r=2, task_type="CAUSAL_LM", init_lora_weights=False)).merge_and_unload()
    assert merged.datastore is datastore
    with pytest.raises(ValueError, match=r"save_pretrained refused.*Rebuild the datastore.*save_datastore=False"):
        merged.save_pretrained(tmp_path / "refused")
    assert not (tmp_path / "refused").exists()

    ids = blocks.input_ids[:2]
    merged.save_pretrained(tmp_path / "without", save_datastore=False)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "without")
    assert loaded.datastore is None
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, merged(ids, lmbda=0.0).logits)

    merged.set_datastore(build_datastore(merged.lm, batches_of(blocks), None, show_progress=False))
    merged.save_pretrained(tmp_path / "rebuilt")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "rebuilt")
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, merged(ids).logits)


def test_lora_target_registration_is_idempotent_and_keeps_the_users_entries(monkeypatch):
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as lora_targets

    from tf_family.auto import register_lora_targets

    for spec in ARCHITECTURES.values():
        for model_type in spec.model_types:  # legacy types too (transfo-xl)
            assert list(lora_targets[model_type]) == list(spec.lora_target_modules)
    monkeypatch.setitem(lora_targets, "tff_longformer", ["query"])
    register_lora_targets()
    register_lora_targets()
    assert lora_targets["tff_longformer"] == ["query"]
