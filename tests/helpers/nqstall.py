"""A consumer whose first reaper pass stalls right after it took the reaper lock: the stand-in for
a host that vanished mid-pass (the test then SIGSTOPs the process). Loaded by `--handler
nqstall:record`, so the patch is in place before the worker starts. Writes "holding" to
$NQ_TEST_OUT/stalled once inside the pass."""

import os
import threading

from notifyq.store import liveness

_real = liveness.dead_consumers


def _stalled(session, *args):
    with open(os.path.join(os.environ["NQ_TEST_OUT"], "stalled"), "w") as f:
        f.write("holding\n")
    threading.Event().wait()  # never returns: the pass holds the reaper lock for good
    return _real(session, *args)


liveness.dead_consumers = _stalled


def record(job):
    pass
