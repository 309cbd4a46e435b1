"""The configuration fields every Transformer-XL-family config shares (Transformer-XL, the Compressive Transformer,
the Memorizing Transformer), their derived defaults and their validation, written once.

A family config subclasses `XLFamilyConfig`, redeclares the fields whose default differs (a dataclass keeps the
field's place and takes the new default), adds its own fields, documents every field in its own docstring, and
extends `validate_architecture` with its own rules after ``super().validate_architecture()``.
"""

from __future__ import annotations

from dataclasses import field

from transformers import PreTrainedConfig

from ..modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ..modeling.validation import check_int, check_nonnegative_int, check_positive_int, check_probability


class XLFamilyConfig(PreTrainedConfig):
    r"""The fields of a Transformer-XL-family language model, with Transformer-XL's defaults (the WikiText-103
    model of Dai et al. 2019). Not a model of its own: `TffTransfoXLConfig`, `TffCompressiveConfig` and
    `TffMemorizingConfig` subclass it and document the fields.
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    keys_to_ignore_at_inference = ["mems"]
    attribute_map = {"hidden_size": "d_model", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}

    vocab_size: int = 267735
    cutoffs: list[int] = field(default_factory=lambda: [20000, 40000, 200000])
    d_model: int = 1024
    d_embed: int | None = None
    n_head: int = 16
    d_head: int | None = None
    d_inner: int = 4096
    div_val: int = 4
    pre_lnorm: bool = False
    n_layer: int = 18
    mem_len: int = 1600
    clamp_len: int = 1000
    same_length: bool = True
    proj_share_all_but_first: bool = True
    untie_r: bool = True
    dropout: float = 0.1
    dropatt: float = 0.0
    proj_init_std: float = 0.01
    init_std: float = 0.02
    layer_norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = 0

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        if self.d_embed is None:
            self.d_embed = self.d_model
        if self.d_head is None:
            # derived from valid values only: a wrong d_model / n_head is then reported by name (validate_config)
            sizes = (self.d_model, self.n_head)
            self.d_head = self.d_model // self.n_head if all(type(v) is int and v > 0 for v in sizes) else 0
        super().__post_init__(**kwargs)
        validate_config(self)

    @property
    def tie_projs(self) -> list[bool]:
        """Per cluster, whether its output projection is tied to an input projection."""
        return [False] + [self.proj_share_all_but_first] * len(self.cutoffs)

    def validate_architecture(self):
        """Cross-field rules of the family's fields; each error names the field, the value and the rule."""
        for name in ("vocab_size", "d_model", "d_embed", "n_head", "d_inner", "n_layer", "div_val"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("d_head", self.d_head, fix="set d_head >= 1 (unset, it is d_model // n_head)")
        check_nonnegative_int("mem_len", self.mem_len, fix="set mem_len >= 0 (0 disables the memory)")
        check_int("clamp_len", self.clamp_len, fix="clamp_len <= 0 disables clamping")
        if self.d_model % 2:
            raise ValueError(f"d_model must be even (sinusoid position embeddings), got {self.d_model}.")
        if self.cutoffs != sorted(set(self.cutoffs)) or any(c <= 0 or c >= self.vocab_size for c in self.cutoffs):
            raise ValueError(
                f"cutoffs must be strictly increasing and within (0, vocab_size={self.vocab_size}), got {self.cutoffs}."
            )
        if self.div_val > 1 and self.d_embed // self.div_val ** len(self.cutoffs) < 1:
            raise ValueError(
                f"div_val={self.div_val} with {len(self.cutoffs)} cutoffs shrinks the last cluster's embedding of "
                f"d_embed={self.d_embed} to zero width; lower div_val or raise d_embed."
            )
        if self.same_length and self.mem_len == 0:
            raise ValueError(
                "same_length=True makes every query attend to the mem_len most recent positions, so it needs "
                "mem_len > 0; set same_length=False for a model without memory."
            )
        for name in ("dropout", "dropatt"):
            check_probability(name, getattr(self, name))


# the fields every family config has, with the same meaning and the same weights: fine-tuning a Transformer-XL
# checkpoint into a Memorizing Transformer (paper section 4.5) copies them
XL_FAMILY_FIELDS = tuple(name for name in XLFamilyConfig.__annotations__ if not name.startswith("_"))

__all__ = ["XL_FAMILY_FIELDS", "XLFamilyConfig"]
