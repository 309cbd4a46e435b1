"""Retrieval over a corpus: the kNN-LM datastore (Khandelwal et al. 2020), built by running a causal LM over the
corpus and searched with the stores of `tf_family.memory.knn`. It lives apart from `tf_family.memory` because it runs
models and reads and writes folders, while `memory` holds only carried state and its pure math."""

from .datastore import (
    DatastoreMismatchError,
    KNNDatastore,
    build_datastore,
    capture_module_inputs,
    check_fingerprints,
    fingerprint_model,
    fingerprint_tokenizer,
    model_fingerprints,
    resolve_key_module,
)

__all__ = [
    "DatastoreMismatchError",
    "KNNDatastore",
    "build_datastore",
    "capture_module_inputs",
    "check_fingerprints",
    "fingerprint_model",
    "fingerprint_tokenizer",
    "model_fingerprints",
    "resolve_key_module",
]
