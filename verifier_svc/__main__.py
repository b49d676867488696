"""`python -m verifier_svc --target DIR --drafter-addr HOST:PORT --port P`: serve until
SIGINT/SIGTERM."""

from __future__ import annotations

import os
import sys

from ddtree.service import configure_logging, configure_threads, serve_until_signalled
from verifier_svc.config import parse_config
from verifier_svc.server import build_server

# Running generations get this long to finish before they are cut off on shutdown.
SHUTDOWN_GRACE_S = 10.0


def main() -> int:
    config = parse_config(sys.argv[1:], os.environ)
    # NVLink SHARP (NVLS) multicast is off unless asked for: it is not on every host's
    # fabric and a group fails to start when NCCL picks it there (followers inherit this).
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    configure_logging(config.log_level)
    configure_threads(os.environ)
    server, _ = build_server(config)
    serve_until_signalled(server, "verifier_svc", SHUTDOWN_GRACE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
