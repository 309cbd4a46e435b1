"""The recipes' library: the run lifecycle every training recipe in ``recipes/`` shares, the way timm's ``train.py``
takes its helpers from ``timm.utils``. A recipe keeps its data, model and training loop in view and takes from here:

- `arguments`: the shared argument groups (optimisation; evaluation, checkpoints, output; LoRA; Hub) and their
  validation (``--report_to`` resolved into ``args.trackers``), ``--config_overrides`` parsing;
- `accelerator`: the `Accelerator` of a run (`make_accelerator`) and its end on every process (`ending_run`, around
  the last barrier, `final_barrier`);
- `checkpointing`: the output folder's guard, atomic checkpoints (beside, then renamed), `find_checkpoint`,
  `resume`, and the state a model carries between steps (its class attribute ``carried_state``);
- `lora`: optional PEFT LoRA adapters on the registry's targets;
- `loop`: AdamW with its schedule, and the logged window of training steps (`TrainingLog`);
- `run`: one run as the recipes' named steps pass it along (`start_run` → `prepare` → the loop's
  `Run.optimizer_step` → `Run.log_metrics` → `Run.finish`);
- `saving`: the weights, the run record (``training_run.json``), the model card and the optional push;
- `early_exit`: what the CALM calibration recipe and benchmark share (prompts, generation with exits, consistency
  losses, Learn-then-Test over a threshold grid);
- `encoder`: what the encoder task recipes (sequence classification, masked LM, question answering) share, their
  training loop included;
- `language_modeling`: what the causal-LM, masked-LM and kNN-LM recipes share (text options and loading, the
  document separator, perplexity metrics, the model to train and its block size).

Nothing in ``tf_family`` imports this package: it is for the recipes (and scripts written like them).
"""

from ..spec import carried_state  # the model's class attribute: what it carries between steps
from .accelerator import configure_ddp, ending_run, final_barrier, make_accelerator, may_leave_parameters_unused
from .arguments import (
    SCHEDULERS,
    TRACKERS,
    add_lora_and_hub_arguments,
    add_optimisation_arguments,
    add_run_arguments,
    architectures_with,
    check_arch,
    check_at_least,
    check_model_source,
    parse_config_overrides,
    validate_run_args,
)
from .checkpointing import (
    CHECKPOINT_PATTERN,
    check_output_dir,
    find_checkpoint,
    load_carried_state,
    load_data_state,
    resume,
    save_checkpoint,
)
from .loop import TrainingLog, make_optimizer
from .lora import apply_lora, check_lora_head, check_lora_targets
from .saving import (
    point_adapter_at_base,
    publish_run,
    run_hyperparameters,
    run_record,
    save_model,
    save_run,
    save_tokenizer,
    weights_fingerprint,
)

__all__ = [
    "CHECKPOINT_PATTERN",
    "SCHEDULERS",
    "TRACKERS",
    "TrainingLog",
    "add_lora_and_hub_arguments",
    "add_optimisation_arguments",
    "add_run_arguments",
    "apply_lora",
    "architectures_with",
    "carried_state",
    "check_arch",
    "check_at_least",
    "check_lora_head",
    "check_lora_targets",
    "check_model_source",
    "check_output_dir",
    "configure_ddp",
    "ending_run",
    "final_barrier",
    "find_checkpoint",
    "load_carried_state",
    "load_data_state",
    "make_accelerator",
    "make_optimizer",
    "may_leave_parameters_unused",
    "parse_config_overrides",
    "point_adapter_at_base",
    "publish_run",
    "resume",
    "run_hyperparameters",
    "run_record",
    "save_checkpoint",
    "save_model",
    "save_run",
    "save_tokenizer",
    "validate_run_args",
    "weights_fingerprint",
]
