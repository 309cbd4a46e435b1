"""What every tf_family model is built from: the pieces each modeling file imports.

* `pretrained` — `TffPreTrainedModel`, the one base of every model's ``PreTrainedModel``: input checks, the
  ``from_pretrained`` hook, ``save_pretrained(remote_code=True)``;
* `configuration` — the checks every config runs on itself (unknown keys, field types, shared fields);
* `validation` — the checks a model input runs once at the edge, and `ValidatedGenerationMixin` (the generation
  mixin of the models that generate);
* `outputs` — the `ModelOutput` dataclasses several models return;
* `heads` — the task heads the encoders share (masked LM, classification, question answering, multiple choice);
* `losses` — the losses, with `Trainer`'s ``num_items_in_batch``;
* `cache` — the key/value cache the decoders grow in place (`GrowingCache`, `GrowingCacheGenerationMixin`);
* `fused_lm_head` — TRL's fused LM head, answered by the causal LMs;
* `utils` — small shared modules and functions (dropout, activations, pooling, decoding-step inputs).
* `handoff` — what ``import tf_family`` hands down to these modules (the remote-code exporter, the callback a
  config calls when it is built), None in a remote-code export.

Nothing here imports a model; the models import from here (by plain relative imports, so that the remote-code export
can copy exactly the modules a model uses).
"""
