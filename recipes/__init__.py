"""Accelerate recipes (installed as ``tf_family.recipes``): ``accelerate launch -m tf_family.recipes.causal_lm``."""
