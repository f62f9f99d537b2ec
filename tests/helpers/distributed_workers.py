"""Per-rank bodies of the multi-process tests; each rank saves what it saw to `out/rank{r}.pt`
and the test process judges."""

import os

import torch
import torch.distributed as dist

from moco_ref import MoCo
from moco_ref.core.distributed import concat_all_gather, shuffle_batch, unshuffle_batch
from tests.helpers.tiny_encoders import tiny_without_bn

BATCH, STEPS, K = 4, 5, 10


def _init(rank, world, rendezvous):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world)


def global_batches(world, steps=STEPS):
    """The images of every step, for all ranks: ``[steps, world·BATCH, 3, 8, 8]`` twice."""
    generator = torch.Generator().manual_seed(7)
    return (torch.randn(steps, world * BATCH, 3, 8, 8, generator=generator),
            torch.randn(steps, world * BATCH, 3, 8, 8, generator=generator))


def shuffle_and_gather(rank, world, rendezvous, out):
    _init(rank, world, rendezvous)
    x = torch.arange(BATCH, dtype=torch.float32)[:, None] + 100 * rank  # [B, 1]
    shuffled, undo = shuffle_batch(x)
    restored = unshuffle_batch(shuffled, undo)
    gathered = concat_all_gather(torch.tensor([rank]))
    torch.save({"x": x, "shuffled": shuffled, "restored": restored, "gathered": gathered},
               f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def _train(forward, model, rows, ids, world):
    """STEPS of SGD on ``rows`` of the global batches; what each step left behind."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    views_q, views_k = global_batches(world)
    record = {"logits": [], "queue": [], "queue_ids": []}
    for step in range(STEPS):
        logits, labels = forward(views_q[step, rows], views_k[step, rows], ids=ids)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(logits, labels).backward()
        optimizer.step()
        record["logits"].append(logits.detach())
        record["queue"].append(model.queue.clone())
        record["queue_ids"].append(model.queue_ids.clone())
    record["params"] = [p.detach().clone() for p in model.encoder_q.parameters()]
    return record


def _model():
    torch.manual_seed(0)
    return MoCo(tiny_without_bn, dim=16, K=K, m=0.9, T=0.2)


def train_moco_ranks(rank, world, rendezvous, out):
    """MoCo without BN under DDP: each rank trains on its slice of the global batch."""
    _init(rank, world, rendezvous)
    model = _model()
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    ids = torch.arange(world * BATCH)[mine] % 6  # sources recur across steps
    record = _train(torch.nn.parallel.DistributedDataParallel(model), model, mine, ids, world)
    torch.save(record, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def train_moco_single(world):
    """The same run in one process on the concatenated batch."""
    model = _model()
    return _train(model, model, slice(0, world * BATCH), torch.arange(world * BATCH) % 6, world)
