"""The systemd notify protocol (READY, STOPPING, WATCHDOG) over $NOTIFY_SOCKET, stdlib only."""

from __future__ import annotations

import os
import socket


def notify(message: str, environ: dict[str, str] | None = None) -> bool:
    """Send one notification; False (and nothing else) when not run by systemd with Type=notify."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError:
        return False
    return True


def watchdog_interval_s(environ: dict[str, str] | None = None) -> float | None:
    """Half the watchdog timeout systemd asks for (the recommended ping period), or None."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000
