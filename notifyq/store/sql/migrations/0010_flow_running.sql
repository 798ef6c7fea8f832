-- notifyq schema, version 10: each key's running jobs kept in its nq_flow_key row, for a queue
-- whose only limits are per key (docs/flow-control.md, "What it costs").
--
-- running: the key's running jobs as its counting claims added them and their acks, failures
-- and give-backs took them off, never fewer than the key's status-2 rows (a path that takes a
-- job out of status 2 without subtracting leaves it high). NULL: unknown (a row made before or
-- by a consumer that does not count, or a key whose count was given up): a claim recounts it
-- under the key row's lock before it trusts it.
-- counted_at: when a claim last recounted it from nq_job (status-2 rows, under the key row's
-- lock). A counter recounted longer ago than the trust bound (store/flow.py, COUNT_TRUST_S) is
-- recounted before it is trusted again: a counter left high (a reaped job) holds its key no
-- longer than that.
-- Both added last and nullable (instant ALTERs), only when not there yet, so an interrupted
-- `init` can simply run again.
SET @nq_ddl = CONCAT_WS(', ',
    IF((SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_flow_key' AND COLUMN_NAME = 'running') = 0,
       'ADD COLUMN running INT NULL', NULL),
    IF((SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
        AND TABLE_NAME = 'nq_flow_key' AND COLUMN_NAME = 'counted_at') = 0,
       'ADD COLUMN counted_at DATETIME(6) NULL', NULL));
SET @nq_ddl = IF(@nq_ddl = '', 'DO 0', CONCAT('ALTER TABLE nq_flow_key ', @nq_ddl));
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;

-- ix_state with the job's key after its id: (status, queue, prio_key, sort_at, id, job_key). The
-- id stays before the key, so claim order and the unlimited claim's read are unchanged; a
-- limited claim reads the head of the ready jobs with their keys from the index alone, and a
-- recount reads a queue's running jobs by key from it. Rebuilt only while it lacks job_key.
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
                  AND TABLE_NAME = 'nq_job' AND INDEX_NAME = 'ix_state' AND COLUMN_NAME = 'job_key') = 0,
                 'ALTER TABLE nq_job DROP INDEX ix_state, ADD INDEX ix_state (status, queue, prio_key, sort_at, id, job_key)',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;
