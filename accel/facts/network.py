"""The rendezvous port: torch's and Accelerate's default, and the one helper that finds a free port."""

from __future__ import annotations

import socket

__all__ = ["DEFAULT_PORT", "free_port", "is_port_in_use"]

#: torch.distributed's and Accelerate's default ``MASTER_PORT``
DEFAULT_PORT = 29500


def free_port(host: str = "") -> int:
    """A TCP port the operating system reports free on ``host`` right now (all interfaces by default).

    Another process may take it before it is used; callers that can should pass port 0 to the server instead.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_port_in_use(port: int | None = None, host: str = "localhost") -> bool:
    """Whether something accepts connections on ``host:port`` (:data:`DEFAULT_PORT` when not given)."""
    port = DEFAULT_PORT if port is None else port
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"a TCP port must be an integer from 1 to 65535, got {port!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((host, port)) == 0
