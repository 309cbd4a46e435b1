"""The ACT halting rule (`tf_family.layers.halting`) against tensor2tensor's ``universal_transformer_act``,
transcribed below line by line (TensorFlow -> torch), and each of its rules on its own."""

import pytest
import torch

from tf_family.layers.halting import HaltingState, HaltingUnit, accumulate_state, halting_step

THRESHOLD = 1.0 - 0.01


def t2t_rule(halting_probability, remainders, n_updates, p, threshold):
    """tensor2tensor ``ut_function``'s halting lines (act_type "basic"), with ``tf.cast(..., float32)`` as ``.float()``."""
    still_running = (halting_probability < 1.0).float()
    new_halted = (halting_probability + p * still_running > threshold).float() * still_running
    still_running = (halting_probability + p * still_running <= threshold).float() * still_running
    halting_probability = halting_probability + p * still_running
    remainders = remainders + new_halted * (1 - halting_probability)
    halting_probability = halting_probability + new_halted * remainders
    n_updates = n_updates + still_running + new_halted
    update_weights = p * still_running + new_halted * remainders
    return halting_probability, remainders, n_updates, update_weights


def t2t_act(state, step_preprocess, halting, transform, max_steps, threshold, act_type="basic", graves=False):
    """tensor2tensor ``universal_transformer_act``'s loop: ``should_continue`` then ``ut_function`` until no position
    runs; returns ``(new_state, n_updates, remainders)``. ``step_preprocess(state, step)`` adds the timing signals,
    ``halting(state)`` gives ``p``, ``transform(state, step)`` applies the blocks. ``graves``: Graves 2016's halt at
    the maximum step, as ``p = 1`` there (every position still running passes the threshold and takes its remainder
    ``1 - h``; ``p`` itself weighs nothing at a halting step)."""
    shape = state.shape[:2]
    halting_probability, remainders, n_updates = torch.zeros(shape), torch.zeros(shape), torch.zeros(shape)
    previous_state = torch.zeros_like(state)
    step = 0
    while bool(((halting_probability < threshold) & (n_updates < max_steps)).any()):
        state = step_preprocess(state, step)
        p = halting(state)
        if graves and step == max_steps - 1:
            p = torch.ones_like(p)
        halting_probability, remainders, n_updates, weights = t2t_rule(
            halting_probability, remainders, n_updates, p, threshold
        )
        transformed_state = transform(state, step)
        weights = weights[..., None]
        if act_type == "accumulated":
            previous_state = transformed_state * weights + previous_state
        else:
            previous_state = transformed_state * weights + previous_state * (1 - weights)
        state = transformed_state
        step += 1
    return previous_state, n_updates, remainders


def run_rule(
    probabilities: torch.Tensor,
    running: torch.Tensor | None = None,
    threshold: float = THRESHOLD,
    force_halt_at_last: bool = False,
):
    """Ours over ``(steps, B, T)`` halting probabilities: the final state and the weights of every step
    (``force_halt_at_last``: Graves's halt at the last of the steps)."""
    state = HaltingState.start(torch.ones(probabilities.shape[1:], dtype=torch.bool) if running is None else running)
    weights = []
    for step, p in enumerate(probabilities):
        state, w = halting_step(state, p, threshold, force_halt=force_halt_at_last and step == len(probabilities) - 1)
        weights.append(w)
    return state, torch.stack(weights)


def exact_probabilities(steps: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random probabilities on a 1/64 grid: every sum is exact in float32, so t2t's ``< 1.0`` and our mask agree."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, 64, (steps, *shape), generator=generator).float() / 64


@pytest.mark.parametrize("seed", range(4))
def test_rule_equals_tensor2tensor(seed):
    probabilities = exact_probabilities(6, (3, 7), seed)
    shape = probabilities.shape[1:]
    hp, rem, n = torch.zeros(shape), torch.zeros(shape), torch.zeros(shape)
    ours = HaltingState.start(torch.ones(shape, dtype=torch.bool))
    for p in probabilities:
        hp, rem, n, expected_weights = t2t_rule(hp, rem, n, p, THRESHOLD)
        ours, weights = halting_step(ours, p, THRESHOLD)
        torch.testing.assert_close(weights, expected_weights, rtol=0, atol=0)
        torch.testing.assert_close(ours.halting_probability, hp, rtol=0, atol=0)
        torch.testing.assert_close(ours.remainders, rem, rtol=0, atol=0)
        torch.testing.assert_close(ours.n_updates, n, rtol=0, atol=0)


def test_remainder_at_the_halting_step_makes_weights_sum_to_one():
    probabilities = torch.tensor([[0.5], [0.3], [0.4], [0.9]])[:, None, :]  # (steps, B=1, T=1)
    state, weights = run_rule(probabilities)
    # 0.5 + 0.3 = 0.8 keeps running; 0.8 + 0.4 > 0.99 halts at step 3 with remainder 0.2; step 4 weighs nothing
    torch.testing.assert_close(weights[:, 0, 0], torch.tensor([0.5, 0.3, 0.2, 0.0]))
    assert state.n_updates.item() == 3 and state.halted.all()
    torch.testing.assert_close(state.remainders, torch.tensor([[0.2]]))
    torch.testing.assert_close(state.ponder_time, torch.tensor([[3.2]]))


def test_threshold_is_one_minus_epsilon():
    # a sum that reaches the threshold exactly keeps running (t2t: "less_equal ... threshold" still runs)
    threshold = 0.75
    state, weights = run_rule(torch.tensor([[[0.5]], [[0.25]], [[0.125]]]), threshold=threshold)
    torch.testing.assert_close(weights[:, 0, 0], torch.tensor([0.5, 0.25, 0.25]))
    assert state.n_updates.item() == 3
    # a sum just past it halts at once
    state, _ = run_rule(torch.tensor([[[0.5]], [[0.2500001]]]), threshold=threshold)
    assert state.n_updates.item() == 2 and state.halted.all()


def test_max_steps_leaves_no_remainder_without_force_halt():
    """tensor2tensor's rule: a position that never passes the threshold takes every step and gets no remainder (the
    loop just stops); its weights sum to less than one."""
    state, weights = run_rule(torch.full((4, 1, 1), 0.1))
    assert state.n_updates.item() == 4 and not state.halted.any()
    assert state.remainders.item() == 0.0
    torch.testing.assert_close(weights[:, 0, 0], torch.full((4,), 0.1))


def test_force_halt_gives_the_remainder_at_the_last_step():
    """Graves 2016 (eq. 3): the position halts at the maximum step N with R = 1 - (p_1 + .. p_{N-1}) as that step's
    weight, so its weights sum to one and the ponder time is N + R."""
    state, weights = run_rule(torch.full((4, 1, 1), 0.1), force_halt_at_last=True)
    torch.testing.assert_close(weights[:, 0, 0], torch.tensor([0.1, 0.1, 0.1, 0.7]))
    assert state.n_updates.item() == 4 and state.halted.all()
    torch.testing.assert_close(state.remainders, torch.tensor([[0.7]]))
    torch.testing.assert_close(state.ponder_time, torch.tensor([[4.7]]))
    # padding stays out: it never runs, even at a forced step
    state, weights = run_rule(torch.full((2, 1, 2), 0.1), torch.tensor([[True, False]]), force_halt_at_last=True)
    torch.testing.assert_close(weights[:, 0], torch.tensor([[0.1, 0.0], [0.9, 0.0]]))
    assert state.n_updates.tolist() == [[2.0, 0.0]]
    torch.testing.assert_close(state.remainders, torch.tensor([[0.9, 0.0]]))


def graves_rule(probabilities: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Graves 2016, eqs. 2-3, position by position: ``N = min(max steps, first n whose sum passes the threshold)``,
    the weights ``p_1 .. p_{N-1}, R``, ``R = 1 - sum_{n<N} p_n``. Returns ``(weights, N, R)``; ``(steps, ...)``
    probabilities (the threshold test is ``>``, as tensor2tensor's)."""
    steps = probabilities.shape[0]
    flat = probabilities.reshape(steps, -1)
    weights, n_updates, remainders = torch.zeros_like(flat), torch.zeros(flat.shape[1]), torch.zeros(flat.shape[1])
    for position in range(flat.shape[1]):
        total = 0.0
        for n in range(steps):
            p = flat[n, position].item()
            if n == steps - 1 or total + p > threshold:
                weights[n, position] = 1.0 - total
                n_updates[position], remainders[position] = n + 1, 1.0 - total
                break
            weights[n, position] = p
            total += p
    shape = probabilities.shape[1:]
    return weights.reshape(probabilities.shape), n_updates.reshape(shape), remainders.reshape(shape)


@pytest.mark.parametrize("seed", range(4))
def test_force_halt_equals_graves_and_changes_only_positions_at_max_steps(seed):
    probabilities = exact_probabilities(5, (3, 7), seed) / 2  # small (still exact sums): some reach the last step
    state, weights = run_rule(probabilities, force_halt_at_last=True)
    expected_weights, expected_n, expected_r = graves_rule(probabilities, THRESHOLD)
    torch.testing.assert_close(weights, expected_weights, rtol=0, atol=1e-6)
    torch.testing.assert_close(state.n_updates, expected_n)
    torch.testing.assert_close(state.remainders, expected_r, rtol=0, atol=1e-6)
    torch.testing.assert_close(weights.sum(0), torch.ones(3, 7))  # every position, those at max steps too
    torch.testing.assert_close(state.ponder_time, expected_n + expected_r, rtol=0, atol=1e-6)
    assert state.halted.all()
    t2t_state, t2t_weights = run_rule(probabilities)
    at_max = ~t2t_state.halted
    assert at_max.any() and (~at_max).any(), "the test needs positions that halt before and at the last step"
    torch.testing.assert_close(weights[:, ~at_max], t2t_weights[:, ~at_max], rtol=0, atol=0)
    assert (t2t_weights.sum(0)[at_max] < 1).all() and (t2t_state.remainders[at_max] == 0).all()
    assert (state.remainders[at_max] > 0).all()


def test_halted_positions_get_no_weight_and_padding_never_runs():
    probabilities = torch.tensor([[0.995, 0.5, 0.7], [0.5, 0.5, 0.7], [0.5, 0.5, 0.7]])[:, None, :]
    running = torch.tensor([[True, True, False]])
    state, weights = run_rule(probabilities, running)
    # position 0 halts at step 1 (remainder 1.0), position 1 at step 2, position 2 is padding
    torch.testing.assert_close(weights[:, 0], torch.tensor([[1.0, 0.5, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 0.0]]))
    assert state.n_updates.tolist() == [[1.0, 2.0, 0.0]]
    assert state.halted.all()


def test_halted_mask_equals_tensor2tensors_less_than_one():
    """tensor2tensor tells halted positions by ``halting_probability < 1.0``; the boolean mask is the same test
    because a halting position's sum ``h + (1 - h)`` rounds to exactly one in float32 (checked here over many h)."""
    h = torch.rand(200_000, generator=torch.Generator().manual_seed(0))
    assert bool(((h + (1 - h)) == 1.0).all())


@pytest.mark.parametrize("act_type", ["basic", "accumulated"])
def test_loop_equals_tensor2tensor(act_type):
    """The whole ``universal_transformer_act`` loop: timing signals added every step, the unweighted state fed on,
    the halting-weighted state out -- ours (the rule + `accumulate_state` in the loop the model runs) against the
    transcription, with a mixing transform so halted positions matter as keys."""
    torch.manual_seed(0)
    batch, length, width, max_steps = 2, 5, 8, 6
    x = torch.randn(batch, length, width)
    unit = HaltingUnit(width, bias_init=0.0, init_std=1.0)
    mix = torch.randn(length, length) / length
    signals = torch.randn(max_steps, width)

    def step_preprocess(state, step):
        return state + signals[step]

    def transform(state, step):
        return torch.tanh(state + torch.einsum("ts,bsd->btd", mix, state))  # every position reads every position

    with torch.no_grad():
        expected, expected_n, expected_r = t2t_act(x, step_preprocess, unit, transform, max_steps, THRESHOLD, act_type)
        halting = HaltingState.start(torch.ones(batch, length, dtype=torch.bool))
        state, output = x, torch.zeros_like(x)
        for step in range(max_steps):
            if not halting.running.any():
                break
            state = step_preprocess(state, step)
            halting, weights = halting_step(halting, unit(state), THRESHOLD)
            state = transform(state, step)
            output = accumulate_state(output, state, weights, act_type == "accumulated")
    assert len(set(expected_n.flatten().tolist())) > 1, "the test needs positions that halt at different steps"
    torch.testing.assert_close(output, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(halting.n_updates, expected_n)
    torch.testing.assert_close(halting.remainders, expected_r)


def test_halting_unit_starts_at_its_bias():
    unit = HaltingUnit(4, bias_init=1.0, init_std=0.0)
    torch.testing.assert_close(unit(torch.randn(2, 3, 4)), torch.full((2, 3), torch.sigmoid(torch.tensor(1.0)).item()))
