"""A handler for the status page tests: it fails with markup in its error, which the pages
must show as text."""


def fail_with_markup(job):
    raise ValueError(f"<b>refused</b> <script>window.pwnedByError = 1</script> job {job.id}")
