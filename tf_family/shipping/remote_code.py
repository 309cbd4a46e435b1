"""Remote-code export: a saved folder that plain transformers loads with ``trust_remote_code=True``, where tf_family
is not installed (only torch, transformers and safetensors).

transformers' dynamic-module loader copies the module a config's ``auto_map`` names and, recursively, the files it
imports with relative imports *inside the same folder* (``from .x import y``; see
``transformers.dynamic_module_utils.get_relative_import_files``), and it refuses a module whose absolute imports
are not installed (``check_imports``: imports inside ``try`` blocks are exempt). So an export writes beside the
weights:

* the architecture's configuration and modeling modules, and exactly the tf_family modules they import, followed
  transitively (imports inside functions included), each under one flat name (``tf_family/attention/backend.py`` ->
  ``attention_backend.py``; a model folder's files keep their names: ``modeling_longformer.py``);
* every import of a tf_family module rewritten to the flat file beside it (``from ...attention import attend`` ->
  ``from .attention_backend import attend``: a name a package re-exports is imported from the module that defines
  it, so a package's ``__init__`` and all its other modules are not dragged along);
* ``auto_map`` in ``config.json``: ``AutoConfig`` and the Auto class of every task head of the architecture.

What cannot travel is replaced by a stand-in with the same names (`STAND_INS`): the native C++ attention kernel
(compiled from tf_family's sources on first use) reports itself unavailable, so attention takes the PyTorch path
(same results; CPU training is slower). faiss stays optional, as in tf_family: exact PyTorch search without it.
An export whose files would import anything beyond the standard library and transformers' own dependencies is
refused (`ExportError`), so a folder that exports loads where only torch, transformers and safetensors are.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .._compat import MOVED

_PACKAGE = __name__.split(".")[0]

PACKAGE_DIR = Path(__file__).resolve().parents[1]
# what an exported file may import besides the standard library: transformers and what it always installs
ALLOWED_IMPORTS = frozenset(
    {"torch", "transformers", "safetensors", "numpy", "tqdm", "huggingface_hub", "packaging", "tokenizers"}
)

_NATIVE_STAND_IN = '''"""Stand-in for tf_family's native CPU attention kernel, which does not travel with remote code (it is C++ compiled
on first use from tf_family's own sources). `extension()` says it is not there, so attention takes the PyTorch path
(the same results; CPU training is slower than with tf_family installed)."""


def extension():
    """The compiled kernel: never available in a remote-code export."""
    return None


def float32_cpu_extension(*tensors):
    """The compiled kernels (the kNN search's too): never available in a remote-code export."""
    return None


def is_built() -> bool:
    return False


def can_build() -> bool:
    """No kernel travels with remote code, so the attention's default is PyTorch's SDPA."""
    return False


def _unavailable(*args, **kwargs):
    raise RuntimeError(
        "tf_family's native attention kernel is not part of a remote-code export; pip install tf-family to use it."
    )


REDUCED_DTYPES = ()  # no kernel, so no dtype is routed to it


fused_attention = fused_attention_upcast = fused_keep_mask = build_directory = build_key = _unavailable
'''
# tf_family modules replaced in an export by a stand-in (their source, which imports nothing of tf_family)
STAND_INS = {f"{_PACKAGE}.attention.native": _NATIVE_STAND_IN}


class ExportError(ValueError):
    """A folder that cannot be exported as remote code; the message says why and what to do."""


@dataclass
class _Module:
    name: str  # dotted, e.g. tf_family.attention.backend
    path: Path
    is_package: bool
    flat: str  # the file name (without .py) in the export
    tree: ast.Module | None = None
    source: bytes = b""
    imports: list[tuple[ast.ImportFrom, list[tuple[str, str | None, str]]]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------- module table
def _locate(name: str) -> tuple[Path, bool] | None:
    """The file of tf_family module ``name`` and whether it is a package, or None when there is no such module."""
    parts = name.split(".")[1:]
    base = PACKAGE_DIR.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None


def flat_name(name: str) -> str:
    """The file name (without ``.py``) module ``name`` gets in an export."""
    parts = name.split(".")[1:]
    if not parts:
        raise ExportError(f"the package {_PACKAGE} itself cannot be exported; import from its modules instead.")
    if parts[0] == "models" and len(parts) == 3:  # a model folder's own files keep their names
        return parts[2]
    return "_".join(parts)


def _current(name: str) -> str:
    """``name``, or where the module of that old path lives now (``tf_family.validation`` ->
    ``tf_family.modeling.validation``: `tf_family._compat.MOVED`)."""
    parts = name.split(".")
    if len(parts) > 1 and parts[0] == _PACKAGE and parts[1] in MOVED:
        return ".".join([MOVED[parts[1]], *parts[2:]])
    return name


def _absolute(module: _Module, level: int, target: str | None) -> str:
    """The absolute name a (possibly relative) ``from <target> import`` in ``module`` refers to (a module's old
    path resolved to where it lives now)."""
    if level == 0:
        return _current(target or "")
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    if level > 1:
        package = package[: -(level - 1)]
    return _current(".".join(package + ([target] if target else [])))


def _ours(name: str) -> bool:
    return name == _PACKAGE or name.startswith(_PACKAGE + ".")


class _Exporter:
    def __init__(self) -> None:
        self.modules: dict[str, _Module] = {}

    def module(self, name: str) -> _Module:
        if name not in self.modules:
            located = _locate(name)
            if located is None:
                raise ExportError(f"{name} is imported by tf_family code but is no module of it.")
            path, is_package = located
            self.modules[name] = _Module(name, path, is_package, flat_name(name))
        return self.modules[name]

    def defining_module(self, package: str, attribute: str, seen: frozenset = frozenset()) -> tuple[str, str | None]:
        """Where ``from <package> import <attribute>`` really comes from: ``(module, name)`` for a name, or
        ``(module, None)`` when the attribute is a submodule. A package's re-exports are followed to the module
        that defines the name; a name defined in the ``__init__`` itself keeps the package. As in Python, a name
        the ``__init__`` binds wins over a submodule of the same name (``attention.dropout`` is the function)."""
        if package in seen:
            raise ExportError(f"{package} re-exports {attribute!r} in a circle.")
        init = self.module(package)
        tree = ast.parse(init.path.read_bytes())
        for node in tree.body:
            if not isinstance(node, ast.ImportFrom):
                continue
            for alias in node.names:
                if (alias.asname or alias.name) != attribute:
                    continue
                source = _absolute(init, node.level, node.module)
                if not _ours(source):
                    return package, attribute  # re-exported from outside tf_family: the __init__ provides it
                located = _locate(source)
                if located is not None and located[1] and source != package:
                    return self.defining_module(source, alias.name, seen | {package})
                return source, alias.name
        defined = {
            target.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
        } | {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        submodule = _current(f"{package}.{attribute}")
        if attribute not in defined and _locate(submodule) is not None:
            return submodule, None
        return package, attribute

    def scan(self, module: _Module) -> list[str]:
        """Parse ``module``, resolve its imports of tf_family modules, and return the modules they need."""
        if module.name in STAND_INS:
            module.source = STAND_INS[module.name].encode()
            return []
        module.source = module.path.read_bytes()
        module.tree = ast.parse(module.source)
        needed = []
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import) and any(_ours(alias.name) for alias in node.names):
                raise ExportError(
                    f"{module.path}:{node.lineno}: `import {_PACKAGE}...` cannot be exported; write it as a relative "
                    "`from ... import name`."
                )
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _absolute(module, node.level, node.module)
            if not _ours(target):
                continue
            resolved = []  # (defining module, name or None for a module, local name)
            located = _locate(target)
            if located is None:
                raise ExportError(f"{module.path}:{node.lineno}: {target} is no module of tf_family.")
            for alias in node.names:
                local = alias.asname or alias.name
                if located[1]:  # a package: a submodule, or a name it defines or re-exports
                    source, name = self.defining_module(target, alias.name)
                else:
                    source, name = target, alias.name
                resolved.append((source, name, local))
                needed.append(source)
            module.imports.append((node, resolved))
        return needed

    def collect(self, entry_points: list[str]) -> None:
        queue = list(entry_points)
        done: set[str] = set()
        while queue:
            name = queue.pop()
            if name in done:
                continue
            done.add(name)
            queue += self.scan(self.module(name))
        flats: dict[str, str] = {}
        for module in self.modules.values():
            if module.name in done and flats.setdefault(module.flat, module.name) != module.name:
                raise ExportError(
                    f"{module.name} and {flats[module.flat]} would both be exported as {module.flat}.py."
                )
        self.modules = {name: module for name, module in self.modules.items() if name in done}

    def rewritten(self, module: _Module) -> str:
        """``module``'s source with its tf_family imports pointing at the flat files beside it."""
        relative = module.path.relative_to(PACKAGE_DIR.parent).as_posix()
        header = (
            f"# Exported by tf_family from {relative}, to load with `trust_remote_code=True` where tf_family\n"
            "# is not installed: its imports of tf_family modules name the files beside it.\n"
        )
        if module.name in STAND_INS:
            return header + module.source.decode()
        source = module.source
        line_starts = [0]
        for line in source.splitlines(keepends=True):
            line_starts.append(line_starts[-1] + len(line))
        edits = []
        for node, resolved in module.imports:
            start = line_starts[node.lineno - 1] + node.col_offset  # ast offsets are UTF-8 byte offsets
            end = line_starts[node.end_lineno - 1] + node.end_col_offset
            prefix = source[line_starts[node.lineno - 1] : start]
            statements = []
            by_module: dict[str, list[str]] = {}
            for source_module, name, local in resolved:
                flat = self.modules[source_module].flat
                if name is None:  # a module: transformers copies only files named by `from .x import`, so name one
                    statements.append(f"from . import {flat} as {local}")
                    statements.append(f"from .{flat} import __name__ as _{flat}_module_name")
                else:
                    by_module.setdefault(flat, []).append(name if name == local else f"{name} as {local}")
            statements += [f"from .{flat} import {', '.join(names)}" for flat, names in by_module.items()]
            separator = "\n" + prefix.decode() if not prefix.strip() else "; "
            edits.append((start, end, separator.join(statements).encode()))
        for start, end, text in sorted(edits, reverse=True):
            source = source[:start] + text + source[end:]
        return header + source.decode()


def _imported_packages(tree: ast.AST) -> set[str]:
    """Top-level packages a file imports outside ``try`` blocks (what transformers' ``check_imports`` requires)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Try):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


# ------------------------------------------------------------------------------------------------------------ export
def remote_code_files(model_type: str) -> tuple[dict[str, str], dict[str, str]]:
    """The files an export of ``model_type`` writes (name -> source) and its ``auto_map``."""
    from ..auto import AUTO_CLASS_BY_TASK
    from ..registry import find_arch

    spec = find_arch(model_type)
    if spec is None or model_type != spec.model_type:
        raise ExportError(
            f"model_type {model_type!r} is not a tf_family architecture's ({spec.model_type!r} is, for a legacy "
            "folder: convert it first with `tf-family convert`)"
            if spec is not None
            else f"model_type {model_type!r} is not a tf_family architecture; only tf_family folders are exported."
        )
    classes = [spec.config_class, *spec.model_classes.values()]
    exporter = _Exporter()
    exporter.collect(list(dict.fromkeys(cls.__module__ for cls in classes)))
    files = {f"{module.flat}.py": exporter.rewritten(module) for module in exporter.modules.values()}
    for name, text in files.items():
        extra = _imported_packages(ast.parse(text)) - ALLOWED_IMPORTS - set(sys.stdlib_module_names) - {"__future__"}
        if extra:
            raise ExportError(
                f"the export of {model_type} would need {sorted(extra)} (imported by {name} outside a try block); "
                "only torch, transformers and their dependencies may be required where tf_family is absent."
            )

    def entry(cls: type) -> str:
        return f"{exporter.modules[cls.__module__].flat}.{cls.__name__}"

    auto_map = {"AutoConfig": entry(spec.config_class)}
    for task, model_class in spec.model_classes.items():
        if task in AUTO_CLASS_BY_TASK:
            auto_map.setdefault(AUTO_CLASS_BY_TASK[task].__name__, entry(model_class))
    return files, auto_map


def _atomic_write(path: Path, text: str) -> None:
    from ..utils.files import atomic_write_text

    atomic_write_text(path, text)


def export_remote_code(folder: str | Path) -> list[str]:
    """Make the saved tf_family model in ``folder`` loadable where tf_family is not installed: write the model's
    code files beside its weights and ``auto_map`` into ``config.json`` (both atomically), and say so in the card
    (``README.md``: re-rendered when the folder has a ``training_run.json``, else the note is added). Returns the
    names of the code files written. Raises `ExportError` (a ValueError) for a folder that cannot be exported."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ExportError(f"{folder} has no config.json; pass the folder of a saved tf_family model.")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    base = config.get("base_config")
    if isinstance(base, dict) and (_tff := str(base.get("model_type", ""))).startswith("tff_"):
        raise ExportError(
            f"{folder} wraps a tf_family model ({_tff}) whose code the export cannot carry inside the wrapper's; "
            "export wrappers of plain transformers models (e.g. llama, gpt2) only."
        )
    files, auto_map = remote_code_files(str(config.get("model_type")))
    for name, text in files.items():
        _atomic_write(folder / name, text)
    config["auto_map"] = auto_map
    _atomic_write(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    _note_in_card(folder, auto_map)
    return sorted(files)


def _note_in_card(folder: Path, auto_map: dict[str, str]) -> None:
    from .cards import REMOTE_CODE_NOTE_MARKER, RUN_INFO_FILE, remote_code_note, write_model_card

    if (folder / RUN_INFO_FILE).is_file():
        write_model_card(folder)  # the card says it (cards.dependencies_text reads auto_map)
        return
    card = folder / "README.md"
    text = card.read_text(encoding="utf-8") if card.is_file() else f"# {folder.resolve().name}\n"
    if REMOTE_CODE_NOTE_MARKER not in text:
        _atomic_write(
            card, text.rstrip("\n") + "\n\n## Loading without tf_family\n\n" + remote_code_note(auto_map) + "\n"
        )


__all__ = [
    "ALLOWED_IMPORTS",
    "STAND_INS",
    "ExportError",
    "export_remote_code",
    "flat_name",
    "remote_code_files",
]
