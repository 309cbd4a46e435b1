"""A fast start: ``tf-family --help`` / ``list`` and ``import tf_family`` import no heavy module, and the lazy
registration with the Auto classes (`tf_family.lazy_auto`) registers the same classes as the eager one.

Each check runs in a fresh interpreter and inspects ``sys.modules`` (what is imported, not how long it takes: the
times are in ``bench/results/startup.md``).
"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from tf_family.spec import ArchSpec

# what must stay out of `import tf_family` and of the CLI's --help / list
HEAVY = (
    "torch",
    "torch.distributed",
    "transformers",
    "datasets",
    "accelerate",
    "peft",
    "safetensors",
    "numpy",
    "tf_family.conversion",
    "tf_family.memory",
    "tf_family.attention",
)


def _run(code: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


_REPORT = """
import json, sys
loaded = [name for name in {heavy!r} if name in sys.modules]
modeling = sorted(name for name in sys.modules if name.startswith("tf_family.models.") and ".modeling_" in name)
print(json.dumps({{"loaded": loaded, "modeling": modeling}}))
"""


@pytest.mark.parametrize(
    "command",
    [
        "import tf_family",
        "from tf_family.cli import main; main(['list'])",
        "from tf_family.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
    ],
    ids=["import", "list", "help"],
)
def test_heavy_modules_stay_out_of_the_start(command):
    report = _run(command + "\n" + _REPORT.format(heavy=HEAVY))
    assert report == {"loaded": [], "modeling": []}


def test_lazy_registration_imports_only_what_transformers_reads():
    code = """
import json, sys
import tf_family
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.for_model("tff_longformer", **dict(tf_family.get_arch("longformer").variants["tiny"]))
model = AutoModelForCausalLM.from_config(config)
modeling = sorted(name for name in sys.modules if name.startswith("tf_family.models.") and ".modeling_" in name)
print(json.dumps({"model": type(model).__name__, "config": type(config).__name__, "modeling": modeling}))
"""
    report = _run(code)
    assert report == {
        "model": "TffLongformerForCausalLM",
        "config": "TffLongformerConfig",
        "modeling": ["tf_family.models.longformer.modeling_longformer"],
    }


@pytest.mark.parametrize("order", ["tf_family first", "transformers first"])
def test_lazy_registration_matches_the_eager_one(order):
    """Whichever is imported first, every Auto class maps every config (legacy ones included) to the class the
    eager `register_all` registers, PEFT knows the LoRA targets, and the memories are pytree nodes."""
    first = {
        "tf_family first": "import tf_family\nimport transformers.models.auto.modeling_auto\nimport peft",
        "transformers first": "import transformers.models.auto.modeling_auto\nimport peft\nimport tf_family",
    }[order]
    code = (
        first
        + """
import json
from transformers import AutoConfig
from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as lora
import torch.utils._pytree as pytree
from tf_family.auto import AUTO_CLASS_BY_TASK, legacy_model_class
from tf_family.registry import ARCHITECTURES
wrong = []
for spec in ARCHITECTURES.values():
    for model_type in spec.model_types:
        if lora.get(model_type) != list(spec.lora_target_modules):
            wrong.append(("lora", model_type))
    pairs = [(spec.config_class, None), *((legacy, legacy) for legacy in spec.legacy_configs)]
    for config_class, legacy in pairs:
        if AutoConfig.for_model(config_class.model_type).__class__ is not config_class:
            wrong.append(("config", config_class.model_type))
        for task, model_class in spec.model_classes.items():
            if task not in AUTO_CLASS_BY_TASK:
                continue
            expected = model_class if legacy is None else legacy_model_class(legacy, task)
            if AUTO_CLASS_BY_TASK[task]._model_mapping[config_class] is not expected:
                wrong.append((task, config_class.model_type))
from tf_family import CompressiveMemory, SegmentMemory
nodes = [cls.__name__ for cls in (SegmentMemory, CompressiveMemory) if cls in pytree.SUPPORTED_NODES]
print(json.dumps({"wrong": wrong, "nodes": nodes}))
"""
    )
    assert _run(code) == {"wrong": [], "nodes": ["SegmentMemory", "CompressiveMemory"]}


def test_a_user_registration_of_the_same_config_wins_over_the_deferred_one():
    code = """
import json
import tf_family
from transformers import AutoModelForCausalLM
spec = tf_family.get_arch("transfo_xl")

class Mine(spec.model_classes["causal_lm"]):
    pass

AutoModelForCausalLM.register(spec.config_class, Mine, exist_ok=True)
model = AutoModelForCausalLM.from_config(spec.tiny_config())
print(json.dumps(type(model).__name__))
"""
    assert _run(code) == "Mine"


def test_a_spec_whose_model_type_disagrees_with_its_config_says_so():
    spec = ArchSpec(
        name="wrong",
        title="wrong",
        model_type="not_the_config_type",
        config="tf_family.models.transfo_xl.configuration_transfo_xl:TffTransfoXLConfig",
        models={},
        variants={},
        lora_target_modules=(),
        reference="",
        parity="",
        card="",
    )
    assert spec.tasks == ()
    with pytest.raises(ValueError, match="model_type='not_the_config_type'"):
        _ = spec.config_class
    with pytest.raises(ValueError, match="'module:Name'"):
        _ = dataclasses.replace(spec, config="no_colon").config_class
