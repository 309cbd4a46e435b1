"""The zoo's one table: every model folder's `ArchSpec`, in order.

Everything that iterates over "all architectures" reads `ARCHITECTURES`: Auto registration (`tf_family.auto`),
the common tester (`tests/common/`), `tf-family list` and ``convert``, the README table and the recipes' ``--arch``
choices. Each architecture declares its own spec in ``tf_family/models/<arch>/__init__.py``; a new architecture
joins the zoo by adding its ``SPEC`` here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .models.big_bird import SPEC as BIG_BIRD
from .models.calm import SPEC as CALM
from .models.compressive import SPEC as COMPRESSIVE
from .models.decision_transformer import SPEC as DECISION_TRANSFORMER
from .models.knn_lm import SPEC as KNN_LM
from .models.linformer import SPEC as LINFORMER
from .models.longformer import SPEC as LONGFORMER
from .models.memorizing import SPEC as MEMORIZING
from .models.performer import LINEAR_TRANSFORMER, RFA
from .models.performer import SPEC as PERFORMER
from .models.reformer import SPEC as REFORMER
from .models.routing_transformer import SPEC as ROUTING_TRANSFORMER
from .models.spalm import SPEC as SPALM
from .models.sparse_transformer import SPEC as SPARSE_TRANSFORMER
from .models.transfo_xl import SPEC as TRANSFO_XL
from .models.universal_transformer import SPEC as UNIVERSAL_TRANSFORMER
from .spec import ArchSpec, Task
from .utils.user_errors import did_you_mean

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ARCHITECTURES: Mapping[str, ArchSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            TRANSFO_XL,
            COMPRESSIVE,
            MEMORIZING,
            LONGFORMER,
            BIG_BIRD,
            REFORMER,
            KNN_LM,
            CALM,
            DECISION_TRANSFORMER,
            PERFORMER,
            LINEAR_TRANSFORMER,
            RFA,
            LINFORMER,
            UNIVERSAL_TRANSFORMER,
            SPARSE_TRANSFORMER,
            ROUTING_TRANSFORMER,
            SPALM,
        )
    }
)


def list_architectures() -> list[str]:
    """Names of every architecture in the zoo, in table order."""
    return list(ARCHITECTURES)


def get_arch(name: str) -> ArchSpec:
    """The `ArchSpec` called ``name``, or a `ValueError` listing the valid names."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(
            f"Unknown architecture {name!r}{did_you_mean(str(name), ARCHITECTURES)}; choose one of "
            f"{list_architectures()}."
        ) from None


def find_arch(model_type: str | None) -> ArchSpec | None:
    """The `ArchSpec` whose models load folders of ``model_type`` (its own type or a legacy one), or ``None`` for a
    model type that is not ours (a plain transformers model)."""
    return next((spec for spec in ARCHITECTURES.values() if model_type in spec.model_types), None)


def public_names(specs: Iterable[ArchSpec] | None = None) -> dict[str, str]:
    """``Name -> module`` of every architecture's public names (`ArchSpec.public_names`), which ``tf_family`` offers
    at its top level; two architectures that export one name from different modules are refused."""
    names: dict[str, str] = {}
    for spec in ARCHITECTURES.values() if specs is None else specs:
        for name, module in spec.public_names().items():
            if names.setdefault(name, module) != module:
                raise ValueError(
                    f"ArchSpec {spec.name!r} exports {name!r} from {module}, but another architecture exports it from "
                    f"{names[name]}; rename one of the two classes."
                )
    return names


def create_model(
    name: str, task: str = "causal_lm", variant: str = "tiny", **config_overrides: Any
) -> PreTrainedModel:
    """Build a randomly initialised model: ``create_model("transfo_xl", "causal_lm", "small", mem_len=256)``."""
    spec = get_arch(name)
    if task not in spec.model_classes:
        raise ValueError(f"{name} has no {task!r} model; its tasks are {list(spec.model_classes)}.")
    return spec.model_classes[task](spec.make_config(variant, **config_overrides))


__all__ = [
    "ARCHITECTURES",
    "ArchSpec",
    "Task",
    "create_model",
    "find_arch",
    "get_arch",
    "list_architectures",
    "public_names",
]
