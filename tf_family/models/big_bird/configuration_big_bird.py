"""Configuration of BigBird (Zaheer et al. 2020, arXiv:2007.14062), with ETC's global-local attention as an option
(Ainslie et al. 2020, arXiv:2004.08483)."""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedConfig

from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import (
    check_float,
    check_nonnegative_int,
    check_positive_int,
    check_probability,
    check_seed,
)


class TffBigBirdConfig(PreTrainedConfig):
    r"""Configuration of a BigBird encoder (ITC: internal global blocks): a BERT-style transformer whose attention
    is block sparse -- a sliding window of blocks, two global blocks and random blocks. ``attention_type="etc"``
    switches to ETC (extended transformer construction): ``num_global_tokens`` learned global tokens before the
    input, global-global, global-long and long-global attention full, long-long within ``local_radius``, with
    learned relative-position keys (`tf_family.attention.etc`).

    Defaults reproduce `google/bigbird-roberta-base`.

    Args:
        vocab_size (`int`, defaults to 50358): number of tokens.
        hidden_size (`int`, defaults to 768): width of the residual stream (``D``).
        num_hidden_layers (`int`, defaults to 12): number of layers (``L``).
        num_attention_heads (`int`, defaults to 12): attention heads (``H``); must divide `hidden_size`.
        intermediate_size (`int`, defaults to 3072): width of the feed-forward block.
        hidden_act (`str`, defaults to `"gelu_new"`): activation of the feed-forward block and the heads.
        hidden_dropout_prob (`float`, defaults to 0.1): dropout on embeddings and sub-layer outputs.
        attention_probs_dropout_prob (`float`, defaults to 0.1): dropout on attention probabilities of full
            attention (block-sparse attention has none, as in the reference code and transformers).
        max_position_embeddings (`int`, defaults to 4096): learned absolute positions (the longest input).
        type_vocab_size (`int`, defaults to 2): token types.
        initializer_range (`float`, defaults to 0.02): std of the normal init of linear layers and embeddings.
        layer_norm_eps (`float`, defaults to 1e-12): layer norm epsilon.
        use_bias (`bool`, defaults to `True`): biases on the query, key and value projections.
        rescale_embeddings (`bool`, defaults to `False`): multiply word embeddings by ``sqrt(hidden_size)``.
        attention_type (`str`, defaults to `"block_sparse"`): ``"block_sparse"``, ``"original_full"`` or ``"etc"``
            attention. Block-sparse layers fall back to full attention *for one call* when the input has too few
            blocks (``<= 2 * window_blocks + 3 + 2 * num_random_blocks``, transformers' rule); nothing is changed on
            the model. ``"etc"``: ETC's global-local attention (the block and random-block fields below are then
            unused).
        num_global_tokens (`int`, *optional*): ETC only (defaults to 16 there): the global input length (``n_g`` in
            Ainslie et al. 2020), a learned table of that many embeddings placed before every input.
        local_radius (`int`, *optional*): ETC only (defaults to 84 there, ETC-base's): a long token attends to the
            long tokens at most this far away (``r``); 0 keeps only itself.
        max_relative_position (`int`, *optional*): ETC only (defaults to `local_radius` there): relative positions
            are clipped to ``[-k, k]`` (``k``, ETC's ``relative_pos_max_distance``); each layer learns
            ``2k + 3`` relative keys (the clipped positions, one long-to-global and one global-to-long label).
        block_size (`int`, defaults to 64): tokens per block (``b``).
        num_random_blocks (`int`, defaults to 3): random key blocks per query block (``r``); 0 is allowed.
        window_blocks (`int`, defaults to 1): one-sided sliding window in blocks (``w``; 1 gives the paper's 3 blocks).
        random_seed (`int`, defaults to 0): seed of the random blocks. Layer ``l`` draws from a `torch.Generator`
            seeded with (`random_seed`, ``l``); a call may pass ``random_seed=`` to draw another pattern. The global
            RNG is never used.
        eval_random_blocks (`str`, defaults to `"same"`): random blocks in eval mode: ``"same"`` as in training,
            ``"none"`` no random blocks, ``"first_block"`` every random slot on the first block (what transformers'
            BigBird does in eval; set when a transformers checkpoint is imported, so outputs match).
        position_embedding_type (`str`, defaults to `"absolute"`): ``"absolute"`` (learned positions added to the
            token embeddings, what BigBird's checkpoints hold), ``"rotary"`` (queries and keys rotated, Su et al. 2021,
            Llama's pairing, `tf_family.attention.rotary`; ETC's global tokens are not rotated) or ``"alibi"`` (a
            per-head bias ``-m_h * |i - j|``, Press et al. 2022 made symmetric for an encoder,
            `tf_family.attention.alibi`; ``attention_type="original_full"`` only: the block-sparse and ETC kernels
            take no score bias). Rotary and ALiBi models have no position table: train them from scratch.
        rope_base (`float`, defaults to 10000.0): the rotary base θ (``position_embedding_type="rotary"``).
        pad_token_id (`int`, defaults to 0): the padding token.
        bos_token_id (`int`, defaults to 1): the beginning-of-sequence token.
        eos_token_id (`int`, defaults to 2): the end-of-sequence token.
        sep_token_id (`int`, defaults to 66): the separator; it ends the question in question answering.
        classifier_dropout (`float`, *optional*): dropout of the classification heads; defaults to
            `hidden_dropout_prob`.
        tie_word_embeddings (`bool`, defaults to `True`): tie the masked-LM decoder to the input embeddings.
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_big_bird"

    vocab_size: int = 50358
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 4096
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    use_bias: bool = True
    rescale_embeddings: bool = False
    attention_type: Literal["block_sparse", "original_full", "etc"] = "block_sparse"
    num_global_tokens: int | None = None
    local_radius: int | None = None
    max_relative_position: int | None = None
    block_size: int = 64
    num_random_blocks: int = 3
    window_blocks: int = 1
    random_seed: int = 0
    eval_random_blocks: Literal["same", "none", "first_block"] = "same"
    position_embedding_type: Literal["absolute", "rotary", "alibi"] = "absolute"
    rope_base: float = 10000.0
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    sep_token_id: int | None = 66
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        if self.attention_type == "etc":  # ETC's defaults (ETC-base's radius; positions clipped at the radius)
            self.num_global_tokens = 16 if self.num_global_tokens is None else self.num_global_tokens
            self.local_radius = 84 if self.local_radius is None else self.local_radius
            if self.max_relative_position is None:
                self.max_relative_position = self.local_radius
        super().__post_init__(**kwargs)
        validate_config(self)

    def validate_architecture(self):
        """Cross-field rules; each error names the field, the value and the rule."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
            "block_size",
            "window_blocks",
        ):
            check_positive_int(name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of num_attention_heads={self.num_attention_heads}."
            )
        check_nonnegative_int("num_random_blocks", self.num_random_blocks, fix="set num_random_blocks >= 0")
        check_seed("random_seed", self.random_seed)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check_probability(name, getattr(self, name))
        check_probability("classifier_dropout", self.classifier_dropout, optional=True)
        self._validate_etc()
        head_dim = self.hidden_size // self.num_attention_heads
        if self.position_embedding_type == "rotary" and head_dim % 2:
            raise ValueError(
                f"position_embedding_type='rotary' rotates pairs, but the head width hidden_size / "
                f"num_attention_heads = {head_dim} is odd; choose an even head width."
            )
        if self.position_embedding_type == "alibi" and self.attention_type != "original_full":
            raise ValueError(
                f"position_embedding_type='alibi' adds a score bias, which attention_type={self.attention_type!r} "
                "does not take (its kernel has none); set attention_type='original_full', or use "
                "position_embedding_type='rotary'."
            )
        check_float("rope_base", self.rope_base, minimum=0.0, min_open=True, fix="set rope_base > 0, e.g. 10000")

    def _validate_etc(self):
        """ETC's three fields: ints when ``attention_type="etc"``, unset otherwise (they would be ignored)."""
        etc_fields = ("num_global_tokens", "local_radius", "max_relative_position")
        if self.attention_type != "etc":
            for name in etc_fields:
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name}={getattr(self, name)!r} is used only by ETC attention, but "
                        f"attention_type={self.attention_type!r}; set attention_type='etc' or leave {name} unset."
                    )
            return
        check_positive_int(
            "num_global_tokens", self.num_global_tokens, fix="set num_global_tokens >= 1 (ETC needs a global input)"
        )
        check_nonnegative_int("local_radius", self.local_radius, fix="set local_radius >= 0 (0: each token itself)")
        check_nonnegative_int(
            "max_relative_position", self.max_relative_position, fix="set max_relative_position >= 0"
        )


__all__ = ["TffBigBirdConfig"]
