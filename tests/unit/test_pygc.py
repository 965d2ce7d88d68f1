"""adpipe.pygc, in a process of its own (it changes the collector of the
process it runs in)."""

from __future__ import annotations

import json
import subprocess
import sys

from adpipe import pygc

PROBE = """
import gc, json
from adpipe import pygc
before = gc.get_freeze_count()
pygc.tune_for_batches()
print(json.dumps([before, gc.get_freeze_count(), gc.get_threshold()]))
"""


def test_the_start_up_objects_are_frozen_and_young_collections_are_rarer() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    before, after, threshold = json.loads(out)
    assert before == 0
    assert after > 1000  # the interpreter's and adpipe's modules
    assert threshold[0] == pygc.YOUNG_THRESHOLD > 700
