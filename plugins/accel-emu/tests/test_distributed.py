"""Collectives and DDP on emu:0/emu:1 across two processes, through the emu_ccl backend."""

from __future__ import annotations

import json

import pytest

from conftest import run_pythons

_RANK = """
import json, os, sys
import torch, torch.distributed as dist
import accel_emu
accel_emu.load()
rank, world = int(sys.argv[1]), 2
dist.init_process_group("cpu:gloo,emu:emu_ccl", init_method="file://" + sys.argv[2], rank=rank, world_size=world)
dev = torch.device("emu", rank)
torch.emu.set_device(rank)
out = {"backend": str(dist.get_backend())}

t = torch.full((4,), float(rank + 1), device=dev)
dist.all_reduce(t)
out["all_reduce"] = t.cpu().tolist()
out["all_reduce_device"] = str(t.device)

b = torch.full((3,), float(rank), device=dev)
dist.broadcast(b, src=1)
out["broadcast"] = b.cpu().tolist()

parts = [torch.empty(2, device=dev) for _ in range(world)]
dist.all_gather(parts, torch.full((2,), float(rank), device=dev))
out["all_gather"] = [p.cpu().tolist() for p in parts]

whole = torch.empty(2 * world, device=dev)
dist.all_gather_into_tensor(whole, torch.full((2,), float(rank + 10), device=dev))
out["all_gather_into_tensor"] = whole.cpu().tolist()

shard = torch.empty(2, device=dev)
dist.reduce_scatter_tensor(shard, torch.arange(4.0, device=dev) * (rank + 1))
out["reduce_scatter"] = shard.cpu().tolist()

dist.barrier()
host = torch.full((1,), float(rank), device="cpu")
dist.all_reduce(host)  # the cpu half of the group still works
out["cpu_all_reduce"] = host.tolist()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(dev)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = torch.Generator().manual_seed(100 + rank)
for _ in range(3):
    x = torch.randn(8, 4, generator=g).to(dev)
    loss = ddp(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
out["ddp_param_device"] = str(next(model.parameters()).device)
out["ddp_weight"] = model[0].weight.detach().cpu().flatten().tolist()
dist.destroy_process_group()
print("RESULT " + json.dumps(out), flush=True)
"""


def _run_two_ranks(tmp_path):
    store = tmp_path / "store"
    results = []
    for rank, run in enumerate(run_pythons(_RANK, [["0", str(store)], ["1", str(store)]], env={"GLOO_SOCKET_IFNAME": "lo"})):
        assert run.returncode == 0, (rank, run.stderr[-3000:])
        line = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
        assert line, run.stdout + run.stderr[-3000:]
        results.append(json.loads(line[0][len("RESULT "):]))
    return results


@pytest.mark.slow
def test_collectives_and_ddp_on_two_devices(tmp_path):
    r0, r1 = _run_two_ranks(tmp_path)
    for rank, r in enumerate((r0, r1)):
        assert r["all_reduce"] == [3.0] * 4
        assert r["all_reduce_device"] == f"emu:{rank}"
        assert r["broadcast"] == [1.0] * 3
        assert r["all_gather"] == [[0.0, 0.0], [1.0, 1.0]]
        assert r["all_gather_into_tensor"] == [10.0, 10.0, 11.0, 11.0]
        assert r["cpu_all_reduce"] == [1.0]
        assert r["ddp_param_device"] == f"emu:{rank}"
    # reduce-scatter of arange(4)*(rank+1) summed over ranks = arange(4)*3, split in halves
    assert r0["reduce_scatter"] == [0.0, 3.0]
    assert r1["reduce_scatter"] == [6.0, 9.0]
    # DDP keeps the replicas identical although each rank saw different data
    assert r0["ddp_weight"] == r1["ddp_weight"]


_DDP_TIMES = """
import json, sys
import torch, torch.distributed as dist
import accel_emu
accel_emu.load()
dist.init_process_group("emu_ccl", init_method="file://" + sys.argv[1], rank=0, world_size=1)
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2).to("emu"))
for _ in range(3):
    ddp(torch.randn(3, 4, device="emu")).sum().backward()
data = ddp._get_ddp_logging_data()
dist.destroy_process_group()
print("RESULT " + json.dumps({k: v for k, v in data.items() if k.startswith("avg_")}), flush=True)
"""


def test_ddp_collects_time_stats_for_emu_parameters(tmp_path):
    """The plug-in registers a DDP timer for its device: DDP reports forward, backward and communication
    times instead of warning that only CPU and CUDA devices are timed."""
    (run,) = run_pythons(_DDP_TIMES, [[str(tmp_path / "store")]])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Time stats are currently only collected" not in run.stderr
    times = json.loads(next(ln for ln in run.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    for key in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
        assert times.get(key, 0) > 0, times
