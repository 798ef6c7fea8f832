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
