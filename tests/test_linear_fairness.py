import numpy as np
import pytest

import forgetkit as fk
from forgetkit import linear
from forgetkit.theory.fairness import amplification_bias, compare_fairness

from .conftest import make_run


def gd_reference(X, Y, depth, width, lr, steps, seed, init_scale):
    """Plain gradient descent with explicit forward and backward passes through the layers."""
    n, d = X.shape
    k = Y.shape[1]
    rng = np.random.default_rng(seed)
    dims = [d] + [width] * (depth - 1) + [k]
    Ws = [rng.normal(0, init_scale, (dims[i + 1], dims[i])) for i in range(depth)]
    outs = []
    for _ in range(steps + 1):
        acts = [X]
        for W in Ws:
            acts.append(acts[-1] @ W.T)
        outs.append(acts[-1].copy())
        delta = (acts[-1] - Y) / n  # dL/d(output) of ||out - Y||^2 / (2n)
        grads = []
        for j in reversed(range(depth)):
            grads.append(delta.T @ acts[j])
            delta = delta @ Ws[j]
        for j, g in zip(reversed(range(depth)), grads, strict=True):
            Ws[j] = Ws[j] - lr * g
    return np.stack(outs)


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_simulation_matches_plain_gd_step_by_step(depth):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 7))
    y = rng.integers(0, 3, 60)
    Y = np.eye(3)[y]
    ref = gd_reference(X, Y, depth, 5, 0.05, 40, 1, 0.3)
    run = linear.simulate_deep_linear(X, y, depth=depth, width=5, lr=0.05, steps=40,
                                      record_every=1, seed=1, init_scale=0.3)
    assert run.epochs.tolist() == list(range(41))
    np.testing.assert_allclose(np.asarray(run.outputs), ref, rtol=1e-5, atol=1e-6)


def test_w_opt_is_the_least_squares_solution():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 12))
    y = rng.integers(0, 4, 200)
    w = linear.optimal_separator(X, y)
    Y = np.eye(4)[y]
    np.testing.assert_allclose(w, (np.linalg.pinv(X) @ Y).T, atol=1e-10)
    np.testing.assert_allclose(X.T @ X @ w.T, X.T @ Y, atol=1e-9)  # normal equations


def test_pca_and_the_projection_path():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 6)) * np.array([5, 4, 3, 2, 1, 0.5])
    y = rng.integers(0, 3, 300)
    vals, vecs = linear.pca(X)
    assert np.all(np.diff(vals) <= 0)
    np.testing.assert_allclose(vecs.T @ vecs, np.eye(6), atol=1e-12)
    path = linear.pca_path(X, y, X, y)
    assert path.epochs.tolist() == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(np.asarray(path.outputs[-1]),
                               X @ linear.optimal_separator(X, y).T, rtol=1e-5, atol=1e-5)
    u1 = vecs[:, :1]
    np.testing.assert_allclose(np.asarray(path.outputs[0]),
                               X @ u1 @ u1.T @ linear.optimal_separator(X, y).T,
                               rtol=1e-5, atol=1e-5)


def test_claim1_every_forgotten_point_has_a_finite_forget_time():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 5)) * np.array([3, 2, 1.5, 1, 0.7])
    y = (X @ rng.normal(size=(5, 3))).argmax(1)
    flip = rng.random(400) < 0.25
    y[flip] = rng.integers(0, 3, flip.sum())  # noise: W_opt gets some points wrong
    run = linear.simulate_deep_linear(X, y, depth=3, width=8, lr=0.2, steps=20000,
                                      record_every=50, seed=0, init_scale=0.1)
    w_opt = linear.optimal_separator(X, y)
    np.testing.assert_allclose(np.array(run.meta["W"]), w_opt, atol=1e-10)  # converged
    final = np.argmax(np.asarray(run.outputs[-1]), 1)
    assert np.array_equal(final, np.argmax(X @ w_opt.T, 1))  # GD reached W_opt's decisions
    dyn = fk.sample_dynamics(run)
    forgotten = dyn[dyn.forgotten]
    assert len(forgotten) > 0
    assert forgotten.forget_epoch.notna().all()  # finite forget time for each
    assert (forgotten.forget_epoch <= run.epochs[-1]).all()


def test_forgotten_sets_and_overlap():
    labels = np.array([0, 0, 0, 0])
    out = np.zeros((3, 4, 2), dtype=np.float32)
    # sample 0 right at 1 only; 1 right at 0 only; 2 always right; 3 never right
    out[:, :, 1] = 1
    out[1, 0] = [1, 0]
    out[0, 1] = [1, 0]
    out[:, 2] = [1, 0]
    run = fk.Run(out, labels)
    assert linear.forgotten_after(run, 0).tolist() == [True, False, False, False]
    assert linear.forgotten_after(run, 2).tolist() == [False] * 4
    assert linear.overlap([True, True, False], [True, False, True]) == (0.5, 0.5)
    assert np.isnan(linear.overlap([False], [True])[0])


def test_overlap_table_on_the_real_run(real_run):
    table = linear.overlap_table(real_run, real_run, alpha=1.0, beta=0.0)
    assert (table.S_in_M == 1.0).all() and (table.k == table.deep_epoch).all()


def test_amplification_bias_by_hand():
    # class 0: 3 natural vs 1 transformed -> 3/4; class 1: 1 vs 3 -> 3/4; class 2: none -> 1/2
    nat = np.array([0, 0, 0, 1])
    tr = np.array([0, 1, 1, 1])
    assert amplification_bias(nat, tr, 3) == pytest.approx((0.75 + 0.75 + 0.5) / 3 - 0.5)
    assert amplification_bias(nat, nat, 3) == 0.0
    with pytest.raises(ValueError, match=r"pred_transformed must lie in \[0, 3\)"):
        amplification_bias(nat, np.array([0, 5]), 3)


def test_compare_fairness():
    nat = make_run(seed=0)
    tr = fk.Run(np.asarray(nat.outputs) + 0.5 * np.random.default_rng(1).normal(
        size=nat.shape).astype(np.float32), nat.labels)
    table = compare_fairness(nat, tr, seeds=(0, 1))
    assert list(table.index) == ["single", "kf"]
    assert set(table.columns) == {"accuracy_natural", "accuracy_transformed", "bias"}
    assert ((table.bias >= 0) & (table.bias <= 0.5)).all()
    with pytest.raises(ValueError, match="same samples"):
        compare_fairness(nat, make_run(seed=5))
