"""Configuration of Transformer-XL (Dai et al. 2019, arXiv:1901.02860)."""

from __future__ import annotations

from dataclasses import field

from transformers import PreTrainedConfig

from ...configuration_utils import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...validation import check_int, check_nonnegative_int, check_positive_int, check_probability


class TffTransfoXLConfig(PreTrainedConfig):
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
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_transfo_xl"
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
    classifier_dropout: float = 0.1
    use_cache: bool = True
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
        """Cross-field rules; each error names the field, the value and the rule."""
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
        for name in ("dropout", "dropatt", "classifier_dropout"):
            check_probability(name, getattr(self, name))


__all__ = ["TffTransfoXLConfig"]
