"""A data-parallel training run that resumes where its last attempt left off (docs/checkpoints.md).

Every ``--save-every`` steps rank 0 writes a checkpoint (model, optimizer, step) into
``$TORCHX_CHECKPOINT_DIR`` as ``step-<n>.pt`` (written beside, then renamed: a reader never
sees half a file) and keeps the newest ``--keep``; the other ranks wait at a barrier. At start
every rank loads the newest checkpoint there (all ranks read the same file: the directory is
shared, a local path on one box, an EFS mount on AWS Batch) and goes on from its step. Without
the variable it trains from step 0 and saves nothing.

``--reclaim-at K``: on the first attempt (``TORCHX_ATTEMPT`` 0), once step K is saved, rank 0
SIGKILLs its node's ``torchrun`` (as a host reclaim or the OOM killer would): with
``max_retries`` left the scheduler restarts the job, which resumes from step K.

Run it with ``torchrun`` (``dist.spmd --script ddp_resume.py -j 2x2``). The checkpoint helpers
need only the standard library; PyTorch is imported by ``main``.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

_NAME = re.compile(r"^step-(\d+)\.pt$")


def attempt_number(env: Mapping[str, str]) -> int:
    """Which attempt of the task instance's work this is: ``TORCHX_ATTEMPT`` plus, on AWS Batch,
    the attempts Batch made before this one (``AWS_BATCH_JOB_ATTEMPT`` is 1 for the first)."""
    return int(env.get("TORCHX_ATTEMPT") or 0) + max(int(env.get("AWS_BATCH_JOB_ATTEMPT") or 1) - 1, 0)


def checkpoints(directory: str) -> list[tuple[int, str]]:
    """The complete checkpoints in ``directory`` as ``(step, path)``, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), os.path.join(directory, n)) for n in names if (m := _NAME.match(n))]
    return sorted(found)


def newest_checkpoint(directory: str) -> tuple[int, str] | None:
    """The checkpoint of the highest step in ``directory`` (None: there is none yet)."""
    found = checkpoints(directory)
    return found[-1] if found else None


def save_checkpoint(directory: str, step: int, write: Callable[[str], None], keep: int = 2) -> str:
    """Write the checkpoint of ``step`` with ``write(path)`` under a temporary name, rename it
    into place, then remove all but the newest ``keep``; return its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"step-{step:08d}.pt")
    partial = f"{path}.partial-{os.getpid()}"
    write(partial)
    os.replace(partial, path)
    for _, old in checkpoints(directory)[:-keep]:
        os.remove(old)
    return path


def say(line: str) -> None:
    """Print ``line`` in one write (the ranks of a node share its stdout)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--keep", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--reclaim-at", type=int, default=-1)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    directory = os.environ.get("TORCHX_CHECKPOINT_DIR")
    attempt = attempt_number(os.environ)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = 0
    newest = newest_checkpoint(directory) if directory else None
    if newest is not None:
        state: dict[str, Any] = torch.load(newest[1], weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    say(f"rank {rank} attempt {attempt}: " + (f"resumed from step {start}" if start else "starting at step 0"))
    for step in range(start + 1, args.steps + 1):
        inputs = torch.randn(32, 8)
        loss = torch.nn.functional.mse_loss(model(inputs), inputs.mean(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients
        optimizer.step()
        say(f"rank {rank} step {step} loss {loss.item():.4f}")
        if directory and step % args.save_every == 0:
            if rank == 0:
                saved = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                path = save_checkpoint(directory, step, functools.partial(torch.save, saved), args.keep)
                say(f"rank 0 saved {path}")
            dist.barrier()  # every rank goes on once the checkpoint is in place
            if step == args.reclaim_at and attempt == 0 and rank == 0:
                say(f"rank 0 simulating a host reclaim after step {step}: SIGKILL to torchrun")
                os.kill(os.getppid(), signal.SIGKILL)
                signal.pause()
    say(f"rank {rank} finished at step {args.steps}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # see ddp_train.py's ``end``: gloo's threads and the interpreter's teardown
