import subprocess
import sys
from pathlib import Path

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
