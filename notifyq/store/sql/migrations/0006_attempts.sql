-- notifyq schema, version 6: every attempt's record, and the completion's marker.
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
