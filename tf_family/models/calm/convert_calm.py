"""Build a CALM model from a transformers Llama or GPT-2 checkpoint (how an existing decoder becomes an exiting one).

`TffCalmForCausalLM.from_pretrained(llama_folder, first_exit=2, ...)` (or ``tf-family convert calm-llama``) reads a
folder saved by transformers' `LlamaForCausalLM` / `LlamaModel` through `tf_family.conversion` with the record
`TRANSFORMERS_LLAMA`: the module names are Llama's, so the weights load one to one, key by key and shape by shape;
the meta classifier, which Llama has not, starts at zero (confidence 0.5 everywhere until fine-tuned with the
anytime loss: ``recipes/causal_lm.py --model_name_or_path <converted>``). Keyword arguments set CALM's fields
(``first_exit``, ``exit_interval``, ``confidence_measure`` …). Rope scaling and ``pretraining_tp`` other than 1 are
refused.

A GPT-2 folder (`GPT2LMHeadModel` / `GPT2Model`, record `TRANSFORMERS_GPT2`) becomes the ``"gpt2"`` decoder style
(LayerNorm, learned positions, plain MLP, biases): its ``Conv1D`` weights (stored ``(in, out)``) are transposed and
the fused ``c_attn`` projection is split into query, key and value. GPT-2's position ids ignore the attention mask
(left padding shifts them); ours count real tokens, so outputs agree without left padding. This module is data: it
never imports the modeling file.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ...conversion import ForeignFormat, build_converted, copy_config_values, declared_formats
from .configuration_calm import TffCalmConfig

REFERENCE_MODEL_TYPE = "llama"

_COPIED_CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "attention_bias",
    "attention_dropout",
    "mlp_bias",
    "initializer_range",
    "tie_word_embeddings",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "use_cache",
)
_IGNORED_CONFIG_KEYS = frozenset(
    {"rope_parameters", "rope_theta", "rope_scaling", "pretraining_tp", "id2label", "label2id", "problem_type"}
)


def translate_config(reference: dict[str, Any], **overrides: Any) -> TffCalmConfig:
    """The `TffCalmConfig` of a transformers ``llama`` ``config.json`` (as a dict), with CALM's ``overrides``."""
    rope = dict(reference.get("rope_parameters") or {})
    if reference.get("rope_scaling"):
        rope.update(reference["rope_scaling"])
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise NotImplementedError(f"rope_type={rope_type!r}: TffCalmConfig implements Llama's default rope only.")
    if reference.get("pretraining_tp", 1) != 1:
        raise NotImplementedError(f"pretraining_tp={reference['pretraining_tp']}: only 1 converts.")
    kwargs = copy_config_values(reference, _COPIED_CONFIG_KEYS, _IGNORED_CONFIG_KEYS, REFERENCE_MODEL_TYPE)
    kwargs["rope_base"] = float(rope.get("rope_theta", reference.get("rope_theta", 10000.0)))
    return TffCalmConfig(**{**kwargs, **overrides})


def _add_meta_classifier(
    source: dict[str, torch.Tensor], converted: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Llama has no meta classifier: it starts at zero (a constant confidence of 0.5)."""
    reference = converted.get("lm_head.weight", converted.get("model.embed_tokens.weight"))
    if reference is not None and "meta_classifier.weight" not in converted:
        converted["meta_classifier.weight"] = reference.new_zeros(2, reference.shape[1])
        converted["meta_classifier.bias"] = reference.new_zeros(2)
    return converted


def translate_gpt2_config(reference: dict[str, Any], **overrides: Any) -> TffCalmConfig:
    """The `TffCalmConfig` (``decoder_style="gpt2"``) of a transformers ``gpt2`` ``config.json`` (as a dict)."""
    for key, required in (
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
        ("add_cross_attention", False),
    ):
        if key in reference and bool(reference[key]) != required:
            raise NotImplementedError(f"{key}={reference[key]}: TffCalmConfig implements GPT-2 with {key}={required}.")
    hidden = reference.get("n_embd", 768)
    kwargs = {
        "decoder_style": "gpt2",
        "attention_bias": True,
        "mlp_bias": True,
        "vocab_size": reference.get("vocab_size", 50257),
        "hidden_size": hidden,
        "intermediate_size": reference.get("n_inner") or 4 * hidden,
        "num_hidden_layers": reference.get("n_layer", 12),
        "num_attention_heads": reference.get("n_head", 12),
        "hidden_act": reference.get("activation_function", "gelu_new"),
        "max_position_embeddings": reference.get("n_positions", 1024),
        "layer_norm_eps": reference.get("layer_norm_epsilon", 1e-5),
        "attention_dropout": reference.get("attn_pdrop", 0.0),
        "initializer_range": reference.get("initializer_range", 0.02),
        "tie_word_embeddings": reference.get("tie_word_embeddings", True),
    }
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if reference.get(name) is not None:
            kwargs[name] = reference[name]
    return TffCalmConfig(**{**kwargs, **overrides})


_GPT2_LAYER = r"^(?:transformer\.)?h\.(\d+)\."
_GPT2_KEY_RULES = (
    (r"^(?:transformer\.)?wte\.", "model.embed_tokens."),
    (r"^(?:transformer\.)?wpe\.", "model.embed_positions."),
    (r"^(?:transformer\.)?ln_f\.", "model.norm."),
    (_GPT2_LAYER + r"ln_1\.", r"model.layers.\1.input_layernorm."),
    (_GPT2_LAYER + r"ln_2\.", r"model.layers.\1.post_attention_layernorm."),
    (_GPT2_LAYER + r"attn\.c_attn\.", r"model.layers.\1.self_attn.c_attn."),
    (_GPT2_LAYER + r"attn\.c_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (_GPT2_LAYER + r"mlp\.c_fc\.", r"model.layers.\1.mlp.up_proj."),
    (_GPT2_LAYER + r"mlp\.c_proj\.", r"model.layers.\1.mlp.down_proj."),
)


def _split_fused_attention(
    source: dict[str, torch.Tensor], converted: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """GPT-2's ``c_attn`` holds query, key and value stacked: split it into ``q_proj``, ``k_proj``, ``v_proj``."""
    for key in [key for key in converted if ".self_attn.c_attn." in key]:
        tensor = converted.pop(key)
        for name, part in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0), strict=True):
            converted[key.replace("c_attn", name)] = part.contiguous()
    return _add_meta_classifier(source, converted)


TRANSFORMERS_GPT2 = ForeignFormat(
    name="calm-gpt2",
    source_model_type="gpt2",
    description="a transformers GPT-2 checkpoint -> a CALM early-exit model (tf_family format)",
    translate_config=translate_gpt2_config,
    rename_rules=_GPT2_KEY_RULES,
    dropped=(r"\.attn\.(bias|masked_bias)$",),
    transposed=(_GPT2_LAYER + r"(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$",),
    transform=_split_fused_attention,
    default_task="causal_lm",
)

# The zoo's other models, and why each cannot become a CALM decoder (`TffCalmForCausalLM.from_decoder` says so).
UNSUPPORTED_FIX = (
    "Train an exiting model with `python recipes/causal_lm.py --arch calm` instead, or build one from a transformers "
    "Llama/GPT-2 model (or a kNN-LM around one) with TffCalmForCausalLM.from_decoder."
)
UNSUPPORTED_DECODERS = {
    "tff_transfo_xl": "Transformer-XL attends with relative positions (r_w_bias, r_r_bias, a relative position "
    "projection) over a memory of previous segments, not a key/value cache: a skipped layer's state propagation would "
    "have to write that layer's segment memory, and CALM's decoder has no relative attention.",
    "tff_compressive": "the Compressive Transformer is Transformer-XL's relative attention over a segment memory plus "
    "a compressed memory: the same obstacle as Transformer-XL (no key/value cache to propagate into).",
    "tff_memorizing": "the Memorizing Transformer is Transformer-XL's relative attention and segment memory plus a kNN "
    "memory of past keys and values in one layer: no plain key/value cache to propagate into.",
    "tff_reformer": "the Reformer's layers are reversible (two residual streams per layer, no single exit state) "
    "with LSH/local attention over chunked buckets and axial positions: state propagation has no keys and values "
    "of one exit state to write.",
    "tff_longformer": "the Longformer is a bidirectional encoder (masked LM): CALM exits while decoding causally.",
    "tff_big_bird": "BigBird is a bidirectional encoder (masked LM): CALM exits while decoding causally.",
    "tff_decision_transformer": "the Decision Transformer decodes (return, state, action) embeddings into continuous "
    "actions: it has no token vocabulary, so no softmax confidence and no LM head to share between exits.",
    "tff_performer": "kernelised attention keeps a recurrent state (sum phi(k) v^T), not per-token keys and values: "
    "a skipped layer's state propagation would have to update that state, which CALM's decoder does not do.",
    "tff_linear_transformer": "the Linear Transformer's attention is kernelised (a recurrent state, no key/value "
    "cache): the same obstacle as the Performer.",
    "tff_rfa": "Random Feature Attention is kernelised and gated (a decaying recurrent state, no key/value cache): "
    "the same obstacle as the Performer.",
    "tff_linformer": "the Linformer is a bidirectional encoder (its E / F projections mix every position): CALM exits "
    "while decoding causally.",
    "tff_universal_transformer": "the Universal Transformer applies one shared block recurrently with its own "
    "per-position halting (ACT): it has no stack of distinct layers to exit from, and its depth is already adaptive.",
    "tff_sparse_transformer": "the Sparse Transformer's heads attend under factorised sparse patterns (and may use "
    "ALiBi biases) that CALM's dense Llama/GPT-2 attention does not express: its layers cannot be copied one to one.",
    "tff_routing_transformer": "the Routing Transformer's routing heads attend within k-means clusters of shared, "
    "normalised queries/keys (no key projection, centroids as state) and its local heads within blocks, which CALM's "
    "dense Llama/GPT-2 attention does not express: its layers cannot be copied one to one.",
    "tff_spalm": "SPALM is Transformer-XL's relative attention over a segment memory plus retrieval from a kNN "
    "datastore mixed in through a gate before its output layer: the same obstacle as Transformer-XL (no key/value "
    "cache to propagate into), and its gated output is not CALM's shared LM head.",
}

TRANSFORMERS_LLAMA = ForeignFormat(
    name="calm-llama",
    source_model_type=REFERENCE_MODEL_TYPE,
    description="a transformers Llama checkpoint -> a CALM early-exit model (tf_family format)",
    translate_config=translate_config,
    dropped=(r"rotary_emb\.inv_freq$",),
    transform=_add_meta_classifier,
    default_task="causal_lm",
)

__all__ = [
    "REFERENCE_MODEL_TYPE",
    "UNSUPPORTED_DECODERS",
    "UNSUPPORTED_FIX",
    "TRANSFORMERS_GPT2",
    "TRANSFORMERS_LLAMA",
    "translate_config",
    "translate_gpt2_config",
]


def from_decoder(cls, decoder, **calm_fields):
    """`TffCalmForCausalLM.from_decoder` (``cls``): a CALM model with the weights of ``decoder`` (a model object or a
    folder: a transformers Llama or GPT-2, a zoo kNN-LM around one, or a CALM model), ``calm_fields`` set."""
    if isinstance(decoder, (str, os.PathLike)):
        model_type = AutoConfig.from_pretrained(decoder).model_type
        if model_type in UNSUPPORTED_DECODERS:  # refuse before building anything
            raise ValueError(
                f"decoder {decoder!s} is a {model_type!r} model: {UNSUPPORTED_DECODERS[model_type]} {UNSUPPORTED_FIX}"
            )
        if any(fmt.matches({"model_type": model_type}) for fmt in declared_formats(cls)):
            return cls.from_pretrained(decoder, **calm_fields)
        decoder = AutoModelForCausalLM.from_pretrained(decoder)
    config = getattr(decoder, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type == "tff_knn_lm":  # the kNN-LM's base LM is the decoder
        return from_decoder(cls, decoder.lm, **calm_fields)
    if model_type == "tff_calm":
        new_config = copy.deepcopy(config)
        for name, value in calm_fields.items():
            if not hasattr(new_config, name):
                raise ValueError(f"{name}={value!r} is not a TffCalmConfig field.")
            setattr(new_config, name, value)
        new_config.validate_architecture()
        model = cls(new_config)
        model.load_state_dict(decoder.state_dict())
        return model.to(next(decoder.parameters()).dtype)
    fmt = next((fmt for fmt in declared_formats(cls) if fmt.matches(config)), None)
    if fmt is None:
        reason = UNSUPPORTED_DECODERS.get(
            model_type, "CALM builds from Llama and GPT-2 decoders (transformers' or inside a zoo kNN-LM)."
        )
        raise ValueError(f"decoder is a {model_type!r} model ({type(decoder).__name__}): {reason} {UNSUPPORTED_FIX}")
    model = build_converted(cls, fmt.translate_config(config.to_dict(), **calm_fields), decoder.state_dict(), fmt)
    return model[0] if isinstance(model, tuple) else model
