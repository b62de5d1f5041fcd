"""The "tandem" logger: INFO to stderr by default, as vLLM users expect start-up lines.

Set TANDEM_LOG_LEVEL (e.g. WARNING) to change it. An application that configures
its own handlers on the "tandem" logger first keeps them.
"""

import logging
import os

_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


def configure_logging() -> None:
    logger = logging.getLogger("tandem")
    if logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(os.environ.get("TANDEM_LOG_LEVEL", "INFO").upper())
    logger.propagate = False
