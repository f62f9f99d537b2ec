"""Adversarial: a buggy submission (no same-source mask: I4) whose train_moco starts 300
threads first — more than the job's 256 processes and threads, a limit the kernel would not
enforce for a job whose host user was root — and goes on with what it got.

Expected: fails I4 exactly, as without the attack: the threads past the limit do not start
(it prints how many did), the job is not stopped, the grader and its neighbours notice
nothing.
"""
import threading

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def swarm():
    threading.stack_size(256 * 1024)  # the process limit is met, not the address space's
    stop, started = threading.Event(), 0
    try:
        for _ in range(300):
            threading.Thread(target=stop.wait, daemon=True).start()
            started += 1
        print("ATTACK threads started: all 300")
    except RuntimeError as error:
        print(f"ATTACK threads started: {started}, then {error}")
    finally:
        stop.set()
        threading.stack_size(0)


def train_moco(initial, x, train, epochs=15):
    swarm()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
