"""`python -m gateway --verifier-addr HOST:PORT --port 8000 --target DIR`: the OpenAI API
until SIGINT/SIGTERM (uvicorn lets running requests finish first)."""

from __future__ import annotations

import os
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
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        http=with_header_timeout(config.header_timeout_s),
        log_level=config.log_level,
        log_config=None,  # uvicorn's records go through our JSON logging
        access_log=False,  # one structured line per request comes from the gateway itself
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
