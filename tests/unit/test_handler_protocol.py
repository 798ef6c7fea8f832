"""The Handler protocol (consume/handler.py): every handler the consumer builds declares it, a
bare object of `per_batch` and the call takes its defaults, and Reporting asks the handler it wraps."""

from notifyq.consume import commands, handlers, reporting
from notifyq.consume.handler import Handler, declared


def test_the_consumers_handlers_declare_the_protocol_and_keep_their_answers():
    python = handlers.PythonHandler(lambda job: None, False, concurrency=4)
    command = commands.CommandHandler("true", False, 5.0)
    wrapped = reporting.Reporting(python, lambda job, exc: None)
    assert all(isinstance(h, Handler) for h in (python, command, wrapped))
    assert (python.timeout_for([], 3.0), command.timeout_for([], 3.0), wrapped.timeout_for([], 3.0)) == (3.0, 0.0, 3.0)
    assert (python.concurrency, command.concurrency, wrapped.concurrency) == (4, 1, 4)
    assert not python.stop_running() and not wrapped.stop_running()
    assert command.stop_running()  # (nothing runs: it ends at once)


def test_a_bare_object_of_per_batch_and_the_call_takes_the_defaults():
    calls = []

    class Recorder:
        per_batch = True

        def __call__(self, jobs, extend):
            calls.append(jobs)

    handler = declared(Recorder())
    handler(["j"], lambda: None)
    assert calls == [["j"]] and handler.per_batch and handler.concurrency == 1
    assert handler.timeout_for(["j"], 3.0) == 0.0 and not handler.stop_running()
    handler.report(["j"])  # nobody to tell
    assert declared(handler) is handler
