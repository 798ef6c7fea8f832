"""A handler for the status page tests: it fails with markup in its error, which the pages
must show as text."""


def fail_with_markup(job):
    raise ValueError(f"<b>refused</b> <script>window.pwnedByError = 1</script> job {job.id}")


def until_cancelled(job):
    """Runs until the job is asked to stop (the console's cancel), at most a minute; then it
    returns, and the job ends cancelled."""
    import threading
    import time

    deadline = time.monotonic() + 60
    pause = threading.Event()
    while not job.cancel_requested(max_age_s=0.1):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job.id} was never cancelled")
        pause.wait(0.05)  # a handler's own pace, not a test's synchronisation


def succeed_or_fail(job):
    """Done, unless the payload says fail (then the attempt fails)."""
    if job.payload.get("fail"):
        raise ValueError("asked to fail")
