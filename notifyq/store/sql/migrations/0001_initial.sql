-- notifyq schema, version 1. One statement per ';'. Every statement is idempotent so an
-- interrupted `notifyq init` can simply be run again.

-- Schema version and other single values.
CREATE TABLE IF NOT EXISTS nq_meta (
    name  VARCHAR(64)  NOT NULL PRIMARY KEY,
    value VARCHAR(255) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The jobs. status: 0 ready, 1 scheduled (run_at in the future when set), 2 claimed, 3 done, 4 dead.
-- A scheduled job whose run_at has passed is claimable as it is: no promoter job has to flip it.
CREATE TABLE IF NOT EXISTS nq_job (
    id            BIGINT UNSIGNED   NOT NULL AUTO_INCREMENT,
    queue         VARCHAR(64)       NOT NULL,
    status        TINYINT UNSIGNED  NOT NULL,
    priority      SMALLINT          NOT NULL DEFAULT 0,
    -- Higher priority first, but MariaDB 10.6 ignores DESC in indexes: index the negation.
    prio_key      INT AS (-priority) STORED,
    run_at        DATETIME(6)       NOT NULL,
    attempts      SMALLINT UNSIGNED NOT NULL DEFAULT 0,
    max_attempts  SMALLINT UNSIGNED NOT NULL,
    owner         CHAR(32)          NULL,
    claim_token   BIGINT UNSIGNED   NULL,
    claimed_at    DATETIME(6)       NULL,
    lease_until   DATETIME(6)       NULL,
    dedup_key     VARCHAR(191)      NULL,
    -- The key only counts while the job is pending (ready, scheduled, claimed): NULLs never clash.
    dedup_active  VARCHAR(191) AS (IF(status < 3, dedup_key, NULL)) STORED,
    cancel_requested TINYINT UNSIGNED NOT NULL DEFAULT 0,
    payload       MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    last_error    TEXT              NULL,
    created_at    DATETIME(6)       NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    finished_at   DATETIME(6)       NULL,
    PRIMARY KEY (id),
    -- Claim scan: equality on (queue, status), then already in priority/age order: no filesort.
    KEY ix_ready (queue, status, prio_key, run_at, id),
    -- Due scheduled jobs, the next due time, and per-status counts.
    KEY ix_due (queue, status, run_at),
    -- The reaper's two questions: what did a dead consumer hold, and which leases ran out.
    KEY ix_owner (owner),
    KEY ix_lease (status, lease_until),
    UNIQUE KEY ux_dedup (queue, dedup_active)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row per queue: what the watcher has already dispatched, which bell a producer holds, pause.
CREATE TABLE IF NOT EXISTS nq_queue (
    queue        VARCHAR(64)     NOT NULL PRIMARY KEY,
    watched_seq  BIGINT UNSIGNED NOT NULL DEFAULT 0,
    bell         TINYINT UNSIGNED NOT NULL DEFAULT 0,
    paused       TINYINT UNSIGNED NOT NULL DEFAULT 0,
    created_at   DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Enqueue counters, sharded into slots so concurrent producers do not queue on one row lock.
-- The sum over a queue's slots only ever grows; the watcher compares it with watched_seq.
CREATE TABLE IF NOT EXISTS nq_signal (
    queue VARCHAR(64)      NOT NULL,
    slot  TINYINT UNSIGNED NOT NULL,
    seq   BIGINT UNSIGNED  NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, slot)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Live consumers. A row is written only while its liveness lock is held, so a row whose lock is
-- free belongs to a consumer whose session is gone.
CREATE TABLE IF NOT EXISTS nq_consumer (
    id          CHAR(32)     NOT NULL PRIMARY KEY,
    lock_name   VARCHAR(64)  NOT NULL,
    host        VARCHAR(255) NOT NULL,
    pid         INT UNSIGNED NOT NULL,
    queues      VARCHAR(1024) NOT NULL,
    started_at  DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    last_seen   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    wakeup      VARCHAR(16)  NOT NULL DEFAULT 'locks'
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Periodic jobs: the last tick enqueued per entry, so a tick is enqueued once across all hosts.
CREATE TABLE IF NOT EXISTS nq_periodic (
    queue     VARCHAR(64)  NOT NULL,
    name      VARCHAR(191) NOT NULL,
    last_tick DATETIME(6)  NOT NULL,
    PRIMARY KEY (queue, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
