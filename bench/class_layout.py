"""Count, for every model class the registry lists, its tf_family bases and the tf_family classes in its MRO.

Issue 38 item 1 asks for at most three tf_family bases and at most six tf_family classes in a model's MRO (the class
itself included); ``tests/test_layout.py`` holds every registry class to it.
Run: ``PYTHONPATH=$PWD python bench/class_layout.py [--all]`` (``--all``: one line per class).
"""

from __future__ import annotations

import statistics
import sys


def _ours(cls: type) -> bool:
    return cls.__module__.startswith("tf_family")


def class_layout() -> dict[str, tuple[int, int]]:
    """``"arch/task: Class" -> (tf_family bases, tf_family classes in the MRO, the class itself included)``."""
    from tf_family.registry import ARCHITECTURES

    layout = {}
    for spec in ARCHITECTURES.values():
        for task, cls in spec.model_classes.items():
            bases = sum(_ours(base) for base in cls.__bases__)
            mro = sum(_ours(klass) for klass in cls.__mro__)
            layout[f"{spec.name}/{task}: {cls.__name__}"] = (bases, mro)
    return layout


def main() -> None:
    layout = class_layout()
    if "--all" in sys.argv:
        for name, (bases, mro) in sorted(layout.items()):
            sys.stdout.write(f"{bases:2d} {mro:3d}  {name}\n")
    bases = [value[0] for value in layout.values()]
    mros = [value[1] for value in layout.values()]
    sys.stdout.write(
        f"{len(layout)} model classes: tf_family bases max {max(bases)} median {statistics.median(bases)}; "
        f"tf_family classes in MRO max {max(mros)} median {statistics.median(mros)}\n"
    )


if __name__ == "__main__":
    main()
