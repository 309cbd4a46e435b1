"""Old path of `tf_family.modeling.fused_lm_head` (see `tf_family._compat`)."""

from tf_family._compat import become_moved_module

become_moved_module(__name__)
