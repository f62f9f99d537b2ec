"""Adversarial: train_moco forks a child that makes a file in a folder of its own in
``/dev/shm``, unlinks it at once and writes 900 MB into it: the file has no name left to
find, it is not mapped (in no resident set) and not a ``memfd``; the child holds it open and
sleeps, the parent waits for its word.

Expected (with ``--memory-mb 512``): the training checks report an error, on every rung. In
the bwrap sandbox the job's own 64 MB ``/dev/shm`` fills (the child says so and train_moco
raises). On the confined rung a file on ``/dev/shm`` that a process of the job holds open
counts against its memory whether or not it still has a name, so the job is stopped at its
limit; the child dies with it, and with it the file; the folder is removed at the job's end.
"""
import os
import time

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def child_hoard(megabytes):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        word = b"ok"
        try:
            folder = f"/dev/shm/moco-hidden-{os.getpid()}"
            os.mkdir(folder, 0o700)
            fd = os.open(f"{folder}/hoard", os.O_RDWR | os.O_CREAT, 0o600)
            os.unlink(f"{folder}/hoard")
            block = b"x" * 2**20
            for _ in range(megabytes):
                os.write(fd, block)
        except OSError as error:
            word = f"no: {error.strerror}".encode()
        os.write(write_end, word)
        time.sleep(120)
        os._exit(0)
    os.close(write_end)
    word = os.read(read_end, 200).decode()
    print(f"ATTACK the child's unlinked /dev/shm file: {word}", flush=True)
    if word != "ok":
        raise OSError(word)


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    child_hoard(900)
    time.sleep(60)
    return run(initial, x, train, epochs, views=views, seed=SEED)
