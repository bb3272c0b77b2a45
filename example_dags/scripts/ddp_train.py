"""A small data-parallel training run: each rank takes a few SGD steps of a DDP-wrapped linear
model on its own random batches (gloo, CPU), then the ranks all-reduce their rank numbers and
each prints the sum. Run it with ``torchrun`` (``dist.spmd --script ddp_train.py -j 2x2``).

``--crash-rank R --crash-step S``: rank R exits 1 before step S (to see a failure handled);
with ``--crash-raises`` it raises ``RuntimeError`` instead, which ``record`` (on ``main``) writes
to torchrun's error file: the task's error then starts with it (the root cause); with
``--crash-aborts`` it writes a line to stderr and aborts (SIGABRT, as a C++ error does), which
leaves no error file: the root cause then shows the node's last stderr lines; with
``--crash-once FILE`` only while FILE does not exist (it is created), so a retry passes.
``--hold``: after the all-reduce, wait until the job is stopped.

The process ends with ``os._exit`` on every path, a failure's too (see ``end``): gloo's worker
threads outlive ``destroy_process_group``, and one that lets go of its last all-reduce while
the interpreter shuts down aborts the rank (SIGABRT, ``terminate called without an active
exception``; docs/troubleshooting.md), which would turn an exit 1 into a -6.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel


@record
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-step", type=int, default=1)
    parser.add_argument("--crash-once", default=None)
    parser.add_argument("--crash-raises", action="store_true")
    parser.add_argument("--crash-aborts", action="store_true")
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        if rank == args.crash_rank and step == args.crash_step and _crash_now(args.crash_once):
            say(f"rank {rank} crashing at step {step}")
            if args.crash_raises:
                raise RuntimeError(f"boom on rank {rank}")
            if args.crash_aborts:
                sys.stderr.write(f"rank {rank}: corrupt shard, aborting\n")
                sys.stderr.flush()
                os.abort()
            sys.exit(1)
        x = torch.randn(16, 8)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        say(f"rank {rank} step {step} loss {loss.item():.4f}")
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    say(f"rank {rank} of {world}: all_reduce sum {int(total.item())}")
    while args.hold:
        time.sleep(1)
    dist.destroy_process_group()


def say(line: str) -> None:
    """Print ``line`` in one write: the ranks of a node share its stdout, and ``print`` makes
    separate writes for the text and the newline when Python runs unbuffered
    (``PYTHONUNBUFFERED``, ``-u``), so two ranks' lines could interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def end(code: int) -> None:
    """Leave with ``code`` without the interpreter's teardown. In torch 2.13 the gloo process group's worker
    threads (``pt_gloo_runloop``) keep running after ``destroy_process_group``; a worker drops
    its reference to the last finished all-reduce a moment after the rank saw it complete, and
    dropping a tensor that Python also knows takes the GIL. If the interpreter is finalising
    by then, taking the GIL ends the thread in a way C++ cannot unwind, and the rank aborts
    (seen in core dumps: ``AsyncAllreduceWork::~AsyncAllreduceWork`` -> ``decref_pyobject`` ->
    ``take_gil`` -> ``pthread_exit`` -> ``std::terminate`` while the main thread is in
    ``Py_FinalizeEx``). It happens more often on a loaded machine."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _crash_now(marker: str | None) -> bool:
    if marker is None:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


if __name__ == "__main__":
    try:
        main()  # ``record`` has written a raised exception to torchrun's error file
    except SystemExit as stop:
        end(stop.code if isinstance(stop.code, int) else 1)
    except BaseException:
        traceback.print_exc()  # what the interpreter would print
        end(1)
    end(0)
