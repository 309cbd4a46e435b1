"""Configuration of the Reformer (Kitaev, Kaiser & Levskaya 2020, arXiv:2001.04451)."""

from __future__ import annotations

import math
from typing import Literal

from transformers import PreTrainedConfig

from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import (
    MAX_SIZE,
    check_float,
    check_nonnegative_int,
    check_positive_int,
    check_probability,
    check_seed,
)


class TffReformerConfig(PreTrainedConfig):
    r"""Configuration of a Reformer: reversible residual layers whose self-attention is either LSH attention
    (shared-QK, hashed into buckets, sorted and chunked) or local chunked attention, per layer.

    Defaults reproduce transformers' `ReformerConfig` defaults (the shapes of `google/reformer-crime-and-punishment`
    apart from its axial shape and bucket count).

    Args:
        vocab_size (`int`, defaults to 320): number of tokens.
        hidden_size (`int`, defaults to 256): width ``d_model`` of each of the two residual streams (the final
            layer norm and the output heads see both, ``2 * hidden_size``).
        attn_layers (`list[str]`, defaults to ``["local", "lsh"] * 3``): the attention of every layer, ``"lsh"`` or
            ``"local"``; its length is the number of layers.
        num_hidden_layers (`int`, *optional*): ``len(attn_layers)`` (derived; given values must agree).
        num_attention_heads (`int`, defaults to 12): heads ``H``.
        attention_head_size (`int`, defaults to 64): head width ``Dh`` (heads * width need not equal hidden_size).
        feed_forward_size (`int`, defaults to 512): width ``d_ff`` of the feed-forward block.
        hidden_act (`str`, defaults to `"relu"`): feed-forward activation.
        hidden_dropout_prob (`float`, defaults to 0.05): dropout on embeddings and sub-layer outputs.
        lsh_attention_probs_dropout_prob, local_attention_probs_dropout_prob (`float`, defaults to 0.0 / 0.05):
            dropout on the attention probabilities of each kind of layer.
        lsh_attn_chunk_length (`int`, defaults to 64): LSH chunk length ``m`` (section 2.2); inputs no longer than
            one chunk take the dense shared-QK path (same result, chosen per call).
        lsh_num_chunks_before, lsh_num_chunks_after (`int`, defaults to 1 / 0): neighbouring chunks an LSH chunk
            also attends to.
        local_attn_chunk_length, local_num_chunks_before, local_num_chunks_after (`int`, 64 / 1 / 0): the same for
            local attention.
        num_hashes (`int`, defaults to 1): hashing rounds ``n_rounds`` (section 2.2); a call may pass another.
        num_buckets (`int`, `list[int]` or `None`, defaults to `None`): buckets ``n_buckets`` (even), or factors of
            a factorised count; ``None`` chooses ``~2 * T / m`` per call (never written back into the config).
        hash_seed (`int`, defaults to 0): seed of the hashing rotations (a `torch.Generator`; all LSH layers share
            it, as in transformers with ``hash_seed`` set); a call may pass another.
        correct_duplicates (`bool`, defaults to `False`): subtract ``log`` of how often a query met a key over the
            rounds, so that each distinct key counts once (section 2.2's "duplicate attention" fix).
        chunk_wrap_around (`bool`, defaults to `False`): transformers' chunking (neighbouring chunks found with a roll
            over all hashing rounds, so the first chunk sees the last; inputs padded to a multiple of the chunk
            lengths' least common multiple). For parity with transformers' checkpoints; off, rounds stay apart and
            nothing wraps.
        causal (`bool`, defaults to `False`): causal attention (a decoder; transformers' ``is_decoder``);
            `TffReformerForCausalLM` sets it.
        position_embedding_type (`str`, defaults to `"axial"`): ``"axial"`` (transformers' factorised positions),
            ``"absolute"`` (learned, ``max_position_embeddings``) or ``"rotary"`` (rotary query/key rotation; no
            embedding added).
        axial_pos_shape (`list[int]`, defaults to ``[64, 64]``): the axial grid; its product bounds the positions.
            Any length up to it trains (transformers requires exactly the product in training).
        axial_pos_embds_dim (`list[int]`, defaults to ``[64, 192]``): widths of the two axial factors (sum to
            ``hidden_size``).
        axial_norm_std (`float`, defaults to 1.0): std of the axial weights' init.
        max_position_embeddings (`int`, defaults to 4096): longest input (absolute and rotary positions; automatic
            bucket factorisation).
        rotary_base (`float`, defaults to 10000.0): base of the rotary frequencies.
        chunk_size_feed_forward (`int`, defaults to 0): positions per feed-forward call (0: all at once).
        chunk_size_lm_head (`int`, defaults to 0): positions per output-head call (0: all at once).
        reversible (`bool`, defaults to `True`): reversible residual layers (activations recomputed in the
            backward, memory flat in depth); `False` keeps every activation (and allows gradient checkpointing).
        reversible_threshold (`int`, defaults to 0): inputs shorter than this train without reversibility (cheaper
            when activations are small).
        layer_norm_eps (`float`, defaults to 1e-12): epsilon of the layer norms.
        initializer_range (`float`, defaults to 0.02): standard deviation of the initial weights.
        pad_token_id (`int`, defaults to 0): the padding token.
        eos_token_id (`int`, defaults to 2): the end-of-sequence token.
        bos_token_id (`int`, *optional*): the beginning-of-sequence token.
        classifier_dropout (`float`, *optional*): dropout of the classification head (else `hidden_dropout_prob`).
        tie_word_embeddings (`bool`, defaults to `False`): share the input embedding with the output projection.
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_reformer"

    vocab_size: int = 320
    hidden_size: int = 256
    attn_layers: list[str] | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int = 12
    attention_head_size: int = 64
    feed_forward_size: int = 512
    hidden_act: str = "relu"
    hidden_dropout_prob: float = 0.05
    lsh_attention_probs_dropout_prob: float = 0.0
    local_attention_probs_dropout_prob: float = 0.05
    lsh_attn_chunk_length: int = 64
    lsh_num_chunks_before: int = 1
    lsh_num_chunks_after: int = 0
    local_attn_chunk_length: int = 64
    local_num_chunks_before: int = 1
    local_num_chunks_after: int = 0
    num_hashes: int = 1
    num_buckets: int | list[int] | None = None
    hash_seed: int = 0
    correct_duplicates: bool = False
    chunk_wrap_around: bool = False
    causal: bool = False
    position_embedding_type: Literal["axial", "absolute", "rotary"] = "axial"
    axial_pos_shape: list[int] | None = None
    axial_pos_embds_dim: list[int] | None = None
    axial_norm_std: float = 1.0
    max_position_embeddings: int = 4096
    rotary_base: float = 10000.0
    chunk_size_lm_head: int = 0
    reversible: bool = True
    reversible_threshold: int = 0
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = 2
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        if self.attn_layers is None:
            self.attn_layers = ["local", "lsh"] * 3
        # tuples become lists; anything else is left for validate_config to name
        if isinstance(self.attn_layers, tuple):
            self.attn_layers = list(self.attn_layers)
        if self.attn_layers == []:  # refused before a layer count of 0 is derived from it
            raise ValueError(
                "TffReformerConfig: attn_layers must be a non-empty list of 'lsh' / 'local' (one per layer), got []."
            )
        if self.num_hidden_layers is None and isinstance(self.attn_layers, list):
            self.num_hidden_layers = len(self.attn_layers)
        if self.axial_pos_shape is None:
            self.axial_pos_shape = [64, 64]
        if self.axial_pos_embds_dim is None:
            self.axial_pos_embds_dim = [64, 192]
        if isinstance(self.axial_pos_shape, tuple):
            self.axial_pos_shape = list(self.axial_pos_shape)
        if isinstance(self.axial_pos_embds_dim, tuple):
            self.axial_pos_embds_dim = list(self.axial_pos_embds_dim)
        if isinstance(self.num_buckets, tuple):
            self.num_buckets = list(self.num_buckets)
        super().__post_init__(**kwargs)
        validate_config(self)

    @property
    def max_positions(self) -> int:
        """The longest input the positions allow."""
        if self.position_embedding_type == "axial":
            return math.prod(self.axial_pos_shape)
        return self.max_position_embeddings

    def chunk_multiple(self) -> int:
        """The least common multiple of the chunk lengths of the layers' attention kinds."""
        lengths = {"lsh": self.lsh_attn_chunk_length, "local": self.local_attn_chunk_length}
        return math.lcm(*(lengths[kind] for kind in set(self.attn_layers)))

    def min_chunk_length(self) -> int:
        lengths = {"lsh": self.lsh_attn_chunk_length, "local": self.local_attn_chunk_length}
        return min(lengths[kind] for kind in set(self.attn_layers))

    def validate_architecture(self):
        """Cross-field rules; each error names the field, the value and the rule."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_attention_heads",
            "attention_head_size",
            "feed_forward_size",
            "lsh_attn_chunk_length",
            "local_attn_chunk_length",
            "num_hashes",
            "max_position_embeddings",
        ):
            check_positive_int(name, getattr(self, name))
        for name in (
            "lsh_num_chunks_before",
            "lsh_num_chunks_after",
            "local_num_chunks_before",
            "local_num_chunks_after",
            "chunk_size_feed_forward",
            "chunk_size_lm_head",
            "reversible_threshold",
        ):
            check_nonnegative_int(name, getattr(self, name))
        check_positive_int("num_hashes", self.num_hashes, maximum=1024)  # rounds of hashing: each one a pass
        check_seed("hash_seed", self.hash_seed)
        check_float("rotary_base", self.rotary_base, minimum=0.0, min_open=True, fix="set rotary_base > 0, e.g. 10000")
        if not self.attn_layers or any(kind not in ("lsh", "local") for kind in self.attn_layers):
            raise ValueError(f"attn_layers must be a non-empty list of 'lsh' / 'local', got {self.attn_layers}.")
        if self.num_hidden_layers != len(self.attn_layers):
            raise ValueError(
                f"num_hidden_layers={self.num_hidden_layers} but attn_layers has {len(self.attn_layers)} entries; "
                "the layers are the entries of attn_layers (leave num_hidden_layers unset)."
            )
        if self.num_buckets is not None:
            factors = [self.num_buckets] if isinstance(self.num_buckets, int) else self.num_buckets
            if not factors or any(f < 2 or f % 2 or f > MAX_SIZE for f in factors):
                raise ValueError(
                    f"num_buckets must be an even int >= 2, a list of such factors, or None, got {self.num_buckets}."
                )
        if self.position_embedding_type == "axial":
            if len(self.axial_pos_shape) != 2 or any(not 1 <= n <= MAX_SIZE for n in self.axial_pos_shape):
                raise ValueError(f"axial_pos_shape must be two positive ints, got {self.axial_pos_shape}.")
            if math.prod(self.axial_pos_shape) > MAX_SIZE:
                raise ValueError(
                    f"axial_pos_shape={self.axial_pos_shape} allows {math.prod(self.axial_pos_shape)} positions, more "
                    f"than {MAX_SIZE}; use smaller factors."
                )
            if len(self.axial_pos_embds_dim) != 2 or any(d < 1 for d in self.axial_pos_embds_dim):
                raise ValueError(f"axial_pos_embds_dim must be two positive widths, got {self.axial_pos_embds_dim}.")
            if sum(self.axial_pos_embds_dim) != self.hidden_size:
                raise ValueError(
                    f"axial_pos_embds_dim={self.axial_pos_embds_dim} must be two widths summing to hidden_size="
                    f"{self.hidden_size}."
                )
        if self.position_embedding_type == "rotary" and self.attention_head_size % 2:
            raise ValueError(f"rotary positions need an even attention_head_size, got {self.attention_head_size}.")
        if self.causal and (self.lsh_num_chunks_after or self.local_num_chunks_after):
            raise ValueError(
                "a causal Reformer attends to no later chunk: set lsh_num_chunks_after and local_num_chunks_after to "
                f"0 (got {self.lsh_num_chunks_after} and {self.local_num_chunks_after})."
            )
        if self.correct_duplicates and self.chunk_wrap_around:
            raise ValueError("correct_duplicates needs chunk_wrap_around=False (rounds kept apart).")
        for name in ("hidden_dropout_prob", "lsh_attention_probs_dropout_prob", "local_attention_probs_dropout_prob"):
            check_probability(name, getattr(self, name))
        check_probability("classifier_dropout", self.classifier_dropout, optional=True)


__all__ = ["TffReformerConfig"]
