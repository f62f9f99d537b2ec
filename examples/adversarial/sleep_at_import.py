"""Adversarial: a long sleep at import (say, a training run at top level that never ends).

Expected: not gradable ("timed out ... while loading the submission").
"""
import time

time.sleep(3600)


def moco_warmup():
    return {}
