"""tf_family.conversion: every foreign format reads single, sharded and .bin weights; manifests stay inside their
folder; `from_pretrained` arguments pass through; converters are data (they never import a modeling file)."""

import ast
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from huggingface_hub import save_torch_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import tf_family
from tf_family.auto import legacy_model_class
from tf_family.conversion import (
    ForeignFormat,
    convert_folder,
    declared_formats,
    find_format,
    read_manifest,
    read_weights,
)
from tf_family.registry import ARCHITECTURES, get_arch

TRANSFO_XL_FIXTURE = Path(__file__).parent / "fixtures" / "transfo_xl_4x" / "adaptive_div1_proj_safetensors"
BODY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)  # noqa: C408


def _transfo_xl(folder):
    shutil.copytree(TRANSFO_XL_FIXTURE, folder)
    return tf_family.TffTransfoXLLMHeadModel


def _longformer(folder):
    config = transformers.LongformerConfig(vocab_size=61, max_position_embeddings=64, attention_window=4, **BODY)
    transformers.LongformerForMaskedLM(config).save_pretrained(folder)
    return tf_family.TffLongformerForMaskedLM


def _big_bird(folder):
    config = transformers.BigBirdConfig(
        vocab_size=61, max_position_embeddings=64, block_size=2, num_random_blocks=1, **BODY
    )
    transformers.BigBirdForMaskedLM(config).save_pretrained(folder)
    return tf_family.TffBigBirdForMaskedLM


def _decision_transformer(folder):
    config = transformers.DecisionTransformerConfig(state_dim=5, act_dim=3, hidden_size=32, n_layer=2, n_head=4)
    transformers.DecisionTransformerModel(config).save_pretrained(folder)
    return tf_family.TffDecisionTransformerModel


def _calm_llama(folder):
    config = transformers.LlamaConfig(vocab_size=61, max_position_embeddings=64, num_key_value_heads=2, **BODY)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return tf_family.TffCalmForCausalLM


def _calm_gpt2(folder):
    config = transformers.GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return tf_family.TffCalmForCausalLM


def _reformer(folder):
    config = transformers.ReformerConfig(
        vocab_size=61, hidden_size=32, num_attention_heads=2, attention_head_size=8, feed_forward_size=37,
        attn_layers=["local", "lsh"], axial_pos_shape=[4, 8], axial_pos_embds_dim=[12, 20], hash_seed=0,
        is_decoder=True, local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=4,
    )  # fmt: skip
    transformers.ReformerModelWithLMHead(config).save_pretrained(folder)
    return tf_family.TffReformerForCausalLM


# one reference folder per foreign checkpoint format (name -> builder returning the tf_family class that reads it)
REFERENCES = {
    "transfo-xl": _transfo_xl,
    "longformer": _longformer,
    "big-bird": _big_bird,
    "decision-transformer": _decision_transformer,
    "calm-llama": _calm_llama,
    "calm-gpt2": _calm_gpt2,
    "reformer": _reformer,
}


def reference(tmp_path, name):
    torch.manual_seed(0)
    folder = tmp_path / "reference"
    return folder, REFERENCES[name](folder)


def assert_same_weights(model, other):
    expected, got = model.state_dict(), other.state_dict()
    assert expected.keys() == got.keys()
    for key, tensor in expected.items():
        assert torch.equal(tensor, got[key]), key


def test_every_foreign_format_has_a_reference_here():
    formats = {
        record.name
        for spec in ARCHITECTURES.values()
        for record in spec.foreign_formats
        if isinstance(record, ForeignFormat)
    }
    assert formats == set(REFERENCES)


@pytest.mark.parametrize("spec", list(ARCHITECTURES.values()), ids=list(ARCHITECTURES))
def test_model_classes_read_the_formats_their_spec_declares_and_no_other(tmp_path, spec):
    """The spec is the one place an architecture lists its foreign formats: every class its folders load through
    (each task class, and the class the Auto classes route a legacy model type to) detects a folder of each of those
    formats, and of no other architecture's, as `from_pretrained` does."""
    declared = tuple(record for record in spec.foreign_formats if isinstance(record, ForeignFormat))
    every = {record for other in ARCHITECTURES.values() for record in other.foreign_formats}
    every = {record for record in every if isinstance(record, ForeignFormat)}
    for record in every:
        (tmp_path / record.name).mkdir()
        (tmp_path / record.name / "config.json").write_text(json.dumps({"model_type": record.source_model_type}))
    classes = [*spec.model_classes.values()]
    classes += [legacy_model_class(config, task) for config in spec.legacy_configs for task in spec.model_classes]
    for model_class in classes:
        assert declared_formats(model_class) == declared, model_class.__name__
        for record in every:
            found = find_format(declared_formats(model_class), tmp_path / record.name, {})
            assert found is (record if record in declared else None), (model_class.__name__, record.name)


def _write_bin_shards(weights, folder):
    names = sorted(weights)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for shard, keys in shards.items():
        torch.save({key: weights[key] for key in keys}, folder / shard)
    weight_map = {key: shard for shard, keys in shards.items() for key in keys}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("name", list(REFERENCES))
@pytest.mark.parametrize("layout", ["sharded_safetensors", "bin", "sharded_bin"])
def test_every_format_reads_every_weight_layout(tmp_path, name, layout):
    folder, model_class = reference(tmp_path, name)
    expected = model_class.from_pretrained(folder)
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    if layout == "sharded_safetensors":
        save_torch_state_dict(weights, folder, max_shard_size="20KB")
        assert len(read_manifest(folder / "model.safetensors.index.json")) > 1
    elif layout == "bin":
        torch.save(weights, folder / "pytorch_model.bin")
    else:
        _write_bin_shards(weights, folder)
    assert_same_weights(expected, model_class.from_pretrained(folder))


@pytest.mark.parametrize("entry", ["../outside.safetensors", "/tmp/outside.safetensors", "shards/../../x.safetensors"])
def test_manifest_entries_outside_the_folder_are_refused(tmp_path, entry):
    folder, model_class = reference(tmp_path, "decision-transformer")
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    save_torch_state_dict(weights, tmp_path)  # a real file the bad entry could reach
    weight_map = dict.fromkeys(weights, entry)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="model.safetensors.index.json names the shard") as error:
        model_class.from_pretrained(folder)
    assert repr(entry) in str(error.value)
    with pytest.raises(ValueError, match="outside the folder"):
        read_weights(folder, {})


def test_from_pretrained_arguments_pass_through(tmp_path):
    folder, model_class = reference(tmp_path, "decision-transformer")
    full = model_class.from_pretrained(folder)
    half = model_class.from_pretrained(folder, dtype=torch.bfloat16, target_return=3600.0, context_length=4)
    assert {parameter.dtype for parameter in half.parameters()} == {torch.bfloat16}
    assert half.config.target_return == 3600.0 and half.config.context_length == 4 and not half.training
    assert half.config.name_or_path == str(folder)
    for (key, tensor), other in zip(full.state_dict().items(), half.state_dict().values(), strict=True):
        torch.testing.assert_close(tensor.to(torch.bfloat16), other, rtol=0, atol=0, msg=key)
    placed, info = model_class.from_pretrained(
        folder, device_map="cpu", low_cpu_mem_usage=True, attn_implementation="eager", output_loading_info=True
    )
    assert placed.config._attn_implementation == "eager" and info["missing_keys"] == set()
    assert_same_weights(full, placed)


def test_config_overrides_and_dtype_through_auto_on_a_legacy_folder():
    model = AutoModelForCausalLM.from_pretrained(TRANSFO_XL_FIXTURE, dtype=torch.bfloat16, mem_len=20)
    assert type(model) is tf_family.TffTransfoXLLMHeadModel and model.config.mem_len == 20
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}


def test_config_override_sets_a_new_head(tmp_path):
    folder, _ = reference(tmp_path, "longformer")
    classifier = tf_family.TffLongformerForSequenceClassification.from_pretrained(folder, num_labels=5)
    with torch.no_grad():
        logits = classifier(torch.randint(3, 61, (2, 9))).logits
    assert classifier.config.num_labels == 5 and logits.shape == (2, 5)


def test_convert_folder_refuses_another_format(tmp_path):
    folder, _ = reference(tmp_path, "decision-transformer")
    spec = get_arch("longformer")
    with pytest.raises(ValueError, match="not a longformer checkpoint.*'decision_transformer'"):
        convert_folder(folder, tmp_path / "out", spec.model_classes, spec.foreign_formats[0])


def test_converters_never_import_a_modeling_file():
    package = Path(tf_family.__file__).parent
    converters = sorted(package.glob("models/*/convert_*.py"))
    assert converters
    for path in converters:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            assert not any("modeling_" in name for name in names), f"{path.name} imports {names}"


def test_convert_kinds_come_from_the_specs():
    from tf_family.cli import build_parser, convert_kinds

    kinds = convert_kinds()
    # every checkpoint format has its reference folder above (REFERENCES), every tokenizer format is a convert kind
    tokenizers = {
        record.name
        for spec in ARCHITECTURES.values()
        for record in spec.foreign_formats
        if not isinstance(record, ForeignFormat)
    }
    assert tokenizers and set(kinds) == set(REFERENCES) | tokenizers
    for name, (spec, record) in kinds.items():
        assert record in spec.foreign_formats
        assert build_parser().parse_args(["convert", name, "in", "out"]).kind == name


def test_variant_and_use_safetensors_pick_the_weight_file(tmp_path):
    save_torch_state_dict({"a": torch.ones(2)}, tmp_path, filename_pattern="model.fp16{suffix}.safetensors")
    torch.save({"a": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    assert torch.equal(read_weights(tmp_path, {}, variant="fp16")["a"], torch.ones(2))
    assert torch.equal(read_weights(tmp_path, {})["a"], torch.zeros(2))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        read_weights(tmp_path, {}, use_safetensors=True)


@pytest.mark.parametrize("name", ["transfo-xl", "longformer", "big-bird", "decision-transformer"])
def test_big_model_loading_arguments_on_foreign_folders(tmp_path, name):
    """``device_map`` and ``low_cpu_mem_usage`` go through the foreign-checkpoint hook to transformers, for the task
    class the folder was saved as, for the base model (a masked-LM folder has no pooler: it starts fresh) and
    through the Auto class (legacy transfo-xl)."""
    folder, model_class = reference(tmp_path, name)
    spec = next(spec for spec in ARCHITECTURES.values() if model_class in spec.model_classes.values())
    for task_class in {model_class, spec.model_classes.get("base", model_class)}:
        plain = task_class.from_pretrained(folder)
        placed = task_class.from_pretrained(folder, device_map="cpu", low_cpu_mem_usage=True)
        assert type(placed) is task_class and not placed.training
        assert {parameter.device.type for parameter in placed.parameters()} == {"cpu"}
        if task_class is model_class:
            assert_same_weights(plain, placed)
        else:  # the base model: everything but a freshly initialised pooler comes from the folder
            fresh = {key for key in plain.state_dict() if key.startswith("pooler.")}
            expected, got = plain.state_dict(), placed.state_dict()
            assert expected.keys() == got.keys()
            assert all(torch.equal(expected[key], got[key]) for key in expected.keys() - fresh)
    if name == "transfo-xl":  # the legacy model type goes through the same hook from the Auto class
        loaded = AutoModelForCausalLM.from_pretrained(folder, device_map="cpu", low_cpu_mem_usage=True)
        assert type(loaded) is model_class
        assert_same_weights(model_class.from_pretrained(folder), loaded)
