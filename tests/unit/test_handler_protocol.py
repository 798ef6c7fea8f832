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


class _Answers(Handler):
    """A handler whose every answer is its own, not the protocol's default."""

    per_batch = True
    concurrency = 7

    def __init__(self):
        self.reported, self.calls = [], []

    def __call__(self, jobs, extend):
        self.calls.append(jobs)

    def timeout_for(self, jobs, queue_timeout_s):
        return 42.0

    def task_name(self, job):
        return "t"

    def report(self, failed):
        self.reported.extend(failed)

    def stop_running(self):
        return True

    def ran_to_end(self, thread_id):
        return thread_id == 9

    def ended_at(self, thread_id):
        return 12.5


class _PassThrough:
    def process(self, queue, jobs, call):
        call()


def test_every_wrapper_passes_each_question_to_the_handler_it_wraps():
    from notifyq.consume.traced import Traced

    for make in (lambda h: reporting.Reporting(h, lambda job, exc: None),
                 lambda h: Traced(h, _PassThrough(), "q")):
        inner = _Answers()
        wrapped = make(inner)
        assert isinstance(wrapped, Handler) and wrapped.per_batch
        assert (wrapped.concurrency, wrapped.timeout_for([], 3.0), wrapped.task_name(None)) == (7, 42.0, "t")
        assert wrapped.stop_running() and wrapped.ran_to_end(9) and not wrapped.ran_to_end(1)
        assert wrapped.ended_at(9) == 12.5
        wrapped([], lambda: None)
        assert inner.calls == [[]]
    traced_inner = _Answers()
    Traced(traced_inner, _PassThrough(), "q").report(["failed"])
    assert traced_inner.reported == ["failed"]
