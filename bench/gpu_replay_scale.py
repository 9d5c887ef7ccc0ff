"""Replay at the scale people replay: one GPU against its floor and the loop users write,
then 2 and 4 GPUs, one process per GPU (torchrun) and threads in one process.

Workloads (checkpoints written on this machine's disk first, then read from the page cache
by every measurement alike):

- ``resnet``: ``--checkpoints`` (60) ResNet-18 state dicts (``--every`` training steps apart) over
  ``--images`` (100,000) random 28 x 28 images, batches of ``--batch-size`` (1024),
  float16 logits stored (the replay's default);
- ``gpt2``: ``--checkpoints`` (16) GPT-2 124M checkpoints (``GPT2Config()``, random weights moved a
  little between checkpoints), each saved as a state dict (``.pt``) and as a
  ``save_pretrained`` folder; ``--seqs`` (512) random sequences of ``--seq-len`` (1024)
  tokens with an attention mask of ones and no labels (targets: the next tokens), batches
  of ``--batch-size`` (8) sequences, top-``--top-k`` (8) token run.

Measured in one process, once each (``--phases`` picks them):

- ``read``: ``torch.load(weights_only=True)`` of every state dict (gpt2: and
  safetensors' ``load_file`` of every folder, ``read_hf``);
- ``forward``: one forward pass per checkpoint over the data already on the GPU, one model
  whose weights never change (gpt2: with the top-k, log-sum-exp and target logit of every
  kept token on the device); the floor is max(read, forward);
- ``evaluate`` (gpt2): the replay's token evaluation alone (``TokenRecorder._evaluate``
  on the placed batches) once per checkpoint, weights unchanged;
- ``replay``: ``torch.replay(model, files, data, run, device="cuda:0")``, all of it;
  ``replay_hf`` (gpt2): ``huggingface.replay(folder, data, run, device="cuda:0")``;
- ``naive``: the loop a user writes (a model built per checkpoint: resnet
  ``load_state_dict(torch.load(...))`` and a DataLoader over host images; gpt2
  ``from_pretrained(folder)``; outputs copied to the host batch by batch), over the first
  ``--naive-n`` checkpoints, given per checkpoint and scaled to ``--checkpoints``;
- ``torchrun_W``: ``torchrun --standalone --nproc-per-node W`` running this file's
  ``--worker``: each rank builds its model on its GPU (off the clock, with one forward
  pass), then ``replay`` from one barrier to the next (the replay's time; ``wall`` adds
  the processes' start); ``torchrun_hf_W`` the same with ``huggingface.replay``;
- ``threads_W``: ``replay(..., devices=[0, ..., W-1])`` in this process.

Every run written is compared with the one-GPU replay's file, bit for bit. Writes
``<out>/replay_scale_<workload>.json`` after every phase.

    python bench/gpu_replay_scale.py --workload gpt2 --out OUT
    python bench/gpu_replay_scale.py --workload resnet --out OUT
    python bench/gpu_replay_scale.py --workload gpt2 --tiny --device cpu --out OUT   # CPU check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from bench.gpu_replay import timed  # noqa: E402
from forgetkit.exporters.torch import replay  # noqa: E402


# ------------------------------------------------------------------ workloads
def gpt2_config(args):
    from transformers import GPT2Config

    if args.tiny:
        return GPT2Config(vocab_size=1000, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    return GPT2Config()


def gpt2_model(args, dev):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(gpt2_config(args)).to(dev).eval()


def resnet_model(args, dev):
    from train_fmnist import ResNet18

    torch.manual_seed(0)
    return ResNet18(width=args.width).to(dev).eval()


def model_of(args, dev):
    return gpt2_model(args, dev) if args.workload == "gpt2" else resnet_model(args, dev)


def data_of(args):
    """gpt2: {"input_ids", "attention_mask"} (seqs, seq_len); resnet: (images, labels)."""
    g = torch.Generator().manual_seed(1)
    if args.workload == "gpt2":
        vocab = gpt2_config(args).vocab_size
        ids = torch.randint(0, vocab, (args.seqs, args.seq_len), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    x = torch.randn(args.images, 1, 28, 28, generator=g)
    return x, torch.randint(0, 10, (args.images,), generator=g)


def make_checkpoints(args, folder, dev):
    """The checkpoint files (gpt2: and folders) of the workload, in ``folder``."""
    files, dirs = [], []
    model = model_of(args, dev)
    if args.workload == "gpt2":
        g = torch.Generator(device=dev).manual_seed(2)
        for e in range(args.n):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=g, device=dev), alpha=1e-3)
            files.append(folder / f"gpt2_{e}.pt")
            torch.save(model.state_dict(), files[-1])
            dirs.append(folder / "hf" / f"checkpoint-{e}")
            model.save_pretrained(dirs[-1])
        return [str(f) for f in files], [str(d) for d in dirs]
    x, y = data_of(args)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    step = 0
    while len(files) < args.n:
        idx = torch.randint(0, len(x), (128,), generator=g)
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(x[idx].to(dev)), y[idx].to(dev)).backward()
        opt.step()
        step += 1
        if step % args.every == 0:
            files.append(folder / f"resnet_{len(files)}.pt")
            torch.save(model.state_dict(), files[-1])
    return [str(f) for f in files], []


def replay_options(args):
    if args.workload == "gpt2":
        return dict(top_k=args.top_k, batch_size=args.batch_size)
    return dict(batch_size=args.batch_size)


# ------------------------------------------------------------------ measurements
def read_all(files):
    for f in files:
        torch.load(f, map_location="cpu", weights_only=True)


def read_hf(dirs):
    from safetensors.torch import load_file

    for d in dirs:
        load_file(str(Path(d) / "model.safetensors"))


def lm_rows(logits, ids, k):
    """The floor's per-token work on the device: top-k, log-sum-exp, target logit."""
    z = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    values, top = torch.topk(z, k, dim=-1)
    lse = torch.logsumexp(z, dim=-1)
    target = z.gather(1, ids[:, 1:].reshape(-1, 1))
    return values, top, lse, target


def forward_all(args, model, data, n, dev):
    """``n`` forward passes over the data on the device (gpt2: with the per-token work)."""
    with torch.inference_mode():
        if args.workload == "gpt2":
            ids, mask = data["input_ids"].to(dev), data["attention_mask"].to(dev)
            for _ in range(n):
                for i in range(0, len(ids), args.batch_size):
                    out = model(input_ids=ids[i:i + args.batch_size],
                                attention_mask=mask[i:i + args.batch_size]).logits
                    lm_rows(out, ids[i:i + args.batch_size], args.top_k)
        else:
            xs = data[0].to(dev)
            for _ in range(n):
                for i in range(0, len(xs), args.batch_size):
                    model(xs[i:i + args.batch_size])


def evaluate_all(args, model, data, out, dev):
    """gpt2: the replay's token evaluation alone, ``n`` times, one model whose weights
    never change (no reading, loading or writing)."""
    from forgetkit.exporters._torch_devices import batches_of, place, token_batches
    from forgetkit.exporters.torch import TokenRecorder

    batches = batches_of(token_batches(data, args.batch_size, "input_ids"),
                         batch_size=args.batch_size, label_key=None)
    recorder = TokenRecorder(out / "unused.npy", batches, top_k=args.top_k)
    recorder.same_batches = True
    placed = place(batches, dev)
    for _ in range(args.n):
        recorder._evaluate(model, 0, ((None, b) for b in placed), catch=False, sync=False)


def naive(args, files, dirs, data, dev):
    """The loop users write, over the first ``--naive-n`` checkpoints."""
    n = min(args.naive_n, len(files))
    with torch.inference_mode():
        if args.workload == "gpt2":
            from transformers import GPT2LMHeadModel

            ids, mask = data["input_ids"], data["attention_mask"]
            for d in dirs[:n]:
                model = GPT2LMHeadModel.from_pretrained(d).to(dev).eval()
                for i in range(0, len(ids), args.batch_size):
                    b = ids[i:i + args.batch_size].to(dev)
                    out = model(input_ids=b, attention_mask=mask[i:i + args.batch_size]
                                .to(dev)).logits
                    [t.cpu() for t in lm_rows(out, b, args.top_k)]
        else:
            x, y = data
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                                 batch_size=args.batch_size)
            for f in files[:n]:
                model = model_of(args, dev)
                model.load_state_dict(torch.load(f, map_location=dev))
                for xb, _ in loader:
                    model(xb.to(dev)).cpu()
    return n


def same_file(a, b):
    return Path(a).read_bytes() == Path(b).read_bytes()


def worker(args):
    """One torchrun rank: its model on its GPU (off the clock), then the replay between two
    barriers; rank 0 writes the replay's time."""
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and args.device != "cpu"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    job = json.loads(Path(args.worker).read_text())
    data = data_of(args)
    if job["hf"]:
        from forgetkit.exporters.huggingface import replay as hf_replay

        forward_all(args, gpt2_model(args, dev), {k: v[:args.batch_size]
                                                  for k, v in data.items()}, 1, dev)
        run = lambda: hf_replay(job["dirs"], data, job["run"], device=dev,  # noqa: E731
                                progress=False, mode="w", **replay_options(args))
    else:
        model = model_of(args, dev)
        first = {k: v[:args.batch_size] for k, v in data.items()} \
            if args.workload == "gpt2" else (data[0][:args.batch_size],)
        forward_all(args, model, first, 1, dev)
        run = lambda: replay(model, job["files"], data, job["run"], device=dev,  # noqa: E731
                             progress=False, mode="w", **replay_options(args))
    dist.barrier()
    t = time.perf_counter()
    run()
    dist.barrier()
    t = time.perf_counter() - t
    if rank == 0:
        Path(job["time"]).write_text(json.dumps({"replay_s": t}))
    dist.destroy_process_group()


def torchrun(args, world, files, dirs, run_path, out, hf=False):
    job = out / f"job_{world}_{int(hf)}.json"
    timing = out / f"time_{world}_{int(hf)}.json"
    job.write_text(json.dumps({"files": files, "dirs": dirs, "run": str(run_path),
                               "time": str(timing), "hf": hf}))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world}", __file__, "--worker", str(job)]
    argv += [a for a in sys.argv[1:] if a != "--worker"]
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun with {world} ranks failed:\n{proc.stderr[-3000:]}")
    return json.loads(timing.read_text())["replay_s"], wall


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=("resnet", "gpt2"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoints", dest="n", type=int, default=None,
                   help="checkpoints (60 resnet, 16 gpt2)")
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--images", type=int, default=100_000)
    p.add_argument("--seqs", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=None, help="1024 resnet, 8 gpt2")
    p.add_argument("--naive-n", type=int, default=4)
    p.add_argument("--gpus", default="2,4", help="GPU counts beside one")
    p.add_argument("--hf-gpus", default=None, help="of those, for torchrun_hf (default all)")
    p.add_argument("--thread-gpus", default=None, help="of those, for threads (default all)")
    p.add_argument("--phases", default="read,forward,evaluate,replay,replay_hf,torchrun,"
                                       "torchrun_hf,threads,naive")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a tiny GPT-2 (a check on the CPU)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.n = args.n or (16 if args.workload == "gpt2" else 60)
    args.batch_size = args.batch_size or (8 if args.workload == "gpt2" else 1024)
    if args.worker:
        return worker(args)
    phases = set(args.phases.split(","))
    gpus = [int(g) for g in args.gpus.split(",") if g]
    hf_gpus = gpus if args.hf_gpus is None else [int(g) for g in args.hf_gpus.split(",")]
    thread_gpus = gpus if args.thread_gpus is None else \
        [int(g) for g in args.thread_gpus.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    n_gpus = torch.cuda.device_count() if cuda else 0
    data = data_of(args)
    folder = Path(tempfile.mkdtemp(prefix="replay-scale-", dir=os.environ.get("SCALE_TMP")))
    result = {"workload": args.workload, "device": torch.cuda.get_device_name(0) if cuda
              else "cpu", "n_gpus": n_gpus, "n_checkpoints": args.n,
              "batch_size": args.batch_size, "torch": torch.__version__, "times_s": {},
              "same_as_replay": {}}
    times = result["times_s"]
    report = out / f"replay_scale_{args.workload}.json"

    def save(name=None, value=None):
        if name is not None:
            times[name] = value
            print(f"{name}: {value:.2f} s", flush=True)
        report.write_text(json.dumps(result, indent=1))

    try:
        t, (files, dirs) = timed(lambda: make_checkpoints(args, folder, dev))
        result["make_checkpoints_s"] = t
        result["checkpoint_bytes"] = Path(files[0]).stat().st_size
        print(f"made {len(files)} checkpoints in {t:.1f} s "
              f"({result['checkpoint_bytes'] / 2**20:.1f} MiB each)", flush=True)
        gpt2 = args.workload == "gpt2"
        if gpt2:
            result.update(seqs=args.seqs, seq_len=args.seq_len, top_k=args.top_k,
                          tokens=args.seqs * (args.seq_len - 1))
        else:
            result.update(images=args.images, width=args.width)
        model = model_of(args, dev)
        first = {k: v[:args.batch_size] for k, v in data.items()} if gpt2 \
            else (data[0][:args.batch_size],)
        for d in range(max(n_gpus, 1)):  # each GPU's first use off the clock
            forward_all(args, model_of(args, torch.device("cuda", d)) if cuda else model,
                        first, 1, torch.device("cuda", d) if cuda else dev)
        if "read" in phases:
            save("read", timed(lambda: read_all(files))[0])
            if gpt2:
                save("read_hf", timed(lambda: read_hf(dirs))[0])
        if "forward" in phases:
            save("forward", timed(lambda: forward_all(args, model, data, args.n, dev))[0])
        if gpt2 and "evaluate" in phases:
            save("evaluate", timed(lambda: evaluate_all(args, model, data, out, dev))[0])
        if "naive" in phases:
            t, n = timed(lambda: naive(args, files, dirs, data, dev))
            result["naive_checkpoints"] = n
            save("naive", t / n * args.n)
        one = out / "replay_1.npy"
        if "replay" in phases:
            save("replay", timed(lambda: replay(model, files, data, one, device=dev,
                                                progress=False, mode="w",
                                                **replay_options(args)))[0])
        if gpt2 and "replay_hf" in phases:
            from forgetkit.exporters.huggingface import replay as hf_replay

            path = out / "replay_hf_1.npy"
            save("replay_hf", timed(lambda: hf_replay(str(folder / "hf"), data, path,
                                                      device=dev, progress=False, mode="w",
                                                      **replay_options(args)))[0])
            result["same_as_replay"]["replay_hf"] = same_file(path, one)
            save()
        for w in gpus:
            if cuda and w > n_gpus:
                continue
            if "torchrun" in phases:
                path = out / f"torchrun_{w}.npy"
                t, wall = torchrun(args, w, files, dirs, path, out)
                result["times_s"][f"torchrun_{w}_wall"] = wall
                result["same_as_replay"][f"torchrun_{w}"] = same_file(path, one)
                save(f"torchrun_{w}", t)
            if gpt2 and "torchrun_hf" in phases and w in hf_gpus:
                path = out / f"torchrun_hf_{w}.npy"
                t, wall = torchrun(args, w, files, dirs, path, out, hf=True)
                result["times_s"][f"torchrun_hf_{w}_wall"] = wall
                result["same_as_replay"][f"torchrun_hf_{w}"] = same_file(path, one)
                save(f"torchrun_hf_{w}", t)
            if "threads" in phases and w in thread_gpus:
                path = out / f"threads_{w}.npy"
                devices = list(range(w)) if cuda else ["cpu"] * w
                t = timed(lambda p=path, d=devices: replay(
                    model_of(args, dev), files, data, p, devices=d, progress=False, mode="w",
                    **replay_options(args)))[0]
                result["same_as_replay"][f"threads_{w}"] = same_file(path, one)
                save(f"threads_{w}", t)
        if "read" in times and "forward" in times:
            floor = max(times["read"], times["forward"])
            result["floor_s"] = floor
            for k in ("replay", "replay_hf", "naive"):
                if k in times:
                    result[f"{k}_over_floor"] = times[k] / floor
            base = times.get("replay")
            if base:
                result["speedup"] = {k: base / v for k, v in times.items()
                                     if k.startswith(("torchrun", "threads"))
                                     and not k.endswith("wall")}
            base = times.get("replay_hf")
            if base:
                result["speedup_hf"] = {k: base / v for k, v in times.items()
                                        if k.startswith("torchrun_hf") and not
                                        k.endswith("wall")}
        save()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({k: v for k, v in result.items() if k != "times_s"}, indent=1))


if __name__ == "__main__":
    main()
