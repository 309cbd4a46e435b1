"""The old import paths of modules that moved into packages (``tf_family.validation`` is now
`tf_family.modeling.validation`, ``tf_family.hub`` is `tf_family.shipping.hub` ...).

``tf_family/__init__.py`` adds this folder to the package's ``__path__``, so ``import tf_family.validation`` finds the
file of that name here; each file makes the old name the moved module itself (``sys.modules``), so that attributes,
``isinstance`` checks and ``monkeypatch.setattr("tf_family.validation.X", ...)`` reach the one module. tf_family's own
code imports the new paths; these are for code written against the old ones.
"""

import importlib
import sys

# old name (below tf_family) -> the module it names now
MOVED = {
    "cache_utils": "tf_family.modeling.cache",
    "cards": "tf_family.shipping.cards",
    "configuration_utils": "tf_family.modeling.configuration",
    "files": "tf_family.utils.files",
    "fused_lm_head": "tf_family.modeling.fused_lm_head",
    "hub": "tf_family.shipping.hub",
    "losses": "tf_family.modeling.losses",
    "modeling_heads": "tf_family.modeling.heads",
    "modeling_outputs": "tf_family.modeling.outputs",
    "modeling_utils": "tf_family.modeling.utils",
    "onnx_export": "tf_family.shipping.onnx_export",
    "remote_code": "tf_family.shipping.remote_code",
    "user_errors": "tf_family.utils.user_errors",
    "validation": "tf_family.modeling.validation",
}


def become_moved_module(old_name: str) -> None:
    """Make the module being imported as ``old_name`` (``tf_family.validation``) the module it moved to."""
    sys.modules[old_name] = importlib.import_module(MOVED[old_name.removeprefix("tf_family.")])
