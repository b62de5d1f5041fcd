"""A serving process's garbage collector (`runtime.serving_gc`): what start-up left alive is frozen out of every
later collection, and what it left as garbage is collected first, not frozen forever. In a child process:
the settings are process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import gc, json, weakref
    from runtime.serving_gc import tune_gc_for_serving

    class Node:
        pass

    kept = [Node() for _ in range(50_000)]  # start-up's long-lived objects (tracked by the collector)
    cycle = Node(); cycle.me = cycle  # start-up's garbage: only the collector frees a cycle
    cycle_gone = weakref.ref(cycle)
    del cycle
    gc.disable()  # no collection may happen on its own before the tune
    tune_gc_for_serving()
    gc.enable()
    tracked_after = len(gc.get_objects())
    print(json.dumps({"frozen": gc.get_freeze_count(), "tracked_after": tracked_after,
                      "cycle_collected": cycle_gone() is None, "threshold": gc.get_threshold()[0]}))
""")


def test_start_ups_objects_are_frozen_out_of_collections_and_its_garbage_collected_first():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    result = json.loads(done.stdout)
    assert result["frozen"] >= 50_000  # every object alive at the tune
    assert result["tracked_after"] < 1_000  # a full collection now walks only what came after
    assert result["cycle_collected"]  # not frozen with the rest, where it would never be freed
    assert result["threshold"] == 20_000
