"""`tandem serve` with its defaults under the five loads of scripts/bench_loads.py, scaled to a tiny model.

The script is run as a user runs it: it starts `tandem serve --model DIR` (every other setting at its
default), drives it with scripts/bench_serving.py (one stream, the burst, the Poisson arrivals, the shared prefixes
and the flood), and exits non-zero if any request failed or any worker restarted. The full-size run,
with vLLM's own load generator and vLLM's server beside it, is in BENCHMARKS.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_request_of_every_load_completes_and_no_worker_restarts(tiny_model_dirs):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    cmd = [sys.executable, "scripts/bench_loads.py", "--model", tiny_model_dirs["llama"], "--client", "ours",
           "--scale", "0.5", "--length-scale", "0.25"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "tandem" in line]
    assert [row.split(" | ")[0].strip("| ") for row in rows] == ["one-stream", "burst", "poisson", "prefixes", "flood"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        sent = cells[3].split(" / ")
        assert sent[0] == sent[1] and cells[4] == "0" and cells[5] == "0", row  # completed all, none failed, no restart
