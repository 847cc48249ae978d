"""A fresh process saves with automatic checkpoint naming and total_limit=3 into projects that already
hold checkpoints (no load_state first). Prints, per library and scenario, JSON: what each save_state
returned, whether that path exists, and the checkpoints left with a marker telling old folders from new ones.

usage: python rotation_fresh.py BASE_DIR LIB [LIB]   (LIB: accel or accelerate; each under BASE_DIR/LIB)

accel and Accelerate keep separate state, so each library's run in one process is its first, as in a
process of its own.
"""

import json
import os
import sys

import torch

SCENARIOS = {"gap": [5, 6, 7], "full": [0, 1, 2], "over": [0, 1, 2, 3, 4]}


def rotate(lib: str, base: str) -> None:
    if lib == "accelerate":
        from accelerate import Accelerator
        from accelerate.utils import ProjectConfiguration
    else:
        from accel import Accelerator
        from accel.utils import ProjectConfiguration

    accelerator = None
    for name, existing in SCENARIOS.items():
        project = os.path.join(base, name)
        for n in existing:
            os.makedirs(os.path.join(project, "checkpoints", f"checkpoint_{n}"))
            with open(os.path.join(project, "checkpoints", f"checkpoint_{n}", "old.txt"), "w") as handle:
                handle.write("from an earlier run")
        config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True, total_limit=3)
        if accelerator is None:
            accelerator = Accelerator(project_config=config)
            accelerator.prepare(torch.nn.Linear(2, 2))
        else:
            accelerator.project_configuration = config
        saves = []
        for _ in range(2):
            try:
                path = accelerator.save_state()
                saves.append([os.path.relpath(path, project), os.path.isdir(path)])
            except ValueError as exc:
                saves.append(["error", "already exists" in str(exc)])
        folder = os.path.join(project, "checkpoints")
        left = {d: ("old" if os.path.exists(os.path.join(folder, d, "old.txt")) else "new") for d in sorted(os.listdir(folder))}
        print(json.dumps({"lib": lib, "scenario": name, "saves": saves, "left": left}), flush=True)


for library in sys.argv[2:]:
    rotate(library, os.path.join(sys.argv[1], library))
