"""A small data-parallel training job whose rank 0 runs a long validation pass mid-epoch.

Rank 0 alone validates at --validate-at-step and takes longer than the process-group timeout,
while the other ranks have already entered that step's gradient all_reduce. They time out,
dump their Flight Recorder buffers and exit; torchrun then stops rank 0 with SIGTERM, which
dumps its buffer too. Run it as described in README.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

FR_DIR = Path("fr_trace")
FR_JSON_DIR = Path("fr_trace_json")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=int, default=15, help="process-group timeout in seconds")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--validate-at-step", type=int, default=5)
    parser.add_argument("--validation-batches", type=int, default=150)
    return parser.parse_args()


def log(msg: str) -> None:
    print(f"[rank {dist.get_rank()}] {msg}", flush=True)


def dump_flight_recorder() -> None:
    """Write this rank's Flight Recorder buffer; gloo has no automatic dump on timeout."""
    rank = dist.get_rank()
    FR_DIR.mkdir(exist_ok=True)
    FR_JSON_DIR.mkdir(exist_ok=True)
    (FR_DIR / f"fr_trace_rank_{rank}").write_bytes(torch._C._distributed_c10d._dump_fr_trace())
    (FR_JSON_DIR / f"fr_trace_rank_{rank}.json").write_bytes(torch._C._distributed_c10d._dump_fr_trace_json())
    print(f"[rank{rank}] flight recorder written to {FR_DIR}/fr_trace_rank_{rank}", flush=True)


def on_sigterm(signum: int, _frame: object) -> None:
    dump_flight_recorder()
    sys.exit(128 + signum)


def make_loader(world_size: int, rank: int, batch_size: int = 16) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(4096, 32, generator=generator)
    targets = features.sum(dim=1, keepdim=True) + 0.1 * torch.randn(4096, 1, generator=generator)
    sampler = DistributedSampler(TensorDataset(features, targets), num_replicas=world_size, rank=rank)
    return DataLoader(TensorDataset(features, targets), batch_size=batch_size, sampler=sampler)


def sync_gradients(model: nn.Module) -> None:
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def validate(model: nn.Module, batches: int) -> float:
    """A validation pass over a slow remote eval set (each batch waits on storage)."""
    log(f"running validation on {batches * 64} samples")
    total = 0.0
    with torch.no_grad():
        for _ in range(batches):
            time.sleep(0.2)
            x = torch.randn(64, 32)
            total += nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).item()
    return total / batches


def train(args: argparse.Namespace) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(make_loader(world_size, rank))
    for step in range(1, args.steps + 1):
        x, y = next(batches)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if rank == 0 and step == args.validate_at_step:
            log(f"step {step}: val_loss={validate(model, args.validation_batches):.4f}")
        sync_gradients(model)
        optimizer.step()
        log(f"step {step}/{args.steps} loss={loss.item():.4f}")


def main() -> None:
    args = parse_args()
    master = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    signal.signal(signal.SIGTERM, on_sigterm)
    log(f"process group ready: backend=gloo timeout={args.timeout}s world_size={dist.get_world_size()} master={master}")
    torch.manual_seed(dist.get_rank())
    try:
        train(args)
    except Exception:
        dump_flight_recorder()
        raise
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
