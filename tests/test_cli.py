import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tf_family.cli import main, zoo_table
from tf_family.registry import ARCHITECTURES

VOCAB = Path(__file__).parent / "fixtures" / "transfo_xl_4x" / "vocab"


def test_list_prints_every_architecture(capsys):
    assert main(["list"]) == 0
    printed = capsys.readouterr().out
    for spec in ARCHITECTURES.values():
        assert spec.model_type in printed and spec.reference in printed
    assert printed.strip() == zoo_table()


def test_console_script_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-c", "from tf_family.cli import main; raise SystemExit(main(['list']))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tff_transfo_xl" in result.stdout and "transfo-xl" in result.stdout


def test_convert_vocab_command(tmp_path):
    assert main(["convert", "transfo-xl-vocab", str(VOCAB / "vocab.pkl"), str(tmp_path)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.convert_tokens_to_ids("<eos>") == tokenizer.vocab["<eos>"]


def test_readme_zoo_table_is_current():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert zoo_table() in readme, "README's zoo table is stale: paste the output of `tf-family list`"


def test_convert_says_a_missing_folder_is_missing(tmp_path, capsys):
    assert main(["convert", "transfo-xl", "/nonexistent", str(tmp_path / "out")]) == 2  # one line, exit code 2
    assert "error: tf-family convert transfo-xl: no such file or folder '/nonexistent'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no such file or folder"):  # --debug: the exception itself
        main(
            ["convert", "transfo-xl-vocab", str(tmp_path / "missing" / "vocab.pkl"), str(tmp_path / "out"), "--debug"]
        )


def test_push_errors_are_one_line(tmp_path, capsys, monkeypatch):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import OfflineModeIsEnabled

    (tmp_path / "config.json").write_text("{}")

    def offline(self, *args, **kwargs):
        raise OfflineModeIsEnabled("Cannot reach https://huggingface.co/api/repos/create: offline mode is enabled.")

    monkeypatch.setattr(HfApi, "create_repo", offline)
    assert main(["push", str(tmp_path), "org/name"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_HUB_OFFLINE" in err and "Traceback" not in err

    def unreachable(self, *args, **kwargs):
        raise ConnectionError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(HfApi, "create_repo", unreachable)
    monkeypatch.setattr("tf_family.shipping.hub._offline", lambda: False)
    assert main(["push", str(tmp_path), "org/name"]) == 1
    assert "the Hub is unreachable (ConnectionError: [Errno -3]" in capsys.readouterr().err


def test_push_is_checked_before_the_work_starts(monkeypatch):
    from tf_family.shipping import hub

    monkeypatch.setattr(hub, "_offline", lambda: True)
    with pytest.raises(hub.HubPushError, match="HF_HUB_OFFLINE is set"):
        hub.check_push_access("org/name")
    monkeypatch.setattr(hub, "_offline", lambda: False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(hub.HubPushError, match="not logged in"):
        hub.check_push_access("org/name")
    # the recipes call it while checking their arguments, before any data or model is loaded
    from tf_family.recipes import causal_lm

    args = causal_lm.parse_args(["--arch", "transfo_xl", "--push_to_hub", "--hub_model_id", "org/name"])
    with pytest.raises(hub.HubPushError, match="not logged in"):
        causal_lm.validate_args(args)


def _folder_digest(folder: Path) -> dict[str, str]:
    import hashlib

    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize(
    "env",
    [{"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_x"}],
    ids=["offline", "unreachable"],
)
def test_a_failed_push_leaves_the_folder_byte_identical(tmp_path, env):
    """The Hub is checked (the repository created) before the card is re-rendered for the repository or the code
    is exported into the folder: a push that cannot happen changes nothing, and says why in one line."""
    import json
    import os

    from tf_family import create_model
    from tf_family.shipping.cards import write_model_card

    folder = tmp_path / "run"
    create_model("transfo_xl", "causal_lm", "tiny").save_pretrained(folder)
    run = {"recipe": "recipes/causal_lm.py", "task": "causal_lm", "metrics": {"perplexity": 9.5}, "dataset": {}}
    (folder / "training_run.json").write_text(json.dumps(run))
    write_model_card(folder)
    before = _folder_digest(folder)
    result = subprocess.run(
        [sys.executable, "-m", "tf_family.cli", "push", str(folder), "org/name", "--remote_code"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert _folder_digest(folder) == before
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    reason = "HF_HUB_OFFLINE is set" if env["HF_HUB_OFFLINE"] == "1" else "the Hub is unreachable"
    assert reason in result.stderr and "the folder was left unchanged" in result.stderr


def test_list_names_each_option_and_its_setting_builds():
    """`tf-family list` names the systems that are options of an architecture (GTrXL, adaptive span on
    Transformer-XL) with their config setting, and each setting is a valid config that switches the option on."""
    table = zoo_table()
    options = [(spec, name, setting) for spec in ARCHITECTURES.values() for name, setting in spec.options]
    assert {name for _, name, _ in options} >= {
        "GTrXL (Parisotto et al. 2020)",
        "Adaptive Attention Span (Sukhbaatar et al. 2019)",
    }
    for spec, name, setting in options:
        assert f"{name}, `{setting}`" in table
        overrides = eval(f"dict({setting})")  # the setting as the user types it
        config = spec.tiny_config(**overrides)
        assert all(getattr(config, field) == value for field, value in overrides.items())
        assert spec.config_class().to_dict() != config.to_dict()
