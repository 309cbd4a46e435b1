"""Configuration of the Compressive Transformer (Rae et al. 2019, arXiv:1911.05507)."""

from __future__ import annotations

from typing import Literal

from ...layers.xl_config import XLFamilyConfig
from ...memory.compression import COMPRESSION_KINDS
from ...modeling.validation import check_choice, check_float, check_nonnegative_int, check_positive_int


class TffCompressiveConfig(XLFamilyConfig):
    r"""Configuration of a Compressive Transformer language model.

    The model is Transformer-XL (relative positions, segment memory, adaptive input and softmax) plus, per layer, a
    compressed memory behind the memory: states leaving the memory are compressed by the rate `compression_rate`
    and kept for `cmem_len` more slots. With `cmem_len=0` the model is exactly Transformer-XL.

    Args:
        vocab_size (`int`, defaults to 267735): number of tokens.
        cutoffs (`list[int]`, defaults to `[20000, 40000, 200000]`): boundaries of the adaptive input / softmax
            clusters. An empty list gives a plain embedding and a plain softmax.
        d_model (`int`, defaults to 1024): width of the residual stream (``d``).
        d_embed (`int`, *optional*): width of the head cluster's embedding; defaults to `d_model`.
        n_head (`int`, defaults to 16): attention heads.
        d_head (`int`, *optional*): width of one head; defaults to `d_model // n_head`.
        d_inner (`int`, defaults to 4096): width of the feed-forward block.
        div_val (`int`, defaults to 4): the embedding width of cluster ``i`` is ``d_embed // div_val**i``.
        pre_lnorm (`bool`, defaults to `False`): layer norm before (True) or after (False, the paper) each block.
        n_layer (`int`, defaults to 18): number of layers (``l``).
        mem_len (`int`, defaults to 512): hidden states kept per layer as memory (``n_m``). States leave it in whole
            groups of `compression_rate`, so between segments it holds up to ``mem_len + compression_rate - 1``
            states (exactly `mem_len` when the segment length is a multiple of the rate). ``0`` disables all
            recurrence (then `cmem_len` must be 0).
        cmem_len (`int`, defaults to 512): compressed memory slots per layer (``n_cm``). ``0`` gives
            Transformer-XL exactly.
        compression_rate (`int`, defaults to 3): states per compressed slot (``c``).
        compression (`str`, defaults to `"conv"`): the compression function ``f_c``: `"max_pool"`, `"mean_pool"`,
            `"conv"` (1D convolution, kernel = stride = c), `"dilated_conv"` (kernel-2 convolutions with dilations
            1, 2, 4, ... covering each group of c) or `"most_used"` (keep the states with the highest average
            attention received while in the memory).
        attention_reconstruction_loss_weight (`float`, defaults to 1.0): weight of the attention-reconstruction loss
            ``L^attn`` in `loss`. It trains only the compression network (everything else is detached).
        autoencoding_loss_weight (`float`, defaults to 0.0): weight of the auto-encoding loss ``L^ae`` (a learned
            transposed-convolution decoder reconstructs the old memories from their compression); ``0`` builds no
            decoder.
        clamp_len (`int`, defaults to 1000): relative distances larger than this use the embedding of `clamp_len`;
            ``<= 0`` disables clamping.
        same_length (`bool`, defaults to `False`): every query attends to the same number of positions of
            ``[memory, segment]`` (the `mem_len` most recent, itself included); the compressed memory stays visible.
        proj_share_all_but_first (`bool`, defaults to `True`): tie the tail clusters' output projections to the input
            projections.
        untie_r (`bool`, defaults to `True`): one pair of position biases ``u, v`` per layer (True) or one shared.
        dropout (`float`, defaults to 0.1): dropout on embeddings, attention output and feed-forward.
        dropatt (`float`, defaults to 0.0): dropout on attention probabilities.
        proj_init_std (`float`, defaults to 0.01): std of the normal init of the adaptive projections.
        init_std (`float`, defaults to 0.02): std of the normal init of linear layers, embeddings, compression
            kernels and the biases ``u, v``.
        layer_norm_epsilon (`float`, defaults to 1e-5): layer norm epsilon.
        tie_word_embeddings (`bool`, defaults to `True`): tie the softmax's output layers to the input embeddings.
        use_cache (`bool`, defaults to `True`): return both memories (`mems`) from `forward`.

    The Transformer-XL fields, their derived defaults and their checks are the family's
    (`tf_family.layers.xl_config`); this class adds the compressed memory's.
    """

    model_type = "tff_compressive"

    mem_len: int = 512
    same_length: bool = False
    cmem_len: int = 512
    compression_rate: int = 3
    compression: Literal["max_pool", "mean_pool", "conv", "dilated_conv", "most_used"] = "conv"
    attention_reconstruction_loss_weight: float = 1.0
    autoencoding_loss_weight: float = 0.0
    use_cache: bool = True

    def validate_architecture(self):
        """The family's rules (`XLFamilyConfig.validate_architecture`) and the compressed memory's."""
        super().validate_architecture()
        check_nonnegative_int("cmem_len", self.cmem_len, fix="set cmem_len >= 0 (0 gives Transformer-XL)")
        if self.cmem_len > 0 and self.mem_len == 0:
            raise ValueError(
                f"cmem_len={self.cmem_len} needs mem_len > 0: only states leaving the memory are compressed."
            )
        check_positive_int("compression_rate", self.compression_rate, fix="set compression_rate >= 1 (the rate c)")
        check_choice("compression", self.compression, COMPRESSION_KINDS)
        for name in ("attention_reconstruction_loss_weight", "autoencoding_loss_weight"):
            check_float(name, getattr(self, name), minimum=0.0, fix=f"set {name} >= 0 (0 turns that loss off)")


__all__ = ["TffCompressiveConfig"]
