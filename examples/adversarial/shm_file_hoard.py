"""Adversarial: train_moco writes 900 MB into one file of ``/dev/shm`` (a tmpfs: its pages
are memory, in no process's resident set once the file is closed) and leaves it there.

Expected (with ``--memory-mb 512``): the training checks report an error, on every rung. In
the bwrap sandbox the job's ``/dev/shm`` is a tmpfs of its own of 64 MB: the write fails
with "No space left on device" and train_moco raises; the tmpfs goes with the job. On the
confined rung ``/dev/shm`` is the container's: the job's files there count against its
memory, so it is stopped at its limit, and its files are removed when it ends.
"""
import time

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def hoard(path, megabytes):
    block = b"x" * 2**20
    with open(path, "wb") as handle:
        for written in range(megabytes):
            try:
                handle.write(block)
                handle.flush()
            except OSError as error:
                print(f"ATTACK /dev/shm: {written} MB, then {error.strerror}", flush=True)
                raise


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    hoard("/dev/shm/moco-hoard", 900)
    print("ATTACK /dev/shm: 900 MB kept", flush=True)
    time.sleep(60)
    return run(initial, x, train, epochs, views=views, seed=SEED)
