"""The ``builder`` probe's two-process run: runs INSIDE the submission's process (and two
children of it) and records what an official-style module does when trained on two ranks.

The submission's process forks one child per rank and waits for both (at most
``RANKS_SECONDS``, then it kills them), so nothing in it ever waits on a collective. Both
children join a gloo group (CPU, a ``file://`` rendezvous, loopback sockets), build the module
with the same seed, keep it in step as the official script's ``DistributedDataParallel`` does
(parameters and buffers from rank 0 at the start, buffers from rank 0 before every forward,
gradients averaged after every backward: ``DataParallelStep``, plain collectives the probe
controls, with no reducer threads in a process that forks), and train it on their own shard
of one *world batch* of ``ranks · batch`` images (rank r takes rows
``r·batch … (r+1)·batch − 1``). After the build each rank draws from its own random stream
(as ranks do without a shared ``--seed``), so a shuffle that is not broadcast from rank 0
differs between ranks.

Every image of the world batch is registered with each rank's recorder under its *global* row,
so a forward on rows gathered from the other rank is traced to their images. Each child sends
its run through a pipe (``torch.save`` of plain data). Nothing here judges.
"""

from __future__ import annotations

import io
import os
import select
import signal
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from moco_ref.observe.builder_probe import (
    BuilderRecorder,
    build_options,
    describe_module,
    state_of,
    train_step,
)
from moco_ref.observe.tracebacks import submission_error_text
from moco_ref.probe.builder import BuilderProbe, ranks_probe, world_images
from moco_ref.probe.schema import BuilderRanks, BuilderRun

COLLECTIVE_TIMEOUT = timedelta(seconds=8)  # a rank stuck in a collective its peer left
RANKS_SECONDS = 12.0  # the whole two-process run; a correct module needs well under 1 s
MAX_RECORD_BYTES = 64 * 2**20


class DataParallelStep:
    """What ``DistributedDataParallel`` does to a module around one training step, in plain
    collectives: rank 0's parameters and buffers at the start, rank 0's buffers before every
    forward (``broadcast_buffers=True``, so a queue kept in a buffer is rank 0's), and the
    gradients of the trained parameters averaged over the ranks after the backward."""

    def __init__(self, model: torch.nn.Module, world: int) -> None:
        self.model = model
        self.world = world
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor, src=0)

    def __call__(self, im_q: torch.Tensor, im_k: torch.Tensor):
        with torch.no_grad():
            for buffer in self.model.buffers():
                dist.broadcast(buffer, src=0)
        return self.model(im_q, im_k)

    def average_gradients(self) -> None:
        for parameter in self.model.parameters():
            if not parameter.requires_grad:
                continue
            if parameter.grad is None:  # every rank takes part in every all_reduce
                parameter.grad = torch.zeros_like(parameter)
            dist.all_reduce(parameter.grad)
            parameter.grad.div_(self.world)


def _rank_run(moco_class, probe: BuilderProbe, rank: int, folder: str) -> BuilderRun:
    """Join the group as ``rank``, build, wrap in DDP and train; the run as plain data."""
    run: BuilderRun = {"mlp": False, "error": None, "stage": "group", "steps": []}
    recorder = BuilderRecorder(probe)
    try:
        dist.init_process_group("gloo", init_method=(Path(folder) / "rendezvous").as_uri(),
                                rank=rank, world_size=probe.ranks, timeout=COLLECTIVE_TIMEOUT)
        run["stage"] = "construct"
        options = build_options(moco_class, probe)
        torch.manual_seed(probe.seed)
        model = moco_class(recorder.base_encoder, **options)
        recorder.follow(model)
        run["module"] = describe_module(model, recorder)
        run["initial"] = state_of(model)
        run["stage"] = "the first broadcast of the parameters and buffers"
        parallel = DataParallelStep(model, probe.ranks)
        optimizer = torch.optim.SGD(model.parameters(), lr=probe.lr)
        torch.manual_seed(probe.seed + 1 + rank)  # each rank its own random stream
        shard = slice(rank * probe.batch, (rank + 1) * probe.batch)
        for t in range(probe.steps):
            run["stage"] = f"step {t}"
            world_q, world_k = world_images(probe, t)
            run["steps"].append(train_step(model, optimizer, recorder, world_q[shard],
                                           world_k[shard], call=parallel,
                                           traced=(world_q, world_k),
                                           after_backward=parallel.average_gradients))
        run["stage"] = "done"
    except BaseException as exc:  # noqa: BLE001 - the submission's failure is data
        if isinstance(exc, KeyboardInterrupt):
            raise
        run["error"] = submission_error_text(exc)
    finally:
        if dist.is_initialized():  # closes the sockets, so a peer waiting on us fails fast
            dist.destroy_process_group()
    return run


def _send(fd: int, run: BuilderRun) -> None:
    buffer = io.BytesIO()
    torch.save(run, buffer)
    data = buffer.getvalue()
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(len(data).to_bytes(8, "little") + data)


def _receive_all(pipes: dict[int, int], deadline: float) -> dict[int, bytes | str]:
    """Every rank's bytes, read from all pipes at once (a rank blocks on a full pipe until it
    is read); a rank still writing at ``deadline``, or sending too much, gets a reason."""
    data = {rank: b"" for rank in pipes}
    open_fds = {fd: rank for rank, fd in pipes.items()}
    result: dict[int, bytes | str] = {}
    while open_fds:
        wait = deadline - time.monotonic()
        if wait <= 0:
            for rank in open_fds.values():
                result[rank] = (f"rank {rank} did not finish within {RANKS_SECONDS:g} s (a "
                                "collective the other rank never joined, or a loop)")
            break
        ready, _, _ = select.select(list(open_fds), [], [], wait)
        for fd in ready:
            chunk = os.read(fd, 1 << 20)
            rank = open_fds[fd]
            if chunk and len(data[rank]) + len(chunk) <= MAX_RECORD_BYTES + 8:
                data[rank] += chunk
                continue
            if chunk:
                result[rank] = f"rank {rank}'s record is larger than {MAX_RECORD_BYTES} bytes"
            del open_fds[fd]
    for rank, fd in pipes.items():
        os.close(fd)
        result.setdefault(rank, data[rank])
    return result


def _decode(rank: int, data: bytes | str) -> BuilderRun | str:
    if isinstance(data, str):
        return data
    size = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if size != len(data) - 8:
        return f"rank {rank} ended without sending its run (it was killed, or exited)"
    run = torch.load(io.BytesIO(data[8:]), weights_only=True)
    return run if isinstance(run, dict) else f"rank {rank} sent no run"


def observe_ranks(moco_class, probe: BuilderProbe, *, symmetric: bool = False) -> BuilderRanks:
    """Train ``moco_class`` on ``probe.ranks`` (two) processes, each a child of this one (so
    nothing here waits on a collective, and this process's state is untouched); both runs.
    ``symmetric``: the module enqueues both views' keys (its K holds a multiple of twice the
    world batch, ``ranks_probe``); ``train_step`` records both pairs of each forward.

    Must be called outside any process group (``dist.is_initialized()`` False)."""
    probe = ranks_probe(probe, symmetric=symmetric)
    result: BuilderRanks = {"world": probe.ranks, "runs": [], "error": None}
    if not dist.is_available() or dist.is_initialized():
        result["error"] = "unavailable: no fresh torch.distributed in this process"
        return result
    saved_interface = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    children: list[int] = []
    try:
        with tempfile.TemporaryDirectory(prefix="moco-ref-ranks-") as folder:
            pipes = {}
            for rank in range(probe.ranks):
                read_end, write_end = os.pipe()
                child = os.fork()
                if child == 0:  # one rank: its run, then gone without anyone's cleanup
                    code = 0
                    try:
                        os.close(read_end)
                        for other in pipes.values():
                            os.close(other)
                        _send(write_end, _rank_run(moco_class, probe, rank, folder))
                    except BaseException:  # noqa: BLE001
                        code = 1
                    finally:
                        os._exit(code)
                os.close(write_end)
                pipes[rank] = read_end
                children.append(child)
            received = _receive_all(pipes, time.monotonic() + RANKS_SECONDS)
    finally:
        for child in children:
            _reap(child)
        if saved_interface is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = saved_interface
    runs = {rank: _decode(rank, data) for rank, data in received.items()}
    missing = [why for why in runs.values() if isinstance(why, str)]
    result["runs"] = [run for _, run in sorted(runs.items()) if not isinstance(run, str)]
    result["error"] = "; ".join(missing) or None
    return result


def _reap(child: int) -> None:
    """Wait briefly for a rank to exit, then kill it."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        pid, _ = os.waitpid(child, os.WNOHANG)
        if pid:
            return
        time.sleep(0.01)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
