-- notifyq schema, version 7: flow control (limits per key and per queue, rates, fairness).
--
-- job_key: the key a job's limits count it under (put(..., key=)), NULL for a job without one.
-- Added last: an instant ALTER (MySQL 8.0.12+, MariaDB 10.3+); only when not there yet, so an
-- interrupted `init` can simply run again.
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'job_key') = 0,
                 'ALTER TABLE nq_job ADD COLUMN job_key VARCHAR(191) NULL',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;

-- ---------------------------------------------------------------- concurrency and fairness

-- ---------------------------------------------------------------- rates
--
-- nq_rate: each rate budget's log of its last N starts (a sliding log, store/rates.py), one row
-- per slot 0..N-1 of a budget: the queue's own (`rate`, rate_key '': a job key is never empty)
-- or one key's (`rate_per_key`). A start takes the slot with the oldest time, and only once that
-- time is a whole period old: so no window of one period ever holds more than N starts. Written
-- in the claim's own transaction (a start counts only if its claim commits), under the lock of
-- the budget's rows. claim_token: the claim that spent the slot (0: notifyq.consume_rate), so a
-- claim that runs again gives back what its earlier, committed try spent.
CREATE TABLE IF NOT EXISTS nq_rate (
    queue        VARCHAR(64)     NOT NULL,
    rate_key     VARCHAR(191)    NOT NULL,
    slot         INT UNSIGNED    NOT NULL,
    started_at   DATETIME(6)     NOT NULL,
    claim_token  BIGINT UNSIGNED NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, rate_key, slot)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- nq_rate_hold: when a rate next frees a start for jobs a claim held back, per queue: the idle
-- watcher's wait ends then (watch_bell and poll_signal read it as they read the next due job),
-- so a held job waits for its refill, not for a poll of the jobs table.
CREATE TABLE IF NOT EXISTS nq_rate_hold (
    queue        VARCHAR(64)     NOT NULL,
    wake_at      DATETIME(6)     NULL,
    PRIMARY KEY (queue)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- ---------------------------------------------------------------- versions
-- Rolling deploys (docs/deploys.md). min_version: the lowest consumer code version that may run
-- the job (put(..., min_version=), a task's min_version), NULL for a job any consumer runs; a
-- claim never takes one its consumer's `version` is below (queries.lock_window). stopping: the
-- consumer was asked to stop (SIGTERM): should it die before it settles what it holds, the
-- reaper gives those jobs back as interrupted, uncharged (liveness.take_back). Instant ALTERs,
-- each only when not there yet, so an interrupted `init` can simply run again.
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'min_version') = 0,
                 'ALTER TABLE nq_job ADD COLUMN min_version INT UNSIGNED NULL',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_consumer' AND COLUMN_NAME = 'stopping') = 0,
                 'ALTER TABLE nq_consumer ADD COLUMN stopping TINYINT NOT NULL DEFAULT 0',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;

-- ---------------------------------------------------------------- durable steps
--
-- nq_step: a job's finished steps (job.step(name), store/steps.py), one row per step that
-- committed: its result (JSON), and the claim and attempt that stored it. A later run of the job
-- (a retry, a run after a take-back) reads them and skips those steps. Written fenced by the
-- claim (the job still claimed by that token, its row locked in share mode until the step
-- commits), in the step's own transaction or in the job.transaction() block it was taken in.
-- Deleted with the job's last attempt record (retention: admin_queries.purge_old_attempts and
-- purge_gone_attempts).
CREATE TABLE IF NOT EXISTS nq_step (
    job_id       BIGINT UNSIGNED   NOT NULL,
    name         VARCHAR(191)      NOT NULL,
    result       MEDIUMTEXT        NOT NULL,
    claim_token  BIGINT UNSIGNED   NOT NULL,
    attempt      SMALLINT UNSIGNED NOT NULL,
    done_at      DATETIME(6)       NOT NULL,
    PRIMARY KEY (job_id, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
