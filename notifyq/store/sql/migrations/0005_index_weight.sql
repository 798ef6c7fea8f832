-- notifyq schema, version 5: fewer index entries per job.
--
-- Every insert wrote 7 index entries (PRIMARY, ix_ready, ix_due, ix_owner, ix_lease, ux_dedup,
-- ix_finished) and every claim moved 5 of them. Now an insert writes 2, as a bare job table
-- with one status index does, and a claim moves 1:
-- - ix_state (status, queue, prio_key, sort_at) takes over every secondary index. sort_at is
--   the time a job's state is ordered by: run_at while ready or scheduled, lease_until while
--   claimed, finished_at once done or dead; prio_key is the negated priority while ready, else
--   0. So within (status, queue): ready jobs in claim order (priority, run_at, id), scheduled
--   ones by due time (ix_due's due scan and next due time), claimed ones by lease end (the
--   reaper's "any lease over?", index-only over consumers x batch rows; the owner of a claim
--   is read from the row, rarely), finished ones by finish time (ix_finished's retention range).
-- - dedup keys live in nq_dedup, written only by jobs that carry one: a key row names the job
--   that took the key last, and the key is held while that job exists and is pending.
-- - nq_queue.bell is gone: the bells are advisory locks now (store/bells.py).
-- The nq_job change rebuilds the table (a new stored column, prio_key's new expression).
--
-- Each step is idempotent (MySQL has no DROP INDEX IF EXISTS): an `init` interrupted anywhere
-- can simply run again. The nq_job changes are one ALTER listing only what is still to do.

CREATE TABLE IF NOT EXISTS nq_dedup (
    queue      VARCHAR(64)     NOT NULL,
    dedup_key  VARCHAR(191)    NOT NULL,
    job_id     BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (queue, dedup_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The keys pending jobs hold, copied while ux_dedup still says which (it made them unique).
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'dedup_active') = 1,
                 'INSERT IGNORE INTO nq_dedup (queue, dedup_key, job_id)
                  SELECT queue, dedup_active, id FROM nq_job WHERE dedup_active IS NOT NULL',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;

SET @nq_ddl = CONCAT_WS(', ',
    IF((SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'sort_at') = 0,
       'MODIFY COLUMN prio_key INT AS (IF(status = 0, -priority, 0)) STORED, ADD COLUMN sort_at DATETIME(6) AS (CASE WHEN status >= 3 THEN finished_at WHEN status = 2 THEN lease_until ELSE run_at END) STORED AFTER prio_key',
       NULL),
    IF((SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND INDEX_NAME = 'ix_state') = 0,
       'ADD INDEX ix_state (status, queue, prio_key, sort_at)', NULL),
    IF((SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND INDEX_NAME = 'ux_dedup') > 0, 'DROP INDEX ux_dedup', NULL),
    IF((SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'dedup_active') > 0, 'DROP COLUMN dedup_active', NULL),
    IF((SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND INDEX_NAME = 'ix_ready') > 0, 'DROP INDEX ix_ready', NULL),
    IF((SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND INDEX_NAME = 'ix_due') > 0, 'DROP INDEX ix_due', NULL),
    IF((SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND INDEX_NAME = 'ix_owner') > 0, 'DROP INDEX ix_owner', NULL),
    IF((SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND INDEX_NAME = 'ix_lease') > 0, 'DROP INDEX ix_lease', NULL),
    IF((SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_job' AND INDEX_NAME = 'ix_finished') > 0, 'DROP INDEX ix_finished', NULL));
SET @nq_ddl = IF(@nq_ddl = '', 'DO 0', CONCAT('ALTER TABLE nq_job ', @nq_ddl));
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;

SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_queue' AND COLUMN_NAME = 'bell') = 1,
                 'ALTER TABLE nq_queue DROP COLUMN bell', 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;
