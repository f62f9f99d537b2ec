"""Adversarial: a buggy submission (no same-source mask: I4) that steals the observation
channel's nonce from the observer's memory and sends, as its training record, a frame whose
archive is a decompression bomb (300 MB of zeros deflated to a few hundred kB).

Expected: the frame is refused before anything is inflated (the grader's reader accepts only
stored, uncompressed archives), the channel is marked tampered with and the training checks
report an error saying so; the warm-up, observed before, is judged as usual.
"""
import io
import os
import struct
import zipfile

from _moco import moco_warmup, run, stolen_channel_writer  # noqa: F401

SEED = 0


def views(batch):
    return batch


def attack():
    writer = stolen_channel_writer()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", b"\0" * (300 * 2**20))
    body = buffer.getvalue()
    header = struct.pack(">4s16sBQ", b"MRF1", writer.nonce, 3, len(body))
    os.write(writer.fd, header + body)
    print(f"ATTACK sent a {len(body)} byte frame that inflates to 300 MB")


def train_moco(initial, x, train, epochs=15):
    attack()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
