"""FSDP2 with torch directly: shard a model the way accelerate's FSDP2 plugin does (``fully_shard`` on every block
its class names in ``_no_split_modules``, then on the root), gather its full weights, and write / read sharded
checkpoints with `torch.distributed.checkpoint` (each process writes and reads only its shards).

accelerate enables FSDP only on GPUs (``recipes/accelerate_configs/fsdp.yaml``); these helpers are what a script
(or the CPU test, ``tests/test_fsdp.py``, two gloo processes) calls instead:

    torch.distributed.init_process_group("gloo")       # or "nccl"
    model = shard_model(create_model("compressive", "causal_lm", "tiny"))
    optimizer = torch.optim.AdamW(model.parameters())  # after sharding: it holds the shards
    ...
    save_sharded_checkpoint(folder, model, optimizer)
    load_sharded_checkpoint(folder, model, optimizer)  # tested with the same number of processes
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

SHARDED_MARKER = "fsdp_sharded.json"


def no_split_classes(model: nn.Module) -> set[str]:
    """The class names every ``_no_split_modules`` in ``model`` declares (a wrapper such as the kNN-LM adds those of
    the model it wraps)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def shard_model(model: nn.Module, mesh=None, **fully_shard_kwargs) -> nn.Module:
    """``fully_shard`` every block of ``model`` whose class is in its ``_no_split_modules``, then the root; returns
    ``model`` (now an ``FSDPModule``). ``mesh`` defaults to all processes of the default group on its device type."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not torch.distributed.is_initialized():
        raise ValueError("shard_model needs torch.distributed initialised: call init_process_group first.")
    if mesh is None:
        device = "cpu" if torch.distributed.get_backend() == "gloo" else "cuda"
        mesh = init_device_mesh(device, (torch.distributed.get_world_size(),))
    blocks = no_split_classes(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} names no blocks in _no_split_modules; FSDP would shard it whole.")
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, **fully_shard_kwargs)
    fully_shard(model, mesh=mesh, **fully_shard_kwargs)
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight of a sharded (or plain) ``model``, gathered whole on every process (CPU tensors)."""
    from torch.distributed.tensor import DTensor

    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu().clone()
        for name, value in model.state_dict().items()
    }


def save_sharded_checkpoint(folder: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, **extra) -> Path:
    """Write the sharded weights and optimizer state of ``model`` into ``folder`` with `torch.distributed.checkpoint`
    (every process writes its shards; the folder is complete once every process returns), plus ``extra`` (JSON) as
    ``fsdp_sharded.json``. Written beside (``folder.partial``) and renamed, so an interrupted save leaves an earlier
    checkpoint of the same name untouched."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from ..utils.files import atomic_write_text, replace_dir

    folder = Path(folder)
    partial = folder.with_name(folder.name + ".partial")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial))
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        record = {"world_size": torch.distributed.get_world_size(), **extra}
        atomic_write_text(partial / SHARDED_MARKER, json.dumps(record))
        replace_dir(partial, folder)
    torch.distributed.barrier()
    return folder


def load_sharded_checkpoint(folder: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Read what `save_sharded_checkpoint` wrote into the sharded ``model`` and ``optimizer``
    (`torch.distributed.checkpoint` reads each process's shards); returns its ``fsdp_sharded.json``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = Path(folder)
    marker = folder / SHARDED_MARKER
    if not marker.is_file():
        raise ValueError(
            f"{folder} is not a complete sharded checkpoint (no {SHARDED_MARKER}); pass a folder that "
            "save_sharded_checkpoint finished writing."
        )
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return json.loads(marker.read_text())


__all__ = ["full_state_dict", "load_sharded_checkpoint", "no_split_classes", "save_sharded_checkpoint", "shard_model"]
