"""Register the zoo with the transformers Auto classes (and its LoRA targets with PEFT) without importing them.

(The same hook makes `SegmentMemory` and `CompressiveMemory` pytree nodes when ``tf_family.memory`` is imported, and
gives the models' ``save_pretrained(remote_code=True)`` its exporter when ``tf_family.modeling.pretrained`` is: the top
of the package hands `tf_family.shipping.remote_code` down, the models never import it.)

``import tf_family`` must stay fast (``tf-family --help`` too: bench/bench_startup.py), so it imports neither torch nor
transformers; yet ``AutoConfig.from_pretrained`` / ``AutoModelForCausalLM.from_config`` must know our model types
after it. `install` does this in two steps:

- when transformers' ``configuration_auto`` / ``modeling_auto`` module (or PEFT's ``utils.constants``) is imported
  (at once, if it already is), the registry's entries are added to its tables: for the Auto classes, as
  `Deferred` references to our classes, nothing imported;
- a `Deferred` class is imported the first time transformers reads the entry (``AutoModel.from_config(config)``
  imports that one modeling file). Transformers keeps its registered classes in a plain dict
  (``_extra_content``) of each table; `install` makes it a `ResolvingDict`, a dict that imports a deferred class
  when it is read and otherwise behaves the same for the classes others register.

Nothing of our code is imported while transformers is itself importing (an import hook runs the moment a module has
finished executing, when transformers' own import may still be part-way): only strings are added then.
`tf_family.auto.register_all` is the eager twin: it registers the same classes, imported now.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from .registry import ARCHITECTURES

CONFIG_AUTO = "transformers.models.auto.configuration_auto"
MODELING_AUTO = "transformers.models.auto.modeling_auto"
PEFT_CONSTANTS = "peft.utils.constants"
MEMORY = f"{__name__.rpartition('.')[0]}.memory"
PRETRAINED = f"{__name__.rpartition('.')[0]}.modeling.pretrained"

# task -> the name of the Auto class in transformers.models.auto.modeling_auto (as in `tf_family.auto`)
AUTO_CLASS_NAME_BY_TASK = {
    "base": "AutoModel",
    "causal_lm": "AutoModelForCausalLM",
    "masked_lm": "AutoModelForMaskedLM",
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "question_answering": "AutoModelForQuestionAnswering",
    "multiple_choice": "AutoModelForMultipleChoice",
    "action": "AutoModel",
}


class Deferred:
    """A class that is imported (by ``load``) the first time a `ResolvingDict` hands it out."""

    __slots__ = ("load", "what")

    def __init__(self, load: Callable[[], Any], what: str):
        self.load = load
        self.what = what

    def __repr__(self) -> str:
        return f"Deferred({self.what})"


class ResolvingDict(dict):
    """A dict whose `Deferred` keys and values are imported when it is read.

    Keys that are `Deferred` (config classes, the keys of transformers' model tables) are all imported at the first
    read of any kind (config modules are light once transformers is loaded); a `Deferred` value (a model class) is
    imported when its entry is read. A key registered as a real class wins over a deferred one for the same class.
    """

    def _settle_keys(self) -> None:
        pending = [key for key in dict.keys(self) if isinstance(key, Deferred)]
        for key in pending:
            value = dict.pop(self, key)
            real = key.load()
            if not dict.__contains__(self, real):
                dict.__setitem__(self, real, value)

    def _value(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if isinstance(value, Deferred):
            value = value.load()
            dict.__setitem__(self, key, value)
        return value

    def __contains__(self, key: object) -> bool:
        self._settle_keys()
        return dict.__contains__(self, key)

    def __getitem__(self, key: Any) -> Any:
        self._settle_keys()
        return self._value(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._settle_keys()
        return self._value(key) if dict.__contains__(self, key) else default

    def keys(self):  # type: ignore[override]
        self._settle_keys()
        return dict.keys(self)

    def __iter__(self):
        self._settle_keys()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._settle_keys()
        return dict.__len__(self)

    def values(self):  # type: ignore[override]
        return [self._value(key) for key in list(self.keys())]

    def items(self):  # type: ignore[override]
        return [(key, self._value(key)) for key in list(self.keys())]

    def pop(self, key: Any, *default: Any) -> Any:
        self._settle_keys()
        if dict.__contains__(self, key):
            value = self._value(key)
            dict.__delitem__(self, key)
            return value
        return dict.pop(self, key, *default)

    def copy(self) -> ResolvingDict:
        return ResolvingDict(self.items())

    def __reduce__(self):
        return (dict, (dict(self.items()),))


def resolving(table: Any) -> ResolvingDict:
    """``table._extra_content`` (a transformers Auto table's registered classes), made a `ResolvingDict` in place."""
    content = table._extra_content
    if not isinstance(content, ResolvingDict):
        content = ResolvingDict(content)
        table._extra_content = content
    return content


def _deferred_config(reference: Any, what: str) -> Deferred:
    from .spec import import_object

    return Deferred(lambda: import_object(reference), what)


def register_configs(configuration_auto: Any) -> None:
    """Add every model type of the registry to ``CONFIG_MAPPING`` as a deferred config class; a model type someone
    already registered is left as it is."""
    content = resolving(configuration_auto.CONFIG_MAPPING)
    for spec in ARCHITECTURES.values():
        pairs = [(spec.model_type, spec.config), *zip(spec.legacy_model_types, spec.legacy, strict=True)]
        for model_type, reference in pairs:
            if not dict.__contains__(content, model_type):
                dict.__setitem__(content, model_type, _deferred_config(reference, model_type))


def register_models(modeling_auto: Any) -> None:
    """Add every (config, task) of the registry to the model table of its Auto class, both deferred; a config class
    already registered there (by `tf_family.auto.register_all` or the user) is left as it is."""
    for spec in ARCHITECTURES.values():
        for task in spec.models:
            if task not in AUTO_CLASS_NAME_BY_TASK:
                continue
            table = getattr(modeling_auto, AUTO_CLASS_NAME_BY_TASK[task])._model_mapping
            content = resolving(table)
            config = Deferred(lambda spec=spec: spec.config_class, spec.model_type)
            model = Deferred(lambda spec=spec, task=task: spec.model_classes[task], f"{spec.name} {task}")
            dict.__setitem__(content, config, model)
            for index, legacy_type in enumerate(spec.legacy_model_types):
                legacy_config = Deferred(lambda spec=spec, i=index: spec.legacy_configs[i], legacy_type)
                legacy_model = Deferred(
                    lambda spec=spec, i=index, task=task: _legacy_model(spec.legacy_configs[i], task),
                    f"{legacy_type} {task}",
                )
                dict.__setitem__(content, legacy_config, legacy_model)


def _legacy_model(legacy_config: type, task: str) -> type:
    from .auto import legacy_model_class

    return legacy_model_class(legacy_config, task)


def register_peft_targets(constants: Any) -> None:
    """Each spec's ``lora_target_modules`` and ``ia3_target_modules`` / ``ia3_feedforward_modules`` as PEFT's
    defaults for its model types (an entry already there, the user's, is kept): the same as
    `tf_family.auto.register_lora_targets` and `tf_family.auto.register_ia3_targets`, run when PEFT's constants are
    imported rather than importing PEFT."""
    lora = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    ia3 = constants.TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING
    ia3_feedforward = constants.TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING
    for spec in ARCHITECTURES.values():
        for model_type in spec.model_types:
            lora.setdefault(model_type, list(spec.lora_target_modules))
            if spec.ia3_target_modules and model_type not in ia3:
                ia3[model_type] = list(spec.ia3_target_modules)
                ia3_feedforward[model_type] = list(spec.ia3_feedforward_modules)


def register_pytree_nodes(memory: Any) -> None:
    """`tf_family.memory.register_pytree_nodes` once that package is imported (torch.export traces the models that
    return a `SegmentMemory` / `CompressiveMemory`)."""
    memory.register_pytree_nodes()


def export_remote_code(folder: Any) -> list[str]:
    """`tf_family.shipping.remote_code.export_remote_code` (imported when first called: the exporter reads the registry)."""
    from .shipping.remote_code import export_remote_code

    return export_remote_code(folder)


def register_remote_code_exporter(pretrained: Any) -> None:
    """Give `tf_family.modeling.pretrained.TffPreTrainedModel` (``save_pretrained(remote_code=True)``) its exporter once
    that module is imported."""
    pretrained.TffPreTrainedModel.code_exporter = staticmethod(export_remote_code)


_HOOKS: dict[str, Callable[[Any], None]] = {
    CONFIG_AUTO: register_configs,
    MODELING_AUTO: register_models,
    PEFT_CONSTANTS: register_peft_targets,
    MEMORY: register_pytree_nodes,
    PRETRAINED: register_remote_code_exporter,
}
_lock = threading.RLock()
_pending: dict[str, Callable[[Any], None]] = {}


def _run(name: str, module: Any) -> None:
    with _lock:
        hook = _pending.pop(name, None)
    if hook is None:
        return
    try:
        hook(module)
    except Exception as error:  # never break the user's import of transformers or PEFT
        warnings.warn(
            f"tf_family could not register its architectures with {name} ({error!r}); call "
            "tf_family.register_all() to register them now.",
            stacklevel=2,
        )


class _AfterExec(importlib.abc.Loader):
    """Wraps a module's loader: runs the module, then our hook for it."""

    def __init__(self, loader: Any, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _run(self._name, module)

    def __getattr__(self, attribute: str) -> Any:  # get_resource_reader, get_source, ... of the real loader
        return getattr(self._loader, attribute)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module we wait for, it asks the finders after it and wraps the loader found."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _AfterExec(spec.loader, fullname)
        return spec


_finder = _Finder()


def install() -> None:
    """Register lazily with every table named in ``_HOOKS``: now for a module already imported, else the moment it
    is. Idempotent."""
    with _lock:
        for name, hook in _HOOKS.items():
            if name not in _pending:
                _pending[name] = hook
        if not any(finder is _finder for finder in sys.meta_path):
            sys.meta_path.insert(0, _finder)
    for name in list(_HOOKS):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__spec__", None) is not None and not _importing(module):
            _run(name, module)


def _importing(module: Any) -> bool:
    """Whether ``module`` is still executing (its import has not finished): its spec says so."""
    return bool(getattr(module.__spec__, "_initializing", False))


__all__ = ["Deferred", "ResolvingDict", "install", "register_configs", "register_models", "register_peft_targets"]
