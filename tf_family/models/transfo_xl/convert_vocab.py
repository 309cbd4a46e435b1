"""Convert a transformers 4.x Transformer-XL ``vocab.pkl`` into a pickle-free ``tokenizers`` tokenizer.

transformers 4.x stored the Transformer-XL word-level vocabulary (``transfo-xl/transfo-xl-wt103`` and every
checkpoint saved with ``TransfoXLTokenizer.save_pretrained``) as a pickle of the tokenizer's ``__dict__``.
Unpickling runs whatever the file tells it to, which is why transformers 5 removed the tokenizer. This module reads
such a file without executing it and writes a ``tokenizer.json`` (a ``tokenizers`` WordLevel model with the same
ids) plus ``tokenizer_config.json`` and ``special_tokens_map.json``, which ``AutoTokenizer.from_pretrained`` loads.

**How the pickle is read.** A ``pickle.Unpickler`` subclass whose ``find_class`` never imports anything:

- plain data types (``builtins`` dict, list, tuple, set, frozenset, str, bytes, int, float, complex, bool and
  ``collections`` OrderedDict, Counter, defaultdict, deque) resolve to the real classes — calling them can only
  build data;
- the non-data objects a 4.x ``TransfoXLTokenizer.__dict__`` holds (compiled ``re`` patterns, the sacremoses
  normaliser / tokenizer / detokenizer, the transformers ``Trie`` of special tokens, ``tokenizers.AddedToken``; see
  ``_INERT_GLOBALS``) resolve to an inert placeholder class: constructing it or restoring its state discards the
  arguments, and the real class is never imported or called. The conversion needs none of them;
- any other global (``os.system``, ``builtins.eval``, ``subprocess.Popen`` …) stops the load with a ``ValueError``
  naming ``module.qualname``; nothing from the file has been executed at that point;
- before anything is unpickled, the opcodes are read once (``pickletools.genops``, which builds nothing) and the
  structure they would build is measured: a file over `MAX_VOCAB_PICKLE_BYTES`, an object nested deeper than
  `MAX_PICKLE_DEPTH` (a tuple key nested a million deep would crash the interpreter when it is hashed) or one that
  unfolds to more than `MAX_PICKLE_ELEMENTS` elements (shared references doubling at each level) is refused with a
  ``ValueError``; so are ``bytes(n)`` / ``bytearray(n)`` calls asking for more than `MAX_PICKLE_ELEMENTS` bytes.

(The house style bans ``pickle`` in ``tf_family/``; this restricted reader is the one exception, and it exists so
that nobody has to call plain ``pickle`` on these files.)

**What the tokenizer reproduces.** 4.x ``TransfoXLTokenizer`` tokenised a line as: split out the special tokens
(``<eos>``, ``<unk>``, ``<formula>`` …), ``strip()``, lowercase if ``lower_case``, Moses punctuation normalisation
and tokenisation (sacremoses, ``aggressive_dash_splits=True``), then ``tokenize_numbers`` (``1,000`` →
``1 @,@ 000``, ``3.5`` → ``3 @.@ 5``); it added no ``<eos>`` when called as ``tokenizer(text)`` (``add_eos`` was
only used when encoding corpus files). The converted tokenizer does: special tokens split out first (added tokens,
``normalized=False``), lowercase if the pickle's ``lower_case`` is true, the aggressive hyphen split
(``well-known`` → ``well @-@ known``) and the number splitting, then a whitespace split and a WordLevel lookup with
the pickle's ``<unk>``. It does **not** reproduce the rest of Moses (splitting ``.``/``,``/quotes/brackets off
words, ``'s``, punctuation normalisation); the WikiText-103 vocabulary was built on text that is already
tokenised that way, so feed pre-tokenised text (``"the cat sat on the mat ."``) for identical ids. Decoding joins
tokens with spaces (no Moses detokeniser). Note that 4.x itself mangled pre-tokenised WikiText (its Moses step
splits ``@,@`` into ``@ , @``); the converted tokenizer keeps such tokens whole.

Example::

    from transformers import AutoTokenizer
    from tf_family.models.transfo_xl.convert_vocab import convert_transfo_xl_vocab

    convert_transfo_xl_vocab("transfo-xl-wt103/vocab.pkl", "converted/")
    tokenizer = AutoTokenizer.from_pretrained("converted/")
"""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import pickletools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers
from transformers.utils import logging

from ...conversion import ForeignTokenizer
from ...utils.files import atomic_update_dir

logger = logging.get_logger(__name__)

__all__ = ["TRANSFO_XL_VOCAB", "convert_transfo_xl_vocab", "load_transfo_xl_vocab"]

# Globals that may be resolved to the real object: calling them can only build plain data.
_DATA_GLOBALS: dict[tuple[str, str], type] = {
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "str"): str,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "complex"): complex,
    ("builtins", "bool"): bool,
    ("builtins", "NoneType"): type(None),
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "Counter"): collections.Counter,
    ("collections", "defaultdict"): collections.defaultdict,
    ("collections", "deque"): collections.deque,
}
# Bounds of what a vocab.pkl may hold (the WikiText-103 vocabulary is ~10 MB, nested 5 deep, ~2M elements).
MAX_VOCAB_PICKLE_BYTES = 1 << 30
MAX_PICKLE_DEPTH = 100
MAX_PICKLE_ELEMENTS = 100_000_000


class _BoundedBytes(bytes):
    """``bytes(...)`` as a pickle may call it: ``bytes(n)`` (n zero bytes) only up to `MAX_PICKLE_ELEMENTS`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> bytes:
        _check_buffer_size(args)
        return bytes(*args, **kwargs)


class _BoundedBytearray(bytearray):
    """``bytearray(...)`` as a pickle may call it, with the bound of `_BoundedBytes`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> bytearray:
        _check_buffer_size(args)
        return bytearray(*args, **kwargs)


def _check_buffer_size(args: tuple) -> None:
    if args and isinstance(args[0], int) and not 0 <= args[0] <= MAX_PICKLE_ELEMENTS:
        raise ValueError(f"the pickle asks for a buffer of {args[0]} bytes (at most {MAX_PICKLE_ELEMENTS}).")


_DATA_GLOBALS[("builtins", "bytes")] = _BoundedBytes
_DATA_GLOBALS[("builtins", "bytearray")] = _BoundedBytearray
# Python 2 era pickles name the builtins module `__builtin__`.
_DATA_GLOBALS.update(
    {("__builtin__", name): cls for (module, name), cls in list(_DATA_GLOBALS.items()) if module == "builtins"}
)

# Non-data objects found in a 4.x TransfoXLTokenizer.__dict__ (transformers 4.35.2 writes all of these). They are
# replaced by _InertPlaceholder and never imported; the conversion reads none of them.
_INERT_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("re", "_compile"),  # punction_without_space_before_pattern, punctuation_with_space_around_pattern
        ("sacremoses.normalize", "MosesPunctNormalizer"),  # moses_punct_normalizer
        ("sacremoses.tokenize", "MosesTokenizer"),  # moses_tokenizer
        ("sacremoses.tokenize", "MosesDetokenizer"),  # moses_detokenizer
        ("transformers.tokenization_utils", "Trie"),  # tokens_trie
        ("tokenizers", "AddedToken"),  # values of _added_tokens_decoder (ids are in _added_tokens_encoder)
    }
)


class _InertPlaceholder:
    """Stands in for an allow-listed non-data object of a 4.x tokenizer pickle.

    The pickle can construct it (``REDUCE``/``NEWOBJ``) and restore its state (``BUILD``), but every argument is
    discarded: the object it replaces is never imported, constructed or called.
    """

    pickled_global: str = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> _InertPlaceholder:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<inert placeholder for {self.pickled_global}>"


class _RefusedGlobalError(ValueError):
    """A pickle referenced a global outside the allowlist."""


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only plain data types and inert placeholders; it never imports a module."""

    def __init__(self, file: io.BufferedIOBase, source: str) -> None:
        # encoding="utf-8": Python 2 era pickles store byte strings that are UTF-8 words.
        super().__init__(file, encoding="utf-8")
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        if key in _DATA_GLOBALS:
            return _DATA_GLOBALS[key]
        if key in _INERT_GLOBALS:
            return type(f"Inert_{name}", (_InertPlaceholder,), {"pickled_global": f"{module}.{name}"})
        raise _RefusedGlobalError(
            f"Refused to load {self._source}: the pickle references the global '{module}.{name}', which is not "
            "part of a Transformer-XL vocabulary (allowed: plain builtins/collections data types and the known "
            f"4.x tokenizer objects {sorted('.'.join(k) for k in _INERT_GLOBALS)}). Nothing from the file was "
            "imported or executed. Only convert vocab.pkl files from a source you trust to be a 4.x TransfoXL "
            "vocabulary."
        )

    def persistent_load(self, pid: Any) -> Any:
        raise _RefusedGlobalError(
            f"Refused to load {self._source}: the pickle uses a persistent id ({pid!r}), which a Transformer-XL "
            "vocab.pkl never does (a torch-serialized file?). Nothing from the file was executed."
        )


def load_transfo_xl_vocab(vocab_pkl: str | os.PathLike) -> dict[str, Any]:
    """Read a 4.x Transformer-XL ``vocab.pkl`` safely and return its validated content.

    Args:
        vocab_pkl (`str` or `os.PathLike`): path to the pickle written by 4.x ``TransfoXLTokenizer``.

    Returns:
        `dict` with ``idx2sym`` (`list[str]`), ``sym2idx`` (`dict[str, int]`), ``unk_token`` (`str`),
        ``eos_token`` (`str | None`), ``special_tokens`` (`list[str]`, in id order; all in the vocabulary) and
        ``lower_case`` (`bool`).

    Raises:
        ValueError: the file references a global outside the allowlist (nothing is executed), is not a pickle, or
            does not hold a consistent Transformer-XL vocabulary (the message names the key).
    """
    path = Path(vocab_pkl)
    if not path.is_file():
        raise ValueError(f"vocab_pkl={str(vocab_pkl)!r} is not a file; pass the path of a 4.x TransfoXL vocab.pkl.")
    size = path.stat().st_size
    if size > MAX_VOCAB_PICKLE_BYTES:
        raise ValueError(
            f"vocab_pkl={str(path)!r} is {size} bytes, more than a Transformer-XL vocabulary pickle holds (at most "
            f"{MAX_VOCAB_PICKLE_BYTES}); pass the vocab.pkl written by 4.x TransfoXLTokenizer."
        )
    data = path.read_bytes()
    try:
        _check_pickle_structure(data)
        content = _RestrictedUnpickler(io.BytesIO(data), source=str(path)).load()
    except _RefusedGlobalError:
        raise
    except Exception as error:  # malformed pickles raise many kinds (UnpicklingError, EOFError, TypeError ...)
        raise ValueError(
            f"vocab_pkl={str(path)!r} could not be read as a Transformer-XL vocabulary pickle "
            f"({type(error).__name__}: {error}). Pass the vocab.pkl written by 4.x TransfoXLTokenizer."
        ) from error
    try:
        return _validate_vocab(content, str(path))
    except RecursionError as error:  # bounded depth makes this unreachable; kept as the documented error anyway
        raise ValueError(f"vocab_pkl={str(path)!r} holds objects nested too deeply to inspect.") from error


class _Node:
    """What `_check_pickle_structure` knows of an object the pickle would build: its nesting depth and how many
    elements it unfolds to (shared references counted each time they are reached)."""

    __slots__ = ("depth", "elements")

    def __init__(self, depth: int = 0, elements: int = 1) -> None:
        self.depth, self.elements = depth, elements


_MARK = object()
# opcodes that add to the container below the mark (or below the items), instead of building a new object
_IN_PLACE = frozenset({"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"})


def _opcode_kinds() -> dict[str, tuple[str, bool, int]]:
    """opcode name -> (kind, pops down to a MARK, objects popped below the MARK or without one)."""
    kinds = {}
    for opcode in pickletools.opcodes:
        name, before, after = opcode.name, opcode.stack_before, opcode.stack_after
        has_mark = pickletools.markobject in before
        below = before.index(pickletools.markobject) if has_mark else len(before)
        if name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET", "DUP", "MARK"):
            kind = name.removeprefix("BIN").removeprefix("LONG_BIN")
        elif not before and len(after) == 1:
            kind = "leaf"
        elif name in _IN_PLACE:
            kind = "in_place"
        else:
            kind = "build" if after else "pop"
        kinds[name] = (kind, has_mark, below)
    return kinds


_OPCODE_KINDS = _opcode_kinds()


def _check_pickle_structure(data: bytes) -> None:
    """Walk the opcodes of ``data`` (nothing is built or called) on a stack of `_Node` and raise a ``ValueError`` when
    an object would nest deeper than `MAX_PICKLE_DEPTH`, or when building the objects would walk more than
    `MAX_PICKLE_ELEMENTS` elements (each object built, or put in a container, counted with all it holds)."""
    stack: list = []
    memo: dict = {}
    unfolded = 0
    for opcode, argument, _ in pickletools.genops(io.BytesIO(data)):
        kind, has_mark, below = _OPCODE_KINDS[opcode.name]
        if kind == "leaf":
            stack.append(_Node())
            continue
        if kind in ("PUT", "MEMOIZE"):
            if not stack or stack[-1] is _MARK:
                raise ValueError(f"{opcode.name} with nothing to memoize")
            memo[len(memo) if kind == "MEMOIZE" else argument] = stack[-1]
            continue
        if kind == "GET":
            if argument not in memo:
                raise ValueError(f"the pickle reads memo entry {argument!r} before writing it")
            stack.append(memo[argument])
            continue
        if kind == "DUP":
            stack.append(stack[-1] if stack else _Node())
            continue
        if kind == "MARK":
            stack.append(_MARK)
            continue
        popped: list = []
        if has_mark or (opcode.name == "POP" and stack and stack[-1] is _MARK):
            while stack and stack[-1] is not _MARK:
                popped.append(stack.pop())
            if not stack:
                raise ValueError(f"{opcode.name} without a MARK")
            stack.pop()
        if len(stack) < below:
            raise ValueError(f"{opcode.name} finds {len(stack)} objects on the stack, needs {below}")
        for _ in range(below):
            popped.append(stack.pop())
        if any(item is _MARK for item in popped):
            raise ValueError(f"{opcode.name} consumes a MARK")
        if kind == "pop":
            continue
        if kind == "in_place":  # the container is the deepest popped object
            node, children = popped[-1], popped[:-1]
        else:
            node, children = _Node(), popped
        if children:
            node.depth = max(node.depth, 1 + max(child.depth for child in children))
            added = sum(child.elements for child in children)
            node.elements += added
            # building an object, or putting one in a container, walks it (hashing a key, say) once
            unfolded += added if kind == "in_place" else node.elements
            if node.depth > MAX_PICKLE_DEPTH:
                raise ValueError(f"an object is nested more than {MAX_PICKLE_DEPTH} levels deep")
            if unfolded > MAX_PICKLE_ELEMENTS:
                raise ValueError(f"the objects unfold to more than {MAX_PICKLE_ELEMENTS} elements")
        stack.append(node)


def _validate_vocab(content: Any, source: str) -> dict[str, Any]:
    """Check the unpickled ``TransfoXLTokenizer.__dict__`` and extract what the conversion needs."""
    if isinstance(content, int) and not isinstance(content, bool):
        raise ValueError(
            f"{source} starts with the integer {content}: it is a torch-serialized vocab.bin, not a vocab.pkl. "
            "Convert the vocab.pkl of the same checkpoint instead."
        )
    if not isinstance(content, Mapping):
        raise ValueError(
            f"{source} holds a {type(content).__name__}, expected the dict a 4.x TransfoXLTokenizer pickles "
            "(with 'idx2sym' and/or 'sym2idx')."
        )
    if "idx2sym" not in content and "sym2idx" not in content:
        raise ValueError(
            f"{source} has neither 'idx2sym' nor 'sym2idx' (keys: {sorted(map(str, content))[:20]}); it is not a "
            "Transformer-XL vocabulary."
        )
    idx2sym = content.get("idx2sym")
    sym2idx = content.get("sym2idx")
    if idx2sym is not None and not (isinstance(idx2sym, list) and all(isinstance(s, str) for s in idx2sym)):
        raise ValueError(f"{source}: 'idx2sym' must be a list of str, got {type(idx2sym).__name__}.")
    if sym2idx is not None and not (
        isinstance(sym2idx, Mapping) and all(isinstance(s, str) and type(i) is int for s, i in sym2idx.items())
    ):
        raise ValueError(f"{source}: 'sym2idx' must map str to int, got {type(sym2idx).__name__}.")
    # 4.x from_pretrained does not restore idx2sym (its __init__ sets it first), so an empty idx2sym next to a
    # full sym2idx is how such a tokenizer looks when saved again: trust sym2idx then.
    if not idx2sym and sym2idx:
        idx2sym = _idx2sym_from_sym2idx(sym2idx, source)
    if not idx2sym:
        raise ValueError(f"{source}: 'idx2sym'/'sym2idx' are empty; the vocabulary has no tokens.")
    if len(set(idx2sym)) != len(idx2sym):
        duplicates = sorted({s for s in idx2sym if idx2sym.count(s) > 1})[:10]
        raise ValueError(f"{source}: 'idx2sym' lists some tokens twice: {duplicates}.")
    if sym2idx is not None:
        mismatched = [s for i, s in enumerate(idx2sym) if sym2idx.get(s) != i]
        if len(sym2idx) != len(idx2sym) or mismatched:
            raise ValueError(
                f"{source}: 'idx2sym' ({len(idx2sym)} tokens) and 'sym2idx' ({len(sym2idx)} entries) disagree, "
                f"e.g. on {mismatched[:5]}; the vocabulary is inconsistent."
            )
    vocab = {symbol: index for index, symbol in enumerate(idx2sym)}

    lower_case = content.get("lower_case", False)
    if not isinstance(lower_case, bool):
        raise ValueError(f"{source}: 'lower_case' must be a bool, got {lower_case!r}.")
    delimiter = content.get("delimiter")
    if delimiter == "":
        raise NotImplementedError(
            f"{source}: delimiter='' (character-level splitting) is not supported by the converter; only the "
            "default word-level TransfoXL vocabularies (delimiter None) are."
        )

    init_kwargs = content.get("init_kwargs") if isinstance(content.get("init_kwargs"), Mapping) else {}
    unk_token = _unk_token(content, init_kwargs, idx2sym, vocab, source)
    eos_token = init_kwargs.get("eos_token") if isinstance(init_kwargs.get("eos_token"), str) else "<eos>"
    if eos_token not in vocab:
        eos_token = None

    additional = init_kwargs.get("additional_special_tokens", ["<formula>"])
    candidates = [unk_token, eos_token]
    if isinstance(additional, list):
        candidates += [t for t in additional if isinstance(t, str)]
    added_encoder = content.get("_added_tokens_encoder")
    if isinstance(added_encoder, Mapping):
        for token, index in added_encoder.items():
            if not isinstance(token, str):
                continue
            if vocab.get(token) != index:
                logger.warning(
                    f"{source}: the 4.x added token {token!r} has id {index}, but the vocabulary gives it "
                    f"{vocab.get(token)}; the converted tokenizer uses the vocabulary (a 4.x tokenizer built "
                    "before its vocabulary had colliding ids here)."
                )
            candidates.append(token)
    special_tokens = sorted({t for t in candidates if t is not None and t in vocab}, key=vocab.__getitem__)
    return {
        "idx2sym": idx2sym,
        "sym2idx": vocab,
        "unk_token": unk_token,
        "eos_token": eos_token,
        "special_tokens": special_tokens,
        "lower_case": lower_case,
    }


def _idx2sym_from_sym2idx(sym2idx: Mapping[str, int], source: str) -> list[str]:
    """Invert ``sym2idx``; its ids must be exactly ``0 .. len - 1``."""
    ids = sorted(sym2idx.values())
    if ids != list(range(len(ids))):
        raise ValueError(
            f"{source}: the ids in 'sym2idx' are not 0..{len(ids) - 1} without gaps or repeats; cannot rebuild "
            "'idx2sym'."
        )
    idx2sym = [""] * len(ids)
    for symbol, index in sym2idx.items():
        idx2sym[index] = symbol
    return idx2sym


def _unk_token(
    content: Mapping[str, Any], init_kwargs: Mapping[str, Any], idx2sym: list[str], vocab: dict[str, int], source: str
) -> str:
    """The token out-of-vocabulary words map to, resolved in 4.x's order (``unk_idx``, then ``<unk>``/``<UNK>``)."""
    unk_idx = content.get("unk_idx")
    if unk_idx is not None:
        if type(unk_idx) is not int or not 0 <= unk_idx < len(idx2sym):
            raise ValueError(f"{source}: 'unk_idx'={unk_idx!r} is not an id of the {len(idx2sym)}-token vocabulary.")
        return idx2sym[unk_idx]
    for candidate in (init_kwargs.get("unk_token"), "<unk>", "<UNK>"):
        if isinstance(candidate, str) and candidate in vocab:
            return candidate
    raise ValueError(
        f"{source}: no 'unk_idx' and no '<unk>'/'<UNK>' token in the vocabulary; a word-level tokenizer needs an "
        "unknown token to map out-of-vocabulary words to."
    )


def _build_tokenizer(vocab: dict[str, Any]) -> Tokenizer:
    """A WordLevel ``tokenizers.Tokenizer`` reproducing 4.x TransfoXL ids (see the module docstring)."""
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab["sym2idx"], unk_token=vocab["unk_token"]))
    steps = [normalizers.Lowercase()] if vocab["lower_case"] else []
    steps += [
        # sacremoses aggressive_dash_splits: "well-known" -> "well @-@ known"
        normalizers.Replace(Regex(r"(?<=[\p{L}\p{N}])-(?=[\p{L}\p{N}])"), " @-@ "),
        # transformers 4.x tokenize_numbers: "1,000" -> "1 @,@ 000", "3.5" -> "3 @.@ 5"
        normalizers.Replace(Regex(r"(?<=\p{Nd}),(?=\p{Nd})"), " @,@ "),
        normalizers.Replace(Regex(r"(?<=\p{Nd})\.(?=\p{Nd})"), " @.@ "),
    ]
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in vocab["special_tokens"]]
    )
    return tokenizer


def convert_transfo_xl_vocab(vocab_pkl: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """Convert a 4.x Transformer-XL ``vocab.pkl`` into ``tokenizer.json`` + config files, without unpickling code.

    Args:
        vocab_pkl (`str` or `os.PathLike`): the ``vocab.pkl`` written by transformers 4.x ``TransfoXLTokenizer``
            (e.g. the one of ``transfo-xl/transfo-xl-wt103``).
        output_dir (`str` or `os.PathLike`): folder to write ``tokenizer.json``, ``tokenizer_config.json`` and
            ``special_tokens_map.json`` to; created if missing. Those three files are overwritten; nothing else
            in the folder is touched.

    Returns:
        `pathlib.Path`: the written ``tokenizer.json``.

    Raises:
        ValueError: the pickle references a global outside the allowlist (nothing is executed; the message names
            ``module.qualname``), or it is not a consistent Transformer-XL vocabulary (the message names the key).
    """
    vocab = load_transfo_xl_vocab(vocab_pkl)
    output = Path(output_dir)
    if output.exists() and not output.is_dir():
        raise ValueError(f"output_dir={str(output_dir)!r} exists and is not a directory; pass a folder path.")
    tokenizer_file = output / "tokenizer.json"
    with atomic_update_dir(output) as staging:  # the three files are written beside, flushed, then renamed in
        _write_tokenizer_files(vocab, staging)
    logger.info(f"Converted {vocab_pkl} ({len(vocab['idx2sym'])} tokens) to {tokenizer_file}.")
    return tokenizer_file


def _write_tokenizer_files(vocab: dict[str, Any], output: Path) -> None:
    _build_tokenizer(vocab).save(str(output / "tokenizer.json"))

    named = {"unk_token": vocab["unk_token"]}
    if vocab["eos_token"] is not None:
        named["eos_token"] = vocab["eos_token"]
    additional = [t for t in vocab["special_tokens"] if t not in named.values()]
    special_tokens_map = {**named, "additional_special_tokens": additional}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_tokens_map,
        # 4.x TransfoXL returned input_ids only (the model takes no attention mask).
        "model_input_names": ["input_ids"],
        "clean_up_tokenization_spaces": False,
        "do_lower_case": vocab["lower_case"],
    }
    for name, payload in (
        ("tokenizer_config.json", tokenizer_config),
        ("special_tokens_map.json", special_tokens_map),
    ):
        (output / name).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


TRANSFO_XL_VOCAB = ForeignTokenizer(
    name="transfo-xl-vocab",
    description="a 4.x vocab.pkl -> tokenizer.json (restricted unpickler)",
    convert=convert_transfo_xl_vocab,
)
