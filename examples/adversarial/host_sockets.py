"""Adversarial: a buggy submission (no same-source mask: I4) that looks for a way out through
UNIX sockets, which a network namespace does not cover: every socket file under ``/run``,
``/var/run``, ``/tmp`` and the home folder (the Docker daemon, D-Bus, an X server, an SSH
agent), the usual abstract names, and TCP on the loopback to ports a host service might use.

Expected: fails I4 exactly; it reaches nothing (it prints what it tried).
"""
import os
import socket
import stat

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
ABSTRACT = ("\0/tmp/.X11-unix/X0", "\0/org/freedesktop/dbus", "\0containerd-shim")
PORTS = (22, 80, 2375, 5432, 6379, 8080)


def views(batch):
    return batch


def _socket_files():
    for top in ("/run", "/var/run", "/tmp", os.path.expanduser("~")):
        for root, _, files in os.walk(top, onerror=lambda error: None):
            for name in files:
                path = os.path.join(root, name)
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        yield path
                except OSError:
                    pass


def attack():
    tried, reached = 0, []
    for address in [*_socket_files(), "/var/run/docker.sock", "/run/dbus/system_bus_socket",
                    *ABSTRACT]:
        tried += 1
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                sock.connect(address)
                reached.append(address.replace("\0", "@"))
        except OSError:
            pass
    for port in PORTS:
        tried += 1
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            reached.append(f"127.0.0.1:{port}")
        except OSError:
            pass
    print(f"ATTACK sockets tried: {tried}; reached: {', '.join(reached) or 'none'}")


def train_moco(initial, x, train, epochs=15):
    attack()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
