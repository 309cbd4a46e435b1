import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig

import tf_family
from tf_family.auto import AUTO_CLASS_BY_TASK, register_all
from tf_family.registry import ARCHITECTURES, create_model, get_arch, list_architectures


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_variant_builds_a_valid_config_and_tiny_is_tiny(name):
    spec = get_arch(name)
    for variant in spec.variants:
        assert isinstance(spec.make_config(variant), spec.config_class)
    for task, model_class in spec.model_classes.items():
        model = model_class(spec.tiny_config(task=task))
        assert sum(p.numel() for p in model.parameters()) < 1_000_000, f"{name} tiny {task} is not tiny"
    assert spec.card and spec.reference and spec.lora_target_modules
    task = "causal_lm" if "causal_lm" in spec.model_classes else next(iter(spec.model_classes))
    names = {n.rsplit(".", 1)[-1] for n, _ in create_model(name, task).named_modules()}
    assert set(spec.lora_target_modules) <= names, "LoRA targets must name modules of the model"


def test_create_model_and_lookup_errors():
    model = create_model("transfo_xl", "causal_lm", "tiny", mem_len=3)
    assert model.config.mem_len == 3
    assert list_architectures()[0] == "transfo_xl"
    with pytest.raises(ValueError, match="Unknown architecture 'nope'"):
        get_arch("nope")
    with pytest.raises(ValueError, match="no 'masked_lm' model"):
        create_model("transfo_xl", "masked_lm")
    with pytest.raises(ValueError, match="no variant 'huge'"):
        create_model("transfo_xl", "causal_lm", "huge")


def test_registration_is_idempotent_and_survives_user_registrations():
    register_all()
    register_all()

    class UserConfig(PreTrainedConfig):
        model_type = "user_thing_for_tf_family_test"

    AutoConfig.register(UserConfig.model_type, UserConfig)
    spec = get_arch("transfo_xl")
    AutoModelForCausalLM.register(spec.config_class, spec.model_classes["causal_lm"], exist_ok=True)
    register_all()
    for spec in ARCHITECTURES.values():
        assert type(AutoConfig.for_model(spec.model_type)) is spec.config_class
        for task, model_class in spec.model_classes.items():
            if task in AUTO_CLASS_BY_TASK:
                assert type(AUTO_CLASS_BY_TASK[task].from_config(spec.tiny_config(task=task))) is model_class


def test_import_twice_in_a_fresh_interpreter():
    code = "import importlib, tf_family; importlib.reload(tf_family.auto); tf_family.register_all(); print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "ok"


def test_bf16_weights_forward():
    model = tf_family.create_model("transfo_xl").to(torch.bfloat16).eval()
    out = model(torch.randint(0, 128, (2, 6)))
    assert torch.isfinite(out.logits).all()
    out2 = model(torch.randint(0, 128, (2, 6)), mems=out.mems)
    assert out2.mems.states[0].dtype == torch.bfloat16


def test_the_top_level_names_come_from_the_specs():
    """`tf_family.TffXModel` and friends are each architecture's config, model classes and `ArchSpec.exports`, read
    from the registry (a new architecture adds nothing to tf_family/__init__.py); every one resolves to the class its
    spec names, and the names listed for static tools (the TYPE_CHECKING block) are among them."""
    import ast
    from pathlib import Path

    from tf_family.spec import import_object

    for spec in ARCHITECTURES.values():
        for name, module in spec.public_names().items():
            assert name in tf_family.__all__
            assert getattr(tf_family, name) is import_object(f"{module}:{name}"), name
        assert spec.public_names()[spec.config_class.__name__]  # the config is public
        assert {cls.__name__ for cls in spec.model_classes.values()} <= set(spec.public_names())
    tree = ast.parse(Path(tf_family.__file__).read_text())
    checking = next(
        node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    static = {alias.name for node in ast.walk(checking) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert static <= set(tf_family.__all__), static - set(tf_family.__all__)


def test_two_architectures_exporting_one_name_are_refused():
    import dataclasses

    from tf_family.registry import public_names

    reformer = get_arch("reformer")
    copy = dataclasses.replace(reformer, name="reformer_copy", config="elsewhere.configuration:TffReformerConfig")
    with pytest.raises(ValueError, match="'reformer_copy' exports 'TffReformerConfig' from elsewhere.configuration"):
        public_names([reformer, copy])
