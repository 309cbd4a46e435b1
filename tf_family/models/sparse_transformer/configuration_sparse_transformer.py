"""Configuration of the Sparse Transformer (Child, Gray, Radford & Sutskever 2019, arXiv:1904.10509) and of the fixed
patterns of the same house: the Image Transformer's local 1-D and 2-D attention (Parmar et al. 2018, arXiv:1802.05751)
and blockwise self-attention (Qiu et al. 2020, arXiv:1911.02972)."""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedConfig

from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import (
    check_activation,
    check_float,
    check_list_of,
    check_nonnegative_int,
    check_positive_int,
    check_probability,
)

# each pattern's two factors: A(1) then A(2) (section 4.2)
FACTORS = {"strided": ("local", "strided"), "fixed": ("block", "summary")}
SPARSITY_PATTERNS = ("strided", "fixed", "local_1d", "local_2d", "blockwise")


class TffSparseTransformerConfig(PreTrainedConfig):
    r"""Configuration of `TffSparseTransformerForCausalLM`: a pre-norm decoder whose attention heads follow the
    Sparse Transformer's factorised patterns; with ``sparsity_pattern="blockwise"`` also of the encoder heads
    (`TffSparseTransformerForMaskedLM`, `TffSparseTransformerForSequenceClassification`: BlockBERT).

    Decoder:
        vocab_size (`int`, defaults to 256: bytes), hidden_size (`int`, 256; D), num_hidden_layers (`int`, 4; L),
        num_attention_heads (`int`, 4; H; must divide hidden_size), intermediate_size (`int`, 1024),
        hidden_act (`str`, ``"gelu"``), max_position_embeddings (`int`, 4096: the longest input with
        ``"absolute"`` positions), layer_norm_eps (`float`, 1e-5), initializer_range (`float`, 0.02),
        hidden_dropout_prob (`float`, 0.0: embeddings and residual branches), attention_dropout (`float`, 0.0:
        attention probabilities), tie_word_embeddings (`bool`, True), pad/bos/eos_token_id.
        causal (`bool`, defaults to `True`): causal attention (a decoder; transformers' ``is_decoder``). ``False`` is
            a bidirectional encoder, defined for ``sparsity_pattern="blockwise"`` only (the paper's cyclic block
            shifts; the other patterns are causal by construction) with ``"absolute"`` or ``"rotary"`` positions.
            Each head class sets it on its own copy of the config: the causal LM ``True``, the masked-LM and
            sequence-classification heads ``False`` (as transformers' BERT heads read ``is_decoder``).
        classifier_dropout (`float`, *optional*): dropout before the sequence classifier (``hidden_dropout_prob``
            when ``None``).

    Factorised attention (section 4.2):
        sparsity_pattern (`str`, defaults to ``"strided"``): ``"strided"`` (A(1): the previous ``stride``
            positions; A(2): every ``stride``-th earlier position) or ``"fixed"`` (A(1): the own block of ``stride``
            positions; A(2): the last ``summary_size`` positions of every block, per head a different sub-block).
        pattern_layout (`str`, defaults to ``"heads"``): how the two factors combine: ``"heads"`` (the first half
            of every layer's heads take A(1), the rest A(2): the paper's multi-head variant) or ``"layers"`` (even
            layers A(1), odd layers A(2): the interleaved variant). Either way every position reaches every earlier
            one in two layers.
        stride (`int`, defaults to 128): ``l``, near ``sqrt(T)`` in the paper.
        summary_size (`int`, defaults to 8): ``c``, summary columns per block and head (``"fixed"`` only). Head ``g``
            of A(2) reads columns ``[l - c (g' + 1), l - c g')`` with ``g' = g mod (l // c)``.

    Image Transformer local attention (Parmar et al. 2018, section 3.2; every head and layer, ``pattern_layout``
    unused), ``sparsity_pattern`` ``"local_1d"`` or ``"local_2d"``:
        local_1d: query blocks of ``stride`` positions (l_q) attend to themselves and the ``memory_length`` positions
            before them (causally). memory_length (`int`, defaults to 128).
        local_2d: the input is an image ``image_width`` positions wide (channels flattened into the row) in
            block-raster order (`tf_family.attention.image_local.block_raster_order`); query blocks of
            ``block_height x block_width`` attend to their memory block, extended by ``memory_height`` rows above and
            ``memory_width`` columns on each side, causally in that order. image_width (`int`, 96), block_height
            (`int`, 8), block_width (`int`, 32; divides image_width), memory_height (`int`, 8), memory_width
            (`int`, 16).

    Blockwise self-attention (Qiu et al. 2020, section 3; every layer, ``pattern_layout`` unused),
    ``sparsity_pattern="blockwise"``: the sequence in blocks of ``stride`` positions (the paper's ``T / n``). In the
    encoder (``causal=False``) head ``h`` lets block ``b`` attend to block ``(b + k_h) mod n``, the paper's cyclic
    shift, with ``n = ceil(T / stride)`` the blocks of each row's real tokens. In the decoder head ``h`` lets block
    ``b`` attend to block ``b - k_h``, the causal partial form of the paper's cyclic shift
    (`tf_family.attention.blockwise`: shift 0 is the own block up to the query; the first ``k_h`` blocks of a head
    with ``k_h > 0`` see only the query itself).
        block_shifts (`list[int]`, *optional*): ``k_h`` per head, ints >= 0 that must differ across heads (at least
            one 0, for the own block, and one > 0, or no information leaves a block); defaults to ``0 .. H - 1``
            (head ``h`` shifts by ``h`` blocks: one layer reaches ``H - 1`` blocks back).

    Positions:
        position_embedding_type (`str`, defaults to ``"absolute"``): ``"absolute"`` (learned, up to
            ``max_position_embeddings``), ``"rotary"`` (Su et al. 2021, Llama's pairing: dimension ``k`` with
            ``k + Dh / 2``), ``"alibi"`` (Press et al. 2022: a linear bias per head, no length limit) or
            ``"distance_aware"`` (DA-Transformer, Wu et al. 2021: per head and layer a learned weight ``w_h`` on the
            real distance ``|i - j|`` through a learnable sigmoid re-scales the ReLU'd scores, which are then
            re-normalised instead of a softmax; `tf_family.attention.distance_aware`; no length limit). ALiBi and
            distance-aware positions need the distance the strided, fixed and blockwise kernels see, not the local
            patterns.
        rope_base (`float`, defaults to 10000.0): the rotary base θ.
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_sparse_transformer"

    vocab_size: int = 256
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    max_position_embeddings: int = 4096
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    hidden_dropout_prob: float = 0.0
    attention_dropout: float = 0.0
    sparsity_pattern: Literal["strided", "fixed", "local_1d", "local_2d", "blockwise"] = "strided"
    pattern_layout: Literal["heads", "layers"] = "heads"
    stride: int = 128
    summary_size: int = 8
    memory_length: int = 128
    image_width: int = 96
    block_height: int = 8
    block_width: int = 32
    memory_height: int = 8
    memory_width: int = 16
    block_shifts: list[int] | None = None
    position_embedding_type: Literal["absolute", "rotary", "alibi", "distance_aware"] = "absolute"
    rope_base: float = 10000.0
    tie_word_embeddings: bool = True
    causal: bool = True
    classifier_dropout: float | None = None
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        if isinstance(self.block_shifts, tuple):
            self.block_shifts = list(self.block_shifts)
        super().__post_init__(**kwargs)
        validate_config(self)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate_architecture(self):
        """Cross-field rules; each error names the field, the value and the rule."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "stride",
            "summary_size",
            "image_width",
            "block_height",
            "block_width",
        ):
            check_positive_int(name, getattr(self, name))
        for name in ("memory_length", "memory_height", "memory_width"):
            check_nonnegative_int(name, getattr(self, name))
        if self.sparsity_pattern == "local_2d" and self.image_width % self.block_width:
            raise ValueError(
                f"image_width={self.image_width} must be a multiple of block_width={self.block_width} (query blocks "
                "tile each image row)."
            )
        if self.block_shifts is not None:
            self._check_block_shifts()
        local = self.sparsity_pattern in ("local_1d", "local_2d")
        if local and self.position_embedding_type in ("alibi", "distance_aware"):
            raise ValueError(
                f"position_embedding_type={self.position_embedding_type!r} is defined here for the strided, fixed and "
                f"blockwise patterns, not for sparsity_pattern={self.sparsity_pattern!r}; use 'absolute' or 'rotary'."
            )
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be True (a decoder) or False (an encoder), got {self.causal!r}.")
        if not self.causal and self.sparsity_pattern != "blockwise":
            raise ValueError(
                f"causal=False (a bidirectional encoder) is defined for sparsity_pattern='blockwise' only, got "
                f"sparsity_pattern={self.sparsity_pattern!r}, which is causal by construction; set "
                "sparsity_pattern='blockwise' or causal=True."
            )
        if not self.causal and self.position_embedding_type in ("alibi", "distance_aware"):
            raise ValueError(
                f"position_embedding_type={self.position_embedding_type!r} is defined here for causal attention "
                "(a bias on the distance back); the encoder (causal=False) takes 'absolute' or 'rotary'."
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of num_attention_heads={self.num_attention_heads}."
            )
        factorised = self.sparsity_pattern in FACTORS
        if self.sparsity_pattern == "blockwise" and self.block_shifts is None and self.num_attention_heads < 2:
            raise ValueError(
                "sparsity_pattern='blockwise' needs heads with different block shifts, so num_attention_heads >= 2, "
                f"got {self.num_attention_heads}."
            )
        if factorised and self.pattern_layout == "heads" and self.num_attention_heads < 2:
            raise ValueError(
                f"pattern_layout='heads' splits the two factors across heads and needs num_attention_heads >= 2, got "
                f"{self.num_attention_heads}; use pattern_layout='layers' or more heads."
            )
        if factorised and self.pattern_layout == "layers" and self.num_hidden_layers < 2:
            raise ValueError(
                f"pattern_layout='layers' interleaves the two factors across layers and needs num_hidden_layers >= 2, "
                f"got {self.num_hidden_layers}; use pattern_layout='heads' or more layers."
            )
        if self.sparsity_pattern == "fixed" and self.summary_size > self.stride:
            raise ValueError(
                f"summary_size={self.summary_size} must be <= stride={self.stride} (c summary columns per block of l)."
            )
        if self.position_embedding_type == "rotary" and self.head_dim % 2:
            raise ValueError(f"position_embedding_type='rotary' rotates pairs: the head width {self.head_dim} is odd.")
        check_activation("hidden_act", self.hidden_act)
        check_float("rope_base", self.rope_base, minimum=0.0, min_open=True, fix="set rope_base > 0, e.g. 10000")
        check_float("layer_norm_eps", self.layer_norm_eps, minimum=0.0, min_open=True, fix="set layer_norm_eps > 0")
        for name in ("hidden_dropout_prob", "attention_dropout"):
            check_probability(name, getattr(self, name))
        check_probability("classifier_dropout", self.classifier_dropout, optional=True)

    def _check_block_shifts(self):
        shifts = self.block_shifts
        check_list_of("block_shifts", shifts, check_nonnegative_int, length=self.num_attention_heads)
        if 0 not in shifts or max(shifts) == 0:
            raise ValueError(
                f"block_shifts={shifts} must differ across heads, with at least one 0 (the own block) and one > 0 "
                "(an earlier block): otherwise no information leaves a block or a token never sees its own block."
            )


__all__ = ["TffSparseTransformerConfig"]
