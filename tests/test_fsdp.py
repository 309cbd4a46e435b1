"""FSDP2 trains every architecture: two gloo CPU processes, torch's ``fully_shard`` on each ``_no_split_modules``
block and on the root (`tf_family.training.fsdp.shard_model`), several AdamW steps with the carried memory of memory
models, then the full weights compared with one process that took the same steps on the whole batch. Sharded
checkpoints (`torch.distributed.checkpoint`) resume exactly.

One launch of two processes runs every case (a launch costs seconds of start-up on two cores)."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tf_family.registry import ARCHITECTURES

# (architecture, head): every architecture of the registry with its first head (or the one in HEAD), plus the heads
# in MORE_HEADS. A new architecture gets its case from the registry, without an edit here. Notes on some cases:
# routing_transformer's k-means centroids (buffers) move by sums added over the ranks; spalm trains with a datastore
# of its stack (the common tester's), so its gate trains too.
HEAD = {"big_bird": "sequence_classification", "universal_transformer": "causal_lm"}
MORE_HEADS = {
    "transfo_xl": ["sequence_classification"],
    "longformer": ["token_classification"],
    "reformer": ["masked_lm"],
    "linformer": ["sequence_classification"],
    "performer": ["masked_lm"],
}


def fsdp_cases(architectures) -> list[tuple[str, str]]:
    """One case per architecture (its first head, or the one in HEAD) and the heads in MORE_HEADS."""
    return [
        (name, task)
        for name, spec in architectures.items()
        for task in [HEAD.get(name, next(iter(spec.tasks))), *MORE_HEADS.get(name, [])]
    ]


CASES = fsdp_cases(ARCHITECTURES)
STEPS, ROWS, LENGTH, LR = 3, 4, 16, 1e-3
RESUME_CASE = ("compressive", "causal_lm")  # a sharded checkpoint after step 2, resumed for step 3


def _model(arch: str, task: str):
    from tf_family.registry import get_arch

    spec = get_arch(arch)
    overrides = {}
    if arch == "calm":  # its meta classifier's loss is class-balanced over the whole call: not a mean of rows
        overrides = {"meta_loss_weight": 0.0}
    if task == "token_classification":
        overrides = {"num_labels": 3}
    if task == "sequence_classification":  # no classifier dropout: its masks would depend on the batch split
        overrides = {"num_labels": 2, **({"classifier_dropout": 0.0} if arch == "transfo_xl" else {})}
    torch.manual_seed(0)
    model = spec.model_classes[task](spec.tiny_config(task=task, **overrides))
    from tests.common.tester import ATTACHED_STATE

    if arch in ATTACHED_STATE:  # state read beside the weights (SPALM's datastore), built before sharding
        ATTACHED_STATE[arch](model)
    return model.train()


def _batches(arch: str, task: str, model) -> list[dict]:
    from tests.common.tester import make_inputs
    from tf_family.registry import get_arch

    return [make_inputs(get_arch(arch), model.config, task, ROWS, LENGTH, seed=step) for step in range(STEPS)]


def _rows(batch: dict, rank: int, world: int) -> dict:
    share = ROWS // world
    return {k: v[rank * share : (rank + 1) * share] for k, v in batch.items()}


def _loss(outputs) -> torch.Tensor:
    loss = outputs.loss
    aux = getattr(outputs, "aux_loss", None)
    return loss if aux is None else loss + aux


def _train(model, batches: list[dict], rank: int, world: int, optimizer=None, memory=None, steps=None):
    """AdamW steps on this process's rows; memory models carry their memory (``mems``) from step to step."""
    from tf_family.training import carried_state

    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=LR)
    carries = carried_state(model) is not None
    for batch in batches if steps is None else batches[steps]:
        inputs = _rows(batch, rank, world)
        if carries:
            inputs["mems"] = memory
        outputs = model(**inputs)
        _loss(outputs).backward()
        optimizer.step()
        optimizer.zero_grad()
        if carries:
            memory = outputs.mems
    return optimizer, memory


def _worker(output: str, *only: str) -> None:
    """One rank: every case (or those named ``arch/task`` in ``only``) sharded and trained; rank 0 saves the
    gathered weights."""
    from tf_family.training.fsdp import full_state_dict, load_sharded_checkpoint, save_sharded_checkpoint, shard_model

    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    results, errors = {}, {}
    for arch, task in CASES:
        key = f"{arch}/{task}"
        if only and key not in only:
            continue
        try:
            model = shard_model(_model(arch, task))
            batches = _batches(arch, task, model)
            if (arch, task) != RESUME_CASE:
                _train(model, batches, rank, world)
                results[key] = full_state_dict(model)
                continue
            optimizer, memory = _train(model, batches, rank, world, steps=slice(0, 2))
            folder = Path(output).parent / "sharded" / "step_2"
            save_sharded_checkpoint(folder, model, optimizer, completed_steps=2)
            _train(model, batches, rank, world, optimizer, memory, steps=slice(2, 3))
            results[key] = full_state_dict(model)
            # a fresh model and optimizer resume from the checkpoint and take step 3 again (same carried memory)
            resumed = shard_model(_model(arch, task))
            optimizer = torch.optim.AdamW(resumed.parameters(), lr=LR)
            load_sharded_checkpoint(folder, resumed, optimizer)
            _train(resumed, batches, rank, world, optimizer, memory, steps=slice(2, 3))
            results[key + "/resumed"] = full_state_dict(resumed)
        except Exception as error:  # noqa: BLE001 - reported per case by the test
            errors[key] = f"{type(error).__name__}: {str(error)[:400]}"
            torch.distributed.barrier()
    if rank == 0:
        torch.save({"results": results, "errors": errors}, output)
    torch.distributed.barrier()  # both ranks done, gloo's threads joined: no abort at interpreter exit
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fsdp")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    output = tmp / "rank0.pt"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
        __file__, str(output),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return {**torch.load(output, weights_only=True), "folder": tmp / "sharded" / "step_2"}


def _max_difference(first: dict, second: dict) -> float:
    assert first.keys() == second.keys()
    return max(float((first[k].float() - second[k].float()).abs().max()) for k in first if first[k].numel())


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "task"), CASES, ids=[f"{a}-{t}" for a, t in CASES])
def test_fsdp2_on_two_processes_matches_one_process(two_process_run, arch, task):
    key = f"{arch}/{task}"
    assert key not in two_process_run["errors"], two_process_run["errors"][key]
    model = _model(arch, task)
    _train(model, _batches(arch, task, model), 0, 1)
    single = {k: v.detach() for k, v in model.state_dict().items()}
    difference = _max_difference(two_process_run["results"][key], single)
    print(f"FSDP2 {arch} {task}: max |dw| = {difference:.2e}")
    assert difference <= 1e-5


def test_every_architecture_has_a_case():
    """A new architecture cannot skip FSDP2: CASES has one (architecture, head) case per registry entry, and the heads
    named in HEAD and MORE_HEADS are heads of theirs."""
    assert [name for name, task in CASES if (name, task) not in _extra_cases()] == list(ARCHITECTURES)
    named = list(HEAD.items()) + _extra_cases()
    wrong = [
        (name, task) for name, task in named if name not in ARCHITECTURES or task not in ARCHITECTURES[name].tasks
    ]
    assert not wrong, f"HEAD / MORE_HEADS name heads that are not in the registry: {wrong}"
    assert len(set(CASES)) == len(CASES)


def test_a_new_architecture_gets_its_case_without_an_edit_here():
    """A scratch architecture (a renamed copy of an entry, as tests/test_compare.py registers one) joins the cases."""
    scratch = dataclasses.replace(ARCHITECTURES["calm"], name="scratch")
    cases = fsdp_cases({**ARCHITECTURES, "scratch": scratch})
    assert cases == [*CASES, ("scratch", "causal_lm")]


def _extra_cases() -> list[tuple[str, str]]:
    return [(name, task) for name, tasks in MORE_HEADS.items() for task in tasks]


@pytest.mark.slow
def test_sharded_checkpoint_resumes_exactly(two_process_run):
    key = "/".join(RESUME_CASE)
    assert key not in two_process_run["errors"], two_process_run["errors"][key]
    uninterrupted, resumed = two_process_run["results"][key], two_process_run["results"][key + "/resumed"]
    assert _max_difference(uninterrupted, resumed) == 0.0


if __name__ == "__main__":  # a rank of the two-process run
    _worker(*sys.argv[1:])
