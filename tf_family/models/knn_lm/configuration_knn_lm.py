"""Configuration of the kNN-LM wrapper (Khandelwal et al. 2020, arXiv:1911.00172)."""

from __future__ import annotations

from typing import Literal

from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import check_float, check_positive_int

INDEX_TYPES = ("exact", "flat", "ivf_flat", "ivf_pq", "hnsw")


class TffKNNLMConfig(PreTrainedConfig):
    r"""Configuration of `TffKNNLMForCausalLM`: any causal LM plus a kNN datastore of its own representations.

    Args:
        base_config (`dict` or `PreTrainedConfig`): the wrapped causal LM's config (any ``AutoModelForCausalLM``
            model type: ``llama``, ``gpt2``, ``tff_transfo_xl`` …). A dict needs its ``model_type``.
        base_model_name_or_path (`str`, *optional*): where the base weights came from (Hub id or folder); recorded
            for provenance and shown in errors about mismatched datastores.
        datastore_path (`str`, *optional*): a datastore folder elsewhere (`tf_family.retrieval.KNNDatastore`). When
            ``None``, ``from_pretrained`` uses the ``datastore/`` sub-folder of the checkpoint if there is one.
        k (`int`, defaults to 1024): neighbours retrieved per position (k in the paper).
        lmbda (`float`, defaults to 0.25): interpolation weight of p_kNN (λ in the paper; 0 is the base LM).
        knn_temperature (`float`, defaults to 1.0): p_kNN ∝ exp(score / knn_temperature).
        distance (`str`, defaults to ``"l2"``): ``"l2"`` (score = −squared Euclidean distance, the paper's) or
            ``"ip"`` (inner product).
        index_type (`str`, defaults to ``"exact"``): the search backend: ``"exact"`` (PyTorch brute force) or a
            faiss index built into the datastore folder (``"flat"``, ``"ivf_flat"``, ``"ivf_pq"``, ``"hnsw"``).
        recompute_distances (`bool`, defaults to `True`): with an approximate index, rescore the neighbours with
            exact distances to their stored keys (the paper's default; its ``--no-load-keys`` is ``False``).
        key_point (`str`, defaults to ``"lm_head_input"``): where queries are read, as when the datastore was
            built: ``"lm_head_input"`` or ``"ffn_input"`` (input of the last feed-forward block).
        key_module_path (`str`, *optional*): a dotted module name (relative to the base model) overriding
            ``key_point``.
        pad_token_id / bos_token_id / eos_token_id (`int`, *optional*): copied from ``base_config`` when not given.
        check_datastore (`bool`, defaults to `True`): refuse a datastore whose fingerprint differs from the base
            model's (set ``False`` to force one, e.g. after fine-tuning only parts that do not change the keys).
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_knn_lm"
    sub_configs_defaults = {"base_config": SubConfigSpec(config_class=AutoConfig, model_type="llama")}

    base_config: dict | PreTrainedConfig | None = None
    base_model_name_or_path: str | None = None
    datastore_path: str | None = None
    k: int = 1024
    lmbda: float = 0.25
    knn_temperature: float = 1.0
    distance: Literal["l2", "ip"] = "l2"
    index_type: Literal["exact", "flat", "ivf_flat", "ivf_pq", "hnsw"] = "exact"
    recompute_distances: bool = True
    key_point: Literal["lm_head_input", "ffn_input"] = "lm_head_input"
    key_module_path: str | None = None
    check_datastore: bool = True
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        _check_base_config(self.base_config)
        super().__post_init__(**kwargs)
        # generation and token ids come from the wrapped model
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if getattr(self, name, None) is None and getattr(self.base_config, name, None) is not None:
                setattr(self, name, getattr(self.base_config, name))
        validate_config(self)

    @property
    def vocab_size(self) -> int:
        return self.base_config.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.base_config.hidden_size

    def get_text_config(self, *args, **kwargs) -> PreTrainedConfig:
        """The base model's config: caches and generation are sized by the wrapped model."""
        return self.base_config.get_text_config(*args, **kwargs)

    def validate_architecture(self):
        """Cross-field rules; each error names the field, the value and the rule."""
        if type(self.base_config) not in AutoModelForCausalLM._model_mapping:
            raise ValueError(
                f"base_config is a {getattr(self.base_config, 'model_type', None)!r} config, which no "
                f"AutoModelForCausalLM builds; wrap a causal language model, e.g. one of {_EXAMPLE_BASES}."
            )
        if getattr(self.base_config, "vocab_size", None) is None:
            raise ValueError("base_config must be a causal LM config with a vocab_size.")
        check_positive_int("k", self.k, fix="set k >= 1 (neighbours per position)")
        check_float("lmbda", self.lmbda, minimum=0.0, maximum=1.0, fix="set lmbda in [0, 1] (0 is the base LM)")
        check_float("knn_temperature", self.knn_temperature, minimum=0.0, min_open=True, fix="set knn_temperature > 0")


_EXAMPLE_BASES = ["llama", "gpt2", "mistral", "qwen2", "tff_transfo_xl", "tff_calm"]


def _check_base_config(base_config) -> None:
    """``base_config`` is ``None`` (a Llama default), a config object or a dict naming a known ``model_type``:
    anything else is refused here, before transformers reads it."""
    if base_config is None or isinstance(base_config, PreTrainedConfig):
        return
    if not isinstance(base_config, dict):
        hint = (
            f" ({base_config!r} is a model type name: pass {{'model_type': {base_config!r}, ...}} with the base "
            "model's fields, or its AutoConfig)"
            if isinstance(base_config, str)
            else ""
        )
        raise TypeError(
            f"TffKNNLMConfig: base_config must be a dict with a 'model_type' or a PreTrainedConfig, got "
            f"{base_config!r} ({type(base_config).__name__}){hint}; supported model types are those of "
            f"AutoModelForCausalLM, e.g. {_EXAMPLE_BASES}."
        )
    model_type = base_config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(
            f"TffKNNLMConfig: base_config needs a 'model_type' that transformers knows, got {model_type!r}; "
            f"supported model types are those of AutoModelForCausalLM, e.g. {_EXAMPLE_BASES}."
        )


__all__ = ["INDEX_TYPES", "TffKNNLMConfig"]
