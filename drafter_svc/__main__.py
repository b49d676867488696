"""`python -m drafter_svc --drafter DIR --target DIR --port P`: serve until SIGINT/SIGTERM."""

from __future__ import annotations

import os
import sys

from ddtree.service import configure_logging, configure_threads, serve_until_signalled
from drafter_svc.config import parse_config
from drafter_svc.server import build_server

# In-flight draft rounds are short; give them this long to finish on shutdown.
SHUTDOWN_GRACE_S = 5.0


def main() -> int:
    config = parse_config(sys.argv[1:], os.environ)
    configure_logging(config.log_level)
    configure_threads(os.environ)
    server, _ = build_server(config)
    serve_until_signalled(server, "drafter_svc", SHUTDOWN_GRACE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
