"""Adapters for the evaluation and embedding clients people bring to a model zoo (lm-evaluation-harness). Each module
imports its client lazily, when it is used: tf_family itself never needs them."""
