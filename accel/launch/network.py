"""The rendezvous on this host: a free port, whether a port is taken, the loopback interface."""

from __future__ import annotations

import errno
import socket

from accel.facts import network

__all__ = ["free_port_on", "is_loopback", "loopback_interface", "port_in_use", "port_taken_on_any_address"]


def free_port_on(host: str) -> int:
    """A free port on ``host``, or on any interface when ``host`` is not an address of this machine."""
    try:
        return network.free_port(host)
    except OSError:  # ``host`` is not an address of this machine: any interface
        return network.free_port()


def port_in_use(host: str, port: int) -> bool:
    """Whether ``port`` cannot be bound on ``host`` (a socket there holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def port_taken_on_any_address(port: int) -> bool:
    """Whether a socket of this host already holds ``port`` on any address: the store that node 0 serves
    listens on all of them. Only "address in use" counts; a bind refused for another reason is no verdict."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def is_loopback(host: str) -> bool:
    """Whether ``host`` resolves to a loopback address (127.x)."""
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def loopback_interface() -> str | None:
    """Name of the network interface that carries 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        import psutil

        for name, addresses in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and str(a.address).startswith("127.") for a in addresses):
                return name
    except Exception:
        return None
    return None
