"""Tests for the pickle-free conversion of a transformers 4.x Transformer-XL vocab.pkl.

The fixtures in tests/fixtures/transfo_xl_4x/vocab/ were written by transformers 4.35.2 (see PROVENANCE.md there):
vocab.pkl is the pickled TransfoXLTokenizer.__dict__, expected.json holds the ids 4.35.2 gives, malicious.pkl would
run a shell command if unpickled with plain pickle.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import pickletools
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

try:
    from tf_family.models.transfo_xl import convert_vocab
except ImportError:  # the package skeleton may not be importable yet: load the module by path
    _PATH = Path(__file__).resolve().parents[3] / "tf_family" / "models" / "transfo_xl" / "convert_vocab.py"
    _SPEC = importlib.util.spec_from_file_location("_tff_convert_vocab", _PATH)
    convert_vocab = importlib.util.module_from_spec(_SPEC)
    sys.modules[_SPEC.name] = convert_vocab
    _SPEC.loader.exec_module(convert_vocab)

convert_transfo_xl_vocab = convert_vocab.convert_transfo_xl_vocab
load_transfo_xl_vocab = convert_vocab.load_transfo_xl_vocab

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "transfo_xl_4x" / "vocab"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
PWNED = Path("/tmp/should_not_exist")


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output_dir = tmp_path_factory.mktemp("converted")
    return convert_transfo_xl_vocab(FIXTURES / "vocab.pkl", output_dir).parent


def _write_pickle(path: Path, obj: object) -> Path:
    path.write_bytes(pickle.dumps(obj, protocol=4))
    return path


def test_fixture_pickle_references_the_expected_globals():
    """Guard the fixture: the 4.35.2 pickle holds the non-data objects the converter neutralises."""
    data = (FIXTURES / "vocab.pkl").read_bytes()
    strings = [arg for op, arg, _ in pickletools.genops(data) if op.name == "SHORT_BINUNICODE"]
    for module, name in convert_vocab._INERT_GLOBALS:
        assert module in strings and name in strings, (module, name)


def test_load_gives_the_4x_vocabulary():
    vocab = load_transfo_xl_vocab(FIXTURES / "vocab.pkl")
    assert vocab["sym2idx"] == EXPECTED["sym2idx"]
    assert vocab["idx2sym"] == sorted(EXPECTED["sym2idx"], key=EXPECTED["sym2idx"].get)
    assert vocab["unk_token"] == EXPECTED["unk_token"]
    assert vocab["sym2idx"][vocab["unk_token"]] == EXPECTED["unk_idx"]
    assert vocab["eos_token"] == EXPECTED["eos_token"]
    assert vocab["lower_case"] is EXPECTED["lower_case"] is True
    assert vocab["special_tokens"] == sorted(
        EXPECTED["added_tokens_encoder"], key=EXPECTED["added_tokens_encoder"].get
    )


def test_converted_ids_match_4x(converted: Path):
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(converted / "tokenizer.json"))
    for case in EXPECTED["sentences"] + EXPECTED["random_sentences"]:
        assert tokenizer(case["text"])["input_ids"] == case["input_ids"], case["text"]
        assert tokenizer.convert_ids_to_tokens(case["input_ids"]) == [
            t if t in EXPECTED["sym2idx"] else EXPECTED["unk_token"] for t in case["tokens"]
        ]


def test_auto_tokenizer_loads_the_conversion(converted: Path):
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert tokenizer.get_vocab() == EXPECTED["sym2idx"]
    assert tokenizer.unk_token == EXPECTED["unk_token"]
    assert tokenizer.eos_token == EXPECTED["eos_token"]
    assert tokenizer.eos_token_id == EXPECTED["sym2idx"]["<eos>"]
    for case in EXPECTED["sentences"]:
        encoded = tokenizer(case["text"])
        assert encoded["input_ids"] == case["input_ids"], case["text"]
        assert list(encoded) == ["input_ids"]  # like 4.x: no attention mask, no <eos> appended


def test_conversion_keeps_other_files_and_creates_folders(tmp_path: Path):
    output_dir = tmp_path / "new" / "nested"
    (tmp_path / "new").mkdir()
    keep = tmp_path / "new" / "README.md"
    keep.write_text("mine")
    first = convert_transfo_xl_vocab(FIXTURES / "vocab.pkl", output_dir)
    (output_dir / "config.json").write_text("{}")
    second = convert_transfo_xl_vocab(str(FIXTURES / "vocab.pkl"), str(output_dir))
    assert first == second == output_dir / "tokenizer.json"
    assert keep.read_text() == "mine"
    assert (output_dir / "config.json").read_text() == "{}"
    assert sorted(p.name for p in output_dir.iterdir()) == [
        "config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_malicious_pickle_is_refused_without_running(tmp_path: Path):
    PWNED.unlink(missing_ok=True)
    with pytest.raises(ValueError, match=r"'(posix|os)\.system'.*Nothing from the file was imported or executed"):
        convert_transfo_xl_vocab(FIXTURES / "malicious.pkl", tmp_path / "out")
    assert not PWNED.exists()
    assert not (tmp_path / "out").exists()


class _Reduce:
    def __init__(self, func: object, args: tuple):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize(
    ("payload", "refused"),
    [
        (_Reduce(eval, ("1+1",)), "builtins.eval"),
        (_Reduce(getattr, (int, "mro")), "builtins.getattr"),
        (_Reduce(__import__("subprocess").Popen, (["true"],)), "subprocess.Popen"),
        (_Reduce(__import__("importlib").import_module, ("os",)), "importlib.import_module"),
    ],
)
def test_other_globals_are_refused(tmp_path: Path, payload: object, refused: str):
    # Hidden inside an otherwise valid vocabulary, so only the global check can stop it.
    vocab = {"idx2sym": ["<unk>", "a"], "sym2idx": OrderedDict(a=1, **{"<unk>": 0}), "hook": payload}
    path = _write_pickle(tmp_path / "vocab.pkl", vocab)
    with pytest.raises(ValueError, match=f"'{refused}'"):
        load_transfo_xl_vocab(path)


def test_plain_and_inert_globals_are_accepted(tmp_path: Path):
    import re
    from collections import Counter, defaultdict

    vocab = {
        "idx2sym": ["<eos>", "<unk>", "Hello"],
        "sym2idx": OrderedDict([("<eos>", 0), ("<unk>", 1), ("Hello", 2)]),
        "counter": Counter({"Hello": 3}),
        "extra": defaultdict(list, {"k": [1.5, 2j, b"x", frozenset({1}), {2}]}),
        "pattern": re.compile(r"\s+"),  # pickles as re._compile: replaced by the inert placeholder
        "unk_idx": 1,
    }
    loaded = load_transfo_xl_vocab(_write_pickle(tmp_path / "vocab.pkl", vocab))
    assert loaded["idx2sym"] == ["<eos>", "<unk>", "Hello"]
    assert loaded["lower_case"] is False
    assert loaded["special_tokens"] == ["<eos>", "<unk>"]
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(convert_transfo_xl_vocab(tmp_path / "vocab.pkl", tmp_path)))
    assert tokenizer("Hello hello <eos>")["input_ids"] == [2, 1, 0]  # no lowercasing when lower_case is absent


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"special": [], "counter": {}}, "neither 'idx2sym' nor 'sym2idx'"),
        (["<unk>", "a"], "holds a list"),
        (12345, "torch-serialized vocab.bin"),
        ({"idx2sym": "abc"}, "'idx2sym' must be a list of str"),
        ({"sym2idx": {"a": "0"}}, "'sym2idx' must map str to int"),
        ({"idx2sym": [], "sym2idx": {}}, "empty"),
        ({"idx2sym": ["<unk>", "a", "a"]}, "lists some tokens twice"),
        ({"idx2sym": ["<unk>", "a"], "sym2idx": {"<unk>": 0, "a": 2}}, "disagree"),
        ({"sym2idx": {"<unk>": 0, "a": 2}}, "not 0..1"),
        ({"idx2sym": ["<unk>", "a"], "unk_idx": 5}, "'unk_idx'=5"),
        ({"idx2sym": ["a", "b"]}, "no 'unk_idx' and no '<unk>'"),
        ({"idx2sym": ["<unk>"], "lower_case": "yes"}, "'lower_case' must be a bool"),
    ],
)
def test_malformed_vocab_is_refused(tmp_path: Path, content: object, message: str):
    path = _write_pickle(tmp_path / "vocab.pkl", content)
    with pytest.raises(ValueError, match=message):
        convert_transfo_xl_vocab(path, tmp_path / "out")


def test_sym2idx_alone_is_enough(tmp_path: Path):
    # 4.x from_pretrained leaves idx2sym empty, so a re-saved 4.x tokenizer pickles idx2sym=[] next to sym2idx.
    path = _write_pickle(tmp_path / "vocab.pkl", {"idx2sym": [], "sym2idx": {"b": 1, "<unk>": 0}})
    assert load_transfo_xl_vocab(path)["idx2sym"] == ["<unk>", "b"]


def test_not_a_pickle_or_missing_file(tmp_path: Path):
    garbage = tmp_path / "vocab.pkl"
    garbage.write_bytes(b"this is not a pickle")
    with pytest.raises(ValueError, match="could not be read"):
        load_transfo_xl_vocab(garbage)
    with pytest.raises(ValueError, match="is not a file"):
        load_transfo_xl_vocab(tmp_path / "missing.pkl")
