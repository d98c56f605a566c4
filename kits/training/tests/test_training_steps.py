"""The generic training step: counted from optimizer steps, for one or several optimizers."""

from __future__ import annotations

import pytest
from ascend_patch_training._steps import StepCounter
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


class FakeOptimizer:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def run(counter: StepCounter, optimizer: FakeOptimizer, log: list[tuple[str, int]]) -> None:
    """One optimizer.step() as torch reports it: pre hook, the step, post hook."""
    counter.before_optimizer_step(optimizer)
    log.append((optimizer.name, counter.completed))
    counter.after_optimizer_step(optimizer)


def test_one_optimizer_one_step_per_optimizer_step() -> None:
    """With one optimizer, training step k ends right after its k-th step."""
    counter = StepCounter()
    ended: list[int] = []
    counter.on_step_end(ended.append)
    opt = FakeOptimizer("opt")
    for k in range(1, 6):
        counter.before_optimizer_step(opt)
        counter.after_optimizer_step(opt)
        assert ended == list(range(1, k + 1))


@settings(max_examples=60, deadline=None)
@given(
    optimizers=st.integers(min_value=1, max_value=4),
    iterations=st.integers(min_value=1, max_value=8),
    order_seed=st.randoms(use_true_random=False),
)
def test_several_optimizers_each_iteration_is_one_step(optimizers, iterations, order_seed) -> None:
    """N optimizers stepping once each per iteration (any fixed order): step k ends when all stepped k times (k >= 2)."""
    opts = [FakeOptimizer(f"opt{i}") for i in range(optimizers)]
    order_seed.shuffle(opts)
    counter = StepCounter()
    snapshots: dict[int, dict[str, int]] = {}
    counts = {o.name: 0 for o in opts}

    def ended(step: int) -> None:
        snapshots[step] = dict(counts)

    counter.on_step_end(ended)
    for _ in range(iterations):
        for opt in opts:
            counter.before_optimizer_step(opt)
            counts[opt.name] += 1
            counter.after_optimizer_step(opt)
    assert counter.completed == iterations
    assert sorted(snapshots) == list(range(1, iterations + 1))
    # Step 1 cannot know the other optimizers yet: it ends with the lead's first step.
    assert snapshots[1][opts[0].name] == 1
    for step in range(2, iterations + 1):
        assert snapshots[step] == {o.name: step for o in opts}


def test_a_brake_listener_stops_a_gan_loop_with_both_optimizers_at_n_steps() -> None:
    """Raising from the step-end listener (what the brake does) leaves D and G with N steps each."""
    counter = StepCounter()
    d, g = FakeOptimizer("D"), FakeOptimizer("G")
    steps = {"D": 0, "G": 0}

    def brake(step: int) -> None:
        if step == 4:
            raise SystemExit(0)

    counter.on_step_end(brake)
    with pytest.raises(SystemExit):
        for _ in range(10):
            for opt in (d, g):
                counter.before_optimizer_step(opt)
                steps[opt.name] += 1
                counter.after_optimizer_step(opt)
    assert steps == {"D": 4, "G": 4}


def test_a_companion_that_does_not_step_ends_the_step_before_the_lead_steps_again() -> None:
    """WGAN-style: the critic steps 3x per generator step; a step never waits past the lead's next step."""
    counter = StepCounter()
    ended: list[tuple[int, int]] = []
    critic, generator = FakeOptimizer("critic"), FakeOptimizer("generator")
    critic_steps = 0
    counter.on_step_end(lambda step: ended.append((step, critic_steps)))
    for _ in range(3):
        for _ in range(3):
            counter.before_optimizer_step(critic)
            critic_steps += 1
            counter.after_optimizer_step(critic)
        counter.before_optimizer_step(generator)
        counter.after_optimizer_step(generator)
    # Every critic step is a training step: the lead drives the count. After the
    # generator joined, step 4 waits for it and ends right before the critic's next step.
    assert ended == [(k, k) for k in range(1, 10)]
    assert critic_steps == 9


def test_a_new_optimizer_that_keeps_stepping_becomes_the_lead() -> None:
    """A second training phase with a new optimizer (the old one still alive) is counted."""
    counter = StepCounter()
    first, second = FakeOptimizer("first"), FakeOptimizer("second")
    for _ in range(3):
        counter.before_optimizer_step(first)
        counter.after_optimizer_step(first)
    assert counter.completed == 3
    for _ in range(5):
        counter.before_optimizer_step(second)
        counter.after_optimizer_step(second)
    # Its first step is taken for a companion of the old lead; from its second on it leads.
    assert counter.completed == 3 + 4


def test_skipped_steps_count_like_steps() -> None:
    """A step GradScaler skips is reported as a post-step without a pre-step, and counts."""
    counter = StepCounter()
    opt = FakeOptimizer("opt")
    counter.after_optimizer_step(opt)  # skipped: no pre hook ran
    counter.before_optimizer_step(opt)
    counter.after_optimizer_step(opt)
    assert counter.completed == 2
    assert counter.optimizer_steps[id(opt)] == 2
