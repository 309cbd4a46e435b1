"""Load the Transformer-XL checkpoints transformers dropped (model_type ``transfo-xl``, saved by 4.x).

transformers 5 no longer knows ``transfo-xl``, so ``transfo-xl/transfo-xl-wt103`` and every fine-tuned copy stopped
loading. tf_family registers the type again: `TffTransfoXLLegacyConfig` reads the 4.x ``config.json``, and the
record `LEGACY_TRANSFO_XL` tells `tf_family.conversion` how config and weights translate (key by key, shape by
shape) into the tf_family model. ``.bin`` weights are read only with ``torch.load(weights_only=True)``. This module
is data: it never imports the modeling file.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedConfig

from ...conversion import ForeignFormat
from ...modeling.handoff import announce_config
from .configuration_transfo_xl import TffTransfoXLConfig

LEGACY_MODEL_TYPE = "transfo-xl"

# 4.x config keys -> tf_family field (same name unless listed); the other keys carry no information we need.
_RENAMED_CONFIG_KEYS = {"n_token": "vocab_size"}
_COPIED_CONFIG_KEYS = (
    "vocab_size", "cutoffs", "d_model", "d_embed", "n_head", "d_head", "d_inner", "div_val", "pre_lnorm", "n_layer",
    "mem_len", "clamp_len", "same_length", "untie_r", "dropout", "dropatt", "init_std", "proj_init_std",
    "layer_norm_epsilon", "eos_token_id", "bos_token_id", "pad_token_id", "tie_word_embeddings", "id2label",
    "label2id", "problem_type",
)  # fmt: skip

# 4.x parameter name -> tf_family name; the body sits under "transformer." in the LM head model, at the top in a
# headless 4.x TransfoXLModel
_KEY_RULES = (
    (r"^(transformer\.)?word_emb\.emb_layers\.(\d+)\.weight$", r"\1word_embeddings.layers.\2.weight"),
    (r"^(transformer\.)?word_emb\.emb_projs\.(\d+)$", r"\1word_embeddings.projections.\2"),
    (r"^(transformer\.)?layers\.(\d+)\.dec_attn\.qkv_net\.weight$", r"\1layers.\2.attention.qkv.weight"),
    (r"^(transformer\.)?layers\.(\d+)\.dec_attn\.r_net\.weight$", r"\1layers.\2.attention.position_proj.weight"),
    (r"^(transformer\.)?layers\.(\d+)\.dec_attn\.o_net\.weight$", r"\1layers.\2.attention.out_proj.weight"),
    (r"^(transformer\.)?layers\.(\d+)\.dec_attn\.layer_norm\.(weight|bias)$", r"\1layers.\2.attention.layer_norm.\3"),
    (r"^(transformer\.)?layers\.(\d+)\.dec_attn\.r_w_bias$", r"\1layers.\2.attention.content_bias"),
    (r"^(transformer\.)?layers\.(\d+)\.dec_attn\.r_r_bias$", r"\1layers.\2.attention.position_bias"),
    (r"^(transformer\.)?layers\.(\d+)\.pos_ff\.CoreNet\.0\.(weight|bias)$", r"\1layers.\2.feed_forward.fc_in.\3"),
    (r"^(transformer\.)?layers\.(\d+)\.pos_ff\.CoreNet\.3\.(weight|bias)$", r"\1layers.\2.feed_forward.fc_out.\3"),
    (r"^(transformer\.)?layers\.(\d+)\.pos_ff\.layer_norm\.(weight|bias)$", r"\1layers.\2.feed_forward.layer_norm.\3"),
    (r"^(transformer\.)?r_w_bias$", r"\1content_bias"),
    (r"^(transformer\.)?r_r_bias$", r"\1position_bias"),
    (r"^crit\.cluster_(weight|bias)$", r"lm_head.cluster_\1"),
    (r"^crit\.out_layers\.(\d+)\.(weight|bias)$", r"lm_head.out_layers.\1.\2"),
    (r"^crit\.out_projs\.(\d+)$", r"lm_head.projections.\1"),
)  # fmt: skip
_DROPPED_KEYS = (r"^(transformer\.)?pos_emb\.inv_freq$",)  # a buffer 4.x saved; recomputed here


class TffTransfoXLLegacyConfig(PreTrainedConfig):
    """The ``config.json`` of a transformers 4.x TransfoXL checkpoint, kept as written (its keys are foreign to
    tf_family, so none is refused here); `to_tff_config` checks and translates it."""

    model_type = LEGACY_MODEL_TYPE

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        announce_config(type(self))  # as every tf_family config: registers the model classes it loads as

    def to_tff_config(self, **overrides: Any) -> TffTransfoXLConfig:
        """The equivalent `TffTransfoXLConfig`; raises `NotImplementedError` for 4.x settings we do not implement."""
        legacy = self.to_dict()
        if legacy.get("attn_type", 0) != 0:
            raise NotImplementedError(
                f"attn_type={legacy['attn_type']} is not supported: only attn_type=0 (the paper's relative attention, "
                "the only type transformers 4.x implemented) is."
            )
        if legacy.get("sample_softmax", -1) > 0:
            raise NotImplementedError(
                f"sample_softmax={legacy['sample_softmax']} is not supported (4.x did not implement it either); use "
                "sample_softmax=-1."
            )
        values = {_RENAMED_CONFIG_KEYS.get(key, key): value for key, value in legacy.items()}
        kwargs = {key: values[key] for key in _COPIED_CONFIG_KEYS if key in values}
        tie_projs = legacy.get("tie_projs")
        if tie_projs is not None and len(tie_projs) > 1:
            if tie_projs[0] or len(set(tie_projs[1:])) != 1:
                raise NotImplementedError(
                    f"tie_projs={tie_projs} cannot be expressed: tf_family ties either all tail projections or none "
                    "(proj_share_all_but_first) and never the head cluster's."
                )
            kwargs["proj_share_all_but_first"] = bool(tie_projs[1])
        elif "proj_share_all_but_first" in legacy:
            kwargs["proj_share_all_but_first"] = bool(legacy["proj_share_all_but_first"])
        kwargs.setdefault("tie_word_embeddings", True)
        if self._attn_implementation is not None:
            kwargs["attn_implementation"] = self._attn_implementation
        return TffTransfoXLConfig(**{**kwargs, **overrides})


def translate_config(values: dict[str, Any], **overrides: Any) -> TffTransfoXLConfig:
    """The `TffTransfoXLConfig` of a 4.x ``transfo-xl`` ``config.json`` (as a dict), with config overrides."""
    return TffTransfoXLLegacyConfig(**values).to_tff_config(**overrides)


LEGACY_TRANSFO_XL = ForeignFormat(
    name="transfo-xl",
    source_model_type=LEGACY_MODEL_TYPE,
    description="a transformers 4.x transfo-xl checkpoint -> tf_family format",
    translate_config=translate_config,
    rename_rules=_KEY_RULES,
    dropped=_DROPPED_KEYS,
    default_task="causal_lm",
)
# Rename 4.x TransfoXL parameters to tf_family names (unknown names are kept, and then reported as unexpected).
convert_state_dict = LEGACY_TRANSFO_XL.convert_state_dict

__all__ = [
    "LEGACY_MODEL_TYPE",
    "LEGACY_TRANSFO_XL",
    "TffTransfoXLLegacyConfig",
    "convert_state_dict",
    "translate_config",
]
