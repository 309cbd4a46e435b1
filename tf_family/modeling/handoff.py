"""What the top of the package hands down to the modules that travel inside a remote-code export.

Those modules (the configs' checks, `TffPreTrainedModel`) never import the top of the package (DESIGN §1: the
registry, the exporter and the Auto registration sit above them); ``import tf_family`` sets these two names instead
(`tf_family.lazy_auto.install`). In an export this file is copied beside the models and both stay None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# ``(config class) -> None``: called by every config the moment it is built (`validate_config`); registers its
# architecture's model classes with the Auto classes (`tf_family.auto.register_models`)
config_built: Callable[[type], None] | None = None
# ``(folder) -> files written``: ``save_pretrained(remote_code=True)``'s exporter
# (`tf_family.shipping.remote_code.export_remote_code`)
code_exporter: Callable[[Any], Any] | None = None


def announce_config(config_class: type) -> None:
    """Tell the top of the package that a ``config_class`` was built (nothing in an export)."""
    if config_built is not None:
        config_built(config_class)
