"""How a step's process tells the parent what it found: figure lines, and a skip with its reason.

A step prints `figure: NAME = VALUE` for each key figure (the summary lists them) and ends with
exit status 0 (passed), SKIPPED with a `skip: REASON` line last, or anything else (failed; the
last line of its output is the reason shown). 77 is automake's "skipped" status.
"""

from __future__ import annotations

import importlib.util
import re
import sys

SKIPPED = 77
FIGURE = re.compile(r"^figure: (?P<name>.+?) = (?P<value>.*)$")
SKIP = re.compile(r"^skip: (?P<reason>.*)$")


def figure(name: str, value) -> None:
    print(f"figure: {name} = {value}", flush=True)


def skip(reason: str) -> None:
    """End the step as skipped, saying why."""
    print(f"skip: {reason}", flush=True)
    sys.exit(SKIPPED)


def importable(name: str) -> bool:
    """Whether `name` can be imported here: a package blocked by TANDEM_CHECK_WITHOUT raises in find_spec,
    where an absent one gives None."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False
