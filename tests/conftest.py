import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import tf_family  # noqa: E402,F401  (registers the Auto classes)

torch.set_num_threads(2)

# Property-based tests: a fixed example budget in CI ("ci", the default), deeper runs with
# `pytest --hypothesis-profile=long`. derandomize keeps CI reproducible; deadline=None because a tiny model's first
# forward pays for lazy initialisation.
from hypothesis import HealthCheck, settings  # noqa: E402

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, suppress_health_check=_SLOW_OK)
settings.register_profile("long", max_examples=500, deadline=None, suppress_health_check=_SLOW_OK)
settings.load_profile(os.environ.get("TF_FAMILY_HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser):
    parser.addoption(
        "--fuzz-report",
        dest="fuzz_report",
        default=None,
        help="write the fuzzing suite's outcome counts to this JSON file",
    )
