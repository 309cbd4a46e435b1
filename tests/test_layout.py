"""The shape of the house (DESIGN §1): no import cycle inside tf_family/, no model folder importing another,
no recipe importing another recipe, no file over 1,200 lines (STYLE: aim for 800).

Imports are read from the source with `ast` (module-level and inside functions alike: a lazy import that closes a
circle is still a circle). Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` too; those implicit edges are
left out, as every tool that draws import graphs does, or every module would sit in a circle with the package root.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tf_family"
MAX_LINES = 1200


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The tf_family modules ``name`` imports (``from pkg import sub`` counts as importing ``pkg.sub``)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            submodules = {f"{target}.{alias.name}" for alias in node.names} & known
            # ``from pkg import sub`` imports the module pkg.sub; ``from pkg import name`` imports pkg itself
            found |= submodules if len(submodules) == len(node.names) else {target, *submodules}
    return {module for module in found if module in known and module != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, components, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_no_import_cycle_inside_tf_family():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _model_folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["tf_family", "models"] else None


def test_no_model_folder_imports_another():
    crossings = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if _model_folder(module) and _model_folder(target) and _model_folder(module) != _model_folder(target)
    )
    assert crossings == []


# DESIGN §1: beside its packages (modeling/: what every model is built from; shipping/: getting a model out; utils/:
# the user's files and errors; attention/, memory/, layers/ ...) tf_family/ holds only these modules
TOP_LEVEL_MODULES = {"__init__", "allocator", "auto", "cli", "lazy_auto", "registry", "spec"}


def test_no_loose_module_beside_the_packages():
    assert {path.stem for path in PACKAGE.glob("*.py")} - TOP_LEVEL_MODULES == set()


@pytest.mark.parametrize("folder", ["tf_family", "recipes"])
def test_no_file_over_1200_lines(folder):
    long_files = {
        str(path.relative_to(ROOT)): count
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long_files == {}


# STYLE: about 6 parameters per function; more needs a reason. A public `forward` keeps transformers' keyword
# signature (callers pass every argument by name) and says so in its docstring; an internal function that needs more
# takes a small per-call dataclass or keyword-only arguments instead, or says in its docstring why not ("Ten
# parameters: ...", "hence more than six"). Checked over every module of tf_family/.
MAX_PARAMETERS = 8
REASON = re.compile(
    r"more than (~ ?6|six|STYLE's six)|\b(nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen) "
    r"(parameters|inputs|arguments)\b",
    re.IGNORECASE,
)
PARAMETER_RULE_FILES = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tf_family").rglob("*.py"))


def _wide_functions_without_reason(source: str) -> list[str]:
    """``name:line`` of every function with more than `MAX_PARAMETERS` parameters (``self``/``cls`` not counted)
    whose docstring does not give the reason."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = node.args
        names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
        count = len(names) + (arguments.vararg is not None) + (arguments.kwarg is not None)
        count -= bool(names) and names[0] in ("self", "cls", "ctx")
        docstring = " ".join((ast.get_docstring(node) or "").split())
        if count > MAX_PARAMETERS and not REASON.search(docstring):
            found.append(f"{node.name}:{node.lineno}")
    return found


@pytest.mark.parametrize("path", PARAMETER_RULE_FILES)
def test_wide_functions_say_why(path):
    assert _wide_functions_without_reason((ROOT / path).read_text(encoding="utf-8")) == []


def test_the_parameter_rule_flags_a_wide_function():
    wide = "def f(a, b, c, d, e, f, g, h, i):\n    '''No reason given.'''\n"
    reasoned = "def f(self, a, b, c, d, e, f, g, h, i):\n    '''transformers' signature, hence more than ~6\n    parameters.'''\n"
    assert _wide_functions_without_reason(wide) == ["f:1"]
    assert _wide_functions_without_reason(reasoned) == []
    counted = "def f(a, b, c, d, e, f, g, h, i):\n    '''Nine parameters: one per field of the record.'''\n"
    assert _wide_functions_without_reason(counted) == []


# ---------------------------------------------------------------------------------------- a model reads in its file
# issue 38: a model class lists at most three tf_family bases and has at most six tf_family classes in its MRO (the
# class itself included), as transformers' `LlamaForCausalLM(LlamaPreTrainedModel, GenerationMixin)` does: what every
# model shares is one base, `TffPreTrainedModel`; a head adds at most a task head, TRL's fused LM head and one
# generation mixin. Every class of the registry is held to it (bench/class_layout.py prints the counts).
XL_FAMILY = ("transfo_xl", "compressive", "memorizing", "spalm", "knn_lm")
MAX_TF_FAMILY_BASES = 3
MAX_TF_FAMILY_MRO = 6


def _tf_family_classes(classes) -> list[str]:
    return [cls.__name__ for cls in classes if cls.__module__.startswith("tf_family")]


def _registry_classes(names=None):
    from tf_family.registry import ARCHITECTURES

    return [
        (f"{spec.name}/{task}", cls)
        for spec in ARCHITECTURES.values()
        if names is None or spec.name in names
        for task, cls in spec.model_classes.items()
    ]


def _layout_faults(cls: type) -> list[str]:
    bases, mro = _tf_family_classes(cls.__bases__), _tf_family_classes(cls.__mro__)
    faults = []
    if len(bases) > MAX_TF_FAMILY_BASES:
        faults.append(f"{cls.__name__} lists {len(bases)} tf_family bases {bases}")
    if len(mro) > MAX_TF_FAMILY_MRO:
        faults.append(f"{cls.__name__}'s MRO holds {len(mro)} tf_family classes {mro}")
    return faults


@pytest.mark.parametrize(
    ("label", "cls"), _registry_classes(), ids=lambda value: value if isinstance(value, str) else ""
)
def test_every_model_class_has_few_tf_family_bases_and_a_short_mro(label, cls):
    assert _layout_faults(cls) == [], label


def test_every_model_class_shares_one_tf_family_base():
    from tf_family.modeling.pretrained import TffPreTrainedModel

    others = [label for label, cls in _registry_classes() if not issubclass(cls, TffPreTrainedModel)]
    assert others == []


def test_the_layout_rule_flags_too_many_bases_and_a_long_mro():
    def ours(name, *bases):
        return type(name, bases, {"__module__": "tf_family.models.fake"})

    first, second, third, fourth = (ours(name) for name in "ABCD")
    assert _layout_faults(ours("Three", first, second, third)) == []
    assert "lists 4 tf_family bases" in _layout_faults(ours("Four", first, second, third, fourth))[0]
    chain = first
    for depth in range(5):  # Level4 ... Level0, A: six tf_family classes
        chain = ours(f"Level{depth}", chain)
    assert _layout_faults(chain) == []
    assert "MRO holds 7" in _layout_faults(ours("Seventh", chain))[0]
    assert _layout_faults(type("Outside", (chain,), {})) == []  # a class outside tf_family is not counted


@pytest.mark.parametrize(
    ("label", "cls"), _registry_classes(XL_FAMILY), ids=lambda value: value if isinstance(value, str) else ""
)
def test_xl_family_models_get_no_state_from_a_mixin(label, cls):
    # every tf_family class in the MRO but the model's own file's and the shared bases defines no __init__: the
    # model's attributes are assigned in its own __init__, in its own file
    shared = {"TffPreTrainedModel", "FusedLMHeadMixin", "ValidatedGenerationMixin"}
    foreign = [
        klass.__name__
        for klass in cls.__mro__
        if klass.__module__.startswith("tf_family")
        and klass.__module__ != cls.__module__
        and klass.__name__ not in shared
    ]
    assert foreign == [], f"{label}: {cls.__name__} inherits {foreign} from another file"
    assert all("__init__" not in vars(klass) for klass in cls.__mro__ if klass.__name__ in shared)
