"""The Decision Transformer recipe end to end on tiny CartPole data generated on the fly (seconds each)."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModel

pytest.importorskip("gymnasium")

from tf_family.data.offline_rl import make_offline_dataset  # noqa: E402
from tf_family.recipes import decision_transformer  # noqa: E402
from tf_family.rl import evaluate_in_env  # noqa: E402

from .conftest import launch_two_processes  # noqa: E402

pytestmark = pytest.mark.recipe

DATA = ["--env_id", "CartPole-v1", "--dataset_steps", "1500", "--reference_episodes", "3"]
TINY = ["--variant", "tiny", "--per_device_train_batch_size", "4", "--logging_steps", "1"]
EVAL = ["--eval_episodes", "2", "--eval_target_returns", "100", "500"]


def front_matter(path: Path) -> dict:
    return yaml.safe_load(path.read_text().split("---\n")[1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    output = tmp_path_factory.mktemp("dt")
    args = [*DATA, *TINY, *EVAL, "--max_train_steps", "4", "--eval_steps", "2", "--output_dir", str(output)]
    results = decision_transformer.main(args)  # with the plot: the `test` extra installs matplotlib
    return output, results


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    """The same kind of data as a save_to_disk folder (metadata kept) and a parquet file (no metadata)."""
    folder = tmp_path_factory.mktemp("data")
    dataset = make_offline_dataset("CartPole-v1", "medium", num_steps=600, seed=3, reference_episodes=3)
    dataset.save_to_disk(folder / "cartpole")
    dataset.to_parquet(folder / "cartpole.parquet")
    return {"folder": str(folder / "cartpole"), "parquet": str(folder / "cartpole.parquet")}


def test_trains_evaluates_and_saves_a_hub_ready_folder(trained):
    output, results = trained
    assert {p.name for p in output.iterdir()} >= {"config.json", "model.safetensors", "README.md", "training_run.json"}
    model = AutoModel.from_pretrained(output)
    assert type(model).__name__ == "TffDecisionTransformerModel"
    assert model.config.env_id == "CartPole-v1" and model.config.state_dim == 4 and model.config.act_dim == 2
    assert model.config.discrete and model.config.return_scale == 1000.0  # the power of ten nearest 500 (log scale)
    assert model.config.target_return == 500.0 and max(model.config.state_std) > 0.1  # from the data
    run = json.loads((output / "training_run.json").read_text())
    assert run["task"] == "reinforcement_learning" and run["train_steps"] == 4
    assert [entry["step"] for entry in run["eval_history"]] == [2]  # during training, then the final one
    targets = results["evaluation"]["targets"]
    assert [entry["target_return"] for entry in targets] == [100.0, 500.0]
    assert all(len(entry["returns"]) == 2 and entry["normalized_score"] is not None for entry in targets)
    # the saved weights are the evaluated ones: the environment gives the same returns again
    again = evaluate_in_env(model, target_return=100.0, num_episodes=2, seed=results["evaluation"]["seed"])
    assert again["returns"] == targets[0]["returns"]

    card = front_matter(output / "README.md")
    assert card["pipeline_tag"] == "reinforcement-learning"
    result = card["model-index"][0]["results"][0]
    assert result["task"]["type"] == "reinforcement-learning" and result["dataset"]["type"] == "CartPole-v1"
    metrics = {(m["type"], m["name"]): m["value"] for m in result["metrics"]}
    assert metrics[("mean_reward", "Mean return (target return 500)")] == pytest.approx(targets[1]["mean_return"])
    assert metrics[("normalized_score", "Normalised score (target return 100)")] == pytest.approx(
        targets[0]["normalized_score"], abs=1e-4
    )
    assert "| 500 |" in (output / "README.md").read_text()
    assert (output / decision_transformer.PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run["evaluation"]["plot"] == decision_transformer.PLOT_FILE


@pytest.mark.parametrize("layout", ["folder", "parquet"])
def test_local_data_and_lora_fine_tuning(tmp_path, trained, local_data, layout):
    from peft import PeftModel

    # the folder carries its environment in its metadata; the parquet file needs --env_id
    data = ["--train_file", local_data[layout], *(["--env_id", "CartPole-v1"] if layout == "parquet" else [])]
    common = [*data, *EVAL, "--per_device_train_batch_size", "4", "--max_train_steps", "2", "--no_plot"]
    base = str(trained[0])
    if layout == "folder":  # the adapter alone
        decision_transformer.main([*common, "--model_name_or_path", base, "--lora_r", "2", "--output_dir",
                                   str(tmp_path)])  # fmt: skip
        run = json.loads((tmp_path / "training_run.json").read_text())
        assert run["dataset"]["train_file"] == local_data["folder"] and run["dataset"]["tier"] == "medium"
        assert (tmp_path / "adapter_model.safetensors").is_file()
        tuned = PeftModel.from_pretrained(AutoModel.from_pretrained(base), tmp_path)
        assert tuned.base_model.model.config.env_id == "CartPole-v1"
    else:  # merged
        decision_transformer.main([*common, "--model_name_or_path", base, "--lora_r", "2", "--merge_lora",
                                   "--output_dir", str(tmp_path)])  # fmt: skip
        merged, original = load_file(tmp_path / "model.safetensors"), load_file(Path(base) / "model.safetensors")
        assert merged.keys() == original.keys()
        assert any(not torch.equal(merged[k], original[k]) for k in merged)


def test_continuous_actions(tmp_path):
    decision_transformer.main(["--env_id", "Pendulum-v1", "--dataset_steps", "400", "--reference_episodes", "2",
                               *TINY, *EVAL, "--max_train_steps", "2", "--no_plot", "--output_dir", str(tmp_path)])  # fmt: skip
    model = AutoModel.from_pretrained(tmp_path)
    # Pendulum's torque lies in [-2, 2]: a tanh policy could not reach the expert's actions
    assert model.config.action_space == "continuous" and model.config.act_dim == 1 and not model.config.action_tanh
    run = json.loads((tmp_path / "training_run.json").read_text())
    assert [len(entry["returns"]) for entry in run["evaluation"]["targets"]] == [2, 2]


def test_hub_dataset_in_the_same_layout(tmp_path, local_data, monkeypatch):
    import datasets

    trajectories = datasets.load_dataset("parquet", data_files=local_data["parquet"], split="train")
    calls = []

    def from_the_hub(name, config_name=None, split=None, **kwargs):  # no network in tests: the Hub call is recorded
        calls.append((name, config_name, split))
        return trajectories

    monkeypatch.setattr(datasets, "load_dataset", from_the_hub)
    decision_transformer.main(["--dataset_name", "someone/cartpole-medium", "--env_id", "CartPole-v1", *TINY, *EVAL,
                               "--max_train_steps", "2", "--no_plot", "--output_dir", str(tmp_path)])  # fmt: skip
    assert calls == [("someone/cartpole-medium", None, "train")]
    card = front_matter(tmp_path / "README.md")
    assert card["datasets"] == ["someone/cartpole-medium"]
    assert card["model-index"][0]["results"][0]["dataset"]["type"] == "CartPole-v1"


def test_killed_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    args = [*DATA, *TINY, *EVAL, "--config_overrides", "resid_pdrop=0.1", "embd_pdrop=0.1", "--max_train_steps",
            "6", "--gradient_accumulation_steps", "2", "--checkpointing_steps", "3", "--eval_steps", "2",
            "--no_plot"]  # fmt: skip
    decision_transformer.main([*args, "--output_dir", str(tmp_path / "straight")])

    real_generator = decision_transformer.micro_batch_generator

    def dies_in_step_5(seed, micro_index, rank):
        if micro_index == 8:  # step 5 = micro-batches 8 and 9
            raise RuntimeError("killed")
        return real_generator(seed, micro_index, rank)

    monkeypatch.setattr(decision_transformer, "micro_batch_generator", dies_in_step_5)
    interrupted = tmp_path / "interrupted"
    with pytest.raises(RuntimeError, match="killed"):
        decision_transformer.main([*args, "--output_dir", str(interrupted)])
    monkeypatch.setattr(decision_transformer, "micro_batch_generator", real_generator)
    assert [p.name for p in (interrupted / "checkpoints").iterdir()] == ["step_3"]
    with pytest.raises(ValueError, match="holds an earlier run"):
        decision_transformer.main([*args, "--output_dir", str(interrupted)])
    decision_transformer.main([*args, "--output_dir", str(interrupted), "--resume_from_checkpoint", "latest"])

    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(interrupted / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=1e-5, atol=1e-6)
    untrained = load_file(tmp_path / "straight" / "checkpoints" / "step_3" / "model.safetensors")
    assert any(not torch.equal(untrained[k], straight[k]) for k in untrained)  # the comparison can fail
    runs = [json.loads((path / "training_run.json").read_text()) for path in (tmp_path / "straight", interrupted)]
    assert runs[0]["eval_history"] == runs[1]["eval_history"]  # steps 2 and 4, the first one from the checkpoint


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--env_id", "Nope-v9"], r"--env_id 'Nope-v9' has no scripted expert to generate data with; choose one of \['CartPole-v1'"),
        (["--train_file", "PARQUET", "--env_id", "Nope-v9"], "--env_id 'Nope-v9' is not a gymnasium environment"),
        (["--train_file", "/nonexistent/trajectories.parquet"], "--train_file='/nonexistent/trajectories.parquet' "
         "does not exist"),
        (["--train_file", "PARQUET"], "pass --env_id"),
        (["--train_file", "PARQUET", "--env_id", "Pendulum-v1"], "the data has 4-dimensional states but Pendulum-v1 "
         "has 3"),
        ([*DATA, "--config_overrides", "state_dim=5"], "state_dim=5 does not match the data, which has state_dim=4"),
        ([*DATA, "--model_name_or_path", "DT5"], "has state_dim=5 but the data's states have 4 dimensions"),
        ([*DATA, "--arch", "transfo_xl"], r"--arch transfo_xl does not act; architectures that do: "
         r"\['decision_transformer'\]"),
        ([*DATA, "--model_name_or_path", "TRAINED", "--lora_r", "2", "--lora_target_modules", "q_proj"],
         "--lora_target_modules 'q_proj' matches no module"),
        ([], "Generated data needs --env_id"),
    ],
)  # fmt: skip
def test_bad_input_stops_before_training(tmp_path, trained, local_data, monkeypatch, extra, message):
    if "DT5" in extra:
        from tf_family import get_arch

        spec = get_arch("decision_transformer")
        spec.model_classes["action"](spec.make_config("tiny")).save_pretrained(tmp_path / "dt5")  # state_dim=5
    names = {"PARQUET": local_data["parquet"], "DT5": str(tmp_path / "dt5"), "TRAINED": str(trained[0])}
    extra = [names.get(arg, arg) for arg in extra]
    monkeypatch.setattr(decision_transformer.torch.optim, "AdamW", None)  # training would crash on this
    with pytest.raises(ValueError, match=message):
        decision_transformer.main([*extra, "--variant", "tiny", "--no_plot", "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_the_plot_asks_for_matplotlib_only_when_requested(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a)
    )
    args = [*DATA, "--output_dir", str(tmp_path)]
    with pytest.raises(ValueError, match=r"needs matplotlib: pip install 'tf-family\[rl\]', or pass --no_plot"):
        decision_transformer.validate_args(decision_transformer.parse_args(args))
    decision_transformer.validate_args(decision_transformer.parse_args([*args, "--no_plot"]))


@pytest.mark.slow
def test_two_processes_train_the_same_weights(tmp_path):
    # Both ranks on one core (they inherit this process's affinity): a gloo worker thread that has just woken the main
    # thread then tends to run late, the ordering in which the end of the run used to deadlock (see final_barrier).
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if cpus:
        os.sched_setaffinity(0, {min(cpus)})
    try:
        launch_two_processes(
            "tf_family.recipes.decision_transformer",
            [*DATA, *TINY, "--eval_episodes", "3", "--eval_target_returns", "100", "500", "--max_train_steps", "3",
             "--checkpointing_steps", "3", "--no_plot", "--output_dir", str(tmp_path)],
        )  # fmt: skip
    finally:
        if cpus:
            os.sched_setaffinity(0, cpus)
    run = json.loads((tmp_path / "training_run.json").read_text())
    assert run["world_size"] == 2 and run["hyperparameters"]["effective_batch_windows"] == 8
    first, second = run["rank_weight_sha256"]
    assert first == second  # both ranks ended with identical weights
    # the 3 episodes per target were split 2 + 1 between the ranks and gathered in episode order
    model = AutoModel.from_pretrained(tmp_path)
    for entry in run["evaluation"]["targets"]:
        again = evaluate_in_env(
            model, target_return=entry["target_return"], num_episodes=3, seed=run["evaluation"]["seed"]
        )
        assert again["returns"] == entry["returns"]


def test_gtrxl_blocks_train_through_the_recipe(tmp_path):
    """GTrXL as the Decision Transformer's sequence model: ``--config_overrides gating=gru`` (issue 41, item 4)."""
    decision_transformer.main([*DATA, *TINY, "--config_overrides", "gating=gru", "--max_train_steps", "3",
                               "--eval_episodes", "1", "--eval_target_returns", "100", "--no_plot",
                               "--output_dir", str(tmp_path)])  # fmt: skip
    model = AutoModel.from_pretrained(tmp_path)
    assert model.config.gating == "gru"
    assert model.layers[0].attention_gate is not None
    run = json.loads((tmp_path / "training_run.json").read_text())
    assert len(run["evaluation"]["targets"]) == 1
