"""The accelerate config files shipped in recipes/ parse with accelerate and say what their names promise.

FSDP and DeepSpeed need GPUs (accelerate ignores them on CPU), so they are not run here; the two-CPU-process config
is run by test_multiprocess.py's equivalent command line.
"""

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import ClusterConfig

CONFIGS = Path(__file__).resolve().parents[2] / "recipes" / "accelerate_configs"


@pytest.mark.parametrize(
    ("name", "distributed_type"),
    [("two_cpu_processes.yaml", "MULTI_GPU"), ("fsdp.yaml", "FSDP"), ("deepspeed_zero2.yaml", "DEEPSPEED")],
)
def test_config_parses(name, distributed_type):
    config = ClusterConfig.from_yaml_file(str(CONFIGS / name))
    assert str(config.distributed_type).split(".")[-1] == distributed_type
    assert config.num_processes == 2 and config.num_machines == 1
    if distributed_type == "FSDP":
        assert config.fsdp_config["fsdp_version"] == 2
        assert config.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    if distributed_type == "DEEPSPEED":
        assert config.deepspeed_config["zero_stage"] == 2
