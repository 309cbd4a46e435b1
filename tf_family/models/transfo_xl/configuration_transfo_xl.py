"""Configuration of Transformer-XL (Dai et al. 2019, arXiv:1901.02860)."""

from __future__ import annotations

from typing import Literal

from ...layers.xl_config import XLFamilyConfig
from ...modeling.validation import check_float, check_positive_int, check_probability


class TffTransfoXLConfig(XLFamilyConfig):
    r"""Configuration of a Transformer-XL language model.

    Defaults reproduce the WikiText-103 model of the paper (`transfo-xl/transfo-xl-wt103` on the Hub).

    Args:
        vocab_size (`int`, defaults to 267735): number of tokens.
        cutoffs (`list[int]`, defaults to `[20000, 40000, 200000]`): boundaries of the adaptive input / softmax
            clusters (Baevski & Auli 2019; Grave et al. 2017). Tokens ``[0, cutoffs[0])`` form the head cluster. An
            empty list gives a plain embedding and a plain softmax.
        d_model (`int`, defaults to 1024): width of the residual stream (``d`` in the paper).
        d_embed (`int`, *optional*): width of the head cluster's embedding; defaults to `d_model`. When it
            differs from `d_model`, embeddings are projected to `d_model`.
        n_head (`int`, defaults to 16): attention heads (``n``).
        d_head (`int`, *optional*): width of one head (``d_h``); defaults to `d_model // n_head`.
        d_inner (`int`, defaults to 4096): width of the feed-forward block.
        div_val (`int`, defaults to 4): the embedding width of cluster ``i`` is ``d_embed // div_val**i``.
        pre_lnorm (`bool`, defaults to `False`): layer norm before (True) or after (False, the paper) each block.
        n_layer (`int`, defaults to 18): number of layers (``N``).
        mem_len (`int`, defaults to 1600): hidden states kept per layer as memory (``M``). ``0`` disables the
            recurrence: every forward pass sees only its own tokens and returns no memory, and `generate()`
            re-reads the whole prefix at every step.
        clamp_len (`int`, defaults to 1000): relative distances larger than this use the embedding of `clamp_len`;
            ``<= 0`` disables clamping.
        same_length (`bool`, defaults to `True`): every query attends to the same number of positions: the
            `mem_len` most recent ones, itself included (the paper's evaluation setting). Needs `mem_len > 0`.
        proj_share_all_but_first (`bool`, defaults to `True`): tie the output projections of the tail clusters to
            the input projections (the head cluster's projection stays untied), as in the original code.
        untie_r (`bool`, defaults to `True`): one pair of global position biases ``u, v`` per layer (True) or one
            pair shared by all layers (False).
        dropout (`float`, defaults to 0.1): dropout on embeddings, attention output and feed-forward.
        dropatt (`float`, defaults to 0.0): dropout on attention probabilities.
        proj_init_std (`float`, defaults to 0.01): std of the normal init of the adaptive projections.
        init_std (`float`, defaults to 0.02): std of the normal init of linear layers, embeddings, cluster weights
            and the biases ``u, v``.
        layer_norm_epsilon (`float`, defaults to 1e-5): layer norm epsilon.
        tie_word_embeddings (`bool`, defaults to `True`): tie the adaptive softmax's output layers to the input
            embeddings.
        classifier_dropout (`float`, defaults to 0.1): dropout before the sequence-classification head.
        use_cache (`bool`, defaults to `True`): return the memory (`mems`) from `forward`.
        gating (`str`, defaults to `"none"`): ``"gru"`` makes the model a GTrXL (Parisotto et al. 2020,
            arXiv:1910.06764): a GRU-type gate in place of each residual connection, with a ReLU on each sublayer's
            output (`tf_family.layers.gated_residual`); needs `pre_lnorm=True` (the layer norm at each sublayer's
            input). ``"none"``: Transformer-XL's residuals.
        gate_bias (`float`, defaults to 2.0): initial gate bias ``b_g``, subtracted in the update gate so that a
            fresh GTrXL layer starts near the identity (used with `gating="gru"`).
        adaptive_span (`bool`, defaults to `False`): Adaptive Attention Span (Sukhbaatar et al. 2019,
            arXiv:1905.07799): every head learns its span ``z`` in ``[0, S]``; the attention weight of a key at
            distance ``x`` is scaled by ``m_z(x) = clamp((R + z - x) / R, 0, 1)`` and the weights renormalised; the
            loss gets the penalty `adaptive_span_loss` ``* mean(z)``; the memory read and kept is trimmed to what the
            spans reach (`tf_family.layers.adaptive_span`). Combines with `gating`.
        adaptive_span_max (`int`, *optional*): the largest span ``S`` in tokens; defaults to `mem_len` (the paper's
            setting: the memory holds the largest span) when `adaptive_span` is on. Needs `mem_len >= adaptive_span_max` when `mem_len > 0`.
        adaptive_span_ramp (`int`, defaults to 32): ``R``, the width of the mask's soft ramp in tokens (32 in the
            paper).
        adaptive_span_init (`float`, defaults to 0.0): initial ``z / S`` of every head, in ``[0, 1]`` (0: every head
            starts at the ramp alone, ``R`` tokens, and grows its span where the loss asks for it).
        adaptive_span_loss (`float`, defaults to 2e-6): the L1 penalty's coefficient per token of span: the loss gets
            ``adaptive_span_loss * mean(z)`` over every head of every layer (``z`` in tokens), added by the
            language-model head to every predicted token's loss (reported as `span_loss`; the sequence classifier
            does not add it).
        adaptive_span_round (`int`, defaults to 64): the memory read and kept is trimmed to the largest span plus
            ``R``, rounded up to a multiple of this (so the key length changes only in steps).
        adaptive_span_trim (`bool`, defaults to `True`): trim the memory to the spans (False reads and keeps all
            `mem_len` slots; the mask makes the trimmed ones weigh 0, so the output is the same).

    The fields, their derived defaults and their checks are the family's (`tf_family.layers.xl_config`); this class
    adds the classification head's dropout, the GTrXL option (`gating`, `gate_bias`) and the adaptive-span option
    (`adaptive_span*`).
    """

    model_type = "tff_transfo_xl"

    classifier_dropout: float = 0.1
    use_cache: bool = True
    gating: Literal["none", "gru"] = "none"
    gate_bias: float = 2.0
    adaptive_span: bool = False
    adaptive_span_max: int | None = None
    adaptive_span_ramp: int = 32
    adaptive_span_init: float = 0.0
    adaptive_span_loss: float = 2e-6
    adaptive_span_round: int = 64
    adaptive_span_trim: bool = True

    def __post_init__(self, **kwargs):
        mem_len = self.mem_len
        if self.adaptive_span is True and self.adaptive_span_max is None and type(mem_len) is int and mem_len > 0:
            self.adaptive_span_max = mem_len
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        """The family's rules (`XLFamilyConfig.validate_architecture`), the classifier's dropout, GTrXL's
        pre-norm and the adaptive span's ranges."""
        super().validate_architecture()
        check_probability("classifier_dropout", self.classifier_dropout)
        self._validate_adaptive_span()
        if self.gating == "gru" and not self.pre_lnorm:
            raise ValueError(
                "gating='gru' (GTrXL) puts the layer norm at each sublayer's input: it needs pre_lnorm=True, got "
                "pre_lnorm=False; set pre_lnorm=True."
            )

    def _validate_adaptive_span(self):
        if self.adaptive_span_max is None:
            if self.adaptive_span:
                raise ValueError(
                    "adaptive_span=True needs the largest span: adaptive_span_max is unset and mem_len=0 (it defaults "
                    "to mem_len); set adaptive_span_max (the span within a segment) or mem_len > 0."
                )
        else:
            check_positive_int("adaptive_span_max", self.adaptive_span_max, fix="set adaptive_span_max >= 1 (tokens)")
            if self.adaptive_span and 0 < self.mem_len < self.adaptive_span_max:
                raise ValueError(
                    f"adaptive_span_max={self.adaptive_span_max} exceeds mem_len={self.mem_len}: the memory could not "
                    "hold the spans the heads may learn; raise mem_len or lower adaptive_span_max."
                )
        check_positive_int("adaptive_span_ramp", self.adaptive_span_ramp, fix="set adaptive_span_ramp >= 1 (tokens)")
        check_float(
            "adaptive_span_init", self.adaptive_span_init, minimum=0.0, maximum=1.0, fix="set it to a z / S in [0, 1]"
        )
        check_float("adaptive_span_loss", self.adaptive_span_loss, minimum=0.0, fix="set adaptive_span_loss >= 0")
        check_positive_int("adaptive_span_round", self.adaptive_span_round, fix="set adaptive_span_round >= 1")


__all__ = ["TffTransfoXLConfig"]
