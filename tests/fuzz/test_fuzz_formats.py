"""Fuzzing every on-disk format tf_family reads: checkpoint folders, sharded indexes, kNN datastores, faiss
indexes, 4.x ``vocab.pkl`` files and recipe checkpoints, damaged by truncation, garbage bytes, edited manifests,
path traversal and symlinks. Every input goes through `expect_clear_error_or_ok`: it loads and works (outputs finite,
and equal to the undamaged ones where the damage could not matter) or fails with a clear error naming the file or
field. The tiny model, datastore and checkpoints are built once per module; each example works on a copy.

Where a format has no checksum of its own (safetensors, a datastore's shards), garbage is written into the header
region, which the readers check; damage to tensor bytes is caught by the checksums tf_family records (a datastore's
``content_sha256`` with `KNNDatastore.verify`, a faiss index's ``file_sha256``), which are fuzzed too.
"""

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.outcomes import expect_clear_error_or_ok
from tf_family import create_model
from tf_family.models.transfo_xl.convert_vocab import load_transfo_xl_vocab
from tf_family.models.transfo_xl.modeling_transfo_xl import TffTransfoXLLMHeadModel
from tf_family.retrieval.datastore import KNNDatastore, build_datastore

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transfo_xl_4x" / "vocab"
IDS = torch.tensor([[1, 2, 3, 4, 5]])
QUERIES = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------------------------------------ strategies
def header_size(data: bytes) -> int:
    return 8 + int.from_bytes(data[:8], "little") if len(data) >= 8 else len(data)


@st.composite
def damaged(draw, data: bytes, garbage_region: int | None = None):
    """``(description, damaged bytes, harmless)``: truncated, emptied, replaced by random bytes, or with garbage
    bytes written into the first ``garbage_region`` bytes (default: anywhere)."""
    kind = draw(st.sampled_from(["truncate", "empty", "random", "garbage"]))
    if kind == "truncate":
        cut = draw(st.integers(0, len(data) - 1))
        return f"truncated to {cut}", data[:cut], False
    if kind == "empty":
        return "emptied", b"", False
    if kind == "random":
        return "random bytes", draw(st.binary(min_size=1, max_size=256)), False
    region = garbage_region if garbage_region is not None else len(data)
    edits = draw(st.lists(st.tuples(st.integers(0, region - 1), st.integers(0, 255)), min_size=1, max_size=8))
    changed = bytearray(data)
    for position, value in edits:
        changed[position] = value
    return f"garbage at {sorted({p for p, _ in edits})}", bytes(changed), bytes(changed) == data


def json_values():
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    )


def copy_of(folder: Path, scratch: str) -> Path:
    target = Path(scratch) / folder.name
    shutil.copytree(folder, target, symlinks=True)
    return target


# ------------------------------------------------------------------------------------- checkpoint folders
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = create_model("transfo_xl", "causal_lm", "tiny").eval()
    folder = tmp_path_factory.mktemp("checkpoint") / "tiny-txl"
    model.save_pretrained(folder)
    sharded = folder.parent / "tiny-txl-sharded"
    model.save_pretrained(sharded, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    with torch.no_grad():
        reference = model(IDS).logits
    return folder, sharded, reference


def load_and_run(folder: Path) -> torch.Tensor:
    model = TffTransfoXLLMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(IDS).logits


@given(data=st.data())
def test_fuzz_checkpoint_weights(checkpoint, data):
    folder, _, reference = checkpoint
    original = (folder / "model.safetensors").read_bytes()
    what, damaged_bytes, harmless = data.draw(damaged(original, header_size(original)))
    with tempfile.TemporaryDirectory() as scratch:
        copy = copy_of(folder, scratch)
        (copy / "model.safetensors").write_bytes(damaged_bytes)
        expect_clear_error_or_ok(
            lambda: load_and_run(copy),
            suite="formats-checkpoint",
            names=["model.safetensors"],
            # a header that still parses may rename a tensor (then freshly initialised, with transformers' load
            # report): the model must still work
            check=lambda logits: (
                bool(torch.isfinite(logits).all()) and (not harmless or torch.equal(logits, reference))
            ),
            describe=f"model.safetensors {what}",
        )


@given(data=st.data())
def test_fuzz_checkpoint_config(checkpoint, data):
    folder, _, reference = checkpoint
    text = (folder / "config.json").read_text()
    config = json.loads(text)
    edit = data.draw(st.sampled_from(["truncate", "not an object", "delete", "model_type"]))
    key = data.draw(st.sampled_from(sorted(config)))
    if edit == "truncate":
        damaged_text = text[: data.draw(st.integers(0, len(text) - 2))]
    elif edit == "not an object":
        damaged_text = json.dumps(data.draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text())))
    elif edit == "delete":
        damaged_text = json.dumps({k: v for k, v in config.items() if k != key})
    else:
        damaged_text = json.dumps({**config, "model_type": data.draw(st.text(max_size=8))})
    with tempfile.TemporaryDirectory() as scratch:
        copy = copy_of(folder, scratch)
        (copy / "config.json").write_text(damaged_text)
        expect_clear_error_or_ok(
            lambda: load_and_run(copy),
            suite="formats-checkpoint",
            names=["config.json", key, "model_type", "size mismatch", "mismatch"],
            check=lambda logits: bool(torch.isfinite(logits).all()),
            describe=f"config.json: {edit} {key!r}",
            clear=(ValueError, TypeError, RuntimeError) if edit == "delete" else (ValueError, TypeError),
        )


# ------------------------------------------------------------------------------------------------ sharded index
@given(data=st.data())
def test_fuzz_sharded_index(checkpoint, data):
    _, folder, reference = checkpoint
    manifest = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(manifest["weight_map"].values()))
    edit = data.draw(st.sampled_from(["traversal", "absolute", "symlink", "missing", "wrong shard", "no map", "json"]))
    tensor = data.draw(st.sampled_from(sorted(manifest["weight_map"])))
    with tempfile.TemporaryDirectory() as scratch:
        copy = copy_of(folder, scratch)
        outside = Path(scratch) / "outside.safetensors"
        shutil.copy(copy / shards[0], outside)
        weight_map = dict(manifest["weight_map"])
        if edit == "traversal":
            weight_map[tensor] = data.draw(st.sampled_from(["../outside.safetensors", "a/../../outside.safetensors"]))
        elif edit == "absolute":
            weight_map[tensor] = str(outside)
        elif edit == "symlink":
            shard = data.draw(st.sampled_from(shards))
            (copy / shard).unlink()
            (copy / shard).symlink_to(outside)
        elif edit == "missing":
            weight_map[tensor] = "model-99999-of-99999.safetensors"
        elif edit == "wrong shard":
            weight_map[tensor] = data.draw(st.sampled_from(shards))
        index_text = json.dumps({**manifest, "weight_map": weight_map})
        if edit == "no map":
            index_text = json.dumps({"metadata": {}})
        elif edit == "json":
            index_text = index_text[: data.draw(st.integers(0, len(index_text) - 2))]
        (copy / "model.safetensors.index.json").write_text(index_text)
        harmless = edit == "wrong shard" and weight_map[tensor] == manifest["weight_map"][tensor]
        expect_clear_error_or_ok(
            lambda: load_and_run(copy),
            suite="formats-sharded-index",
            names=["model.safetensors.index.json", *shards, "model-99999"],
            check=lambda logits: (
                bool(torch.isfinite(logits).all()) and (not harmless or torch.equal(logits, reference))
            ),
            describe=f"index: {edit} {tensor}",
            # a shard that is missing is transformers' own OSError naming it
            clear=(ValueError, TypeError, OSError) if edit == "missing" else (ValueError, TypeError),
        )


# ------------------------------------------------------------------------------------------------- datastores
@pytest.fixture(scope="module")
def datastore(tmp_path_factory):
    torch.manual_seed(0)
    base = create_model("knn_lm", "causal_lm", "tiny").lm.eval()
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(3):
        ids = torch.randint(1, 128, (2, 12), generator=generator)
        batches.append({"input_ids": ids, "labels": torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)})
    folder = tmp_path_factory.mktemp("knn") / "datastore"
    build_datastore(base, batches, folder, shard_size=20, show_progress=False)
    exact = KNNDatastore.load(folder).search(QUERIES, 4)
    KNNDatastore.load(folder).build_index("flat", show_progress=False)
    return base, folder, exact


def same_search(reference):
    def check(found):
        return all(torch.equal(a, b) for a, b in zip(found, reference, strict=True))

    return check


@given(data=st.data())
def test_fuzz_datastore_description(datastore, data):
    base, folder, reference = datastore
    description = json.loads((folder / "datastore.json").read_text())
    shard_names = [shard["file"] for shard in description["shards"]]
    edit = data.draw(st.sampled_from(["set", "delete", "shard file", "shard size", "symlink", "json"]))
    key = data.draw(st.sampled_from(sorted(description)))
    with tempfile.TemporaryDirectory() as scratch:
        copy = copy_of(folder, scratch)
        (Path(scratch) / "elsewhere").mkdir()
        shutil.copy(copy / shard_names[0], Path(scratch) / "elsewhere" / "s.safetensors")
        edited = json.loads(json.dumps(description))
        number = data.draw(st.integers(0, len(shard_names) - 1))
        if edit == "set":
            edited[key] = data.draw(json_values())
        elif edit == "delete":
            edited.pop(key)
        elif edit == "shard file":
            edited["shards"][number]["file"] = data.draw(
                st.sampled_from(
                    [
                        "../elsewhere/s.safetensors",
                        str(Path(scratch) / "elsewhere" / "s.safetensors"),
                        "",
                        ".",
                        "missing.safetensors",
                        *shard_names,
                    ]
                )  # fmt: skip
            )
        elif edit == "shard size":
            edited["shards"][number]["size"] = data.draw(json_values())
        elif edit == "symlink":
            (copy / shard_names[number]).unlink()
            (copy / shard_names[number]).symlink_to(Path(scratch) / "elsewhere" / "s.safetensors")
        text = json.dumps(edited)
        if edit == "json":
            text = text[: data.draw(st.integers(0, len(text) - 2))]
        (copy / "datastore.json").write_text(text)
        harmless = edit != "symlink" and edited == description

        def load_and_search():
            return KNNDatastore.load(copy, model=base).search(QUERIES, 4)

        def check(found):
            finite = all(torch.isfinite(s).all() for s in found[:1])
            return finite and (not harmless or same_search(reference)(found))

        expect_clear_error_or_ok(
            load_and_search,
            suite="formats-datastore",
            names=["datastore.json", "datastore", key, *shard_names],
            check=check,
            describe=f"datastore.json: {edit} {key!r}",
            # a shard named but absent is a FileNotFoundError naming it
            clear=(ValueError, TypeError, FileNotFoundError),
        )


@given(data=st.data())
def test_fuzz_datastore_shards(datastore, data):
    base, folder, reference = datastore
    shard_names = sorted(p.name for p in folder.glob("shard-*.safetensors"))
    name = data.draw(st.sampled_from(shard_names))
    original = (folder / name).read_bytes()
    in_data = data.draw(st.booleans())  # tensor bytes: no header check sees it, verify() does
    what, damaged_bytes, harmless = data.draw(damaged(original, None if in_data else header_size(original)))
    with tempfile.TemporaryDirectory() as scratch:
        copy = copy_of(folder, scratch)
        (copy / name).write_bytes(damaged_bytes)

        def load_verify_and_search():
            loaded = KNNDatastore.load(copy, model=base)
            loaded.verify()
            return loaded.search(QUERIES, 4)

        expect_clear_error_or_ok(
            load_verify_and_search,
            suite="formats-datastore",
            names=[name, "datastore"],
            check=lambda found: harmless and same_search(reference)(found),
            describe=f"{name} {what}",
        )


# ------------------------------------------------------------------------------------------------- faiss index
@given(data=st.data())
def test_fuzz_faiss_index(datastore, data):
    pytest.importorskip("faiss")
    base, folder, _ = datastore
    reference = KNNDatastore.load(folder, index_type="flat").search(QUERIES, 4)
    target = data.draw(st.sampled_from(["index.faiss", "knn_store.json"]))
    original = (folder / "index-flat" / target).read_bytes()
    what, damaged_bytes, harmless = data.draw(damaged(original))
    with tempfile.TemporaryDirectory() as scratch:
        copy = copy_of(folder, scratch)
        (copy / "index-flat" / target).write_bytes(damaged_bytes)
        expect_clear_error_or_ok(
            lambda: KNNDatastore.load(copy, model=base, index_type="flat").search(QUERIES, 4),
            suite="formats-faiss-index",
            names=[target, "index-flat", "knn_store.json"],
            # a description edit that still parses may change a search parameter: results must stay sound
            check=lambda found: same_search(reference)(found) or (not harmless and target == "knn_store.json"),
            describe=f"index-flat/{target} {what}",
        )


# ---------------------------------------------------------------------------------------------------- vocab.pkl
def nested(depth: int, opener: bytes, closer: bytes) -> bytes:
    return b"\x80\x02" + opener * depth + b"K\x01" + closer * depth + b"."


@st.composite
def vocab_pickles(draw):
    original = (FIXTURES / "vocab.pkl").read_bytes()
    kind = draw(st.sampled_from(["damaged", "nested tuple key", "nested list", "nested dict", "huge", "doubling"]))
    if kind == "damaged":
        what, data, harmless = draw(damaged(original))
        return what, data
    depth = draw(st.integers(1, 200_000))
    if kind == "nested tuple key":
        return f"key nested {depth}", b"\x80\x02}X\x01\x00\x00\x00a" + b"\x85" * depth + b"K\x01s."
    if kind == "nested list":
        return f"list nested {depth}", nested(depth, b"]", b"a")  # EMPTY_LIST ... APPEND
    if kind == "nested dict":
        return f"dict nested {depth}", b"\x80\x02" + b"}X\x01\x00\x00\x00k" * depth + b"K\x01" + b"s" * depth + b"."
    if kind == "huge":
        size = draw(st.integers(10**8, 10**15))
        return f"bytes({size})", b"\x80\x02c__builtin__\nbytes\n\x8a\x08" + size.to_bytes(8, "little") + b"\x85R."
    levels = draw(st.integers(30, 250))  # a key of 2**levels elements when unfolded: hashing it would never end
    body = b"\x80\x02X\x01\x00\x00\x00aq\x000"
    for level in range(levels):
        body += b"h" + bytes([level]) + b"h" + bytes([level]) + b"\x86q" + bytes([level + 1]) + b"0"
    return f"doubling {levels}", body + b"}h" + bytes([levels]) + b"K\x01s."


def sound_vocab(vocab) -> bool:
    return len(vocab["idx2sym"]) == len(vocab["sym2idx"]) and all(
        vocab["sym2idx"][s] == i for i, s in enumerate(vocab["idx2sym"])
    )


@given(case=vocab_pickles())
def test_fuzz_vocab_pickle(case):
    what, data = case
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "vocab.pkl"
        path.write_bytes(data)
        expect_clear_error_or_ok(
            lambda: load_transfo_xl_vocab(path),
            suite="formats-vocab-pkl",
            names=["vocab.pkl", "vocab_pkl"],
            check=sound_vocab,
            describe=f"vocab.pkl {what}",
            # a well-formed vocabulary with an unsupported setting (delimiter='') says so
            clear=(ValueError, TypeError, NotImplementedError),
        )


# ---------------------------------------------------------------------------------------------- recipe checkpoints
@pytest.fixture(scope="module")
def recipe_checkpoint(tmp_path_factory):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from tf_family.training import save_checkpoint

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    output = tmp_path_factory.mktemp("run")
    save_checkpoint(accelerator, str(output), {"completed_steps": 1}, None, None)
    checkpoint = output / "checkpoints" / "step_1"
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved["torch random state"] = torch.get_rng_state()  # what the checkpoint's random_states_0.pkl holds
    yield accelerator, model, checkpoint, saved
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@given(data=st.data())
def test_fuzz_recipe_checkpoint(recipe_checkpoint, data):
    from tf_family.training import resume

    accelerator, model, checkpoint, saved = recipe_checkpoint
    names = sorted(p.name for p in checkpoint.iterdir())
    name = data.draw(st.sampled_from(names))
    original = (checkpoint / name).read_bytes()
    delete = data.draw(st.booleans()) and name != "trainer_state.json"
    what, damaged_bytes, harmless = data.draw(
        damaged(original, header_size(original) if name.endswith(".safetensors") else None)
    )
    with tempfile.TemporaryDirectory() as scratch:
        copy = copy_of(checkpoint, scratch)
        if delete:
            os.unlink(copy / name)
            what = "deleted"
        else:
            (copy / name).write_bytes(damaged_bytes)
        args = argparse.Namespace(output_dir=scratch, resume_from_checkpoint=str(copy), allow_inexact_resume=False)

        def resumed_weights():
            with torch.no_grad():  # start from other weights: an accepted resume must restore the saved ones
                for parameter in model.parameters():
                    parameter.add_(1.0)
            torch.manual_seed(12345)  # an accepted resume must restore the saved random state too
            resume(accelerator, args)
            return {**model.state_dict(), "torch random state": torch.get_rng_state()}

        expect_clear_error_or_ok(
            resumed_weights,
            suite="formats-recipe-checkpoint",
            names=[name],
            check=lambda weights: all(torch.equal(weights[k], saved[k]) for k in saved),
            describe=f"{name} {what}",
        )
