"""What the per-file checksums of ``save_state``/``load_state`` cost on a ~1 GB checkpoint, in one run.

One process builds a model of ``--layers`` Linear(4096, 4096) fp32 layers (16 layers: 1.07 GB of
weights, saved as one ``model.safetensors``; plain SGD, so the optimizer file is tiny), then for
``--rounds`` rounds times, in alternating order so both variants see the same host and page cache:

* ``save_state`` with checksums (the default) and with ``ACCEL_CHECKPOINT_CHECKSUMS=0``;
* ``load_state`` verifying (the default) and with ``verify_checksums=False``.

Reported: median seconds per variant, the difference, and the hashing rate it implies; plus, for
reference, raw sha256 (what the manifest uses, always in hashlib) and xxh3_128 (only when the
``xxhash`` package is installed) rates over the saved file. Files are read back from the page cache
right after they are written, as they are in a save; a load from cold storage pays the read anyway,
so the verification adds mostly the hashing. Saves include fsync of every file.

    python suites/benchmarks/checkpoint_checksum.py [--layers 16] [--rounds 3] [--dir /tmp] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16, help="Linear(4096, 4096) layers (16: 1.07 GB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write the checkpoints (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)

    import torch

    from accel import Accelerator
    from accel import checkpointing as C
    from accel.io.files import file_digest

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(args.layers)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    root = tempfile.mkdtemp(prefix="accel_ckpt_sum_", dir=args.dir)
    times: dict[str, list[float]] = {"save_checksums": [], "save_plain": [], "load_verify": [], "load_plain": []}
    try:
        def save(with_sums: bool, folder: str) -> None:
            if with_sums:
                os.environ.pop(C.CHECKSUM_ENV, None)
            else:
                os.environ[C.CHECKSUM_ENV] = "0"
            start = time.perf_counter()
            accelerator.save_state(folder)
            times["save_checksums" if with_sums else "save_plain"].append(time.perf_counter() - start)
            os.environ.pop(C.CHECKSUM_ENV, None)

        def load(verify: bool, folder: str) -> None:
            start = time.perf_counter()
            accelerator.load_state(folder, verify_checksums=verify)
            times["load_verify" if verify else "load_plain"].append(time.perf_counter() - start)

        summed, plain = os.path.join(root, "with"), os.path.join(root, "without")
        for r in range(args.rounds):
            order = [True, False] if r % 2 == 0 else [False, True]
            for with_sums in order:
                save(with_sums, summed if with_sums else plain)
            for verify in order:
                load(verify, summed)
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(summed) for f in fs)
        weights = os.path.join(summed, "model.safetensors")
        weights_bytes = os.path.getsize(weights)
        start = time.perf_counter()
        file_digest(weights, "sha256")
        sha = time.perf_counter() - start
        xxh = None
        try:
            import xxhash

            digest = xxhash.xxh3_128()
            start = time.perf_counter()
            with open(weights, "rb", buffering=0) as handle:
                for chunk in iter(lambda: handle.read(8 << 20), b""):
                    digest.update(chunk)
            xxh = time.perf_counter() - start
        except ImportError:
            pass
    finally:
        shutil.rmtree(root, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    gb = size / 1e9
    result = {
        "checkpoint_bytes": size,
        "rounds": args.rounds,
        "median_s": med,
        "samples_s": times,
        "save_overhead_s": med["save_checksums"] - med["save_plain"],
        "load_overhead_s": med["load_verify"] - med["load_plain"],
        "sha256_GBps_model_file": weights_bytes / 1e9 / sha if sha else None,
        "xxh3_128_GBps_model_file": (weights_bytes / 1e9 / xxh) if xxh else None,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    print(f"checkpoint: {gb:.2f} GB, {args.rounds} rounds, medians:")
    print(f"  save_state  with checksums {med['save_checksums']:.2f} s   without {med['save_plain']:.2f} s   "
          f"(+{result['save_overhead_s']:.2f} s, {100 * result['save_overhead_s'] / med['save_plain']:+.0f} %)")
    print(f"  load_state  verifying      {med['load_verify']:.2f} s   without {med['load_plain']:.2f} s   "
          f"(+{result['load_overhead_s']:.2f} s, {100 * result['load_overhead_s'] / med['load_plain']:+.0f} %)")
    for name, values in times.items():
        print(f"  {name:15s} samples: {', '.join(f'{v:.2f}' for v in values)}")
    print(f"  raw sha256 over model.safetensors: {result['sha256_GBps_model_file']:.2f} GB/s"
          + (f"; xxh3_128: {result['xxh3_128_GBps_model_file']:.2f} GB/s" if xxh else "; xxhash not installed"))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    return result


if __name__ == "__main__":
    main()
