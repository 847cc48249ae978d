"""Forked workers do not collect the parent's garbage: an inherited process group's destructor hangs a forked child."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from _waits import SAFETY_NET_S

#: a parent that leaves a gloo process group in a reference cycle (as an earlier notebook cell or test can), then
#: starts forked workers that collect garbage first thing
SCRIPT = textwrap.dedent("""
    import gc, os, sys
    import torch, torch.distributed as dist
    from accel.launchers import debug_launcher

    def worker(out):
        gc.collect()  # a forked child's first collection: it must not reach the parent's process group
        open(os.path.join(out, os.environ["RANK"]), "w").close()

    if __name__ == "__main__":
        gc.disable()  # the cycle stays garbage until a collection runs
        dist.init_process_group("gloo", init_method="file://" + os.path.join(sys.argv[1], "pg"), rank=0, world_size=1)
        dist.all_reduce(torch.ones(2))
        class Holder: pass
        holder = Holder(); holder.me = holder; holder.group = dist.group.WORLD
        dist.destroy_process_group()
        del holder
        debug_launcher(worker, args=(sys.argv[1],), num_processes=2)
        print("workers done", sorted(f for f in os.listdir(sys.argv[1]) if f != "pg"))
""")


def test_forked_workers_do_not_collect_an_inherited_process_group(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    # without the freeze every worker hangs in its first collection, and this run would reach its time limit
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "workers done ['0', '1']" in proc.stdout
