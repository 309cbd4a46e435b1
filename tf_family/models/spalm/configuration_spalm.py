"""Configuration of SPALM (Yogatama et al. 2021, "Adaptive Semiparametric Language Models", arXiv:2102.02557)."""

from __future__ import annotations

from dataclasses import field
from typing import Literal

from ...layers.xl_config import XLFamilyConfig
from ...modeling.validation import check_choice, check_positive_int


class TffSpalmConfig(XLFamilyConfig):
    r"""Configuration of a SPALM language model: a Transformer-XL (short-term memory: the segment memory of
    `mem_len` states per layer) whose next-token distribution also reads a kNN datastore (long-term memory: keys are
    the model's final hidden states over a corpus, values the tokens that followed) through a learned gate.

    Args:
        vocab_size (`int`, defaults to 267735): number of tokens.
        cutoffs (`list[int]`, defaults to `[]`): must stay empty: the retrieved tokens are embedded with the output
            embedding matrix, which an adaptive softmax (non-empty cutoffs) does not have as one matrix.
        d_model (`int`, defaults to 1024): width of the residual stream (``d``).
        d_embed (`int`, *optional*): must equal `d_model` (defaults to it): the output embedding rows are mixed with
            the hidden state ``h_t``.
        n_head (`int`, defaults to 16): attention heads.
        d_head (`int`, *optional*): width of one head; defaults to `d_model // n_head`.
        d_inner (`int`, defaults to 4096): width of the feed-forward block.
        div_val (`int`, defaults to 1): must be 1 (one output embedding matrix of width `d_model`).
        pre_lnorm (`bool`, defaults to `False`): layer norm before (True) or after (False) each block.
        n_layer (`int`, defaults to 18): number of layers.
        mem_len (`int`, defaults to 1600): hidden states kept per layer as the short-term memory (``0`` disables
            it).
        clamp_len (`int`, defaults to 1000): relative distances larger than this use the embedding of `clamp_len`;
            ``<= 0`` disables clamping.
        same_length (`bool`, defaults to `True`): every query attends to the same number of positions.
        proj_share_all_but_first (`bool`, defaults to `True`): kept for the family (no tail clusters here).
        untie_r (`bool`, defaults to `True`): one pair of position biases ``u, v`` per layer (True) or one shared.
        dropout (`float`, defaults to 0.1): dropout on embeddings, attention output and feed-forward.
        dropatt (`float`, defaults to 0.0): dropout on attention probabilities.
        proj_init_std (`float`, defaults to 0.01): std of the normal init of the (unused) adaptive projections.
        init_std (`float`, defaults to 0.02): std of the normal init of linear layers (the gate's ``w_g`` too),
            embeddings and the biases ``u, v``.
        layer_norm_epsilon (`float`, defaults to 1e-5): layer norm epsilon.
        tie_word_embeddings (`bool`, defaults to `True`): tie the output embedding matrix to the input embeddings.
        use_cache (`bool`, defaults to `True`): return the memory (`mems`) from `forward`.
        k (`int`, defaults to 32): neighbours retrieved from the datastore per position (K in the paper).
        distance (`str`, defaults to ``"l2"``): how the datastore is searched: ``"l2"`` (nearest by Euclidean
            distance, as the kNN-LM) or ``"ip"`` (largest inner product).
        datastore_path (`str`, *optional*): a datastore folder elsewhere (`tf_family.retrieval.KNNDatastore`); when
            ``None``, ``from_pretrained`` attaches the checkpoint's ``datastore/`` sub-folder if there is one.
        check_datastore (`bool`, defaults to `True`): refuse a datastore not built by this model's Transformer-XL
            stack (its weights fingerprint); ``False`` accepts it with a warning (e.g. keys kept from the
            pretrained stack while the whole model is fine-tuned, as the paper does).
    """

    model_type = "tff_spalm"

    cutoffs: list[int] = field(default_factory=list)
    div_val: int = 1
    use_cache: bool = True
    k: int = 32
    distance: Literal["l2", "ip"] = "l2"
    datastore_path: str | None = None
    check_datastore: bool = True

    def validate_architecture(self):
        """The family's rules (`XLFamilyConfig.validate_architecture`) and SPALM's."""
        super().validate_architecture()
        if self.cutoffs:
            raise ValueError(
                f"cutoffs={self.cutoffs!r}: SPALM embeds the retrieved tokens with its output embedding matrix, which "
                "an adaptive softmax does not have; set cutoffs=[] (a plain softmax)."
            )
        if self.div_val != 1:
            raise ValueError(f"div_val={self.div_val!r}: SPALM has one output embedding matrix; set div_val=1.")
        if self.d_embed != self.d_model:
            raise ValueError(
                f"d_embed={self.d_embed!r} differs from d_model={self.d_model!r}: the retrieved tokens' output "
                "embeddings are mixed with the hidden state; set d_embed=d_model (or leave it unset)."
            )
        check_positive_int("k", self.k, fix="set k >= 1 (neighbours per position)")
        check_choice("distance", self.distance, ("l2", "ip"))
        if self.datastore_path is not None and not isinstance(self.datastore_path, str):
            raise TypeError(f"datastore_path must be a folder path (str) or None, got {self.datastore_path!r}.")
        if not isinstance(self.check_datastore, bool):
            raise TypeError(f"check_datastore must be True or False, got {self.check_datastore!r}.")


__all__ = ["TffSpalmConfig"]
