"""Snapshot the Transformer-XL family's outputs, gradients and memories, to check a refactor is bit-identical.

``python bench/xl_snapshot.py save DIR`` writes one file per case; ``python bench/xl_snapshot.py compare DIR [ARCH ...]``
rebuilds every case and compares each tensor with ``torch.equal`` (and the checkpoint saved before loads into the
new classes with no missing or unexpected keys). A case is a tiny seeded model (fixed config overrides) run over three
segments with its memory carried, in train mode (dropout on) with a backward pass, and in eval mode.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from tf_family.registry import get_arch

# (arch, task, config overrides)
CASES = [
    ("transfo_xl", "base", {}),
    ("transfo_xl", "causal_lm", {}),
    ("transfo_xl", "causal_lm", {"cutoffs": [], "div_val": 1, "untie_r": True}),
    ("transfo_xl", "causal_lm", {"adaptive_span": True}),
    ("transfo_xl", "causal_lm", {"gating": "gru", "pre_lnorm": True}),
    ("transfo_xl", "causal_lm", {"same_length": True}),
    ("transfo_xl", "sequence_classification", {"num_labels": 3}),
    ("compressive", "base", {}),
    ("compressive", "causal_lm", {}),
    ("memorizing", "base", {}),
    ("memorizing", "causal_lm", {}),
    ("spalm", "base", {}),
    ("spalm", "causal_lm", {}),
    ("spalm", "causal_lm", {"datastore": True}),
    # key/value-cache models whose state is `cache`: CALM (its cache carried across the three calls) and the kNN-LM
    # over its default base
    ("calm", "causal_lm", {}),
    ("knn_lm", "causal_lm", {}),
]

# the argument (and output field) that carries the state between calls: `mems` in the Transformer-XL family, `cache`
# in key/value-cache models (`tf_family.modeling.state_names`)
STATE_NAME = {"calm": "cache", "knn_lm": "cache"}


def flatten(value, prefix: str, out: dict, depth: int = 0) -> None:
    """Every tensor reachable from ``value`` (tensors, sequences, dicts, dataclasses, plain objects) by path."""
    if depth > 6 or value is None:
        return
    if isinstance(value, torch.Tensor):
        out[prefix] = value.detach().clone()
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            flatten(item, f"{prefix}.{index}", out, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            flatten(item, f"{prefix}.{key}", out, depth + 1)
    elif dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            flatten(getattr(value, field.name), f"{prefix}.{field.name}", out, depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, type)):
        for key, item in vars(value).items():
            flatten(item, f"{prefix}.{key}", out, depth + 1)
    elif isinstance(value, (int, float, bool)):
        out[prefix] = torch.tensor(value)


def run_case(index: int, state_dict: dict | None = None) -> tuple[dict, dict, torch.nn.Module]:
    arch, task, overrides = CASES[index]
    overrides = dict(overrides)
    with_datastore = overrides.pop("datastore", False)
    spec = get_arch(arch)
    dropout = {} if arch in STATE_NAME else {"dropout": 0.1}  # the key/value-cache models have no `dropout` field
    config = spec.make_config("tiny", **{**dropout, **overrides})
    torch.manual_seed(1234 + index)
    model = spec.model_classes[task](config)
    with torch.no_grad():
        for parameter in model.parameters():  # away from the small init, so every path matters
            parameter.add_(0.3 * torch.randn_like(parameter))
    if state_dict is not None:  # the checkpoint saved before, loaded strictly (no missing or unexpected key)
        model.load_state_dict(state_dict, strict=True)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    vocab = config.vocab_size
    gen = torch.Generator().manual_seed(99 + index)
    segments = [torch.randint(0, vocab, (2, 6), generator=gen) for _ in range(3)]
    datastore = None
    if with_datastore:
        ids = torch.randint(0, vocab, (4, 16), generator=gen)
        batch = {"input_ids": ids, "labels": torch.cat([ids[:, 1:], torch.full((4, 1), -100)], dim=1)}
        datastore = model.build_datastore([batch], show_progress=False)
    out = {}
    for mode in ("train", "eval"):
        model.train(mode == "train")
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        mems, total = None, 0.0
        for step, segment in enumerate(segments):
            state_name = STATE_NAME.get(arch, "mems")
            kwargs = {"input_ids": segment, state_name: mems, "use_cache": True, "output_hidden_states": True}
            kwargs["output_attentions"] = True
            if task == "causal_lm":
                kwargs["labels"] = segment
            if task == "sequence_classification":
                kwargs["labels"] = torch.tensor([0, 2])
            if datastore is not None:
                kwargs["datastore"] = datastore
            result = model(**kwargs)
            flatten(result.to_tuple(), f"{mode}.{step}.out", out)
            flatten(dict(result), f"{mode}.{step}.named", out)
            mems = result.get(state_name)
            if getattr(result, "loss", None) is not None:
                total = total + result.loss
            else:
                total = total + result.last_hidden_state.float().pow(2).mean()
        total.backward()
        for name, parameter in model.named_parameters():
            if parameter.grad is not None:
                out[f"{mode}.grad.{name}"] = parameter.grad.clone()
    return out, state, model


def main() -> None:
    action, directory = sys.argv[1], Path(sys.argv[2])
    archs = set(sys.argv[3:])  # compare only these architectures (default: all)
    directory.mkdir(parents=True, exist_ok=True)
    compared = tensors = 0
    failures = []
    for index, (arch, task, _) in enumerate(CASES):
        if archs and arch not in archs:
            continue
        path = directory / f"case{index:02d}_{arch}_{task}.pt"
        if action == "save":
            torch.manual_seed(0)
            out, state, _ = run_case(index)
            torch.save({"out": out, "state": state}, path)
            sys.stdout.write(f"saved {path.name}: {len(out)} tensors\n")
            continue
        before = torch.load(path)
        out, state, _ = run_case(index)
        # fresh construction draws the same weights, under the same state-dict keys
        checks = [("state", before["state"], state), ("out", before["out"], out)]
        # the checkpoint saved before loads into the new class and gives the same results
        out_loaded, _, _ = run_case(index, state_dict=before["state"])
        checks.append(("loaded", before["out"], out_loaded))
        for label, old, new in checks:
            if list(old) != list(new):
                failures.append(f"{path.name} {label}: keys differ {sorted(set(old) ^ set(new))[:5]}")
                continue
            for key in old:
                tensors += 1
                if old[key].dtype != new[key].dtype or not torch.equal(old[key], new[key]):
                    failures.append(f"{path.name} {label}: {key} differs")
        compared += 1
    if action == "compare":
        sys.stdout.write(f"{compared} cases, {tensors} tensors compared with torch.equal; {len(failures)} differ\n")
        for line in failures[:40]:
            sys.stdout.write(line + "\n")
        sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
