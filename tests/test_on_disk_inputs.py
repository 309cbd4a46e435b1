"""Bad input on disk, refused by name: the restricted unpickler's bounds, files named by manifests staying inside their
folder, datastore integrity, truncated or changed checkpoints, atomic rebuilds (with a kill test) and exact resume."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tf_family import create_model
from tf_family.conversion import read_weights
from tf_family.models.knn_lm.modeling_knn_lm import TffKNNLMForCausalLM
from tf_family.models.transfo_xl.convert_vocab import load_transfo_xl_vocab
from tf_family.retrieval.datastore import DatastoreMismatchError, KNNDatastore, build_datastore

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 128


# ----------------------------------------------------------------------------------------------------- helpers
def nested_tuple_key_pickle(depth: int) -> bytes:
    """A protocol-2 pickle of ``{((...('a',)...),): 1}`` with the key nested ``depth`` deep (TUPLE1 opcodes)."""
    return b"\x80\x02}X\x01\x00\x00\x00a" + b"\x85" * depth + b"K\x01s."


def doubling_key_pickle(levels: int) -> bytes:
    """``{t: 1}`` with t0 = 'a', t(i+1) = (t(i), t(i)) memoized: 2**levels elements when unfolded, a few bytes each."""
    body = b"\x80\x02X\x01\x00\x00\x00aq\x000"  # 'a', BINPUT 0, POP
    for level in range(levels):  # BINGET i, BINGET i, TUPLE2, BINPUT i+1, POP
        body += b"h" + bytes([level]) + b"h" + bytes([level]) + b"\x86q" + bytes([level + 1]) + b"0"
    return body + b"}h" + bytes([levels]) + b"K\x01s."  # EMPTY_DICT, BINGET levels, 1, SETITEM


def tiny_base(seed: int = 0):
    torch.manual_seed(seed)
    wrapper = create_model("knn_lm", "causal_lm", "tiny")
    with torch.no_grad():
        for parameter in wrapper.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return wrapper.lm.eval()


def token_batches(num_batches: int = 3, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        ids = torch.randint(1, VOCAB, (2, 12), generator=generator)
        batches.append({"input_ids": ids, "labels": torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)})
    return batches


@pytest.fixture(scope="module")
def base():
    return tiny_base()


@pytest.fixture
def datastore_folder(base, tmp_path):
    folder = tmp_path / "datastore"
    build_datastore(base, token_batches(), folder, shard_size=20, show_progress=False)
    return folder


def edit_description(folder: Path, edit) -> None:
    path = folder / "datastore.json"
    description = json.loads(path.read_text())
    edit(description)
    path.write_text(json.dumps(description))


def search(datastore: KNNDatastore):
    queries = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    return datastore.search(queries, 5)


# ------------------------------------------------------------------------------------- 1. the restricted unpickler
def test_a_vocab_pickle_with_a_deeply_nested_key_does_not_crash_the_converter(tmp_path):
    pickle_file = tmp_path / "vocab.pkl"
    pickle_file.write_bytes(nested_tuple_key_pickle(1_000_000))  # a 1 MB file
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tf_family.cli",
            "convert",
            "transfo-xl-vocab",
            str(pickle_file),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert run.returncode > 0, f"the converter died with signal {-run.returncode}"  # a segfault on the old code
    assert "ValueError" in run.stderr and "nested more than" in run.stderr and "vocab.pkl" in run.stderr


def test_a_vocab_pickle_nested_1000_deep_gives_the_documented_value_error(tmp_path):
    pickle_file = tmp_path / "vocab.pkl"
    pickle_file.write_bytes(nested_tuple_key_pickle(1000))
    with pytest.raises(ValueError, match=r"vocab\.pkl.*nested more than"):
        load_transfo_xl_vocab(pickle_file)


def test_a_vocab_pickle_of_shared_references_doubling_at_each_level_is_refused(tmp_path):
    (tmp_path / "vocab.pkl").write_bytes(doubling_key_pickle(60))  # {t60: 1}: hashing the key never ends
    with pytest.raises(ValueError, match="unfold to more than"):
        load_transfo_xl_vocab(tmp_path / "vocab.pkl")


@pytest.mark.parametrize("zip_format", [True, False])
def test_a_truncated_bin_checkpoint_names_the_file(tmp_path, zip_format):
    torch.save({"weight": torch.randn(64, 32)}, tmp_path / "full.bin", _use_new_zipfile_serialization=zip_format)
    data = (tmp_path / "full.bin").read_bytes()
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(data[: len(data) - 40])
    with pytest.raises(ValueError, match=r"pytorch_model\.bin could not be read"):
        read_weights(folder, {})


# ---------------------------------------------------------------------------------- 2. files named by manifests
@pytest.mark.parametrize("entry", ["../elsewhere/s.safetensors", "ABSOLUTE"])
def test_a_datastore_shard_outside_the_folder_is_refused(datastore_folder, tmp_path, entry):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "s.safetensors").write_bytes((datastore_folder / "shard-00000.safetensors").read_bytes())
    entry = str(elsewhere / "s.safetensors") if entry == "ABSOLUTE" else entry
    edit_description(datastore_folder, lambda d: d["shards"][0].update(file=entry))
    with pytest.raises(ValueError, match="datastore.json names the shard") as error:
        KNNDatastore.load(datastore_folder)
    assert repr(entry) in str(error.value) and "inside the manifest's folder" in str(error.value)


def test_a_datastore_shard_symlinked_out_of_the_folder_is_refused(datastore_folder, tmp_path):
    outside = tmp_path / "outside.safetensors"
    shard = datastore_folder / "shard-00000.safetensors"
    outside.write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(ValueError, match="shard-00000.safetensors', which resolves to .*outside"):
        KNNDatastore.load(datastore_folder)


def test_a_weight_map_shard_symlinked_out_of_the_checkpoint_is_refused(tmp_path):
    weights = {"weight": torch.randn(4, 4)}
    save_file(weights, tmp_path / "secret.safetensors")
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "model-00001.safetensors").symlink_to(tmp_path / "secret.safetensors")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"weight": "model-00001.safetensors"}})
    )
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json names the shard 'model-00001"):
        read_weights(folder, {})


def test_hub_cache_snapshot_links_into_blobs_are_inside(tmp_path):
    from tests.hub_cache import as_hub_cache

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    save_file({"weight": torch.ones(2)}, folder / "model-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"weight": "model-00001.safetensors"}})
    )
    as_hub_cache(folder, tmp_path / "cache", "org/sharded")
    snapshot = next((tmp_path / "cache" / "models--org--sharded" / "snapshots").iterdir())
    assert torch.equal(read_weights(snapshot, {})["weight"], torch.ones(2))


# ------------------------------------------------------------------------------------- 3. datastore integrity
def test_forward_with_another_models_datastore_is_refused(base, datastore_folder):
    other = TffKNNLMForCausalLM.from_base(tiny_base(seed=1), k=4)
    datastore = KNNDatastore.load(datastore_folder)
    with pytest.raises(DatastoreMismatchError, match="built by another model"):
        other(torch.tensor([[1, 2, 3]]), datastore=datastore)
    own = TffKNNLMForCausalLM.from_base(base, k=4)
    assert torch.isfinite(own(torch.tensor([[1, 2, 3]]), datastore=datastore).logits).all()


def test_a_datastore_without_fingerprint_is_refused_unless_allowed(datastore_folder, caplog):
    edit_description(datastore_folder, lambda d: d.pop("model_fingerprint"))
    stranger = tiny_base(seed=2)
    with pytest.raises(DatastoreMismatchError, match="records no model fingerprint.*allow_unverified=True"):
        KNNDatastore.load(datastore_folder, model=stranger)
    datastore = KNNDatastore.load(datastore_folder)
    model = TffKNNLMForCausalLM.from_base(stranger, k=4)
    with pytest.raises(DatastoreMismatchError, match="records no model fingerprint"):
        model.set_datastore(datastore)
    with pytest.raises(DatastoreMismatchError, match="records no model fingerprint"):
        model(torch.tensor([[1, 2]]), datastore=datastore)
    with caplog.at_level("WARNING"):
        model.set_datastore(datastore, allow_unverified=True)
    assert "using it anyway (allow_unverified=True)" in caplog.text
    assert torch.isfinite(model(torch.tensor([[1, 2]])).logits).all()


@pytest.mark.faiss
def test_rebuilding_in_place_with_another_model_does_not_keep_the_old_index(base, datastore_folder, tmp_path):
    pytest.importorskip("faiss")
    KNNDatastore.load(datastore_folder).build_index("flat", show_progress=False)
    saved_index = tmp_path / "old-index"
    os.rename(datastore_folder / "index-flat", saved_index)
    KNNDatastore.load(datastore_folder).build_index("flat", show_progress=False)
    build_datastore(tiny_base(seed=3), token_batches(), datastore_folder, shard_size=20, show_progress=False)
    with pytest.raises(FileNotFoundError, match="index-flat does not exist"):  # the rebuild replaced the folder
        KNNDatastore.load(datastore_folder, index_type="flat")
    os.rename(saved_index, datastore_folder / "index-flat")  # the old model's index put back by hand
    with pytest.raises(ValueError, match="built from other keys than the datastore's shards"):
        KNNDatastore.load(datastore_folder, index_type="flat")


@pytest.mark.parametrize("lmbda", [-0.5, float("nan"), 2.0, float("inf")])
def test_lmbda_outside_zero_one_is_refused_at_forward(base, datastore_folder, lmbda):
    model = TffKNNLMForCausalLM.from_base(base, KNNDatastore.load(datastore_folder), k=4)
    with pytest.raises(ValueError, match=r"lmbda=.* must be a number in \[0, 1\]"):
        model(torch.tensor([[1, 2, 3]]), lmbda=lmbda)
    model.config.lmbda = lmbda  # set after construction, past the config's own check
    with pytest.raises(ValueError, match=r"config\.lmbda=.* must be a number in \[0, 1\]"):
        model(torch.tensor([[1, 2, 3]]))


# ----------------------------------------------------------------------------------------- 7. damaged datastores
def test_a_description_without_shards_names_the_file(datastore_folder):
    edit_description(datastore_folder, lambda d: d.pop("shards"))
    with pytest.raises(ValueError, match=r"datastore\.json: 'shards' is missing"):
        KNNDatastore.load(datastore_folder)


def test_a_truncated_shard_names_the_file(datastore_folder):
    shard = datastore_folder / "shard-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-30])
    with pytest.raises(ValueError, match=r"shard-00001\.safetensors: tensor '\w+' lies at bytes .* \(truncated\?\)"):
        KNNDatastore.load(datastore_folder)


def test_a_shard_header_with_a_huge_shape_names_the_file(datastore_folder):
    shard = datastore_folder / "shard-00000.safetensors"
    data = shard.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    header["keys"]["shape"] = [2**62, 2**62]
    raw = json.dumps(header).encode()
    shard.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + size :])
    with pytest.raises(ValueError, match=r"shard-00000\.safetensors: tensor 'keys' has"):
        KNNDatastore.load(datastore_folder)


def test_float_shard_values_are_refused_not_truncated(datastore_folder):
    shard = datastore_folder / "shard-00000.safetensors"
    tensors = load_file(shard)
    save_file({"keys": tensors["keys"], "values": tensors["values"].float() + 0.7}, shard)
    with pytest.raises(ValueError, match=r"shard-00000\.safetensors: 'values' has dtype F32.*integer token ids"):
        KNNDatastore.load(datastore_folder)


def test_shard_values_outside_the_vocabulary_name_the_shard(datastore_folder):
    shard = datastore_folder / "shard-00001.safetensors"
    tensors = load_file(shard)
    tensors["values"][3] = -7
    save_file(tensors, shard)
    with pytest.raises(ValueError, match=r"shard-00001\.safetensors: 'values' holds token ids in \[-7"):
        search(KNNDatastore.load(datastore_folder))


# ----------------------------------------------------------------------------------------- 4. atomic rebuilds
def test_a_failed_rebuild_keeps_the_previous_datastore(base, datastore_folder):
    before = search(KNNDatastore.load(datastore_folder))

    def batches_then_failure():
        yield from token_batches(2, seed=5)
        raise RuntimeError("the corpus went away")

    with pytest.raises(RuntimeError, match="went away"):
        build_datastore(base, batches_then_failure(), datastore_folder, shard_size=5, show_progress=False)
    after = search(KNNDatastore.load(datastore_folder))
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert [p.name for p in datastore_folder.parent.iterdir()] == ["datastore"]  # no staging folder left behind


def test_building_into_a_folder_that_is_not_a_datastore_is_refused(base, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not a kNN datastore .* pass a new or empty folder"):
        build_datastore(base, token_batches(1), tmp_path, show_progress=False)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_an_interrupted_conversion_leaves_the_output_folder_as_it_was(tmp_path, monkeypatch):
    from tests.test_conversion import reference
    from tf_family.cli import convert_kinds
    from tf_family.conversion import convert_folder

    source, _ = reference(tmp_path, "decision-transformer")
    output = tmp_path / "converted"
    output.mkdir()
    (output / "config.json").write_text('{"kept": true}')
    spec, record = convert_kinds()["decision-transformer"]
    real_save = save_file

    def save_then_die(tensors, filename, *args, **kwargs):
        real_save(tensors, filename, *args, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", save_then_die)
    with pytest.raises(OSError, match="disk full"):
        convert_folder(source, output, spec.model_classes, record)
    assert sorted(p.name for p in output.iterdir()) == ["config.json"]  # no half-written weights, config kept
    assert json.loads((output / "config.json").read_text()) == {"kept": True}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the staging folder is gone


KILLED_REBUILD = """
import sys, time
import torch
from tests.test_on_disk_inputs import tiny_base, token_batches
from tf_family.retrieval.datastore import build_datastore

folder = sys.argv[1]

def batches():
    yield from token_batches(2, seed=7)
    print("first shards written", flush=True)  # shards of 5 keys: several are on disk by now
    time.sleep(600)  # killed here
    yield from token_batches(2, seed=8)

build_datastore(tiny_base(seed=4), batches(), folder, shard_size=5, show_progress=False)
"""


def test_a_killed_rebuild_leaves_the_previous_datastore_loadable(datastore_folder, base):
    before = search(KNNDatastore.load(datastore_folder, model=base))
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_REBUILD), str(datastore_folder)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout.readline().strip() == "first shards written"
        staging = [p for p in datastore_folder.parent.iterdir() if p.name.endswith(".partial")]
        assert staging and list(staging[0].glob("shard-*.safetensors"))  # the rebuild was under way
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=60)
    after = search(KNNDatastore.load(datastore_folder, model=base))  # the old datastore, for the old model
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


# ------------------------------------------------------------------------------------------------- 5. exact resume
# (the recipe-level test, which needs tests/recipes' fixtures, is tests/recipes/test_resume_hardening.py)
def test_a_missing_random_state_file_is_refused(tmp_path):
    from accelerate import PartialState

    from tf_family.training.checkpointing import check_random_states

    PartialState(cpu=True)  # accelerate's logger needs it
    with pytest.raises(ValueError, match=r"random_states_0\.pkl cannot be restored \(FileNotFoundError"):
        check_random_states(tmp_path, 0, allow_inexact=False)
    check_random_states(tmp_path, 0, allow_inexact=True)  # warns, goes on


# ------------------------------------------------------------------------------- 7. damaged checkpoint folders
@pytest.fixture(scope="module")
def saved_txl(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("txl") / "checkpoint"
    create_model("transfo_xl", "causal_lm", "tiny").save_pretrained(folder)
    return folder


def test_a_truncated_model_safetensors_names_the_file(saved_txl, tmp_path):
    from tf_family.models.transfo_xl.modeling_transfo_xl import TffTransfoXLLMHeadModel

    folder = tmp_path / "checkpoint"
    shutil.copytree(saved_txl, folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor .* \(truncated\?\)"):
        TffTransfoXLLMHeadModel.from_pretrained(folder)


def test_a_config_json_that_is_not_json_names_the_file(saved_txl, tmp_path):
    from tf_family.models.transfo_xl.modeling_transfo_xl import TffTransfoXLLMHeadModel

    folder = tmp_path / "checkpoint"
    shutil.copytree(saved_txl, folder)
    (folder / "config.json").write_text('{"model_type": "tff_transfo_xl", ')
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        TffTransfoXLLMHeadModel.from_pretrained(folder)


@pytest.mark.faiss
def test_a_changed_faiss_index_file_is_refused(datastore_folder):
    pytest.importorskip("faiss")
    KNNDatastore.load(datastore_folder).build_index("flat", show_progress=False)
    path = datastore_folder / "index-flat" / "index.faiss"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x40  # one bit of one stored key: faiss reads it without complaint
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"index\.faiss does not match the file_sha256"):
        KNNDatastore.load(datastore_folder, index_type="flat")


def test_verify_finds_a_changed_key(datastore_folder):
    shard = datastore_folder / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-50] ^= 0x01  # inside the tensors: the header check cannot see it
    shard.write_bytes(bytes(data))
    datastore = KNNDatastore.load(datastore_folder)
    with pytest.raises(ValueError, match="do not match the content_sha256"):
        datastore.verify()


@pytest.mark.parametrize("name", ["random_states_0.pkl", "optimizer.bin"])
def test_a_recipe_checkpoint_file_changed_after_saving_is_refused(tmp_path, name):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from tf_family.training import resume, save_checkpoint

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        accelerator = Accelerator(cpu=True)
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, optimizer = accelerator.prepare(model, optimizer)
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        checkpoint = save_checkpoint(accelerator, str(tmp_path), {"completed_steps": 1}, None, None)
        path = checkpoint / name
        data = bytearray(path.read_bytes())
        record = data.index(b"PK\x03\x04", data.index(b"/data/0") - 60)  # the first tensor's local header
        name_length, extra_length = (int.from_bytes(data[record + i : record + i + 2], "little") for i in (26, 28))
        data[record + 30 + name_length + extra_length] ^= 0x10  # one bit of its bytes
        path.write_bytes(bytes(data))
        accelerate_load = __import__("accelerate.utils", fromlist=["load"]).load
        accelerate_load(path)  # the file still loads: only the recorded digest shows the change
        args = argparse.Namespace(output_dir=str(tmp_path), resume_from_checkpoint="latest")
        with pytest.raises(ValueError, match=rf"{name}.*(changed or damaged since the checkpoint was written)"):
            resume(accelerator, args)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def test_a_recipe_checkpoint_without_its_optimizer_state_names_the_file(tmp_path):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from tf_family.training import resume, save_checkpoint

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        accelerator = Accelerator(cpu=True)
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        checkpoint = save_checkpoint(accelerator, str(tmp_path), {"completed_steps": 1}, None, None)
        (checkpoint / "optimizer.bin").unlink()
        args = argparse.Namespace(output_dir=str(tmp_path), resume_from_checkpoint="latest")
        with pytest.raises(ValueError, match=r"step_1 lacks optimizer\.bin"):
            resume(accelerator, args)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
