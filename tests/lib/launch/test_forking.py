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


def _frozen_after_fork_context(freeze_first: bool) -> tuple[int, int]:
    """(objects frozen inside the context, objects frozen after it), in a fresh interpreter."""
    code = textwrap.dedent(f"""
        import gc
        from accel.launch.forking import garbage_frozen_for_fork
        if {freeze_first}:
            gc.freeze()
        with garbage_frozen_for_fork():
            inside = gc.get_freeze_count()
        print(inside, gc.get_freeze_count())
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert proc.returncode == 0, proc.stderr
    inside, after = map(int, proc.stdout.split())
    return inside, after


def test_the_parents_collections_resume_after_forking():
    inside, after = _frozen_after_fork_context(freeze_first=False)
    assert inside > 0 and after == 0


def test_a_parent_that_froze_its_objects_keeps_them_frozen():
    # a pytest session freezes what it collected; a rank pool forked from it must not undo that
    inside, after = _frozen_after_fork_context(freeze_first=True)
    # the context's own frames were frozen too and are gone once it ends; everything else is still frozen
    assert inside > 0 and after > inside // 2
