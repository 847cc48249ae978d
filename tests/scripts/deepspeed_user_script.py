# Written the way Accelerate's DeepSpeed docs show; only the import names accel.
import json, sys
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accel import Accelerator
from accel.utils import set_seed

def main(out):
    accelerator = Accelerator()
    set_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(data, batch_size=8)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.9)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    losses = []
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y)  # a bf16 engine takes bf16 inputs
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            losses.append(accelerator.gather(loss.detach()[None]).mean().item())
    accelerator.save_state(out + "/ckpt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        json.dump({"distributed_type": str(accelerator.distributed_type), "num_processes": accelerator.num_processes,
                   "zero_stage": accelerator.state.deepspeed_plugin.zero_stage, "losses": losses,
                   "mixed_precision": accelerator.mixed_precision}, open(out + "/result.json", "w"))

if __name__ == "__main__":
    main(sys.argv[1])
