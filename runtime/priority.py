"""A worker runs the model at the process priority everything beside it has.

Ray starts its workers at niceness 15 unless its raylet was told otherwise (`RAY_worker_niceness=0` before
`ray start`; the embedded Ray of `tandem serve` is started so). At 15 a worker gets the cores only when no
other process wants them: on a small machine its steps stretch whenever the router streams (measured on
2 cores: the same prefill step took 0.78 to 1.47 s).
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("tandem.runtime")


def run_at_normal_priority(name: str) -> int:
    """Lower this process's niceness to 0 where it is above it and the process may (root, CAP_SYS_NICE or
    RLIMIT_NICE); warn where it may not. Returns the niceness in force."""
    niceness = os.nice(0)
    if niceness <= 0:
        return niceness
    try:
        return os.nice(-niceness)
    except PermissionError:
        logger.warning("%s runs at niceness %d (Ray's default for its workers): its steps yield the cores to "
                       "every other process. Start Ray with RAY_worker_niceness=0 set.", name, niceness)  # fmt: skip
        return niceness
