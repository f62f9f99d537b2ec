"""Adversarial: a correct submission that starts processes meant to outlive grading: a plain
child, one in a new session, a double fork (setsid, then the middle process exits), one exec'd
with an empty environment, and a multiprocessing child.

Expected: full marks, and none of those processes is left when grading ends. (The test run's
tag, if any, goes on the command lines of the processes that drop their environment, so a
test can find them.)
"""
import multiprocessing
import os
import subprocess
import sys
import time

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
TAG = os.environ.get("MOCO_REF_TEST_RUN", "untagged")
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)", TAG]


def views(batch):
    return batch


def _double_fork():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execve(sys.executable, SLEEP, {})  # no environment: no token, own session
        os._exit(0)


def _sleep():
    time.sleep(600)


def spawn_everything():
    subprocess.Popen(SLEEP)
    subprocess.Popen(SLEEP, start_new_session=True, env={})
    _double_fork()
    child = multiprocessing.get_context("fork").Process(target=_sleep)
    child.start()
    print("spawned 4 processes meant to outlive grading", flush=True)


def train_moco(initial, x, train, epochs=15):
    spawn_everything()
    return run(initial, x, train, epochs, views=views, seed=SEED)
