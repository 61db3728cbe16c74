import itertools
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posdebias import Instance, cyclic_rotations, symmetrized_calibration_set
from posdebias.core.instance import random_orders
from posdebias.errors import InputError


def make(n=4, target=1, ident="x"):
    return Instance(
        stem="a red circle", images=[f"img{k}.png" for k in range(n)], target=target, id=ident
    )


def test_permutation_tracks_target_and_identity():
    instance = make()
    view = instance.permuted([2, 0, 3, 1])
    assert view.images == ("img2.png", "img0.png", "img3.png", "img1.png")
    assert view.target == 3  # base target 1 now sits at position 3
    assert view.candidate_id_at(view.target) == "img1.png"


def test_rotation_convention():
    view = make().rotated(1)
    assert view.images[0] == "img1.png" and view.target == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target": 4}, "out of range"),
        ({"images": ["a.png", "a.png", "b.png"], "target": 0}, "duplicate"),
        ({"stem": "   "}, "empty"),
        ({"images": ["a.png"], "target": 0}, "at least 2"),
    ],
)
def test_invalid_instances(kwargs, message):
    fields = {"stem": "q", "images": ["a.png", "b.png", "c.png"], "target": 0, "id": "i"}
    fields.update(kwargs)
    with pytest.raises(InputError, match=message):
        Instance(**fields)


def test_symmetrized_set_puts_truth_everywhere_m_times():
    instances = [make(target=t, ident=f"i{t}") for t in (0, 0, 3)]
    symmetrized = symmetrized_calibration_set(instances)
    assert len(symmetrized) == 12
    assert np.bincount([view.target for view in symmetrized]).tolist() == [3, 3, 3, 3]
    for index, base in enumerate(instances):
        group = symmetrized[index * 4 : (index + 1) * 4]
        assert [r.images for r in group] == [r.images for r in cyclic_rotations(base)]
        # the matching image is the same one in every rotation
        assert {r.candidate_id_at(r.target) for r in group} == {base.candidate_id_at(base.target)}


def test_random_orders_are_seeded_permutations():
    first = random_orders(5, 3, seed=[7, 1])
    again = random_orders(5, 3, seed=[7, 1])
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert all(sorted(order.tolist()) == [0, 1, 2, 3, 4] for order in first)


@pytest.mark.parametrize(("n", "count"), [(2, 2), (3, 6), (4, 5), (4, 24), (5, 40), (12, 16)])
@pytest.mark.parametrize("identity_first", [False, True])
def test_random_orders_are_distinct(n, count, identity_first):
    orders = random_orders(n, count, seed=[3, n], identity_first=identity_first)
    assert len(orders) == count
    assert len({tuple(order.tolist()) for order in orders}) == count
    assert all(sorted(order.tolist()) == list(range(n)) for order in orders)
    if identity_first:
        assert orders[0].tolist() == list(range(n))


def test_distinct_orders_keep_the_with_replacement_draws_up_to_the_first_repeat():
    """Drawing without replacement only skips repeats: every earlier order is unchanged."""
    rng = np.random.default_rng([0, 9])
    raw = [tuple(rng.permutation(3).tolist()) for _ in range(6)]
    first_repeat = next(i for i in range(len(raw)) if raw[i] in raw[:i])
    distinct = [tuple(o.tolist()) for o in random_orders(3, 6, seed=[0, 9])]
    assert distinct[:first_repeat] == raw[:first_repeat]
    assert sorted(distinct) == sorted(itertools.permutations(range(3)))


@pytest.mark.parametrize(("n", "count"), [(2, 3), (3, 7), (4, 25)])
def test_more_orders_than_n_factorial_is_a_clear_error(n, count):
    with pytest.raises(InputError, match=rf"{count} distinct candidate orders .* only"):
        random_orders(n, count, seed=0)


@given(shifts=st.lists(st.integers(0, 5), min_size=3, max_size=3), n=st.integers(2, 6))
def test_rotating_the_base_instances_does_not_change_the_fitted_state(shifts, n):
    """The symmetrised set of a rotated instance is the same N views, so every fitted
    calibration state is unchanged (up to float tolerance) by rotating the base instances."""
    from posdebias import get_calibrator
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.evaluation.runner import fit_calibrators

    adapter = SyntheticAdapter(num_layers=3)
    base = synthetic_instances(3, n, seed=5)
    rotated = [instance.rotated(shift % n) for instance, shift in zip(base, shifts, strict=True)]
    calibrators = {name: get_calibrator(name) for name in ("pride", "attention_guided")}
    first = fit_calibrators(adapter, calibrators, base)
    second = fit_calibrators(adapter, calibrators, rotated)
    for name in calibrators:
        a, b = first[name], second[name]
        for field in ("bias_matrix", "attention_prior", "logit_prior", "gamma"):
            if getattr(a, field) is not None:
                assert np.allclose(getattr(a, field), getattr(b, field), atol=1e-12), field


@pytest.mark.parametrize(
    ("fields", "where", "code"),
    [
        ({"stem": "Which?\ud800"}, "the stem", "U+D800"),
        ({"texts": ("a", "b\udfff")}, "candidate 2's text", "U+DFFF"),
    ],
)
def test_a_lone_surrogate_is_refused_when_the_instance_is_made(fields, where, code):
    # it reached the tokenizer, which raised a TypeError mid-run
    values = {"stem": "Which?", "texts": ("a", "b"), "id": "i", "task": "multiple_choice"}
    message = re.escape(f"instance 'i': {where} holds {code}, half of a surrogate pair")
    with pytest.raises(InputError, match=message):
        Instance(**{**values, **fields})
    assert Instance(**{**values, "stem": "Which? é ✓ 😀"}).stem.endswith("😀")
