"""ListOps, generated offline: our own generator following the Long Range Arena's rules (Tay et al. 2020,
arXiv 2011.04006; Nangia & Bowman 2018): nested expressions of the operators MIN, MAX, MED (median; of an even count, the
mean of the middle two rounded down) and SM (sum modulo 10) over the digits 0-9, at most ``max_depth`` levels deep and at
most ``max_args`` arguments per operator; a node is an operator with probability 0.25, else a digit. The
label is the expression's value (10 classes). Expressions are kept when their length in words lies between
``min_length`` and ``max_length`` (LRA: 500-2,000 words; our runs pass shorter bounds for small budgets).

    [MAX 2 9 [MIN 4 7 ] 0 ]  ->  9

The text is written with spaces between words, the way LRA's TSV files hold it, so any tokenizer reads it.
"""

from __future__ import annotations

import random
import statistics

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
VALUE_PROBABILITY = 0.25


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int):
    """A digit, or (operator, [arguments]): as LRA's ``generate_tree``, a node below ``max_depth`` is an operator
    with probability 0.25 (else a digit), its 2-``max_args`` arguments drawn the same way one level deeper."""
    if depth >= max_depth or rng.random() > VALUE_PROBABILITY:
        return rng.randrange(10)
    arguments = [_tree(rng, depth + 1, max_depth, max_args) for _ in range(rng.randint(2, max_args))]
    return rng.choice(OPERATORS), arguments


def evaluate(tree) -> int:
    if isinstance(tree, int):
        return tree
    operator, arguments = tree
    values = [evaluate(a) for a in arguments]
    if operator == "[MIN":
        return min(values)
    if operator == "[MAX":
        return max(values)
    if operator == "[MED":
        return int(statistics.median(values))  # LRA: int(np.median(...)), the mean of the middle two, floored
    return sum(values) % 10


def words(tree) -> list[str]:
    if isinstance(tree, int):
        return [str(tree)]
    operator, arguments = tree
    return [operator, *(w for a in arguments for w in words(a)), "]"]


def generate(
    count: int, seed: int, min_length: int = 1, max_length: int = 2000, max_depth: int = 10, max_args: int = 10
) -> list[dict]:
    """``count`` examples ``{"text": ..., "label": int}`` with ``min_length`` <= words <= ``max_length``."""
    if not 1 <= min_length <= max_length:
        raise ValueError(f"min_length {min_length} and max_length {max_length} must satisfy 1 <= min <= max.")
    if max_depth < 1 or max_args < 2:
        raise ValueError(f"max_depth {max_depth} must be >= 1 and max_args {max_args} >= 2.")
    rng = random.Random(seed)
    examples = []
    attempts = 0
    while len(examples) < count:
        attempts += 1
        if attempts > 10_000 * count:
            raise ValueError(
                f"no ListOps expression of {min_length}-{max_length} words came out of {attempts - 1} tries at "
                f"max_depth {max_depth}, max_args {max_args}; widen the length bounds."
            )
        tree = _tree(rng, 1, max_depth, max_args)
        text = words(tree)
        if min_length <= len(text) <= max_length:
            examples.append({"text": " ".join(text), "label": evaluate(tree)})
    return examples


__all__ = ["OPERATORS", "evaluate", "generate", "words"]
