"""`python -m verifier_svc --target DIR --drafter-addr HOST:PORT --port P`: serve until
SIGINT/SIGTERM."""

from __future__ import annotations

import os
import signal
import sys
import threading

import structlog

from ddtree.service import configure_logging
from verifier_svc.config import parse_config
from verifier_svc.server import build_server

# Running generations get this long to finish before they are cut off on shutdown.
SHUTDOWN_GRACE_S = 10.0


def main() -> int:
    config = parse_config(sys.argv[1:], os.environ)
    configure_logging(config.log_level)
    server, _ = build_server(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    structlog.get_logger("verifier_svc").info("verifier_stopping")
    server.stop(SHUTDOWN_GRACE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
