"""Speed of `forgetkit.exporters.torch.replay` against its floor and the loop users write.

Makes ``--n`` ResNet-18 checkpoints (state dicts saved every ``--every`` steps of a short
training on the test images themselves: only their weights matter here), then measures in
the same process, each ``--reps`` times (the best is reported):

- ``read``: reading the checkpoint files alone (``torch.load(weights_only=True)`` of each);
- ``forward``: one forward pass per checkpoint over the 10,000 Fashion-MNIST test images
  already on the GPU (one model, weights unchanged, batches of ``--batch-size``);
- ``replay_1gpu``: ``replay(model, files, (images, labels), run.npy, device="cuda:0")``, all
  of it (epoch numbers, reading, hashing, loading, evaluating, writing the run);
- ``naive``: the loop a user writes today: per checkpoint a new model, ``torch.load``,
  ``load_state_dict`` and a DataLoader pass over the CPU images, outputs gathered on the
  host (run once);
- ``replay_2gpu``: the replay on ``devices=[0, 1]`` (when two GPUs are there);
- ``read_hash``: reading, checking and hashing the files as the replay's reader does, one
  after another, and both replays with ``durable=False`` (no fsync per stored epoch);
- ``forward_graph``: the forward passes of ``forward`` replayed as one captured CUDA graph
  (what the replay does on a GPU), and the replay with ``cuda_graph=False`` (once).

The floor is max(read, forward) (reading overlaps computing); goals: replay_1gpu <= 1.1x
the floor, replay_2gpu >= 1.8x faster than replay_1gpu. The checkpoint files were just
written, so reading them comes from the page cache for every measurement alike.
Precision: float32 (the model's), cuDNN's defaults. Writes ``<out>/gpu_replay.json``.

    python bench/gpu_replay.py --data DIR --out OUT          # GPU: 60 checkpoints
    python bench/gpu_replay.py --device cpu --n 3 --test-subset 256 --width 8 --out OUT
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from train_fmnist import ResNet18  # noqa: E402

from forgetkit.datasets import load_fashion_mnist  # noqa: E402
from forgetkit.exporters.torch import replay  # noqa: E402


def sync():
    if torch.cuda.is_available():
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)


def timed(fn):
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t, out


def test_images(args):
    """The Fashion-MNIST test images (normalised, (n, 1, 28, 28) float32) and labels."""
    images, labels = load_fashion_mnist("test", root=args.data)
    if args.test_subset:
        images, labels = images[:args.test_subset], labels[:args.test_subset]
    x = (torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 255.0 - 0.2860) / 0.3530
    return x, torch.as_tensor(labels)


def make_checkpoints(args, x, y, dev, folder):
    torch.manual_seed(0)
    model = ResNet18(width=args.width).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    xs, ys = x.to(dev), y.to(dev)
    files, step = [], 0
    gen = torch.Generator().manual_seed(0)
    while len(files) < args.n:
        idx = torch.randint(0, len(xs), (128,), generator=gen).to(dev)
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(xs[idx]), ys[idx]).backward()
        opt.step()
        step += 1
        if step % args.every == 0:
            f = folder / f"model_{len(files)}.pt"
            torch.save(model.state_dict(), f)
            files.append(str(f))
    sync()
    return files


def first_use_off_the_clock(width, x, devices):
    """One forward pass of a fresh ResNet-18 of ``width`` on images ``x`` on each of
    ``devices``: a GPU's first use (its context, cuDNN) is paid here, before the timings."""
    for d in devices:
        with torch.inference_mode():
            ResNet18(width=width).to(d).eval()(x.to(d))


def read_all(files):
    for f in files:
        torch.load(f, map_location="cpu", weights_only=True)


def read_and_hash(files):
    """What the replay's reader does before the copy to the GPU, one file after another."""
    from forgetkit.exporters._checkpoints import hash_pool
    from forgetkit.exporters._torch_replay import Device

    class Reader(Device):
        def __init__(self, keys, pool):
            self.keys, self.pool, self.trust_pickle = keys, pool, False
            self.targets = [_Shape(s) for s in shapes]

    class _Shape:
        def __init__(self, shape):
            self.shape = shape

    state = torch.load(files[0], map_location="cpu", weights_only=True)
    keys, shapes = list(state), [t.shape for t in state.values()]
    with hash_pool() as pool:
        reader = Reader(keys, pool)
        for f in files:
            reader.digest(type("C", (), {"file": f})())


def forward_all(model, xs, n, batch_size):
    model.eval()
    with torch.inference_mode():
        for _ in range(n):
            for i in range(0, len(xs), batch_size):
                model(xs[i:i + batch_size])


def graph_forward(model, xs, batch_size):
    """A callable replaying one forward pass over ``xs`` captured as a CUDA graph."""
    model.eval()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for i in range(0, len(xs), batch_size):
            model(xs[i:i + batch_size])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        for i in range(0, len(xs), batch_size):
            model(xs[i:i + batch_size])
    return graph.replay


def naive(files, x, y, args, dev):
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=args.batch_size)
    outs = []
    for f in files:
        model = ResNet18(width=args.width).to(dev)
        model.load_state_dict(torch.load(f, map_location=dev))
        model.eval()
        rows = []
        with torch.no_grad():
            for xb, _ in loader:
                rows.append(model(xb.to(dev)).cpu())
        outs.append(torch.cat(rows).numpy())
    return np.stack(outs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder of the Fashion-MNIST IDX files")
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=60, help="checkpoints")
    p.add_argument("--every", type=int, default=3, help="training steps between checkpoints")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--test-subset", type=int, default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--skip-eager", action="store_true",
                   help="leave out the replay without CUDA graph and the graph forward")
    p.add_argument("--skip-nodurable", action="store_true",
                   help="leave out the replays with durable=False")
    args = p.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    x, y = test_images(args)
    folder = Path(tempfile.mkdtemp(prefix="replay-ckpts-"))
    result = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
              "n_gpus": torch.cuda.device_count(), "n_checkpoints": args.n,
              "n_images": len(y), "batch_size": args.batch_size, "width": args.width,
              "torch": torch.__version__}
    try:
        t, files = timed(lambda: make_checkpoints(args, x, y, dev, folder))
        result["make_checkpoints_s"] = t
        result["checkpoint_bytes"] = Path(files[0]).stat().st_size
        print(f"made {len(files)} checkpoints in {t:.1f} s "
              f"({result['checkpoint_bytes'] / 2**20:.1f} MiB each)", flush=True)
        model = ResNet18(width=args.width).to(dev)
        xs = x.to(dev)
        runs = {}
        two = dev.type == "cuda" and torch.cuda.device_count() >= 2
        forward_all(model, xs, 1, args.batch_size)  # warm-up: cuDNN, allocator
        times = {k: [] for k in ("read", "read_hash", "forward", "forward_graph",
                                 "replay_1gpu", "replay_1gpu_nodurable", "replay_2gpu",
                                 "replay_2gpu_nodurable")}
        replay_graph = graph_forward(model, xs, args.batch_size) \
            if dev.type == "cuda" and not args.skip_eager else None
        # the models replay receives are built once, off the clock, both on the device:
        # building one is the caller's work, not the replay's (each replay loads every
        # checkpoint into it); the second GPU's first use (its context, cuDNN) is off the
        # clock too, as the first's is (the forward passes above): the 2-GPU timing holds
        # nothing the 1-GPU timing does not, but the replay's own second model copy
        m1, m2 = ResNet18(width=args.width).to(dev), ResNet18(width=args.width).to(dev)
        if two:
            first_use_off_the_clock(args.width, xs[:args.batch_size], ["cuda:1"])
            sync()
        for rep in range(args.reps):
            times["read"].append(timed(lambda: read_all(files))[0])
            times["read_hash"].append(timed(lambda: read_and_hash(files))[0])
            times["forward"].append(
                timed(lambda: forward_all(model, xs, len(files), args.batch_size))[0])
            if replay_graph is not None:
                times["forward_graph"].append(
                    timed(lambda: [replay_graph() for _ in files])[0])
            t, runs["1"] = timed(lambda: replay(
                m1, files, (x, y), out / "replay1.npy",
                device=dev, batch_size=args.batch_size, mode="w", progress=False))
            times["replay_1gpu"].append(t)
            if not args.skip_nodurable:
                times["replay_1gpu_nodurable"].append(timed(lambda: replay(
                    m1, files, (x, y), out / "replay1n.npy",
                    device=dev, batch_size=args.batch_size, mode="w", progress=False,
                    durable=False))[0])
            if two:
                t, runs["2"] = timed(lambda: replay(
                    m2, files, (x, y), out / "replay2.npy",
                    devices=[0, 1], batch_size=args.batch_size, mode="w", progress=False))
                times["replay_2gpu"].append(t)
                if not args.skip_nodurable:
                    times["replay_2gpu_nodurable"].append(timed(lambda: replay(
                        m2, files, (x, y), out / "replay2n.npy",
                        devices=[0, 1], batch_size=args.batch_size, mode="w",
                        progress=False, durable=False))[0])
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()
                                            if v), flush=True)
            (out / "gpu_replay.json").write_text(json.dumps(dict(result, times_s=times)))
        best = {k: min(v) for k, v in times.items() if v}
        result["times_s"] = times
        result["best_s"] = best
        floor = max(best["read"], best["forward"])
        result["floor_s"] = floor
        result["replay_1gpu_over_floor"] = best["replay_1gpu"] / floor
        result["replay_1gpu_over_read"] = best["replay_1gpu"] / best["read"]
        if dev.type == "cuda" and not args.skip_eager:  # without the CUDA graph, once
            t, eager = timed(lambda: replay(
                ResNet18(width=args.width).to(dev), files, (x, y), out / "replay_eager.npy",
                device=dev, batch_size=args.batch_size, mode="w", progress=False,
                cuda_graph=False))
            result["replay_1gpu_eager_s"] = t
            result["graph_run_equals_eager_run"] = bool(np.array_equal(
                np.asarray(eager.outputs), np.asarray(runs["1"].outputs)))
            result["graph_vs_eager_max_abs_diff"] = float(np.max(np.abs(
                np.asarray(eager.outputs, np.float32) - np.asarray(runs["1"].outputs,
                                                                  np.float32))))
        if not args.skip_naive:
            t, outs = timed(lambda: naive(files, x, y, args, dev))
            result["naive_s"] = t
            result["naive_over_replay_1gpu"] = t / best["replay_1gpu"]
            result["naive_over_read_plus_forward"] = t / (best["read"] + best["forward"])
            stored = np.asarray(runs["1"].outputs, dtype=np.float32)
            result["replay_vs_naive_max_abs_diff"] = float(
                np.max(np.abs(stored - outs.astype(np.float16).astype(np.float32))))
        if two:
            result["speedup_2gpu"] = best["replay_1gpu"] / best["replay_2gpu"]
            if not args.skip_nodurable:
                result["speedup_2gpu_nodurable"] = \
                    best["replay_1gpu_nodurable"] / best["replay_2gpu_nodurable"]
            result["two_gpu_run_equals_one_gpu_run"] = bool(np.array_equal(
                np.asarray(runs["1"].outputs), np.asarray(runs["2"].outputs)))
        one = runs["1"]
        result["run_shape"] = list(one.shape)
        result["final_accuracy"] = float(np.mean(
            np.asarray(one.outputs[-1]).argmax(1) == one.labels))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    (out / "gpu_replay.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "times_s"}, indent=1))


if __name__ == "__main__":
    main()
