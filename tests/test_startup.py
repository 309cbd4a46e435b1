"""A fast start: ``tf-family --help`` / ``list`` and ``import tf_family`` import no heavy module, and the late
registration with the Auto classes (`tf_family.lazy_auto`: public ``register`` calls, the configs when transformers'
``configuration_auto`` is imported, an architecture's model classes when its first config is built) registers the
same classes as the eager one, whatever is imported first.

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


def test_late_registration_imports_only_the_model_classes_of_the_configs_built():
    """The configs are registered when the Auto classes are imported, the model classes of an architecture when its
    first config is built: only that architecture's modeling module is imported."""
    code = """
import json, sys
import tf_family
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
config_class = CONFIG_MAPPING["tff_longformer"]
before = [config_class.__name__, config_class in AutoModelForCausalLM._model_mapping]
modeling_before = [name for name in sys.modules if name.startswith("tf_family.models.") and ".modeling_" in name]
config = AutoConfig.for_model("tff_longformer", **dict(tf_family.get_arch("longformer").variants["tiny"]))
model = AutoModelForCausalLM.from_config(config)
modeling = sorted(name for name in sys.modules if name.startswith("tf_family.models.") and ".modeling_" in name)
print(json.dumps({"before": before, "modeling_before": modeling_before, "model": type(model).__name__,
                  "config": type(config).__name__, "modeling": modeling}))
"""
    report = _run(code)
    assert report == {
        "before": ["TffLongformerConfig", False],
        "modeling_before": [],
        "model": "TffLongformerForCausalLM",
        "config": "TffLongformerConfig",
        "modeling": ["tf_family.models.longformer.modeling_longformer"],
    }


@pytest.mark.parametrize("order", ["tf_family first", "transformers first"])
def test_late_registration_matches_the_eager_one(order):
    """Whichever is imported first, every Auto class maps every config (legacy ones included, each built once here)
    to the class the eager `register_all` registers, PEFT knows the LoRA targets, the memories are pytree nodes, and
    transformers' tables of registered classes are still plain dicts (we only call ``register``)."""
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
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
tables = [CONFIG_MAPPING, *(auto_class._model_mapping for auto_class in AUTO_CLASS_BY_TASK.values())]
table_types = sorted({type(table._extra_content).__name__ for table in tables})
print(json.dumps({"wrong": wrong, "nodes": nodes, "table_types": table_types}))
"""
    )
    assert _run(code) == {"wrong": [], "nodes": ["SegmentMemory", "CompressiveMemory"], "table_types": ["dict"]}


@pytest.mark.parametrize(
    "first",
    [
        "import transformers.modeling_utils",  # imports configuration_auto half-way through its own import
        "import peft",
        "import tf_family.models.longformer.modeling_longformer",
    ],
)
def test_configs_register_whatever_imports_transformers_first(first):
    """The configs are registered once nothing of transformers or tf_family is half-imported any more, so no import
    order trips a circular import (a failed registration warns: an error here)."""
    code = f"""
import json, warnings
warnings.simplefilter("error", UserWarning)
import tf_family
{first}
from transformers import AutoConfig
print(json.dumps(type(AutoConfig.for_model("tff_transfo_xl")).__name__))
"""
    assert _run(code) == "TffTransfoXLConfig"


def test_a_config_pickled_to_a_fresh_process_finds_its_model_class(tmp_path):
    """A config is not built where it is unpickled (``torch.multiprocessing.spawn``): its rebuild registers the
    model classes all the same, and ``copy.deepcopy`` keeps it whole."""
    import copy
    import pickle

    import tf_family

    config = tf_family.get_arch("longformer").tiny_config()
    duplicate = copy.deepcopy(config)
    assert type(duplicate) is type(config) and duplicate.to_dict() == config.to_dict()
    (tmp_path / "config.pkl").write_bytes(pickle.dumps(config))
    code = f"""
import json, pickle
config = pickle.loads(open({str(tmp_path / "config.pkl")!r}, "rb").read())
from transformers import AutoModel
print(json.dumps([type(AutoModel.from_config(config)).__name__, config.hidden_size]))
"""
    assert _run(code) == ["TffLongformerModel", config.hidden_size]


def test_tf_family_writes_no_private_table_of_transformers():
    """Registration goes through transformers' public ``register`` calls: no tf_family module names the private
    ``_extra_content`` tables (they are read, as plain dicts, only by the tests)."""
    from pathlib import Path

    import tf_family

    root = Path(tf_family.__file__).parent
    naming = [str(path.relative_to(root)) for path in root.rglob("*.py") if "_extra_content" in path.read_text()]
    assert naming == []


def test_a_user_registration_of_the_same_config_wins_over_the_late_one():
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


def test_a_legacy_transfo_xl_folder_loads_after_only_importing_tf_family():
    """The legacy config (``transfo-xl``) announces itself as ours do: its folder loads through the Auto class in a
    fresh interpreter where no other config was built."""
    from pathlib import Path

    folder = Path(__file__).parent / "fixtures" / "transfo_xl_4x" / "plain_softmax_safetensors"
    code = f"""
import json
import tf_family
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained({str(folder)!r})
model = AutoModelForCausalLM.from_pretrained({str(folder)!r})
print(json.dumps([type(config).__name__, type(model).__name__]))
"""
    assert _run(code) == ["TffTransfoXLLegacyConfig", "TffTransfoXLLMHeadModel"]
