"""Sequence parallelism on the backend under test: DeepSpeed Ulysses (ALST) on a small Hugging Face Llama
gives the same losses as one process on whole sequences; torch context parallelism either shards the
device's attention kernel or is refused naming that kernel.

Ulysses: two ranks form one sequence-parallel group, each holding half of a 16-token sample. The
token-weighted loss over the group (``sequence_parallel_loss``) must equal the loss of the whole
sample in one process, and the ranks' gradients must add up to the whole sample's gradient (DeepSpeed's
engine sums them over the sequence-parallel ranks). Attention is exact under Ulysses (the all-to-all only moves heads), so both agree
to fp32 reassociation: 1e-5 relative; a dropped shard or a wrong position moves them by 1e-2 or more.
Through DeepSpeed's engine (the adapter, ``deepspeed.initialize(mpu=...)``, three SGD steps) every
loss must equal the one-process run's on whole sequences (SGD shows a wrong gradient scale, which
Adam would hide; DeepSpeed's default gradient clipping at norm 1 is turned off for the comparison).
The same run through ``Accelerator`` (``ParallelismConfig(sp_size=2)`` with a ``DeepSpeedPlugin``) must
give the same losses: ``prepare`` registers Ulysses, builds the engine with its ``mpu`` and shards the
data loader's sequences; a loader prepared apart is sharded by ``deepspeed_ulysses_dl_adapter``.
"""

from __future__ import annotations

import pytest
import torch

from accel.strategies.sequence_parallel import context_parallel_support

SEQ = 16
VOCAB = 64
STEPS = 3
LR = 0.05
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _samples(count: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (count, SEQ), generator=torch.Generator().manual_seed(1))


def _reference_losses(order: list[int]) -> list[float]:
    """One process, whole sequences, one sample per SGD step in ``order``."""
    model = _llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    samples = _samples(max(order) + 1)
    losses = []
    for index in order:
        ids = samples[index:index + 1]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    return losses


def _group_loss(logits: torch.Tensor, labels: torch.Tensor, group) -> torch.Tensor:
    """The token-weighted loss over the sequence-parallel ``group`` of this rank's ``logits`` for its ``labels``."""
    import torch.nn.functional as F

    from accel.strategies.sequence_parallel import sequence_parallel_loss

    shard_loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    return sequence_parallel_loss(shard_loss, labels, group=group)


def _ulysses_losses(model, loader, group, device, update) -> list[float]:
    """``STEPS`` training steps on this rank's half sequences; ``update(loss)`` runs the backward pass and
    the optimizer step. Returns the group's loss of every step."""
    losses = []
    for _, batch in zip(range(STEPS), loader):
        assert batch["input_ids"].shape == (1, SEQ // 2), "each rank holds half of the sequence"
        logits = model(input_ids=batch["input_ids"].to(device), position_ids=batch["position_ids"].to(device)).logits
        loss = _group_loss(logits, batch["shift_labels"].to(device), group)
        update(loss)
        losses.append(float(loss))
    return losses


def _assert_whole_sequence_losses(losses: list[float], expected: list[float], through: str) -> None:
    """The sharded run's losses equal the one-process run's on whole sequences (samples 0, 1, 2: the
    adapter serves rank 0's first sample, then rank 1's, then rank 0's second)."""
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), **TOLERANCE,
                               msg=lambda m: f"Ulysses through {through} vs whole-sequence losses: {m}")


@pytest.mark.require_deepspeed
@pytest.mark.world_size(2)
def test_ulysses_loss_and_gradient_match_whole_sequences(device, world_size, rank):
    pytest.importorskip("transformers", reason="[needs-package] DeepSpeed's Ulysses patches transformers' attention")
    import torch.distributed as dist
    import torch.nn.functional as F

    from accel.parallelism_config import ParallelismConfig
    from accel.strategies.sequence_parallel import register_deepspeed_ulysses, release_deepspeed_ulysses

    release_deepspeed_ulysses()  # the rank processes are reused: start from transformers' own attention
    ids = _samples(1)
    reference = _llama()
    want_loss = reference(input_ids=ids, labels=ids).loss
    want_loss.backward()
    want_grad = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])

    model = _llama().to(device)
    mpu = register_deepspeed_ulysses(model, ParallelismConfig(sp_backend="deepspeed", sp_size=2), micro_batch_size=1)
    half = slice(rank * SEQ // 2, (rank + 1) * SEQ // 2)
    shift_labels = F.pad(ids, (0, 1), value=-100)[:, 1:][:, half].to(device)
    logits = model(input_ids=ids[:, half].to(device), position_ids=torch.arange(SEQ)[None, half].to(device)).logits
    loss = _group_loss(logits, shift_labels, mpu.get_sequence_parallel_group())
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.all_reduce(grad, group=mpu.get_sequence_parallel_group())  # on the device: the group's backend may know no other
    grad = grad.to("cpu")
    release_deepspeed_ulysses()
    torch.testing.assert_close(loss.detach().cpu(), want_loss.detach(), **TOLERANCE)
    torch.testing.assert_close(grad, want_grad, **TOLERANCE,
                               msg=lambda m: f"sum of the ranks' gradients vs the whole sequence's: {m}")


@pytest.mark.require_deepspeed
@pytest.mark.world_size(2)
def test_ulysses_training_through_deepspeed(device, world_size, rank):
    pytest.importorskip("transformers", reason="[needs-package] DeepSpeed's Ulysses patches transformers' attention")
    import deepspeed

    from accel.parallelism_config import ParallelismConfig
    from accel.utils.dataclasses import DeepSpeedSequenceParallelConfig
    from accel.strategies.sequence_parallel import (
        register_deepspeed_ulysses,
        release_deepspeed_ulysses,
        sequence_parallel_train_batch_size,
        ulysses_dataloader,
    )

    config = ParallelismConfig(sp_backend="deepspeed", sp_size=2,
                               sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length=SEQ, sp_seq_length_is_variable=False))
    # before Ulysses takes over transformers' sdpa attention (it patches it process-wide)
    release_deepspeed_ulysses()
    expected = _reference_losses([0, 1, 2])
    model = _llama().to(device)
    mpu = register_deepspeed_ulysses(model, config, micro_batch_size=1)
    assert (mpu.get_sequence_parallel_world_size(), mpu.get_sequence_parallel_rank()) == (2, rank)
    ds_config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                 "train_batch_size": sequence_parallel_train_batch_size(1, 1, world_size, config.sp_size),
                 "zero_optimization": {"stage": 0}, "gradient_clipping": 0.0}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
                                      config_params=ds_config, mpu=mpu)

    samples = _samples(world_size * 2)
    mine = [{"input_ids": samples[i:i + 1], "labels": samples[i:i + 1],
             "position_ids": torch.arange(SEQ)[None]} for i in range(rank, len(samples), world_size)]

    def update(loss: torch.Tensor) -> None:
        engine.backward(loss)
        engine.step()

    losses = _ulysses_losses(engine, ulysses_dataloader(mine, mpu, device), mpu.get_sequence_parallel_group(), device,
                             update)
    release_deepspeed_ulysses()  # also drops the mpu the engine left in deepspeed.utils.groups
    _assert_whole_sequence_losses(losses, expected, "DeepSpeed")


class _Samples(torch.utils.data.Dataset):
    """Whole-sequence samples as Ulysses' adapter reads them: ``input_ids``, ``labels``, ``position_ids``."""

    def __init__(self, count: int):
        self.ids = _samples(count)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index], "position_ids": torch.arange(SEQ)}


@pytest.mark.require_deepspeed
@pytest.mark.world_size(2)
def test_ulysses_training_through_the_accelerator(device, world_size, rank):
    pytest.importorskip("transformers", reason="[needs-package] DeepSpeed's Ulysses patches transformers' attention")
    from torch.utils.data import DataLoader

    from _training_utils import fresh_state
    from accel import Accelerator
    from accel.parallelism_config import ParallelismConfig
    from accel.utils import DeepSpeedPlugin
    from accel.utils.dataclasses import DeepSpeedSequenceParallelConfig
    from accel.strategies.sequence_parallel import release_deepspeed_ulysses

    release_deepspeed_ulysses()
    expected = _reference_losses([0, 1, 2])
    fresh_state()
    config = ParallelismConfig(sp_backend="deepspeed", sp_size=2,
                               sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length=SEQ, sp_seq_length_is_variable=False))
    plugin = DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                                           "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
                                           "zero_optimization": {"stage": 0}})
    accelerator = Accelerator(deepspeed_plugin=plugin, parallelism_config=config)
    model = _llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(_Samples(world_size * 2), batch_size=1))
    assert plugin.deepspeed_config["train_batch_size"] == 1, "the two ranks of the one sequence group count once"

    def update(loss: torch.Tensor) -> None:
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    losses = _ulysses_losses(engine, loader, accelerator.strategy.mpu.get_sequence_parallel_group(), device, update)
    apart = accelerator.deepspeed_ulysses_dl_adapter(accelerator.prepare(DataLoader(_Samples(world_size), batch_size=1)),
                                                     engine)
    first = next(iter(apart))
    assert first["input_ids"].shape == (1, SEQ // 2), "a loader prepared apart is sharded too"
    accelerator.free_memory()  # releases Ulysses (attention, groups, the engine's mpu) for the next run in this rank
    _assert_whole_sequence_losses(losses, expected, "the Accelerator")


def test_context_parallelism_names_the_attention_kernel(device):
    """Where torch can shard the device's SDPA kernel it says which; elsewhere the reason names the kernel."""
    supported, why = context_parallel_support(device)
    assert "scaled_dot_product" in why, why
    if device.type == "cuda":
        assert supported, why
    if device.type == "cpu":
        assert not supported and "_scaled_dot_product_flash_attention_for_cpu" in why, why
