"""Load transformers' ``decision_transformer`` checkpoints (e.g. `edbeeching/decision-transformer-gym-hopper-medium`).

`TffDecisionTransformerModel.from_pretrained(folder)` accepts a folder (or cached Hub id) saved by transformers'
`DecisionTransformerModel`, through `tf_family.conversion` with the record `TRANSFORMERS_DECISION_TRANSFORMER`:
`translate_config` maps its ``config.json`` to a `TffDecisionTransformerConfig` and the weights are renamed and
reshaped, key by key and shape by shape:

- GPT-2 `Conv1D` weights are stored ``(in, out)``; ours are `nn.Linear` ``(out, in)``: transposed;
- transformers' GPT-2 adds the position embedding of position 0 to every token (its position ids are all zero);
  that constant goes into the bias of `embed_ln`, which is applied right before it (exact);
- the unused word embedding (``vocab_size`` 1) and the rest of the position table are dropped, as are the causal
  mask buffers older checkpoints saved (``attn.bias``, ``attn.masked_bias``).

The state statistics and the return scale of such a checkpoint live in its model card, not in its config: pass
them as keyword arguments (``state_mean=[...], state_std=[...], return_scale=1000.0, target_return=3600.0``) and
they are stored in the converted config. ``.bin`` weights are read with ``torch.load(weights_only=True)``. This
module is data: it never imports the modeling file.
"""

from __future__ import annotations

from typing import Any

import torch

from ...conversion import ForeignFormat, copy_config_values
from .configuration_decision_transformer import TffDecisionTransformerConfig

REFERENCE_MODEL_TYPE = "decision_transformer"

_COPIED_CONFIG_KEYS = (
    "state_dim",
    "act_dim",
    "hidden_size",
    "max_ep_len",
    "action_tanh",
    "n_layer",
    "n_head",
    "n_inner",
    "activation_function",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "layer_norm_epsilon",
    "initializer_range",
)
# keys of transformers' config that carry nothing this model needs (GPT-2 text settings, besides every config's
# bookkeeping)
_IGNORED_CONFIG_KEYS = frozenset(
    {
        "vocab_size",
        "n_positions",
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "reorder_and_upcast_attn",
        "tie_word_embeddings",
        "id2label",
        "label2id",
        "problem_type",
        "max_position_embeddings",
        "num_attention_heads",
        "num_hidden_layers",
        "scale_attn_weights",
        "scale_attn_by_inverse_layer_idx",
        "add_cross_attention",
    }
)
# settings of transformers' GPT-2 this model does not implement, with the value it must have
_REQUIRED_CONFIG_VALUES = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
}

# transformers name -> tf_family name
_KEY_RULES = (
    (r"^encoder\.h\.(\d+)\.ln_1\.", r"layers.\1.attention_norm."),
    (r"^encoder\.h\.(\d+)\.ln_2\.", r"layers.\1.mlp_norm."),
    (r"^encoder\.h\.(\d+)\.attn\.c_attn\.", r"layers.\1.attention.qkv."),
    (r"^encoder\.h\.(\d+)\.attn\.c_proj\.", r"layers.\1.attention.out_proj."),
    (r"^encoder\.h\.(\d+)\.mlp\.c_fc\.", r"layers.\1.mlp.fc_in."),
    (r"^encoder\.h\.(\d+)\.mlp\.c_proj\.", r"layers.\1.mlp.fc_out."),
    (r"^encoder\.ln_f\.", "final_norm."),
    (r"^predict_action\.0\.", "predict_action."),
)
# GPT-2 `Conv1D` weights are stored (in, out); ours are `nn.Linear` (out, in)
_TRANSPOSED_KEYS = (r"^encoder\.h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$",)
_POSITION_KEY = "encoder.wpe.weight"
# the unused word embedding, the position table (folded, below) and the causal-mask buffers older checkpoints saved
_DROPPED_KEYS = (r"^encoder\.(wte\.weight|wpe\.weight|h\.\d+\.attn\.(bias|masked_bias))$",)


def _fold_position_embedding(
    source: dict[str, torch.Tensor], converted: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """transformers' GPT-2 gives every token the position embedding of position 0 right after ``embed_ln``: fold
    that constant into ``embed_ln``'s bias (exact)."""
    if _POSITION_KEY in source and "embed_ln.bias" in converted:
        converted["embed_ln.bias"] = converted["embed_ln.bias"] + source[_POSITION_KEY][0]
    return converted


def translate_config(reference: dict[str, Any], **overrides: Any) -> TffDecisionTransformerConfig:
    """The `TffDecisionTransformerConfig` of a transformers ``decision_transformer`` ``config.json`` (as a dict).

    ``overrides`` set what transformers keeps outside the config (``state_mean``, ``state_std``, ``return_scale``,
    ``target_return``, ``context_length``, ``env_id``) or change anything else. Settings of transformers' GPT-2
    that this model does not implement raise `NotImplementedError`; keys it does not know are logged and ignored.
    """
    for key, required in _REQUIRED_CONFIG_VALUES.items():
        if key in reference and bool(reference[key]) != required:
            raise NotImplementedError(
                f"{key}={reference[key]} is not supported by TffDecisionTransformerModel (it implements {key}="
                f"{required}, the setting of every published Decision Transformer checkpoint)."
            )
    kwargs = copy_config_values(reference, _COPIED_CONFIG_KEYS, _IGNORED_CONFIG_KEYS, REFERENCE_MODEL_TYPE)
    # transformers' embed_ln uses torch's default epsilon, its blocks use layer_norm_epsilon
    if kwargs.get("layer_norm_epsilon", 1e-5) != 1e-5:
        raise NotImplementedError(
            f"layer_norm_epsilon={kwargs['layer_norm_epsilon']}: transformers uses it in the blocks but 1e-5 in "
            "embed_ln; TffDecisionTransformerModel uses one epsilon everywhere, so only 1e-5 converts exactly."
        )
    # transformers' model always has the state and return heads (they are never trained there)
    kwargs.update(predict_state=True, predict_return=True, action_space="continuous")
    return TffDecisionTransformerConfig(**{**kwargs, **overrides})


TRANSFORMERS_DECISION_TRANSFORMER = ForeignFormat(
    name="decision-transformer",
    source_model_type=REFERENCE_MODEL_TYPE,
    description="a transformers decision_transformer checkpoint -> tf_family format",
    translate_config=translate_config,
    rename_rules=_KEY_RULES,
    dropped=_DROPPED_KEYS,
    # a model saved inside a wrapper keeps its weights under its base prefix
    renamed_prefixes=(("decision_transformer.", ""),),
    transposed=_TRANSPOSED_KEYS,
    transform=_fold_position_embedding,
    default_task="action",
)
# Rename, transpose and fold transformers' `DecisionTransformerModel` weights into tf_family's layout.
convert_state_dict = TRANSFORMERS_DECISION_TRANSFORMER.convert_state_dict

__all__ = ["REFERENCE_MODEL_TYPE", "TRANSFORMERS_DECISION_TRANSFORMER", "convert_state_dict", "translate_config"]
