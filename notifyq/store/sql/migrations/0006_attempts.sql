-- notifyq schema, version 6: every attempt's record, the completion's marker, and cancelled jobs.
--
-- One row per attempt that ended (per claim of a job: a claim token is unique), written in the
-- same transaction as the outcome it records: the ack (outcome 'done'), the retry ('failed'),
-- the burial ('dead'); a completion committed with the handler's own writes (job.transaction(),
-- job.complete_in()) writes its 'done' row in the handler's transaction, and that row is how a
-- COMMIT whose reply was lost is found out to have landed. A job keeps its last few attempts
-- (queries.ATTEMPTS_KEPT); the rows outlive a deleted job (its record: done, cancelled,
-- purged) until retention drops them (retention_s, with the queue's
-- finished jobs). `result` is the handler's return value (JSON) when the
-- queue keeps results. Times are UTC.
CREATE TABLE IF NOT EXISTS nq_attempt (
    job_id       BIGINT UNSIGNED   NOT NULL,
    claim_token  BIGINT UNSIGNED   NOT NULL,
    attempt      SMALLINT UNSIGNED NOT NULL,
    queue        VARCHAR(64)       NOT NULL,
    outcome      VARCHAR(16)       NOT NULL,
    consumer     CHAR(32)          NULL,
    host         VARCHAR(255)      NULL,
    started_at   DATETIME(6)       NULL,
    ended_at     DATETIME(6)       NOT NULL,
    error        TEXT              NULL,
    traceback    TEXT              NULL,
    result       MEDIUMTEXT        NULL,
    PRIMARY KEY (job_id, claim_token),
    -- Retention: a queue's records by age (periodic.purge_finished)
    KEY ix_ended (queue, ended_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- A job cancelled while it ran ends in a state of its own (status 5, cancelled), with who asked
-- and when. Added last: an instant ALTER (MySQL 8.0.12+, MariaDB 10.3+); only when not there yet,
-- so an interrupted `init` can simply run again.
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'cancelled_by') = 0,
                 'ALTER TABLE nq_job ADD COLUMN cancelled_by VARCHAR(255) NULL, ADD COLUMN cancelled_at DATETIME(6) NULL',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;
