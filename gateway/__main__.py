"""`python -m gateway --verifier-addr HOST:PORT --port 8000 --target DIR`: the OpenAI API
until SIGINT/SIGTERM (uvicorn lets running requests finish first)."""

from __future__ import annotations

import os
import socket
import sys

import uvicorn

from ddtree.service import configure_logging, configure_threads
from gateway.app import create_app
from gateway.config import parse_config
from gateway.limits import with_header_timeout
from gateway.verifier_client import VerifierClient

# Streams still running at shutdown get this long before they are cut.
SHUTDOWN_GRACE_S = 10


def main() -> int:
    config = parse_config(sys.argv[1:], os.environ)
    configure_logging(config.log_level)
    configure_threads(os.environ)
    client = VerifierClient.from_config(config)
    app = create_app(config, client)
    # Several gateways on one port (`ddtree serve --gateway-workers N`): each binds its own
    # SO_REUSEPORT socket and the kernel spreads new connections over them.
    shared = bind_reusable(config.host, config.port) if config.reuse_port else None
    where = ({"fd": shared.fileno()} if shared is not None
             else {"host": config.host, "port": config.port})
    uvicorn.run(
        app,
        **where,  # type: ignore[arg-type]
        http=with_header_timeout(config.header_timeout_s),
        log_level=config.log_level,
        log_config=None,  # uvicorn's records go through our JSON logging
        access_log=False,  # one structured line per request comes from the gateway itself
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    return 0


def bind_reusable(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port) that other processes may bind too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    sys.exit(main())
