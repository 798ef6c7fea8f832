-- Statements of notifyq.testing only (an app's tests: look at a queue, run its delayed jobs
-- now, clear it). Kept apart from queries.sql: none of them is on a consumer's or a producer's
-- path, and none may ever be. Same format: '-- name --' then why.

-- testing_jobs --
-- A queue's jobs in the given states, oldest first: what a test asserts was enqueued. A plain
-- read: on the caller's connection it sees the caller's own uncommitted puts (a Django TestCase).
SELECT id, queue, status, priority, run_at, attempts, max_attempts, dedup_key, payload, last_error,
       created_at, job_key
FROM nq_job
WHERE queue = %(queue)s AND status IN %(statuses)s
ORDER BY id
LIMIT %(limit)s

-- testing_statuses --
-- Where the jobs a drain ran ended (a done job that is not kept has no row).
SELECT id, status, attempts FROM nq_job WHERE id IN %(ids)s

-- testing_run_delayed --
-- drain(run_delayed=True): a queue's scheduled jobs (delayed puts, retries waiting for their
-- backoff) fall due now; the claim promotes them as it promotes any due job.
UPDATE nq_job SET run_at = UTC_TIMESTAMP(6)
WHERE queue = %(queue)s AND status = 1 AND run_at > UTC_TIMESTAMP(6)

-- testing_clear_jobs --
-- clear(): a queue's jobs (every queue's when `every`), whatever their state.
DELETE FROM nq_job WHERE %(every)s OR queue = %(queue)s

-- testing_clear_attempts --
DELETE FROM nq_attempt WHERE %(every)s OR queue = %(queue)s

-- testing_clear_dedup --
-- The dedup keys the deleted jobs held: a test's put with a key must not find the last test's.
DELETE FROM nq_dedup WHERE %(every)s OR queue = %(queue)s

-- testing_clear_periodic --
-- The last periodic tick: a test's scheduler starts as on a new database.
DELETE FROM nq_periodic WHERE %(every)s OR queue = %(queue)s

-- testing_resume --
-- A queue a test paused is not paused in the next.
UPDATE nq_queue SET paused = 0 WHERE (%(every)s OR queue = %(queue)s) AND paused = 1
