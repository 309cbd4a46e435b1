"""Register the zoo with the transformers Auto classes (and its LoRA / IA3 targets with PEFT) through their public
API, each piece as late as it can be, so that ``import tf_family`` imports neither torch nor transformers.

Why late: ``import tf_family`` must stay fast (``tf-family --help`` too: bench/bench_startup.py), and importing
transformers' Auto classes, which any call to ``AutoConfig.register`` needs, alone takes longer than the whole budget
(bench/results/startup_registration.md). So `install` (run by ``import tf_family``) registers:

- the **configs**, with ``AutoConfig.register(model_type, config_class)``, the moment transformers'
  ``configuration_auto`` module has been imported (at once, if it already is): `register_configs`. That is the one
  thing this module needs an import hook for: `_Finder` wraps the loader of that module (and of PEFT's constants
  module) and calls the public registration after the module has run. Until the configs are registered it also wraps
  the loaders of the ``transformers.*`` and ``tf_family.*`` modules imported meanwhile, only to know when none is
  half-imported (our config modules import transformers; registering in the middle of transformers' own import would
  import it half-made); it changes none of them and stops once the configs are registered;
- the **model classes** of an architecture, with ``AutoModel*.register(config_class, model_class)``, the first time a
  config of that architecture is built (`config_built`, handed to every config's checks through
  `tf_family.modeling.handoff`): ``AutoModel*.from_pretrained`` / ``from_config``, pipelines and the libraries
  built on them (TRL, lm-eval) build the config before they look its model class up;
- **PEFT's default targets** (its public ``TRANSFORMERS_MODELS_TO_*_MODULES_MAPPING`` dicts) when
  ``peft.utils.constants`` is imported (at once, if it already is): `register_peft_targets`, strings only.

A user's own registration of one of our model types or config classes is left as it is. `tf_family.auto.register_all`
is the eager twin: it registers everything now.
"""

from __future__ import annotations

import copyreg
import importlib.abc
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from .modeling import handoff
from .registry import ARCHITECTURES

CONFIG_AUTO = "transformers.models.auto.configuration_auto"
PEFT_CONSTANTS = "peft.utils.constants"


def register_configs(configuration_auto: Any) -> None:
    """``AutoConfig.register`` for every model type of the registry (legacy ones included); a model type already
    known to transformers (the user's registration) is left as it is."""
    for spec in ARCHITECTURES.values():
        for config_class in (spec.config_class, *spec.legacy_configs):
            if config_class.model_type not in configuration_auto.CONFIG_MAPPING:
                configuration_auto.AutoConfig.register(config_class.model_type, config_class)


def register_peft_targets(constants: Any) -> None:
    """Each spec's ``lora_target_modules`` and ``ia3_target_modules`` / ``ia3_feedforward_modules`` as PEFT's
    defaults for its model types (an entry already there, the user's, is kept): `tf_family.auto.register_lora_targets`
    and `tf_family.auto.register_ia3_targets` on the module just imported."""
    lora = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    ia3 = constants.TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING
    ia3_feedforward = constants.TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING
    for spec in ARCHITECTURES.values():
        for model_type in spec.model_types:
            lora.setdefault(model_type, list(spec.lora_target_modules))
            if spec.ia3_target_modules and model_type not in ia3:
                ia3[model_type] = list(spec.ia3_target_modules)
                ia3_feedforward[model_type] = list(spec.ia3_feedforward_modules)


_SPEC_BY_MODEL_TYPE = {model_type: spec for spec in ARCHITECTURES.values() for model_type in spec.model_types}
_announced: set[type] = set()  # config classes seen by `config_built`
_registered: set[str] = set()  # names of the architectures whose model classes are registered
_lock = threading.RLock()


def config_built(config_class: type) -> None:
    """Register the model classes of ``config_class``'s architecture with the Auto classes, the first time one of
    its configs is built (`tf_family.auto.register_models`, keeping a user's registration); then nothing.

    A config pickled to another process (``torch.multiprocessing.spawn``) is not built there, only filled in: so
    ``config_class`` is also given a `copyreg` reducer whose rebuild (`rebuild_config`) announces it the same way."""
    if config_class in _announced:
        return
    spec = _SPEC_BY_MODEL_TYPE.get(getattr(config_class, "model_type", None))
    with _lock:
        if config_class not in _announced:
            _announced.add(config_class)
            copyreg.pickle(config_class, _reduce_config)
        if spec is None or spec.name in _registered:  # done, or a config built while the model classes import
            return
        _registered.add(spec.name)
        try:
            from .auto import register_models

            register_models(spec, replace=False)
        except Exception as error:  # never break building a config; the next one tries again
            _registered.discard(spec.name)
            _announced.discard(config_class)
            warnings.warn(
                f"tf_family could not register the {spec.name} model classes with the Auto classes ({error!r}); "
                "call tf_family.register_all() to register them now.",
                stacklevel=2,
            )


def rebuild_config(config_class: type) -> Any:
    """An empty ``config_class`` for pickle or ``copy`` to fill in (as ``object.__reduce_ex__`` makes one), after
    `config_built` (the model classes registered in the process that unpickles it)."""
    config_built(config_class)
    return config_class.__new__(config_class)


def _reduce_config(config: Any) -> tuple:
    return rebuild_config, (type(config),), config.__getstate__()


def export_remote_code(folder: Any) -> list[str]:
    """`tf_family.shipping.remote_code.export_remote_code` (imported when first called: the exporter reads the
    registry), handed down to ``save_pretrained(remote_code=True)``."""
    from .shipping.remote_code import export_remote_code

    return export_remote_code(folder)


_HOOKS: dict[str, Callable[[Any], None]] = {CONFIG_AUTO: register_configs, PEFT_CONSTANTS: register_peft_targets}
# Registering the configs imports our config modules, which import transformers (``GenerationMixin``...); done while
# a transformers or tf_family module is still executing (``import transformers.modeling_utils`` imports
# ``configuration_auto`` half-way) it would import that module half-made. So while the configs wait, the loader of
# every module under these prefixes is wrapped too, and the configs are registered when none is executing any more.
_WATCHED = ("transformers.", "tf_family.")
_pending: dict[str, Callable[[Any], None]] = {}
_ready: dict[str, Any] = {}  # modules imported whose hook waits for `_executing` to empty
_executing: set[str] = set()  # watched modules executing now, under `_AfterExec`


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


def _run_ready() -> None:
    """Run the hooks of the modules imported, once no watched module is executing (in any thread)."""
    with _lock:
        if _executing or not _ready:
            return
        ready = list(_ready.items())
        _ready.clear()
    for name, module in ready:
        _run(name, module)


class _AfterExec(importlib.abc.Loader):
    """Wraps a module's loader: runs the module, then the hooks that were waiting for it (or for it to finish)."""

    def __init__(self, loader: Any, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        with _lock:
            _executing.add(self._name)
        try:
            self._loader.exec_module(module)
        finally:
            with _lock:
                _executing.discard(self._name)
                if self._name in _pending:
                    _ready[self._name] = module
        _run_ready()

    def __getattr__(self, attribute: str) -> Any:  # get_resource_reader, get_source, ... of the real loader
        return getattr(self._loader, attribute)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module in ``_pending`` (or under ``_WATCHED`` while the configs wait), asks the
    finders after it and wraps the loader found."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending and not (CONFIG_AUTO in _pending and fullname.startswith(_WATCHED)):
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
    """Hand the configs and `TffPreTrainedModel` their callbacks (`tf_family.modeling.handoff`), and register with
    the modules of ``_HOOKS``: now for one already imported, else the moment it is. Idempotent."""
    handoff.config_built = config_built
    handoff.code_exporter = export_remote_code
    with _lock:
        for name, hook in _HOOKS.items():
            if name not in _pending:
                _pending[name] = hook
        if not any(finder is _finder for finder in sys.meta_path):
            sys.meta_path.insert(0, _finder)
    for name in list(_HOOKS):
        module = sys.modules.get(name)
        if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
            _run(name, module)


__all__ = ["config_built", "install", "rebuild_config", "register_configs", "register_peft_targets"]
