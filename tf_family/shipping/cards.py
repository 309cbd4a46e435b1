"""Model cards for trained folders: the architecture's template plus the run's data, hyperparameters and results.

Recipes write ``training_run.json`` next to the weights; `write_model_card` turns it into ``README.md`` with the
evaluation results in the YAML front matter (``model-index``, through `huggingface_hub.ModelCardData` /
`EvalResult`) so the Hub shows them, and, as the Hub expects, the training data's Hub id (``datasets``) and the model
fine-tuned from (``base_model`` and ``base_model_relation``: ``finetune`` or ``adapter``) when those are Hub
repositories (local paths and bundled corpora are named in the card's text only). ``tf-family card DIR`` calls the same function.

What goes into the ``model-index`` follows the run's ``task``: a causal LM (``"causal_lm"``, the default) reports its
perplexity and losses on the evaluation split of its dataset; a reinforcement-learning run (``"reinforcement_learning"``,
e.g. ``recipes/decision_transformer.py``) reports, for every target return it was evaluated at, the mean return
(``mean_reward``) and the normalised score (``normalized_score``) in its environment, with the environment id as the
dataset (the convention of the Hub's RL models). The encoder recipes' tasks report accuracy and macro-F1
(``"sequence_classification"``), masked-token perplexity, loss and accuracy (``"masked_lm"``) or exact match and F1
(``"question_answering"``), and set the card's pipeline tag and the Auto class of its usage example (templates may
write ``{{ pipeline_tag }}`` and ``{{ auto_class }}``).
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..utils.files import atomic_write_text

RUN_INFO_FILE = "training_run.json"
# a Hub repository id: "name" or "owner/name"
HUB_ID_PATTERN = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
DEFAULT_TEMPLATE = "default.md"
# marks the card paragraph about loading without tf_family (`remote_code_note`)
REMOTE_CODE_NOTE_MARKER = "<!-- tf_family remote code -->"

# metric key in training_run.json -> (metric type, display name) in the model-index
_METRICS = {
    "perplexity": ("perplexity", "Perplexity"),
    "eval_loss": ("loss", "Cross-entropy (nats per token)"),
    "bits_per_token": ("bits_per_token", "Bits per token"),
    "bits_per_character": ("bpc", "Bits per character"),
}

RL_TASK = "reinforcement_learning"
# the encoder recipes' tasks: (pipeline tag, task type, task name, {metric key: (metric type, display name)})
_ENCODER_TASKS = {
    "sequence_classification": (
        "text-classification",
        "text-classification",
        "Text classification",
        {"eval_accuracy": ("accuracy", "Accuracy"), "eval_macro_f1": ("f1", "Macro F1")},
    ),
    "masked_lm": (
        "fill-mask",
        "fill-mask",
        "Masked language modeling",
        {
            "perplexity": ("perplexity", "Perplexity of the masked tokens"),
            "eval_loss": ("loss", "Cross-entropy of the masked tokens (nats)"),
            "masked_accuracy": ("accuracy", "Masked-token accuracy"),
        },
    ),
    "question_answering": (
        "question-answering",
        "question-answering",
        "Extractive question answering",
        {"exact_match": ("exact_match", "Exact match"), "f1": ("f1", "F1")},
    ),
}
# the Auto class a card's usage example loads, per task
AUTO_CLASSES = {
    "causal_lm": "AutoModelForCausalLM",
    "sequence_classification": "AutoModelForSequenceClassification",
    "masked_lm": "AutoModelForMaskedLM",
    "question_answering": "AutoModelForQuestionAnswering",
}
# training_run.json "dataset" keys shown as the size of the training data, per task
_DATA_COUNTS = {
    "causal_lm": ("train_documents", "train_tokens", "eval_documents", "eval_tokens"),
    "sequence_classification": ("train_documents", "eval_documents", "test_documents"),
    "masked_lm": ("train_documents", "train_tokens", "eval_documents", "eval_tokens"),
    "question_answering": ("train_examples", "eval_examples"),
    RL_TASK: ("num_episodes", "num_transitions", "mean_return", "max_return"),
}


def template_text(name: str) -> str:
    """A card template shipped in ``model_cards/`` (installed as ``tf_family.model_cards``)."""
    path = resources.files("tf_family.model_cards").joinpath(name)
    if not path.is_file():
        raise ValueError(f"no model card template {name!r} in tf_family's model_cards/.")
    return path.read_text(encoding="utf-8")


def template_for(model_type: str | None) -> str:
    """The template file name for ``model_type``: the registry's card, or the generic one."""
    from ..registry import find_arch  # the registry imports every model: only when a card is rendered

    spec = find_arch(model_type)
    return spec.card if spec is not None else DEFAULT_TEMPLATE


def _split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    if not text.startswith("---\n"):
        return {}, text
    end = text.index("\n---\n", 4)
    return yaml.safe_load(text[4:end]) or {}, text[end + 5 :]


def read_run_info(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / RUN_INFO_FILE
    if not path.is_file():
        raise ValueError(
            f"{folder} has no {RUN_INFO_FILE}; it is written by the tf_family recipes. Train with a recipe, or write "
            "the card by hand."
        )
    return json.loads(path.read_text(encoding="utf-8"))


def _markdown_table(rows: dict[str, Any], header: tuple[str, str]) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "| --- | --- |"]
    lines += [f"| {key} | {value} |" for key, value in rows.items()]
    return "\n".join(lines)


def _wide_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _rl_eval_results(run: dict[str, Any]) -> list[EvalResult]:
    """One ``mean_reward`` and (with reference returns) one ``normalized_score`` per evaluated target return."""
    evaluation = run.get("evaluation") or {}
    env_id = evaluation.get("env_id") or run.get("dataset", {}).get("env_id") or "environment"
    results = []
    for entry in evaluation.get("targets", []):
        target = _format(float(entry["target_return"]))
        common = {
            "task_type": "reinforcement-learning",
            "task_name": "Offline reinforcement learning",
            "dataset_type": env_id,
            "dataset_name": env_id,
        }
        results.append(
            EvalResult(
                **common,
                metric_type="mean_reward",
                metric_name=f"Mean return (target return {target})",
                metric_value=round(float(entry["mean_return"]), 4),
            )
        )
        if entry.get("normalized_score") is not None:
            results.append(
                EvalResult(
                    **common,
                    metric_type="normalized_score",
                    metric_name=f"Normalised score (target return {target})",
                    metric_value=round(float(entry["normalized_score"]), 4),
                )
            )
    return results


def _rl_evaluation_text(run: dict[str, Any]) -> str:
    evaluation = run.get("evaluation") or {}
    targets = evaluation.get("targets", [])
    if not targets:
        return "No evaluation was run."
    normalized = any(entry.get("normalized_score") is not None for entry in targets)
    header = ["target return", "mean return ± std", *(["normalised score ± std"] if normalized else []), "episodes"]
    rows = []
    for entry in targets:
        row = [_format(float(entry["target_return"])), f"{entry['mean_return']:.1f} ± {entry['std_return']:.1f}"]
        if normalized:
            score = entry.get("normalized_score")
            row.append("—" if score is None else f"{score:.1f} ± {entry.get('normalized_score_std', 0.0):.1f}")
        row.append(str(len(entry.get("returns", [])) or evaluation.get("num_episodes", "")))
        rows.append(row)
    text = (
        f"In `{evaluation.get('env_id', 'the environment')}`, the policy conditioned on each target return "
        f"(greedy actions; episode `i` resets with seed `{evaluation.get('seed', 0)} + i`):\n\n"
        + _wide_table(header, rows)
    )
    reference = evaluation.get("reference_returns")
    if reference:
        text += f"\n\nReference returns: random policy {reference['random']:.1f}, expert {reference['expert']:.1f}."
    if evaluation.get("plot"):
        text += f"\n\n![achieved return against target return]({evaluation['plot']})"
    return text


def _format(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _base_on_hub(run: dict[str, Any]) -> bool:
    base = run.get("base_model")
    if not base:
        return False
    if run.get("base_model_on_hub") is not None:
        return bool(run["base_model_on_hub"])
    # a record written before the flag existed: a Hub id is no local path
    return not Path(base).exists() and HUB_ID_PATTERN.fullmatch(base) is not None


def _hub_datasets(data: dict[str, Any]) -> list[str] | None:
    """The run's training data as the Hub's ``datasets`` field: a Hub dataset id only. A local file or folder (even
    one passed as ``--dataset_name``) and a bundled corpus are described in the card's text instead."""
    name = data.get("name")
    if not name or not data.get("on_hub") or Path(name).exists() or not HUB_ID_PATTERN.fullmatch(str(name)):
        return None
    return [str(name)]


def _base_model_relation(folder: Path, run: dict[str, Any]) -> str:
    """How the folder relates to its ``base_model`` in the Hub's terms: ``"adapter"`` (a LoRA adapter) or
    ``"finetune"`` (whole weights trained further, LoRA merged in included)."""
    return "adapter" if (folder / "adapter_config.json").is_file() or run.get("adapter") else "finetune"


def remote_code_note(auto_map: dict[str, str]) -> str:
    """What a card says about loading the folder without tf_family."""
    auto_class = next((name for name in auto_map if name.startswith("AutoModelFor")), "AutoModel")
    return (
        f"{REMOTE_CODE_NOTE_MARKER}\n**Loads without tf_family.** This folder carries its model code (the `*.py` "
        "files, named in `config.json`'s `auto_map`), so plain transformers (with torch and safetensors) loads it: "
        f"`{auto_class}.from_pretrained(path_or_repo_id, trust_remote_code=True)`; read the code before trusting it. "
        "Without tf_family, attention always takes the PyTorch path: the native C++ CPU kernel tf_family compiles is "
        "not included (same results; CPU training is slower), and faiss indexes stay optional (exact search without "
        "faiss). With tf_family installed, `import tf_family` and load without `trust_remote_code`."
    )


def dependencies_text(folder: Path, run: dict[str, Any]) -> str:
    """What the folder needs besides itself, said plainly: an adapter's base model, a kNN-LM's datastore, whether it
    loads without tf_family (a remote-code export); and where a fine-tuned model came from when that is no Hub
    repository."""
    base = run.get("base_model")
    on_hub = _base_on_hub(run)
    lines = []
    if (folder / "adapter_config.json").is_file() or run.get("adapter"):
        where = (
            f"the Hub model [`{base}`](https://huggingface.co/{base}), downloaded when the adapter is loaded"
            if on_hub
            else f"the local folder `{base}`, which is neither in this folder nor on the Hub: copy it along (and "
            "fix `base_model_name_or_path` in `adapter_config.json`), or train with `--merge_lora` for a standalone "
            "folder"
        )
        lines.append(
            f"**Depends on a base model.** This folder holds a LoRA adapter (`adapter_model.safetensors`), not a "
            f"whole model; loading it (with `peft` installed) also loads its base model: {where}."
        )
    elif base and not on_hub:
        lines.append(
            f"Fine-tuned from the local folder `{base}` (not on the Hub); this folder holds the whole model and "
            "needs nothing from it."
        )
    config_path = folder / "config.json"
    auto_map = json.loads(config_path.read_text()).get("auto_map") if config_path.is_file() else None
    if auto_map:  # a remote-code export (`tf_family.shipping.remote_code`)
        lines.append(remote_code_note(auto_map))
    datastore = run.get("datastore")
    if datastore:
        lines.append(
            f"**Depends on its datastore**, stored in this folder under `{datastore['folder']}/` "
            f"({datastore['keys']:,} keys): `from_pretrained` attaches it, from a local copy of the folder or by Hub "
            "id (the repository's `datastore/` files are fetched into the Hub cache with the weights); without its "
            "datastore the model is its base LM alone."
        )
    return "\n\n".join(lines)


def render_model_card(folder: str | Path, repo_id: str | None = None) -> ModelCard:
    """The card of a folder trained by a recipe (reads ``config.json`` and ``training_run.json``)."""
    folder = Path(folder)
    run = read_run_info(folder)
    config_path = folder / "config.json"
    model_type = json.loads(config_path.read_text())["model_type"] if config_path.is_file() else run.get("model_type")
    data = run.get("dataset", {})
    task = run.get("task", "causal_lm")
    encoder_task = _ENCODER_TASKS.get(task)
    # a template may leave its pipeline tag and Auto class to the task (the encoders' templates do)
    template = jinja2.Template(template_text(template_for(model_type)), undefined=jinja2.DebugUndefined).render(
        pipeline_tag=encoder_task[0] if encoder_task else "text-generation",
        auto_class=AUTO_CLASSES.get(task, "AutoModel"),
    )
    template_front, body = _split_front_matter(template)
    dataset_id = data.get("name") or "local files"
    eval_split = data.get("eval_split", "validation")
    eval_results = [
        EvalResult(
            task_type="text-generation",
            task_name="Causal language modeling",
            dataset_type=dataset_id,
            dataset_name=data.get("title", dataset_id),
            dataset_split=eval_split,
            metric_type=metric_type,
            metric_name=metric_name,
            metric_value=round(float(run["metrics"][key]), 6),
        )
        for key, (metric_type, metric_name) in _METRICS.items()
        if key in run.get("metrics", {})
    ]
    if task == RL_TASK:
        eval_results = _rl_eval_results(run)
    elif encoder_task:
        _, task_type, task_name, metric_names = encoder_task
        eval_results = [
            EvalResult(
                task_type=task_type,
                task_name=task_name,
                dataset_type=dataset_id,
                dataset_name=data.get("title", dataset_id),
                dataset_split=eval_split,
                metric_type=metric_type,
                metric_name=metric_name,
                metric_value=round(float(run["metrics"][key]), 6),
            )
            for key, (metric_type, metric_name) in metric_names.items()
            if key in run.get("metrics", {})
        ]
    name = repo_id.split("/")[-1] if repo_id else folder.resolve().name
    tags = list(dict.fromkeys([*template_front.get("tags", []), "tf_family", *([model_type] if model_type else [])]))
    card_data = ModelCardData(
        model_name=name,
        library_name=template_front.get("library_name", "transformers"),
        pipeline_tag=template_front.get("pipeline_tag", "text-generation"),
        tags=tags,
        license=template_front.get("license", "apache-2.0"),
        base_model=run.get("base_model") if _base_on_hub(run) else None,  # the Hub takes repository ids only
        datasets=_hub_datasets(data),
        eval_results=eval_results or None,
        hyperparameters=run.get("hyperparameters"),
        training_data={key: data[key] for key in sorted(data) if key not in ("title",)} or None,
    )
    if card_data.base_model:
        card_data.base_model_relation = _base_model_relation(folder, run)

    training_data = data.get("description") or f"`{dataset_id}`"
    counts = {key: data[key] for key in _DATA_COUNTS.get(task, _DATA_COUNTS["causal_lm"]) if key in data}
    if counts:
        header = ("quantity", "value") if task == RL_TASK else ("split", "size")
        training_data += "\n\n" + _markdown_table({k: _format(v) for k, v in counts.items()}, header)
    depends = dependencies_text(folder, run)
    procedure = (depends + "\n\n" if depends else "") + f"Trained with `{run.get('recipe', 'a tf_family recipe')}`"
    if run.get("world_size", 1) > 1:
        procedure += f" on {run['world_size']} processes"
    procedure += ".\n\n" + _markdown_table(
        {k: f"`{_format(v)}`" for k, v in (run.get("hyperparameters") or {}).items()}, ("hyperparameter", "value")
    )
    metrics = run.get("metrics", {})
    if task == RL_TASK:
        evaluation = _rl_evaluation_text(run)
    elif metrics:
        evaluation = f"On the {eval_split} split:\n\n" + _markdown_table(
            {k: _format(v) for k, v in metrics.items()}, ("metric", "value")
        )
    else:
        evaluation = "No evaluation was run."
    rendered = jinja2.Template(body, undefined=jinja2.StrictUndefined).render(
        model_name=name,
        repo_id=repo_id or str(folder),
        training_data=training_data,
        training_procedure=procedure,
        evaluation=evaluation,
    )
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n{rendered}")


def write_model_card(folder: str | Path, repo_id: str | None = None) -> Path:
    """Render the card of ``folder`` and write it to ``folder/README.md``."""
    card = render_model_card(folder, repo_id)
    path = Path(folder) / "README.md"
    atomic_write_text(path, str(card))  # beside, fsync, rename: an interrupted write keeps the previous card
    return path


__all__ = [
    "REMOTE_CODE_NOTE_MARKER",
    "RL_TASK",
    "RUN_INFO_FILE",
    "read_run_info",
    "remote_code_note",
    "render_model_card",
    "template_for",
    "write_model_card",
]
