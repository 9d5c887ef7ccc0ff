"""The PyTorch and JAX recorders, run for real on the CPU."""

import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import forgetkit as fk

from .conftest import import_real_part, kill_when_ready

torch = import_real_part("torch", "PyTorch (pip install forgetkit[torch])")


def test_import_forgetkit_imports_no_framework():
    code = "import sys, forgetkit; print('torch' in sys.modules, 'jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"]


def toy_data(n=300, d=8, c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    return x, y


def train_and_record(tmp_path, dtype, suffix=".npy", epochs=3):
    from forgetkit.exporters.torch import LogitRecorder

    torch.manual_seed(0)
    x, y = toy_data()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Dropout(0.5), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
    expected = []
    path = tmp_path / f"run{suffix}"
    with LogitRecorder(path, loader, dtype=dtype) as rec:
        for epoch in range(epochs):
            model.train()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc = rec.record(model, epoch)
            assert model.training  # mode restored
            model.eval()
            with torch.no_grad():
                out = model(x).to(getattr(torch, dtype)).numpy()
            expected.append(out)
            assert acc == pytest.approx(np.mean(out.argmax(1) == y.numpy()))
    return path, np.stack(expected), y.numpy()


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_torch_recorder_stores_the_model_outputs(tmp_path, dtype, suffix):
    path, expected, y = train_and_record(tmp_path, dtype, suffix)
    run = fk.load(path)
    assert run.outputs.dtype == np.dtype(dtype)
    assert np.array_equal(np.asarray(run.outputs), expected)  # value by value
    assert np.array_equal(run.labels, y) and run.epochs.tolist() == [0, 1, 2]


def test_torch_recorder_resumes_and_checks_shapes(tmp_path):
    from forgetkit.exporters.torch import LogitRecorder

    x, y = toy_data()
    model = torch.nn.Linear(8, 4)
    with LogitRecorder(tmp_path / "r.npy", (x, y), batch_size=50) as rec:
        rec.record(model, 0)
        rec.record(model, 1)
    with LogitRecorder(tmp_path / "r.npy", (x, y), batch_size=50) as rec:  # resumed training
        rec.record(model, 2)
    assert fk.load(tmp_path / "r.npy").epochs.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="n_classes=4; this writer has n_classes=5"):
        LogitRecorder(tmp_path / "r.npy", (x, y)).record(torch.nn.Linear(8, 5), 3)
    with pytest.raises(ValueError, match="n_samples=300; this writer has n_samples=100"):
        LogitRecorder(tmp_path / "r.npy", (x[:100], y[:100])).record(model, 3)


def test_torch_output_fn_and_model_outputs(tmp_path):
    from forgetkit.exporters.torch import LogitRecorder

    class Multi(torch.nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.lin, self.kind = torch.nn.Linear(8, 4), kind

        def forward(self, x):
            z = self.lin(x)
            return (z, z.sum()) if self.kind == "tuple" else {"logits": z, "aux": z * 2}

    x, y = toy_data()
    for kind in ("tuple", "dict"):
        model = Multi(kind).eval()
        rec = LogitRecorder(tmp_path / f"{kind}.npy", (x, y), dtype="float32")
        rec.record(model, 0)
        assert not model.training  # eval mode restored as eval
        with torch.no_grad():
            assert np.array_equal(np.asarray(fk.load(tmp_path / f"{kind}.npy").outputs[0]),
                                  model.lin(x).numpy())
    rec = LogitRecorder(tmp_path / "aux.npy", (x, y), dtype="float32",
                        output_fn=lambda out: out["aux"])
    rec.record(Multi("dict"), 0)

    class NoLogits(torch.nn.Module):
        def forward(self, x):
            return "not a tensor"

    with pytest.raises(TypeError, match="pass output_fn"):
        LogitRecorder(tmp_path / "bad.npy", (x, y)).record(NoLogits(), 0)


def test_torch_bad_loaders(tmp_path):
    from forgetkit.exporters.torch import LogitRecorder

    x, y = toy_data()

    class Growing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 6)

        def forward(self, x):
            return self.lin(x)[:, : 4 if len(x) == 100 else 6]

    with pytest.raises(ValueError, match=r"returned \[4, 6\] classes in different batches"):
        LogitRecorder(tmp_path / "c.npy", [(x[:100], y[:100]), (x[100:], y[100:])]).record(
            Growing(), 0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64,
                                         shuffle=True)
    rec = LogitRecorder(tmp_path / "s.npy", loader)
    rec.record(torch.nn.Linear(8, 4), 0)
    with pytest.raises(ValueError, match="same order every epoch"):
        rec.record(torch.nn.Linear(8, 4), 1)


def test_torch_nonfinite_logits_keep_earlier_epochs(tmp_path):
    from forgetkit.exporters.torch import LogitRecorder

    x, y = toy_data()
    model = torch.nn.Linear(8, 4)
    rec = LogitRecorder(tmp_path / "n.npy", (x, y))
    rec.record(model, 0)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="epoch 1 contain NaN or inf"):
        rec.record(model, 1)
    rec.close()
    assert fk.load(tmp_path / "n.npy").epochs.tolist() == [0]


KILLED = textwrap.dedent("""
    import sys, torch
    from forgetkit.exporters.torch import LogitRecorder
    x = torch.randn(4000, 32); y = torch.randint(0, 100, (4000,))
    model = torch.nn.Linear(32, 100)
    rec = LogitRecorder(sys.argv[1], (x, y), dtype="float32")
    epoch = 0
    while True:
        rec.record(model, epoch)
        epoch += 1
        if epoch == 2:
            print("ready", flush=True)
""")


def test_killed_training_keeps_recorded_epochs(tmp_path):
    path = tmp_path / "k.npy"
    kill_when_ready(KILLED, path)
    run = fk.load(path)
    assert run.n_epochs >= 2 and run.epochs.tolist() == list(range(run.n_epochs))


def test_lightning_callback_with_a_stub_module(tmp_path, monkeypatch):
    from forgetkit.exporters.torch import LogitRecorder

    stub = types.ModuleType("lightning.pytorch")
    stub.Callback = type("Callback", (), {})
    monkeypatch.setitem(sys.modules, "lightning", types.ModuleType("lightning"))
    monkeypatch.setitem(sys.modules, "lightning.pytorch", stub)
    x, y = toy_data()
    model = torch.nn.Linear(8, 4)
    cb = LogitRecorder(tmp_path / "l.parquet", (x, y)).lightning_callback()
    trainer = types.SimpleNamespace(current_epoch=0)
    for e in range(2):
        trainer.current_epoch = e
        cb.on_train_epoch_end(trainer, model)
    cb.on_fit_end(trainer, model)
    assert fk.load(tmp_path / "l.parquet").epochs.tolist() == [0, 1]


# -------------------------------------------------------------------------- JAX
def test_jax_recorder_stores_the_model_outputs(tmp_path):
    jax = import_real_part("jax", "JAX (pip install forgetkit[jax])")
    import jax.numpy as jnp

    from forgetkit.exporters.jax import LogitRecorder

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    y = rng.integers(0, 4, 300)
    batches = [(x[i:i + 64], y[i:i + 64]) for i in range(0, 300, 64)]

    def apply_fn(params, inputs):
        return jnp.tanh(inputs @ params["w1"]) @ params["w2"]

    def loss(params):
        logp = jax.nn.log_softmax(apply_fn(params, x))
        return -jnp.mean(logp[jnp.arange(300), y])

    params = {"w1": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
              "w2": jnp.asarray(rng.normal(size=(16, 4)), jnp.float32)}
    grad = jax.jit(jax.grad(loss))
    expected = []
    for dtype in ("float32", "float16"):
        path = tmp_path / f"j_{dtype}.npy"
        with LogitRecorder(path, lambda: iter(batches), apply_fn, dtype=dtype) as rec:
            p = params
            for epoch in range(3):
                p = jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grad(p))
                rec.record(p, epoch)
                direct = jax.jit(lambda q, b, dt=dtype: apply_fn(q, b).astype(dt))
                expected.append(np.concatenate([np.asarray(direct(p, b)) for b, _ in batches]))
        run = fk.load(path)
        assert run.outputs.dtype == np.dtype(dtype)
        assert np.array_equal(np.asarray(run.outputs), np.stack(expected[-3:]))
        assert np.array_equal(run.labels, y)
