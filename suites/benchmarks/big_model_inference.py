"""Big-model inference, accel against Hugging Face Accelerate, on one generated checkpoint.

    python suites/benchmarks/big_model_inference.py [--size-mb 1024] [--rounds 3] [--workdir DIR]

Generates (once, reused afterwards) a safetensors checkpoint of a stack of transformer-like blocks
(attention projections, MLP, layer norms), sharded with a ``model.safetensors.index.json``, then runs,
interleaved round by round (the library order alternates between rounds, so drift on a shared machine
hits both alike), every measurement in a fresh Python process:

* **load**: ``load_checkpoint_and_dispatch(model, ckpt, device_map="auto", max_memory={"cpu": ~half})``
  on an ``init_empty_weights`` model: wall time of that call; half the blocks end up on disk.
* **forward**: the same dispatched model (half of the blocks on disk), forward passes per second over a
  fixed batch (default 1 sequence of 16 tokens: the decode-like regime of big-model inference, where the
  cost of bringing offloaded weights in dominates over the matmuls; ``--batch``/``--seq`` change it),
  after one warm-up pass; and the process peak RSS (VmHWM) over load and forwards. The
  peak is taken after the forwards, not right after loading: weights read lazily (memory-mapped) only
  count in RSS once touched, so a peak taken after loading would flatter a lazy loader.

It prints medians per library and the three ratios: load time accel/Accelerate (target <= 1.0), peak
RSS accel/Accelerate (target <= 1.0) and forward throughput accel/Accelerate (target >= 1.0). Each
child uses one intra-op thread so the two libraries compete for the same share of the CPU. The
checkpoint is read once before the rounds so both start from a warm page cache. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HIDDEN = 1024


def _block_bytes(hidden: int) -> int:
    # qkv (3h^2 + 3h) + out (h^2 + h) + up (4h^2 + 4h) + down (4h^2 + h) + 2 layer norms (4h), fp32
    return 4 * (12 * hidden * hidden + 13 * hidden)


def build_model(num_blocks: int, hidden: int = HIDDEN):
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.out = nn.Linear(hidden, hidden)
            self.norm2 = nn.LayerNorm(hidden)
            self.up = nn.Linear(hidden, 4 * hidden)
            self.down = nn.Linear(4 * hidden, hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
            attn = torch.softmax(q @ k.transpose(-1, -2) / hidden**0.5, dim=-1) @ v
            x = x + self.out(attn)
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(num_blocks))
            self.norm = nn.LayerNorm(hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return self.norm(x)

    return Stack()


def generate(folder: str, num_blocks: int, shard_blocks: int) -> None:
    """Write the sharded safetensors checkpoint (skipped when its index already exists)."""
    index_path = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        return
    import torch
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    model = build_model(num_blocks)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    weight_map: dict[str, str] = {}
    shards: dict[str, dict] = {}
    for key, tensor in state.items():
        block = int(key.split(".")[1]) if key.startswith("blocks.") else num_blocks - 1
        name = f"model-{block // shard_blocks + 1:05d}.safetensors"
        shards.setdefault(name, {})[key] = tensor
        weight_map[key] = name
    for name, tensors in shards.items():
        save_file(tensors, os.path.join(folder, name), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in state.values())
    with open(index_path + ".tmp", "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh)
    os.replace(index_path + ".tmp", index_path)


def _peak_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(lib: str, mode: str, ckpt: str, num_blocks: int, cpu_budget: int, forwards: int, batch: int, seq: int) -> dict:
    """One measurement in this (fresh) process."""
    import torch

    torch.set_num_threads(1)
    if lib == "accel":
        from accel import init_empty_weights, load_checkpoint_and_dispatch
    else:
        from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    import logging

    logging.disable(logging.WARNING)
    with init_empty_weights():
        model = build_model(num_blocks)
    model.eval()
    offload = tempfile.mkdtemp(prefix=f"bmi-{lib}-")
    try:
        start = time.perf_counter()
        model = load_checkpoint_and_dispatch(
            model, ckpt, device_map="auto", max_memory={"cpu": cpu_budget}, offload_folder=offload
        )
        load_s = time.perf_counter() - start
        result = {"lib": lib, "mode": mode, "load_s": load_s, "peak_rss": _peak_rss(),
                  "device_map": {k: str(v) for k, v in model.hf_device_map.items()}}
        if mode == "forward":
            x = torch.randn(batch, seq, HIDDEN, generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                out = model(x)  # warm-up
                start = time.perf_counter()
                for _ in range(forwards):
                    out = model(x)
                elapsed = time.perf_counter() - start
            result["forward_per_s"] = forwards / elapsed
            result["checksum"] = float(out.double().abs().sum())
            result["forward_peak_rss"] = _peak_rss()
        return result
    finally:
        shutil.rmtree(offload, ignore_errors=True)


def _run_child(args: argparse.Namespace, lib: str, mode: str, ckpt: str, num_blocks: int, budget: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", lib, mode, "--ckpt", ckpt,
           "--blocks", str(num_blocks), "--cpu-budget", str(budget), "--forwards", str(args.forwards),
           "--batch", str(args.batch), "--seq", str(args.seq)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{lib} {mode} child failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="approximate checkpoint size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forwards", type=int, default=5, help="timed forward passes per forward measurement")
    parser.add_argument("--batch", type=int, default=1, help="sequences per forward pass")
    parser.add_argument("--seq", type=int, default=16, help="tokens per sequence")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "accel-big-model-bench"))
    parser.add_argument("--child", nargs=2, metavar=("LIB", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", help=argparse.SUPPRESS)
    parser.add_argument("--blocks", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cpu-budget", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.ckpt, args.blocks, args.cpu_budget, args.forwards, args.batch, args.seq)))
        return 0

    num_blocks = max(2, round(args.size_mb * 2**20 / _block_bytes(HIDDEN)))
    ckpt = os.path.join(args.workdir, f"ckpt-{num_blocks}x{HIDDEN}")
    t0 = time.perf_counter()
    generate(ckpt, num_blocks, shard_blocks=4)
    total = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    print(f"checkpoint: {ckpt} ({total / 2**20:.0f} MiB, {num_blocks} blocks, ready in {time.perf_counter() - t0:.1f}s); "
          f"forward batch {args.batch} x {args.seq} tokens, {args.forwards} timed passes, {args.rounds} rounds")
    for name in os.listdir(ckpt):  # warm the page cache for both libraries alike
        with open(os.path.join(ckpt, name), "rb") as fh:
            while fh.read(1 << 24):
                pass
    budget = total // 2  # max_memory["cpu"]: about half of the blocks go to disk

    samples: dict[str, dict[str, list[float]]] = {lib: {"load_s": [], "load_peak_rss": [], "peak_rss": [], "forward_per_s": []} for lib in ("accel", "accelerate")}
    maps, sums = {}, {}
    for r in range(args.rounds):
        order = ("accel", "accelerate") if r % 2 == 0 else ("accelerate", "accel")
        for mode in ("load", "forward"):
            for lib in order:
                res = _run_child(args, lib, mode, ckpt, num_blocks, budget)
                maps[lib] = res["device_map"]
                if mode == "load":
                    samples[lib]["load_s"].append(res["load_s"])
                    samples[lib]["load_peak_rss"].append(res["peak_rss"])
                else:
                    samples[lib]["forward_per_s"].append(res["forward_per_s"])
                    samples[lib]["peak_rss"].append(res["forward_peak_rss"])
                    sums[lib] = res["checksum"]
                extra = f"  forward {res['forward_per_s']:.3f}/s  peak RSS load+forward {res['forward_peak_rss'] / 2**20:.0f} MiB" if mode == "forward" else ""
                print(f"round {r + 1} {mode:7s} {lib:10s} load {res['load_s']:.3f}s  peak RSS after load {res['peak_rss'] / 2**20:.0f} MiB{extra}", flush=True)

    on_disk = {lib: sum(1 for v in m.values() if v == "disk") for lib, m in maps.items()}
    print(f"device maps equal: {maps['accel'] == maps['accelerate']} (entries on disk: {on_disk})")
    print(f"outputs: accel {sums['accel']:.6f}  accelerate {sums['accelerate']:.6f}")
    med = {lib: {k: statistics.median(v) for k, v in s.items()} for lib, s in samples.items()}
    for lib in med:
        m = med[lib]
        print(f"{lib:10s} median load {m['load_s']:.3f}s  peak RSS after load {m['load_peak_rss'] / 2**20:.0f} MiB, "
              f"over load+forward {m['peak_rss'] / 2**20:.0f} MiB  forward {m['forward_per_s']:.3f}/s")
    load_ratio = med["accel"]["load_s"] / med["accelerate"]["load_s"]
    rss_ratio = med["accel"]["peak_rss"] / med["accelerate"]["peak_rss"]
    fwd_ratio = med["accel"]["forward_per_s"] / med["accelerate"]["forward_per_s"]
    print(f"load time ratio accel/accelerate:          {load_ratio:.3f}  (target <= 1.0) {'OK' if load_ratio <= 1.0 else 'MISSED'}")
    print(f"peak RSS (load+forward) accel/accelerate:  {rss_ratio:.3f}  (target <= 1.0) {'OK' if rss_ratio <= 1.0 else 'MISSED'}")
    print(f"forward throughput ratio accel/accelerate: {fwd_ratio:.3f}  (target >= 1.0) {'OK' if fwd_ratio >= 1.0 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
