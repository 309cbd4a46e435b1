"""transformers' `Trainer` trains every architecture of the registry, and gradient accumulation is exact.

`Trainer` passes ``num_items_in_batch`` (the labels that are not -100 over every micro-batch of an optimizer step) to
a model whose ``forward`` takes ``**kwargs`` and then leaves the 1/accumulation-steps scaling to the model's loss. So
``gradient_accumulation_steps=2, per_device_train_batch_size=1`` must give the same SGD update, and log the same loss,
as ``per_device_train_batch_size=2`` on the same two examples. The examples have different numbers of labelled items
(padding, and -100 inside the real tokens), so a loss that averaged per micro-batch, or ignored the count, fails.

Two documented exceptions (`tf_family.modeling.losses`): the Decision Transformer declares ``accepts_loss_kwargs = False``
(`Trainer` then averages the micro-batches' losses: equal to the large batch when they hold as many real steps, which
its examples here do, and the mean of the per-trajectory losses otherwise, checked separately); CALM's meta loss is
class-balanced within a call, so it is switched off in the exactness check and checked apart (it trains only the
meta classifier; everything else gets exactly the large-batch update with it on).
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainingArguments

from tf_family.registry import ARCHITECTURES

LENGTH = 16  # a multiple of every tiny config's chunk / block length
CHOICES = 2
LEARNING_RATE = 0.5

CASES = [(name, task) for name, spec in ARCHITECTURES.items() for task in spec.tasks]


def _tiny_model(name: str, task: str, **overrides) -> torch.nn.Module:
    """The registry's tiny model with every dropout at 0 (so that one batch of two and two batches of one compute
    the same rows)."""
    spec = ARCHITECTURES[name]
    defaults = spec.tiny_config(task=task).to_dict()
    no_dropout = {
        key: 0.0
        for key, value in defaults.items()
        if any(part in key for part in ("dropout", "pdrop", "dropatt")) and isinstance(value, float | type(None))
    }
    torch.manual_seed(0)
    return spec.model_classes[task](spec.tiny_config(task=task, **{**no_dropout, **overrides}))


def _token_rows(vocab_size: int, real: tuple[int, int], generator: torch.Generator) -> list[dict[str, torch.Tensor]]:
    """Two right-padded rows of ``LENGTH`` with ``real`` real tokens each; labels are the ids, -100 on padding and on
    every third real token (so the rows differ in labelled tokens whether or not the loss shifts them)."""
    rows = []
    for count in real:
        ids = torch.randint(4, vocab_size, (LENGTH,), generator=generator)
        mask = (torch.arange(LENGTH) < count).long()
        labels = ids.masked_fill(mask == 0, -100)
        labels[2:count:3] = -100
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return rows


def _examples(name: str, task: str, model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    """Two training examples for ``task`` with different numbers of labelled items."""
    generator = torch.Generator().manual_seed(1)
    config = model.config
    if task == "action":
        return _trajectories(config, (LENGTH // 2 - 2, LENGTH // 2 - 2), generator)
    vocab_size = config.base_config.vocab_size if name == "knn_lm" else config.vocab_size
    rows = _token_rows(vocab_size, (LENGTH - 3, LENGTH // 2 - 1), generator)
    if task in ("causal_lm", "masked_lm", "token_classification"):
        if task == "token_classification":
            for row in rows:
                row["labels"] = row["labels"].where(row["labels"] < 0, row["labels"] % config.num_labels)
        return rows
    if task == "sequence_classification":
        return [{**row, "labels": torch.tensor(index % config.num_labels)} for index, row in enumerate(rows)]
    if task == "question_answering":
        return [
            {"input_ids": row["input_ids"], "attention_mask": row["attention_mask"],
             "start_positions": torch.tensor(3 + index), "end_positions": torch.tensor(5 + index)}
            for index, row in enumerate(rows)
        ]  # fmt: skip
    if task == "multiple_choice":
        choices = _token_rows(config.vocab_size, (LENGTH - 5, LENGTH // 2), generator)
        return [
            {"input_ids": torch.stack([row["input_ids"], choice["input_ids"]]),
             "attention_mask": torch.stack([row["attention_mask"], choice["attention_mask"]]),
             "labels": torch.tensor(index)}
            for index, (row, choice) in enumerate(zip(rows, choices, strict=True))
        ]  # fmt: skip
    raise AssertionError(f"no examples for task {task!r}")


def _trajectories(config, real: tuple[int, int], generator: torch.Generator) -> list[dict[str, torch.Tensor]]:
    """Decision Transformer windows of ``context_length`` steps, ``real`` of them real: the first left-padded, the
    second right-padded."""
    steps = config.context_length
    rows = []
    for index, count in enumerate(real):
        mask = torch.zeros(steps, dtype=torch.long)
        if index % 2 == 0:
            mask[steps - count :] = 1
        else:
            mask[:count] = 1
        rows.append(
            {
                "states": torch.randn(steps, config.state_dim, generator=generator),
                "actions": torch.randn(steps, config.act_dim, generator=generator).tanh(),
                "returns_to_go": torch.rand(steps, 1, generator=generator) * 10,
                "timesteps": torch.arange(steps),
                "attention_mask": mask,
                "labels": torch.randn(steps, config.act_dim, generator=generator).tanh(),
            }
        )
    return rows


def _collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def _train_one_step(
    model, examples, batch_size: int, accumulation: int, output_dir, use_cache: bool = False, **arguments
) -> tuple[dict, float]:
    """One SGD step (no clipping, no decay, constant rate) of `Trainer`; returns the parameter update and the
    logged loss. ``use_cache``: `Trainer` sets ``config.use_cache`` from it (off by default: the memory models then
    keep no memory, so the Compressive Transformer compresses nothing)."""
    model = copy.deepcopy(model)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        learning_rate=LEARNING_RATE,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,  # no clipping
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
        use_cache=use_cache,
        **arguments,
    )
    trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=_collate)
    trainer.train()
    update = {name: param.detach() - before[name] for name, param in model.named_parameters()}
    logged = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
    return update, logged


def _large_batch_loss(model, examples) -> float:
    """The model's own loss on the two examples as one batch (train mode, no dropout, no cache: as `Trainer`
    runs it)."""
    model = copy.deepcopy(model).train()
    model.config.use_cache = False
    with torch.no_grad():
        return float(model(**_collate(examples)).loss)


def _assert_same_updates(accumulated: dict, large: dict, skip: tuple[str, ...] = ()) -> None:
    moved = 0
    for name, delta in large.items():
        if name.startswith(skip):
            continue
        torch.testing.assert_close(accumulated[name], delta, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        moved += bool(delta.abs().max() > 0)
    assert moved, "no parameter moved: the check would pass on a model that does not train"


@pytest.mark.parametrize(("name", "task"), CASES, ids=[f"{name}-{task}" for name, task in CASES])
def test_gradient_accumulation_equals_large_batch(name, task, tmp_path):
    # CALM's class-balanced meta loss and the Universal Transformer's ponder cost are per-call quantities (see the
    # module docstring, the test below and tests/models/universal_transformer/)
    per_call = {"calm": {"meta_loss_weight": 0.0}, "universal_transformer": {"act_loss_weight": 0.0}}
    model = _tiny_model(name, task, **per_call.get(name, {}))
    examples = _examples(name, task, model)
    large_update, large_loss = _train_one_step(model, examples, 2, 1, tmp_path / "large")
    accumulated_update, accumulated_loss = _train_one_step(model, examples, 1, 2, tmp_path / "accumulated")
    _assert_same_updates(accumulated_update, large_update)
    assert accumulated_loss == pytest.approx(large_loss, rel=1e-5)
    assert large_loss == pytest.approx(_large_batch_loss(model, examples), rel=1e-5)


AUXILIARY = [
    # CALM's class-balanced meta loss trains the meta classifier on detached states
    ("calm", {"meta_loss_weight": 1.0}, False, "meta_classifier."),
    # the Compressive Transformer's reconstruction losses (with a memory, so that states get compressed) train the
    # compression network on detached states
    ("compressive", {"autoencoding_loss_weight": 1.0}, True, "transformer.compression."),
]


@pytest.mark.parametrize(("name", "overrides", "use_cache", "trained_by_it"), AUXILIARY, ids=[a[0] for a in AUXILIARY])
def test_auxiliary_losses_train_only_their_module_under_accumulation(
    name, overrides, use_cache, trained_by_it, tmp_path
):
    """An auxiliary loss that is a mean over its call (`tf_family.modeling.losses.batch_share`) changes only the module it
    trains: every other parameter gets exactly the large-batch update; that module does train."""
    model = _tiny_model(name, "causal_lm", **overrides)
    examples = _examples(name, "causal_lm", model)
    large_update, _ = _train_one_step(model, examples, 2, 1, tmp_path / "large", use_cache)
    accumulated_update, _ = _train_one_step(model, examples, 1, 2, tmp_path / "accumulated", use_cache)
    _assert_same_updates(accumulated_update, large_update, skip=(trained_by_it,))
    assert any(delta.abs().max() > 0 for key, delta in accumulated_update.items() if key.startswith(trained_by_it))


def test_decision_transformer_accumulates_the_mean_of_micro_batch_losses(tmp_path):
    """``accepts_loss_kwargs = False``: `Trainer` divides by the accumulation steps, so trajectories with different
    numbers of real steps weigh equally (the mean of their losses), as the decision_transformer recipe does."""
    model = _tiny_model("decision_transformer", "action")
    assert model.accepts_loss_kwargs is False
    examples = _trajectories(model.config, (3, 7), torch.Generator().manual_seed(2))
    _, logged = _train_one_step(model, examples, 1, 2, tmp_path)
    each = [_large_batch_loss(model, [example]) for example in examples]
    assert logged == pytest.approx(sum(each) / 2, rel=1e-5)
    assert logged != pytest.approx(_large_batch_loss(model, examples), rel=1e-3)  # the lengths do matter here


@pytest.mark.parametrize("value", [0, -3])
def test_num_items_in_batch_must_be_positive(value):
    model = _tiny_model("transfo_xl", "causal_lm")
    example = _collate(_examples("transfo_xl", "causal_lm", model))
    with pytest.raises(ValueError, match="num_items_in_batch must be positive"):
        model(**example, num_items_in_batch=value)


# ------------------------------------------------------------------------------------------ two processes (DDP)
DDP_CASES = [("transfo_xl", "causal_lm")]  # one launch of two processes costs ~20 s on two cores


def _four_examples(name: str, task: str, model) -> list[dict[str, torch.Tensor]]:
    """Four rows with 13, 7, 10 and 4 real tokens (two per process)."""
    generator = torch.Generator().manual_seed(3)
    return _token_rows(model.config.vocab_size, (13, 7), generator) + _token_rows(
        model.config.vocab_size, (10, 4), generator
    )


def _ddp_worker(name: str, task: str, output: str) -> None:
    """One rank of a two-process gloo run: batch 1 per process, 2 accumulation steps (4 rows an update); rank 0
    saves the update and the logged loss."""
    model = _tiny_model(name, task)
    update, logged = _train_one_step(
        model, _four_examples(name, task, model), 1, 2, Path(output).parent / "run", ddp_backend="gloo"
    )
    if int(os.environ["RANK"]) == 0:
        torch.save({"update": update, "loss": logged}, output)
    if torch.distributed.is_initialized():  # both ranks done, gloo's threads joined: no abort at interpreter exit
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "task"), DDP_CASES, ids=[f"{name}-{task}" for name, task in DDP_CASES])
def test_two_processes_with_accumulation_equal_one_large_batch(name, task, tmp_path):
    """`Trainer` sums ``num_items_in_batch`` over the processes and multiplies the loss by their number (DDP then
    averages the gradients): 2 processes x batch 1 x 2 accumulation steps give the update of one batch of 4."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    output = tmp_path / "rank0.pt"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
        __file__, name, task, str(output),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    distributed = torch.load(output, weights_only=True)
    model = _tiny_model(name, task)
    examples = _four_examples(name, task, model)
    large_update, large_loss = _train_one_step(model, examples, 4, 1, tmp_path / "large")
    _assert_same_updates(distributed["update"], large_update)
    assert distributed["loss"] == pytest.approx(large_loss, rel=1e-5)


if __name__ == "__main__":  # a rank of test_two_processes_with_accumulation_equal_one_large_batch
    _ddp_worker(*sys.argv[1:4])


CAUSAL = [name for name, spec in ARCHITECTURES.items() if "causal_lm" in spec.model_classes]


@pytest.mark.parametrize("name", CAUSAL)
def test_evaluate_returns_eval_loss(name, tmp_path):
    """`Trainer.evaluate()` reports ``eval_loss`` for every causal LM. `Trainer` counts as labels every ``forward``
    argument whose name holds "label" and computes no loss unless all are given: CALM's aligned-targets argument
    once was ``exit_labels`` (now ``exit_targets``), so its evaluation came back without a loss."""
    model = _tiny_model(name, "causal_lm")
    examples = _examples(name, "causal_lm", model)
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to=[], use_cpu=True, disable_tqdm=True
    )
    trainer = Trainer(model=model, args=args, eval_dataset=examples, data_collator=_collate)
    assert trainer.label_names == ["labels"]
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics and metrics["eval_loss"] > 0, metrics


def test_a_knn_lm_trained_by_trainer_keeps_every_checkpoint(tmp_path, caplog):
    """Training moves the base weights away from the attached datastore's: every checkpoint still saves the weights
    and the config (the stale datastore is left out, with one warning) and loads without a datastore."""
    from tests.models.knn_lm.test_knn_lm import knn_lm_with_a_datastore

    model = knn_lm_with_a_datastore()
    examples = _examples("knn_lm", "causal_lm", model)
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2, learning_rate=LEARNING_RATE,
        optim="sgd", save_strategy="steps", save_steps=1, report_to=[], use_cpu=True, seed=0,
        dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=_collate)
    with caplog.at_level("WARNING"):
        trainer.train()
    assert sum("build_datastore" in record.getMessage() for record in caplog.records) == 1, caplog.text
    for step in (1, 2):
        folder = tmp_path / f"checkpoint-{step}"
        assert (folder / "model.safetensors").is_file() and not (folder / "datastore").exists()
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2")
    assert loaded.datastore is None
    for key, value in trainer.model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
