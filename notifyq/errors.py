"""One exception hierarchy and the exit codes the CLI maps it to.

Operators script against the exit codes, so they are part of the contract. What each code means
is written once, in docs/configuration.md ("Exit codes"); `notifyq --help` (run/cli.py) lists
them in short, and tests/unit/test_docs.py keeps the table, these constants and the help in step.
"""

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_INPUT = 4
EXIT_DB = 5
EXIT_SCHEMA = 6
EXIT_SERVER = 7
EXIT_HANDLER = 8
EXIT_UNKNOWN_OUTCOME = 9
EXIT_RUNNING = 10
EXIT_KILLED = 130


class NotifyqError(Exception):
    """Base of every error notifyq raises on purpose; `str()` is one line for the user."""

    exit_code = EXIT_INTERNAL


class ConfigError(NotifyqError):
    """Bad configuration: an unknown key, a value out of range, a bad DSN, an unreadable file."""

    exit_code = EXIT_CONFIG


class InputError(NotifyqError):
    """Bad user data: nothing was written."""

    exit_code = EXIT_INPUT


class DatabaseError(NotifyqError):
    """The server could not be reached, or refused us, after retrying."""

    exit_code = EXIT_DB


class TransientDBError(DatabaseError):
    """A retryable database failure that outlived the retry policy."""


class GrantMissing(DatabaseError):
    """The server refused a statement for want of a privilege (a table the database user has no
    grant on, as after an upgrade that added one). Not retried, as waiting grants nothing: the
    exit code is the configuration's, and `notifyq init --print-grants USER` says what to grant."""

    exit_code = EXIT_CONFIG


class SchemaError(NotifyqError):
    """The database has no notifyq schema, or one older or newer than this notifyq's: run
    `notifyq init`, or upgrade notifyq on this host."""

    exit_code = EXIT_SCHEMA


class UnsupportedServer(NotifyqError):
    """A server without SKIP LOCKED: MySQL before 8.0.1, MariaDB before 10.6."""

    exit_code = EXIT_SERVER


class WriterRefused(NotifyqError):
    """A server notifyq must not write through, refused at every connect: a MySQL Group
    Replication (InnoDB Cluster) group in multi-primary mode or a member that is not its
    primary (named locks are not certified across members), or super_read_only or
    offline_mode on. Not retried: point the DSN at the group's primary (MySQL Router's
    read-write port) (docs/high-availability.md#mysql-group-replication-innodb-cluster)."""

    exit_code = EXIT_SERVER


class HandlerError(NotifyqError):
    """A handler could not be loaded at all (not: a handler that raised)."""

    exit_code = EXIT_HANDLER


class JobFailed(NotifyqError):
    """A job failed, where no Python exception says so: what an on_failure hook gets for a
    command's non-zero exit or job.fail() in a batch handler, and what Producer.result() raises
    for a job that ended dead. str() is the job's error."""


class OutcomeUnknown(NotifyqError):
    """The connection died during COMMIT: the jobs may or may not be stored."""

    exit_code = EXIT_UNKNOWN_OUTCOME


class AlreadyRunning(NotifyqError):
    """Another process holds the pidfile (classic daemon mode)."""

    exit_code = EXIT_RUNNING


class ClaimLost(NotifyqError):
    """job.transaction() / job.complete_in(): the claim was taken back (its lease ran out, or
    its consumer was judged dead) before the job's completion could commit. The transaction is
    rolled back: none of the handler's writes in it are stored, and the job is someone else's."""


class TransactionEnded(NotifyqError):
    """job.transaction(): the block's transaction ended inside the block (a COMMIT, a ROLLBACK,
    or a statement with an implicit COMMIT), so its writes cannot commit with the job's
    completion. The job fails and is not retried: a rerun would store again what was stored."""


class ResultPending(NotifyqError):
    """Producer.result(): the job has not finished within the wait."""


class Snooze(Exception):
    """Raised by a handler: put the job back for `seconds` without spending an attempt
    (job.snooze(seconds) does the same without raising). Not a NotifyqError: it is no error."""

    def __init__(self, seconds: float):
        super().__init__(f"snoozed for {seconds:g} s")
        self.seconds = float(seconds)
