"""A small training run that checkpoints with automatic naming, for tests/lib/checkpointing/test_crashes.py.

    python ckpt_train.py PROJECT_DIR LOSSES_FILE --steps N --save-every K [--kill-at S] [--resume]

Writes one line per optimizer step to LOSSES_FILE ("<step> <loss as float.hex()>", flushed at once).
The test runs it in forked children (:func:`start_in_fork`), the way this command line runs it.
``--kill-at S`` SIGKILLs the process right after step S; ``--resume`` starts from the newest checkpoint
(``accelerator.load_state()``), skipping the batches of the current epoch already seen, the way an
Accelerate script resumes (``skip_first_batches`` with the script's own step counter, which is kept in a
registered object).
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed

BATCH_SIZE = 4
SAMPLES = 32  # 8 batches per epoch


class Progress:
    """The script's own counter, checkpointed through register_for_checkpointing."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def build(project_dir: str, total_limit: int | None = 3):
    set_seed(0)
    accelerator = Accelerator(
        project_config=ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=total_limit),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    data = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, 4, generator=data)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(SAMPLES, 1, generator=data)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    # The loader has its own generator: without one, every `iter(loader)` draws a seed from the global torch
    # RNG, and the iterator a resumed run creates mid-epoch would shift the dropout masks by one draw.
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH_SIZE, shuffle=True, generator=torch.Generator().manual_seed(7))
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    return accelerator, model, optimizer, scheduler, loader, progress


def train(project_dir: str, losses_file: str, steps: int, save_every: int, kill_at: int | None, resume: bool) -> None:
    accelerator, model, optimizer, scheduler, loader, progress = build(project_dir)
    if resume:
        accelerator.load_state()
    per_epoch = len(loader)
    epoch, skip = divmod(progress.step, per_epoch)
    with open(losses_file, "a") as out:
        while progress.step < steps:
            # the epoch is set explicitly: the loader skip_first_batches returns counts its own epochs, so the
            # original loader would otherwise replay the resumed epoch's order once
            loader.set_epoch(epoch)
            active = accelerator.skip_first_batches(loader, skip) if skip else loader
            skip = 0
            for x, y in active:
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                progress.step += 1
                out.write(f"{progress.step} {loss.item().hex()}\n")
                out.flush()
                if progress.step % save_every == 0:
                    accelerator.save_state()
                if progress.step == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                if progress.step >= steps:
                    break
            epoch += 1


def start_in_fork(project_dir: str, losses_file: str, steps: int, save_every: int, kill_at: int | None = None,
                  resume: bool = False) -> int:
    """:func:`train` in a forked child of a process that has imported torch and accel but holds no accel
    state, as a fresh ``python ckpt_train.py`` would run it without paying for the imports again;
    returns the child's pid (its exit status: 0, or -SIGKILL for ``kill_at``; 1 and a traceback on error)."""
    import torch._dynamo  # noqa: F401 - what the optimizer imports on first use (seconds): once, not in each child

    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.environ.pop("ACCEL_DEVICE", None)
            torch.set_num_threads(1)
            train(project_dir, losses_file, steps, save_every, kill_at, resume)
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("project_dir")
    parser.add_argument("losses_file")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, required=True)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    train(args.project_dir, args.losses_file, args.steps, args.save_every, args.kill_at, args.resume)


if __name__ == "__main__":
    main()
