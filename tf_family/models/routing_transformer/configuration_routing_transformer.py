"""Configuration of the Routing Transformer (Roy, Saffar, Vaswani & Grangier 2021, arXiv:2003.05997)."""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedConfig

from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import (
    check_activation,
    check_choice,
    check_float,
    check_int,
    check_positive_int,
    check_probability,
)

ROUTING_MEMBERSHIPS = ("nearest", "balanced")


class TffRoutingTransformerConfig(PreTrainedConfig):
    r"""Configuration of `TffRoutingTransformerForCausalLM`: a pre-norm decoder whose heads are local heads (causal
    attention within a block and the block before) and routing heads (causal attention within k-means clusters of the
    shared, normalised queries/keys).

    Decoder:
        vocab_size (`int`, defaults to 256: bytes), hidden_size (`int`, 256; D), num_hidden_layers (`int`, 4; L),
        num_attention_heads (`int`, 4; H, local and routing heads together; must divide hidden_size),
        intermediate_size (`int`, 1024), hidden_act (`str`, ``"gelu"``), layer_norm_eps (`float`, 1e-5),
        initializer_range (`float`, 0.02), hidden_dropout_prob (`float`, 0.0: embeddings and residual branches),
        attention_dropout (`float`, 0.0: attention probabilities), tie_word_embeddings (`bool`, True), rope_base
        (`float`, 10000.0: rotary positions on the queries and keys of every head, and on the routing heads' values
        as the reference does), pad/bos/eos_token_id.

    Heads (section 4.2, "local and routing attention heads"):
        num_local_heads (`int`, defaults to 2): heads per layer that attend locally (0 .. H); the other
            ``H - num_local_heads`` heads route.
        local_window (`int`, defaults to 64): the local heads' block length; a query attends to the positions of
            its own block up to itself and to the whole block before (lucidrains' ``local_attn_window_size``).
        sparsity_skip_first (`int`, defaults to 0): the first ``sparsity_skip_first`` layers have local heads only
            (the paper's and google-research's hparam of that name); 0 .. L.

    Routing (section 4.1, online k-means over the shared QK):
        num_clusters (`int`, defaults to 8): k, centroids per routing head (near ``sqrt(T)`` in the paper).
        routing_membership (`str`, defaults to ``"nearest"``): ``"nearest"`` (every token joins its nearest centroid:
            strictly causal, cached decoding) or ``"balanced"`` (every centroid takes its ``cluster_size`` nearest
            tokens, the implementations' top-k: equal cluster sizes, but membership ranks a token against the whole
            sequence, so a later token can change an earlier token's clusters; generation recomputes the prefix).
        cluster_size (`int`, defaults to 64): w, members per cluster with ``"balanced"`` (lucidrains' ``window_size``).
        kmeans_ema_decay (`float`, defaults to 0.999): lambda of the centroids' moving average, in [0, 1); the
            centroids move in training forwards only.
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_routing_transformer"

    vocab_size: int = 256
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    hidden_dropout_prob: float = 0.0
    attention_dropout: float = 0.0
    num_local_heads: int = 2
    local_window: int = 64
    sparsity_skip_first: int = 0
    num_clusters: int = 8
    routing_membership: Literal["nearest", "balanced"] = "nearest"
    cluster_size: int = 64
    kmeans_ema_decay: float = 0.999
    rope_base: float = 10000.0
    tie_word_embeddings: bool = True
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        super().__post_init__(**kwargs)
        validate_config(self)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def local_heads(self, layer_idx: int) -> int:
        """How many of layer ``layer_idx``'s heads are local (all of them in the first ``sparsity_skip_first``)."""
        return self.num_attention_heads if layer_idx < self.sparsity_skip_first else self.num_local_heads

    def validate_architecture(self):
        """Cross-field rules; each error names the field, the value and the rule."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "local_window",
            "num_clusters",
            "cluster_size",
        ):
            check_positive_int(name, getattr(self, name))
        check_int(
            "num_local_heads",
            self.num_local_heads,
            minimum=0,
            maximum=self.num_attention_heads,
            fix=f"set num_local_heads between 0 and num_attention_heads={self.num_attention_heads}",
        )
        check_int(
            "sparsity_skip_first",
            self.sparsity_skip_first,
            minimum=0,
            maximum=self.num_hidden_layers,
            fix=f"set sparsity_skip_first between 0 and num_hidden_layers={self.num_hidden_layers}",
        )
        check_choice("routing_membership", self.routing_membership, ROUTING_MEMBERSHIPS)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of num_attention_heads={self.num_attention_heads}; "
                "change one of the two."
            )
        if self.head_dim % 2:
            raise ValueError(
                f"the head width hidden_size / num_attention_heads = {self.head_dim} is odd, but rotary positions "
                "rotate pairs of dimensions; choose hidden_size and num_attention_heads with an even quotient."
            )
        check_float(
            "kmeans_ema_decay",
            self.kmeans_ema_decay,
            minimum=0.0,
            maximum=1.0,
            max_open=True,
            fix="set kmeans_ema_decay in [0, 1), e.g. 0.999",
        )
        check_activation("hidden_act", self.hidden_act)
        check_float("rope_base", self.rope_base, minimum=0.0, min_open=True, fix="set rope_base > 0, e.g. 10000")
        check_float("layer_norm_eps", self.layer_norm_eps, minimum=0.0, min_open=True, fix="set layer_norm_eps > 0")
        for name in ("hidden_dropout_prob", "attention_dropout"):
            check_probability(name, getattr(self, name))


__all__ = ["ROUTING_MEMBERSHIPS", "TffRoutingTransformerConfig"]
