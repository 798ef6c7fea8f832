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
