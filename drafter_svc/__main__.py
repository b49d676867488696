"""`python -m drafter_svc --drafter DIR --target DIR --port P`: serve until SIGINT/SIGTERM."""

from __future__ import annotations

import os
import signal
import sys
import threading

import structlog

from ddtree.service import configure_logging
from drafter_svc.config import parse_config
from drafter_svc.server import build_server

# In-flight draft rounds are short; give them this long to finish on shutdown.
SHUTDOWN_GRACE_S = 5.0


def main() -> int:
    config = parse_config(sys.argv[1:], os.environ)
    configure_logging(config.log_level)
    server, _ = build_server(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    structlog.get_logger("drafter_svc").info("drafter_stopping")
    server.stop(SHUTDOWN_GRACE_S).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
