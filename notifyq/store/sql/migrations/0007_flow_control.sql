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

-- nq_flow_key: one row per (queue, key) a limited or fair queue's claims have met, and one per
-- queue with the empty key (no job key is empty) for the queue's `limit`. A claim locks the
-- rows of the keys it takes (FOR UPDATE SKIP LOCKED: a key another consumer is claiming right
-- now is skipped, not waited on), and under that lock counts the key's running jobs from its
-- claimed rows: no counter, so nothing to drift (queries_flow.py).
CREATE TABLE IF NOT EXISTS nq_flow_key (
    queue    VARCHAR(64)  NOT NULL,
    job_key  VARCHAR(191) NOT NULL,
    PRIMARY KEY (queue, job_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- ix_key: a key's ready jobs in claim order, and which keys have ready jobs (a loose scan), so
-- that one key's 50,000 ready jobs cannot hide another key's 10 from a claim. Over virtual
-- columns whose values never change for a job without a key (ready_key NULL, key_prio its
-- negated priority, run_at): its claim, ack_keep and burial leave its ix_key entry in place,
-- so an unkeyed job pays one entry at insert and one at delete, and nothing in between.
SET @nq_ddl = CONCAT_WS(', ',
    IF((SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'ready_key') = 0,
       'ADD COLUMN ready_key VARCHAR(191) AS (IF(status = 0, job_key, NULL)) VIRTUAL', NULL),
    IF((SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'key_prio') = 0,
       'ADD COLUMN key_prio INT AS (-priority) VIRTUAL', NULL));
SET @nq_ddl = IF(@nq_ddl = '', 'DO 0', CONCAT('ALTER TABLE nq_job ', @nq_ddl));
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;

SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
                  AND TABLE_NAME = 'nq_job' AND INDEX_NAME = 'ix_key') = 0,
                 'ALTER TABLE nq_job ADD INDEX ix_key (queue, ready_key, key_prio, run_at)',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;

-- ---------------------------------------------------------------- rates
