"""Remote-code export: every architecture and every task head of the registry, exported, loads with
``AutoModelFor<Task>.from_pretrained(folder, trust_remote_code=True)`` in a Python process that cannot import
tf_family, and gives tf_family's outputs on the same inputs."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForMaskedLM

from tf_family.auto import AUTO_CLASS_BY_TASK
from tf_family.registry import ARCHITECTURES
from tf_family.shipping.remote_code import STAND_INS, ExportError, export_remote_code, remote_code_files

from .common.tester import build, make_inputs
from .hub_cache import as_hub_cache

# flattens a model output into named tensors; run here and, as source, in the subprocess (the same code both sides)
FLATTEN = textwrap.dedent(
    """
    import dataclasses

    def flatten(value, prefix, out):
        if hasattr(value, "keys") and hasattr(value, "to_tuple"):  # a ModelOutput
            for key in value.keys():
                flatten(value[key], f"{prefix}.{key}", out)
        elif isinstance(value, torch.Tensor):
            out[prefix] = value.detach().float().contiguous()
        elif isinstance(value, (tuple, list)):
            for index, item in enumerate(value):
                flatten(item, f"{prefix}.{index}", out)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):  # a carried memory
            for item in dataclasses.fields(value):
                flatten(getattr(value, item.name), f"{prefix}.{item.name}", out)
        return out
    """
)
namespace = {"torch": torch}
exec(FLATTEN, namespace)
flatten = namespace["flatten"]

# the loading side: tf_family cannot be imported (a meta-path finder refuses it before anything else runs, and
# `python -I` keeps the repository and PYTHONPATH off sys.path); only torch, transformers and safetensors are used
LOADER = (
    textwrap.dedent(
        """
    import importlib.abc
    import json
    import sys


    class RefuseTfFamily(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "tf_family" or name.startswith("tf_family."):
                raise ImportError(f"{name} is not importable in this test")
            return None


    sys.meta_path.insert(0, RefuseTfFamily())
    try:
        import tf_family  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("tf_family is importable: the test would prove nothing")

    import torch
    import transformers
    from safetensors.torch import load_file
    """
    )
    + FLATTEN
    + textwrap.dedent(
        """
    manifest = json.load(open(sys.argv[1]))
    failures = []
    for task, entry in manifest.items():
        tensors = load_file(entry["tensors"])
        auto_class = getattr(transformers, entry["auto_class"])
        model = auto_class.from_pretrained(entry["folder"], trust_remote_code=True, **entry["kwargs"]).eval()
        if type(model).__name__ != entry["class"] or not type(model).__module__.startswith("transformers_modules."):
            failures.append(f"{task}: loaded {type(model).__module__}.{type(model).__name__}")
            continue
        inputs = {name[len("input."):]: value for name, value in tensors.items() if name.startswith("input.")}
        with torch.no_grad():
            got = flatten(model(**inputs), "output", {})
        expected = {name: value for name, value in tensors.items() if name.startswith("output.")}
        if sorted(got) != sorted(expected):
            failures.append(f"{task}: outputs {sorted(got)} != {sorted(expected)}")
            continue
        for name, value in expected.items():
            difference = (got[name] - value).abs().max().item() if value.numel() else 0.0
            if not difference <= 1e-5:
                failures.append(f"{task}: {name} differs by {difference}")
    leaked = sorted(name for name in sys.modules if name == "tf_family" or name.startswith("tf_family."))
    if leaked:
        failures.append(f"tf_family modules were imported: {leaked}")
    print("\\n".join(failures) if failures else "all outputs equal")
    sys.exit(1 if failures else 0)
    """
    )
)


def _knn_lm_datastore(model, tmp_path):
    """A small datastore of the kNN-LM's own base model, so the exported retrieval code runs, not just the base."""
    from tf_family.data.packing import pack_into_blocks
    from tf_family.retrieval.datastore import build_datastore

    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(1, model.config.vocab_size, (40,), generator=generator).tolist() for _ in range(4)]
    blocks = pack_into_blocks(documents, 16, separator_id=0)
    batches = [blocks.batch(range(i, min(i + 4, len(blocks)))) for i in range(0, len(blocks), 4)]
    return build_datastore(model.lm, batches, tmp_path / "datastore-build", show_progress=False)


def _export_and_expect(spec, task: str, folder, tensors_path, tmp_path) -> dict:
    """Save a tiny ``task`` model of ``spec`` to ``folder`` with its code, and its inputs and outputs to
    ``tensors_path``; returns the loader's manifest entry."""
    model = build(spec, task)
    if spec.name == "knn_lm":
        model.set_datastore(_knn_lm_datastore(model, tmp_path))
    model.save_pretrained(folder, remote_code=True)  # save, then export_remote_code(folder)
    model_class = spec.model_classes[task]
    assert (folder / f"{model_class.__module__.rsplit('.', 1)[-1]}.py").is_file()
    inputs = make_inputs(spec, model.config, task)
    with torch.no_grad():
        expected = flatten(model(**inputs), "output", {})
    assert expected, f"{spec.name}/{task} returned no tensors"
    save_file({**{f"input.{k}": v.contiguous() for k, v in inputs.items()}, **expected}, str(tensors_path))
    return {
        "folder": str(folder),
        "kwargs": {},
        "auto_class": AUTO_CLASS_BY_TASK[task].__name__,
        "class": model_class.__name__,
        "tensors": str(tensors_path),
    }


def _load_without_tf_family(manifest: dict, tmp_path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "load.py").write_text(LOADER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    result = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "load.py"), str(tmp_path / "manifest.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "all outputs equal" in result.stdout


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_task_head_loads_without_tf_family_and_gives_the_same_outputs(arch, tmp_path):
    spec = ARCHITECTURES[arch]
    manifest = {
        # one folder name for every task: the loaded code modules are shared between the tasks
        task: _export_and_expect(spec, task, tmp_path / task / "model", tmp_path / f"{task}.safetensors", tmp_path)
        for task in spec.model_classes
        if task in AUTO_CLASS_BY_TASK
    }
    _load_without_tf_family(manifest, tmp_path)


def test_a_pushed_export_loads_by_hub_id_without_tf_family(tmp_path):
    """From the Hub, transformers fetches each code file a module names with `from .x import` on its own, and checks
    each file's imports: the repository is read from a pre-populated Hub cache here (no network)."""
    spec = ARCHITECTURES["longformer"]  # its attention backend imports a module object (the native stand-in)
    entry = _export_and_expect(spec, "masked_lm", tmp_path / "saved", tmp_path / "tensors.safetensors", tmp_path)
    as_hub_cache(tmp_path / "saved", tmp_path / "hub", "org/tiny-longformer")
    entry.update(folder="org/tiny-longformer", kwargs={"cache_dir": str(tmp_path / "hub")})
    _load_without_tf_family({"masked_lm": entry}, tmp_path)


def test_the_export_holds_exactly_the_modules_needed_and_the_card_says_so(tmp_path):
    spec = ARCHITECTURES["longformer"]
    files, auto_map = remote_code_files(spec.model_type)
    # what Longformer imports, followed through the packages' re-exports: no package __init__, no other model
    assert "modeling_longformer.py" in files and "attention_sliding_window.py" in files
    assert not any(name in files for name in ("attention.py", "memory.py", "modeling_reformer.py", "registry.py"))
    assert "def extension():\n    " in files["attention_native.py"] and "fused_attention.cpp" not in str(files)
    assert set(auto_map) == {"AutoConfig"} | {AUTO_CLASS_BY_TASK[t].__name__ for t in spec.model_classes}
    for name, text in files.items():  # every import of tf_family names a file beside it
        imports = [node for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.Import, ast.ImportFrom))]
        assert not any(alias.name.startswith("tf_family") for node in imports for alias in node.names), name
        assert all(node.level <= 1 for node in imports if isinstance(node, ast.ImportFrom)), name
        assert not any(
            (node.module or "").startswith("tf_family") for node in imports if isinstance(node, ast.ImportFrom)
        ), name
    build(spec, "masked_lm").save_pretrained(tmp_path / "model")
    export_remote_code(tmp_path / "model")
    card = (tmp_path / "model" / "README.md").read_text()
    assert "trust_remote_code=True" in card and "native C++ CPU kernel" in card and "faiss" in card
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForMaskedLM"] == "modeling_longformer.TffLongformerForMaskedLM"
    # with tf_family imported, the folder still loads tf_family's own classes, without trust_remote_code
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path / "model")
    assert type(loaded) is spec.model_classes["masked_lm"] and loaded.config.auto_map == config["auto_map"]
    assert list(STAND_INS) == ["tf_family.attention.native"]


def test_saving_with_code_gets_the_exporter_from_the_top_never_by_an_import(tmp_path, monkeypatch):
    """DESIGN §1: remote-code saving is called from the top, never imported upward. No module an export carries
    loads another by name (``importlib``: how the exporter used to be reached from the models) or is the exporter;
    ``save_pretrained(remote_code=True)`` uses the exporter ``import tf_family`` hands down (`tf_family.lazy_auto`),
    and without it (code loaded from an export) refuses before writing anything."""
    from tf_family.lazy_auto import export_remote_code as handed_down
    from tf_family.modeling.pretrained import TffPreTrainedModel

    for spec in ARCHITECTURES.values():
        files, _ = remote_code_files(spec.model_type)
        assert "remote_code.py" not in files and "lazy_auto.py" not in files, spec.name
        assert not [name for name, text in files.items() if "importlib" in text], spec.name
    assert TffPreTrainedModel.code_exporter is handed_down
    model = build(ARCHITECTURES["transfo_xl"], "causal_lm")
    monkeypatch.setattr(TffPreTrainedModel, "code_exporter", None)
    with pytest.raises(ValueError, match="needs tf_family installed"):
        model.save_pretrained(tmp_path / "model", remote_code=True)
    assert not (tmp_path / "model").exists()


def test_an_export_that_would_need_more_than_transformers_is_refused(monkeypatch):
    import tf_family.shipping.remote_code as remote_code

    monkeypatch.setattr(remote_code, "ALLOWED_IMPORTS", remote_code.ALLOWED_IMPORTS - {"numpy"})
    with pytest.raises(ExportError, match=r"would need \['numpy'\] \(imported by retrieval_datastore.py"):
        remote_code_files("tff_knn_lm")


def test_what_cannot_be_exported_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ExportError, match="no config.json"):
        export_remote_code(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ExportError, match="'gpt2' is not a tf_family architecture"):
        export_remote_code(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "tff_knn_lm", "base_config": {"model_type": "tff_transfo_xl"}})
    )
    with pytest.raises(ExportError, match="wraps a tf_family model"):
        export_remote_code(tmp_path)


def test_export_and_push_commands(tmp_path, capsys, monkeypatch):
    from huggingface_hub import HfApi

    from tf_family import cli

    folder = tmp_path / "model"
    build(ARCHITECTURES["transfo_xl"], "causal_lm").save_pretrained(folder)
    # a recipe's run record: the card is rendered from it, and says how the folder loads without tf_family
    run = {"recipe": "recipes/causal_lm.py", "task": "causal_lm", "arch": "transfo_xl", "metrics": {}, "dataset": {}}
    (folder / "training_run.json").write_text(json.dumps(run))
    assert cli.main(["export", str(folder)]) == 0
    assert "code files and auto_map" in capsys.readouterr().out
    assert "trust_remote_code=True" in (folder / "README.md").read_text()

    pushed = tmp_path / "pushed"
    build(ARCHITECTURES["reformer"], "masked_lm").save_pretrained(pushed)
    uploads = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: None)
    monkeypatch.setattr(
        HfApi, "create_commit", lambda self, repo_id, ops, **kw: uploads.append([o.path_in_repo for o in ops])
    )
    assert cli.main(["push", str(pushed), "org/tiny-reformer", "--remote_code"]) == 0
    assert {"config.json", "modeling_reformer.py", "configuration_reformer.py", "attention_lsh.py"} <= set(uploads[0])
    assert "AutoModelForMaskedLM" in json.loads((pushed / "config.json").read_text())["auto_map"]
