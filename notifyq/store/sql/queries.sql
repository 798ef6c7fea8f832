-- Every statement notifyq runs, except DDL (migrations/). Run only from the store: queries.py,
-- completion.py, inserts.py, dedup.py, bells.py, liveness.py, rates.py, steps.py, flow.py and
-- admin_queries.py (the schema-version ones from schema.py, tls_cipher from db.py). Values are
-- always bound parameters.

-- schema_version --
SELECT value FROM nq_meta WHERE name = 'schema_version'

-- set_schema_version --
INSERT INTO nq_meta (name, value) VALUES ('schema_version', %(version)s)
ON DUPLICATE KEY UPDATE value = %(version)s

-- tls_cipher --
-- After connecting with TLS options (store.db): an empty cipher means the session is plaintext.
SHOW SESSION STATUS LIKE 'Ssl_cipher';

-- writer_variables --
-- Part of a new connection's one round trip (store.db._prepare): what says whether the server
-- may be notifyq's writer (store/server_role.py). A SHOW with a WHERE lists only the variables
-- the server has: MariaDB has none of these (an empty answer), MySQL has the first two, and the
-- group_replication_* ones where the Group Replication plugin is loaded.
SHOW GLOBAL VARIABLES WHERE Variable_name IN ('super_read_only', 'offline_mode', 'group_replication_group_name',
                                             'group_replication_single_primary_mode')

-- group_member --
-- On a server of a replication group only (its group_replication_group_name is set): this
-- server's role (PRIMARY, SECONDARY) and state (ONLINE, RECOVERING, OFFLINE, ERROR ...) in it.
SELECT MEMBER_ROLE, MEMBER_STATE FROM performance_schema.replication_group_members WHERE MEMBER_ID = @@server_uuid

-- ensure_queue --
INSERT IGNORE INTO nq_queue (queue) VALUES (%(queue)s)

-- queue_known --
-- Whether a queue's row is there, a plain read (queries.ensure_queue_unlocked).
SELECT 1 FROM nq_queue WHERE queue = %(queue)s

-- insert_job --
-- store.insert_jobs repeats the VALUES row: one multi-row INSERT per chunk. Times are
-- UTC_TIMESTAMP(6), never NOW(6) or a column default: a transactional enqueue runs on the
-- caller's connection, whose session time_zone may be anything (notifyq's own sessions use UTC).
INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload, dedup_key, job_key, created_at)
VALUES (%s, %s, %s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, %s, %s, %s, %s, UTC_TIMESTAMP(6))

-- insert_job_at --
-- insert_job for a put at a given time (put(run_at=...), `produce --at`): the time is bound
-- twice, and the server's clock decides whether it has come (ready) or not (scheduled), as it
-- does for a delay: a producer's clock never matters. A time past is now. Only the VALUES row
-- is used, after insert_job's head.
INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload, dedup_key, job_key, created_at)
VALUES (%s, IF(CAST(%s AS DATETIME(6)) > UTC_TIMESTAMP(6), 1, 0), %s,
        GREATEST(CAST(%s AS DATETIME(6)), UTC_TIMESTAMP(6)), %s, %s, %s, %s, UTC_TIMESTAMP(6))

-- insert_job_ready --
-- insert_job for jobs ready now with no dedup key and no job key (a put_many's usual rows): the
-- key columns are left to their NULL default and run_at is the server's time without the
-- interval arithmetic. The server's work per row is most of a bulk enqueue's time: the fewer
-- values and expressions a row holds, the less of it. Only the VALUES row is used, after its
-- own head (the column list differs from insert_job's).
INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload, created_at)
VALUES (%s, %s, %s, UTC_TIMESTAMP(6), %s, %s, UTC_TIMESTAMP(6))

-- require_version --
-- put(..., min_version=): the jobs just inserted, in the put's own transaction (before its
-- COMMIT, so no consumer ever sees them without their minimum). A put without one never sends it.
UPDATE nq_job FORCE INDEX (PRIMARY) SET min_version = %(version)s WHERE id IN %(ids)s

-- job_stored --
-- After a COMMIT whose reply was lost (the server or the Galera node died): is the first job the
-- transaction's INSERT got stored? A transaction commits whole: yes, it committed; no, it did not.
-- Only a row written before the COMMIT went out is that job (created_at is the INSERT's time, by
-- the server's clock): crash recovery may give a lost transaction's AUTO_INCREMENT ids again, to
-- a put after the restart, whose row is younger.
SELECT 1 FROM nq_job
WHERE id = %(id)s AND created_at <= UTC_TIMESTAMP(6) - INTERVAL %(older_than_us)s MICROSECOND

-- insert_job_returning --
-- MariaDB: appended to a multi-row insert_job, so that the server names the ids it gave. The
-- ids cannot be computed from the first one: auto_increment_increment changes in open sessions
-- when a Galera node leaves or joins.
RETURNING id

-- auto_increment_increment --
-- Without RETURNING (MySQL): the spacing of a multi-row INSERT's ids, read right after it in the
-- same round trip (a view change between the two statements is the one window left).
SELECT @@auto_increment_increment

-- savepoint_probe --
-- With caller_transaction_open: a caller's connection in autocommit mode may still have a
-- transaction open (BEGIN). A savepoint outside one ends with its statement, and releasing it
-- then fails (1305); inside one it is released. MariaDB's @@in_transaction is not in MySQL.
SAVEPOINT nq_probe

-- caller_transaction_open --
RELEASE SAVEPOINT nq_probe

-- begin_own_transaction --
-- A put of several statements on a caller's connection that commits each one by itself: the
-- key's lock (dedup_lock) must last until its job is inserted, and put_many is atomic.
START TRANSACTION

-- max_allowed_packet --
-- The largest statement the server takes, on a caller's connection (notifyq's own sessions
-- read it when they connect). Fixed for the session's lifetime.
SELECT @@max_allowed_packet

-- dedup_lock --
-- A unique put, and a retry of a job that carries a key, first lock the key's row (made if it is
-- new; job 0 is no job), so that puts and retries of one key take turns until they commit.
-- Only jobs that carry a key touch nq_dedup: a plain insert writes no index entry for keys.
INSERT INTO nq_dedup (queue, dedup_key, job_id) VALUES (%(queue)s, %(dedup_key)s, 0)
ON DUPLICATE KEY UPDATE job_id = job_id

-- dedup_holder --
-- Under dedup_lock: the job holding the key, if the job that took it last is still pending
-- (ready, scheduled, claimed). Done, dead and deleted jobs leave the key free without a write.
-- A locking read, so that it reads the rows as they are now: in a caller's REPEATABLE READ
-- transaction a plain read sees its snapshot, without a holder another producer committed
-- since (two pending jobs with one key). LOCK IN SHARE MODE, not FOR UPDATE: it only keeps
-- the holder from ending until the put commits (MariaDB has no FOR SHARE; MySQL 8 takes both).
-- In READ COMMITTED (notifyq's own sessions) it locks the holder row only; in REPEATABLE READ
-- also the gap after a holder that is gone. With innodb_snapshot_isolation (MariaDB) a row
-- changed since the snapshot fails the read with 1020: the caller reruns its transaction.
SELECT j.id FROM nq_dedup d JOIN nq_job j ON j.id = d.job_id
WHERE d.queue = %(queue)s AND d.dedup_key = %(dedup_key)s AND j.status < 3
LOCK IN SHARE MODE

-- dedup_replaceable --
-- A put that replaces (dedup="replace"), under dedup_lock: the pending job holding the key and
-- its status, locked for update. A ready or scheduled one is replaced (dedup_replaced); a
-- claimed one is left to run. The lock comes before any claim's: a claim skips the row (SKIP
-- LOCKED) until the put commits, and a claim that locked it first makes this read wait, then
-- see it claimed. A locking read, as dedup_holder, so that a caller's REPEATABLE READ
-- transaction reads the rows as they are now.
SELECT j.id, j.status FROM nq_dedup d JOIN nq_job j ON j.id = d.job_id
WHERE d.queue = %(queue)s AND d.dedup_key = %(dedup_key)s AND j.status < 3
FOR UPDATE

-- dedup_replaced --
-- The replaced job goes (its record first: job_record_gone, outcome 'replaced'), under
-- dedup_replaceable's lock: still ready or scheduled.
DELETE FROM nq_job WHERE id = %(id)s AND status IN (0, 1)

-- dedup_take --
-- Under dedup_lock: the key is this job's now.
UPDATE nq_dedup SET job_id = %(id)s WHERE queue = %(queue)s AND dedup_key = %(dedup_key)s

-- dedup_key_job --
-- After a dedup_take that changed no row: the job the key's row names (an operator's retry of
-- the job that took the key last changes nothing; a KILL QUERY's cut-short UPDATE neither).
SELECT job_id FROM nq_dedup WHERE queue = %(queue)s AND dedup_key = %(dedup_key)s

-- dedup_free_keys --
-- Retention's sweep, a plain read: the next keys of a queue, in key order after `after`, whose
-- job is no longer pending. Their rows would otherwise stay forever (a key never used again).
SELECT d.dedup_key FROM nq_dedup d LEFT JOIN nq_job j ON j.id = d.job_id AND j.status < 3
WHERE d.queue = %(queue)s AND d.dedup_key > %(after)s AND j.id IS NULL
ORDER BY d.dedup_key LIMIT %(limit)s

-- dedup_drop_free --
-- The sweep's delete tests again, under the row's lock: a key a put or a retry took meanwhile
-- (even by the same job, retried) is held now and stays.
DELETE d FROM nq_dedup d LEFT JOIN nq_job j ON j.id = d.job_id AND j.status < 3
WHERE d.queue = %(queue)s AND d.dedup_key IN %(keys)s AND j.id IS NULL

-- bump_signal --
-- Every change that makes work claimable bumps a slot of its queue's counter, inside the same
-- transaction, so the watcher can never see the count before the rows: the first slot row no
-- other transaction holds at or after the random `slot`, else before it (wrapping round), else
-- (every row held; all 16 are made before the queue's first bump, store/slot_rows.py) `slot`
-- itself, which may wait. A transaction that bumped a slot
-- and stays open holds that row until it ends: a producer stopped (SIGSTOP, a paused VM) between
-- its put and its COMMIT, an application's own transaction that put a job (put(conn=...), the
-- Django and SQLAlchemy integrations) and goes on working, a claim stopped inside its
-- transaction. A plain bump of a random slot waited on such a row for the lock wait timeout (1
-- put in 16 per open transaction, a silent stall of unrelated producers; a limited claim 10 s in
-- a long fault run; a reaper's take-back); this one passes it by. The random start keeps
-- concurrent producers on different rows, as the plain bump did: SKIP LOCKED sees only the
-- locks of its own server, so Galera writers on two nodes meet on a row as often as before.
-- Each read stops at the first row it can lock (the primary key's order, LIMIT 1), and COALESCE
-- runs the second only when the first found none: a bump locks one row. The two reads cost
-- about 60 us of server CPU, twice the plain bump's: put() sends bump_signal_nowait first on
-- MariaDB.
INSERT INTO nq_signal (queue, slot, seq)
SELECT %(queue)s, COALESCE(
    (SELECT slot FROM nq_signal WHERE queue = %(queue)s AND slot >= %(slot)s
     ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED),
    (SELECT slot FROM nq_signal WHERE queue = %(queue)s AND slot < %(slot)s
     ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED),
    %(slot)s), %(n)s
ON DUPLICATE KEY UPDATE seq = seq + %(n)s

-- bump_signal_nowait --
-- put()'s and put_many()'s bump on MariaDB (inserts._insert_one, _insert_uniform), in the
-- INSERT's round trip: bump_signal's plain form on the random slot, refused at once (1205)
-- instead of waited on when another transaction holds that row; the put then sends bump_signal
-- (after in_transaction: a server that rolls the whole transaction back on a lock wait timeout
-- has dropped the jobs too). bump_signal's two reads cost about 60 us of server CPU (twice the
-- plain bump's), this form nothing measurable (benchmarks/HISTORY.md).
SET STATEMENT innodb_lock_wait_timeout = 0 FOR
INSERT INTO nq_signal (queue, slot, seq) VALUES (%(queue)s, %(slot)s, %(n)s)
ON DUPLICATE KEY UPDATE seq = seq + %(n)s

-- slot_rows_lock_wait --
-- The lock wait of the session that makes a queue's slot rows (store/slot_rows.py): the least
-- the server takes (MariaDB 0, MySQL 1 s). It writes for a caller that waits for it, and rows
-- another open transaction holds are left to that transaction: never waited on.
SET SESSION innodb_lock_wait_timeout = %(s)s

-- slot_rows_dirty --
-- The next statement reads rows other transactions have not committed: the slot rows an open
-- transaction made, which an INSERT of the same slot would wait on (slot_rows_made).
SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED

-- slot_rows_made --
-- The queue's slot rows, committed or not (after slot_rows_dirty): a plain read, no lock.
SELECT slot FROM nq_signal WHERE queue = %(queue)s

-- slot_row_make --
-- A slot row that slot_rows_made did not find, counting nothing (sent for all of them at once:
-- executemany's multi-row INSERT). IGNORE: another session may have made it meanwhile.
INSERT IGNORE INTO nq_signal (queue, slot, seq) VALUES (%(queue)s, %(slot)s, 0)

-- in_transaction --
-- Whether the session's transaction is still open: after bump_signal_nowait was refused.
SELECT @@in_transaction

-- claim_ready --
-- Step 1 of a claim, a plain read: up to `limit` ready ids, in claim order (ix_state's own
-- order: priority, run_at, id), index-only. Sent with due_any and queue_paused as one
-- multi-statement query, one round trip. claim_candidates, the union of the three that every
-- claim read before, also sent each candidate's sort key as text for the client to merge and
-- sort: with 300 candidates it took 0.73-0.87 ms to these three's 0.30-0.40 ms.
SELECT id FROM nq_job FORCE INDEX (ix_state)
WHERE status = 0 AND queue = %(queue)s
ORDER BY prio_key, sort_at, id LIMIT %(limit)s

-- watcher_looks --
-- A watcher's claim_take goes after this, in its round trip: the queue's enqueue count
-- (signal_total: a statement before the locking read, so every job it counts is visible to
-- that read), whether a scheduled job has fallen due (due_any) and whether the queue is paused
-- (queue_paused), in one statement: each statement of its own cost the server 0.08-0.18 ms
-- here (the three 0.52 ms with claim_take, this one 0.39 ms). Last, the server's time, as
-- queue_paused's: the claim's clock (queries.Claim.clock).
SELECT (SELECT COALESCE(SUM(seq), 0) FROM nq_signal WHERE queue = %(queue)s),
       EXISTS (SELECT 1 FROM nq_job FORCE INDEX (ix_state)
               WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at <= NOW(6)),
       EXISTS (SELECT 1 FROM nq_queue WHERE queue = %(queue)s AND paused = 1), UTC_TIMESTAMP(6)

-- claim_take --
-- A watcher's claim (woken from idle, on a queue without flow limits or rates): steps 1 and 2 in
-- one locking read, one round trip fewer on every pick-up from idle. The first `limit` ready
-- jobs in claim order, walked in ix_state's own order (no filesort: a sorted locking read
-- locks every row it sorts), each locked as it is read; a row another claim holds is skipped,
-- not waited for. In READ COMMITTED a locking read keeps no gap locks and lets go of the rows
-- it reads and does not return (delete-marked entries), so it holds exactly the rows it
-- returns: the claim asks for one more than its batch, to know whether it left any behind, and
-- that one goes back unmarked at its COMMIT. Only the watcher: busy claimers running this at
-- once walk each other's locked and delete-marked entries at the head of the index (the drain
-- fell to 0.40 of the seed with it in every claim); they read candidates, then lock by id.
-- Columns as claim_lock's.
SELECT id, payload, priority, attempts, max_attempts, CAST(run_at AS BINARY), CAST(created_at AS BINARY), dedup_key, job_key,
       suspect, min_version
FROM nq_job FORCE INDEX (ix_state)
WHERE status = 0 AND queue = %(queue)s
ORDER BY prio_key, sort_at, id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- claim_ready_for_version --
-- claim_ready again, past the jobs too new for the consumer's code `version` (min_version
-- above it): read only when the claim's locking read met such jobs (lock_window counted them)
-- and it still has room, in the same transaction. A run of them at the head of the queue,
-- longer than claim_ready's window, hid every job behind it that an old consumer could run (it
-- took nothing and counted the queue as drained). min_version is not in ix_state, so this read
-- checks each entry's row (0.44 ms for 300 candidates to claim_ready's index-only 0.20 ms):
-- kept out of claim_ready, so that a claim that meets no such job pays nothing for them.
SELECT id FROM nq_job FORCE INDEX (ix_state)
WHERE status = 0 AND queue = %(queue)s AND (min_version IS NULL OR min_version <= %(version)s)
ORDER BY prio_key, sort_at, id LIMIT %(limit)s

-- due_any --
-- Whether a scheduled job (or a retry) has fallen due: then the claim promotes the due jobs and
-- reads claim_candidates, which orders them with the ready ones.
SELECT 1 FROM nq_job FORCE INDEX (ix_state)
WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at <= NOW(6)
LIMIT 1

-- queue_paused --
-- Whether the queue is paused, and the server's time: the claim's clock (queries.Claim.clock),
-- which its jobs' attempt records place their start and end by. One row, always.
SELECT EXISTS (SELECT 1 FROM nq_queue WHERE queue = %(queue)s AND paused = 1), UTC_TIMESTAMP(6)

-- claim_candidates --
-- Step 1 of a claim that found due jobs (due_any) and promoted them (promote_due), a plain
-- read: up to `limit` ready ids in priority/age order (index order of ix_state, no filesort),
-- the due scheduled ids still left (more than PROMOTE_MAX, or fallen due since), and a
-- marker row (id 0) when the queue is paused. One round trip, index-only: a ready or scheduled
-- job's sort_at is its run_at, and a ready job's prio_key its negated priority. run_at comes
-- back as text ('YYYY-MM-DD hh:mm:ss.ffffff', fixed width, so it sorts like the time): the
-- client only merges the two parts by it, and decoding 3 x batch datetimes per claim was a
-- consumer's largest single CPU cost. The marker's 0 is cast so the ids stay BIGINT UNSIGNED
-- (a plain 0 turned every id into a DECIMAL). The due part is read by run_at (its index order:
-- a scheduled job's prio_key is 0), not by priority; its priority comes from the row. The
-- client merges both parts, so that every claimable job is taken in (priority, run_at, id)
-- order. The last column tells the parts apart.
(SELECT id, prio_key, CAST(sort_at AS CHAR), 0 FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 0 AND queue = %(queue)s
  ORDER BY prio_key, sort_at, id LIMIT %(limit)s)
UNION ALL
(SELECT id, -priority, CAST(sort_at AS CHAR), 1 FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at <= NOW(6)
  ORDER BY sort_at LIMIT %(limit)s)
UNION ALL
(SELECT CAST(0 AS UNSIGNED), NULL, NULL, 0 FROM nq_queue WHERE queue = %(queue)s AND paused = 1)

-- claim_candidates_for_version --
-- claim_candidates again, past the jobs too new for the consumer's code `version`, as
-- claim_ready_for_version is claim_ready's (read only when the locking read met such jobs).
-- No pause marker: the claim already read the queue as not paused.
(SELECT id, prio_key, CAST(sort_at AS CHAR), 0 FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 0 AND queue = %(queue)s AND (min_version IS NULL OR min_version <= %(version)s)
  ORDER BY prio_key, sort_at, id LIMIT %(limit)s)
UNION ALL
(SELECT id, -priority, CAST(sort_at AS CHAR), 1 FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at <= NOW(6)
    AND (min_version IS NULL OR min_version <= %(version)s)
  ORDER BY sort_at LIMIT %(limit)s)

-- due_ids --
-- The due jobs a claim promotes: oldest first, a bounded number, in ix_state's own order (not
-- the UPDATE's own: an UPDATE ... ORDER BY on the index whose key it changes sorted the whole
-- due range). A scheduled job's prio_key is 0 and its sort_at its run_at. Locked here, passing
-- over rows another session holds (an application's SELECT ... FOR UPDATE, a peer promoting
-- them): promote_due then waits on none of them. It waited on such a row for the server's
-- lock wait, failed with error 1205 and was retried, again and again, and every other ready
-- job of the queue waited with it. A row passed over is left due; the consumer claims again
-- for it (Waiter.locked_out, which claimable_left tells of).
SELECT id FROM nq_job FORCE INDEX (ix_state)
WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at <= NOW(6)
ORDER BY sort_at LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- promote_due --
-- Due scheduled jobs and due retries become ready, run_at kept: in ix_state they then sort by
-- priority with every other claimable job. By primary key (see claim_mark); the status and
-- run_at tests are repeated on the locked rows, so a job a peer promoted or claimed meanwhile,
-- or an operator rescheduled, is left as it is.
UPDATE nq_job FORCE INDEX (PRIMARY) SET status = 0
WHERE id IN %(ids)s AND status = 1 AND run_at <= NOW(6)

-- flow_keys --
-- A limited or fair queue's claim (store/flow.py), step 1, sent with flow_running as one query:
-- the keys its claims have met (nq_flow_key), round-robin: up to `limit` after the last key
-- the previous claim read, then from the start (with the empty key: the queue's own row, for
-- its `limit`).
(SELECT job_key FROM nq_flow_key WHERE queue = %(queue)s AND job_key > %(after)s
  ORDER BY job_key LIMIT %(limit)s)
UNION ALL
(SELECT job_key FROM nq_flow_key WHERE queue = %(queue)s AND job_key <= %(after)s
  ORDER BY job_key LIMIT %(limit)s)

-- flow_discover_from --
-- Where a claim's key discovery starts: in the column's collation, or the dives below compare
-- in the connection's and scan instead.
SET @nq_k0 = CONVERT(%(after)s USING utf8mb4) COLLATE utf8mb4_bin

-- flow_next_key --
-- Key discovery, a few steps per claim: the next key after the last step's (@nq_kPREV; the
-- first step's is bound by the claim) that has ready jobs, into @nq_kSTEP (store/flow.py numbers them),
-- one dive into ix_key each (a statement of its own per step: a user variable assigned in the
-- same statement is no constant, and the dive became a scan of the queue's ready jobs). A
-- GROUP BY over ix_key read every ready job of a key with 50,000 (16 ms).
-- A SELECT ... INTO, not SET @v = (SELECT ...): InnoDB reads a SET's subquery with shared row
-- locks (it is no SELECT statement), so the dives locked ix_key entries that peers' claims
-- mark, and deadlocked with them (about one claim in 400 with four consumers on a limited
-- queue, each a rerun; a dive also waited behind a claim held across a round trip). The
-- scalar subquery yields NULL past the last key, where SELECT col INTO would keep the last
-- claim's value.
SELECT (SELECT ready_key FROM nq_job FORCE INDEX (ix_key)
        WHERE queue = %(queue)s AND ready_key > @nq_kPREV ORDER BY ready_key LIMIT 1) INTO @nq_kSTEP

-- flow_discovered --
-- The keys discovery found (NULL past the last one), in step order.
SELECT @nq_k1, @nq_k2, @nq_k3, @nq_k4

-- flow_discovered_named --
-- Which of the keys discovery found have a row already (a plain read, with flow_discovered): only
-- a key without one is named (flow_add_keys). An INSERT IGNORE of a key whose row exists waits
-- for the row's lock (its duplicate check takes a shared lock), and a peer's claim holds that
-- lock until its COMMIT: a claim of one or two jobs reads fewer named keys than a queue of a
-- few keys has (3 x its batch), and it named again, waiting, the keys its dives found beyond them.
SELECT job_key FROM nq_flow_key WHERE queue = %(queue)s AND job_key IN (@nq_k1, @nq_k2, @nq_k3, @nq_k4)

-- flow_running --
-- Running jobs per key of a queue, from its claimed rows (status 2): bounded by what the
-- consumers hold, and no counter to drift. A dead consumer's rows count until a reaper takes
-- them back. Read first as committed (which keys have free slots), then again right after the
-- keys' locks (flow_lock, store/key_gate.py), where it decides, and once more after the mark.
SELECT job_key, COUNT(*) FROM nq_job FORCE INDEX (ix_state)
WHERE status = 2 AND queue = %(queue)s GROUP BY job_key

-- flow_add_keys --
-- Keys discovery found that no row names yet (flow_discovered_named), in a transaction of their
-- own before the claim's (store/flow.py, FlowClaims.name_keys) and committed in the same round
-- trip, so that its rows are locked for no longer than the statement: a peer naming the same key
-- meanwhile waits for that, not for a claim (or a paused process). It waits for a claim only
-- when a peer named the key and its claim locked it between the read and this statement, and
-- it carries no acks. The VALUES rows are repeated by store/flow.py.
INSERT IGNORE INTO nq_flow_key (queue, job_key) VALUES (%(queue)s, %(key)s)

-- flow_lock --
-- The keys of the jobs a claim is about to take (store/key_gate.py: sent with flow_running and
-- claim_lock, one window of jobs at a time), locked for its transaction; a key another consumer
-- is claiming right now is skipped, not waited on (that claim sees its jobs). Under these locks
-- no other claim can start a job of the key, so flow_running read after it is exact.
-- With each key's counter (nq_flow_key.running, schema 10) and whether a claim of a queue that
-- counts may trust it (store/key_gate.py): known, and recounted within the trust bound.
SELECT job_key, running, running IS NOT NULL AND counted_at > NOW(6) - INTERVAL %(trust_s)s SECOND
FROM nq_flow_key FORCE INDEX (PRIMARY)
WHERE queue = %(queue)s AND job_key IN %(keys)s
FOR UPDATE SKIP LOCKED

-- flow_lock_wait --
-- A retake's locks (queries.retake) on the rows of the limited keys of the jobs it takes again
-- (and the queue's, the empty key, for a `limit`): waited for, not skipped (it runs outside any
-- claim, in a transaction of its own), so that flow_running read after it is exact.
SELECT job_key FROM nq_flow_key FORCE INDEX (PRIMARY)
WHERE queue = %(queue)s AND job_key IN %(keys)s
ORDER BY job_key
FOR UPDATE

-- flow_counts --
-- The committed running counts of a queue that counts (limited per key only: store/flow.py,
-- FlowLimits.counts), from its keys' counter rows instead of flow_running's read of every
-- claimed row. Only counters a claim may trust (known, recounted within the trust bound): the
-- others read as free, so the claim reads their candidates and its KeyGate recounts them under
-- their rows' locks (flow_recount) before it keeps any job of theirs.
-- Only the keys the claim may take: flow_keys' (the same round-robin window) and the ones its
-- discovery found (flow_discovered_named's), so it reads as many key rows as flow_keys, not
-- every key of the queue (a queue of a key per customer has thousands).
SELECT job_key, running FROM (
  (SELECT job_key, running, counted_at FROM nq_flow_key FORCE INDEX (PRIMARY)
    WHERE queue = %(queue)s AND job_key > %(after)s ORDER BY job_key LIMIT %(limit)s)
  UNION ALL
  (SELECT job_key, running, counted_at FROM nq_flow_key FORCE INDEX (PRIMARY)
    WHERE queue = %(queue)s AND job_key <= %(after)s ORDER BY job_key LIMIT %(limit)s)
  UNION ALL
  (SELECT job_key, running, counted_at FROM nq_flow_key FORCE INDEX (PRIMARY)
    WHERE queue = %(queue)s AND job_key IN (@nq_k1, @nq_k2, @nq_k3, @nq_k4))
) w
WHERE running <> 0 AND counted_at > NOW(6) - INTERVAL %(trust_s)s SECOND

-- flow_recount --
-- Keys whose rows this claim holds (flow_lock) and whose counters it may not trust: counted
-- again from their status-2 rows (ix_state holds the key: an index-only read), stamped. Under the
-- rows' locks no counting claim can start a job of these keys and no counted ack, failure or
-- give-back of theirs is under way (each holds the row until its COMMIT), and a READ COMMITTED
-- read sees what committed before it: the count is exact, or high by a job another path is
-- taking back right now (never low). A subquery of a one-table UPDATE: a plain read.
UPDATE nq_flow_key k FORCE INDEX (PRIMARY)
SET k.running = (SELECT COUNT(*) FROM nq_job j FORCE INDEX (ix_state)
                 WHERE j.status = 2 AND j.queue = k.queue AND j.job_key = k.job_key),
    k.counted_at = NOW(6)
WHERE k.queue = %(queue)s AND k.job_key IN %(keys)s

-- flow_recounted --
-- The counters flow_recount just wrote (rows this claim holds).
SELECT job_key, running FROM nq_flow_key FORCE INDEX (PRIMARY)
WHERE queue = %(queue)s AND job_key IN %(keys)s AND running IS NOT NULL

-- flow_count_forget_keys --
-- A queue's counters given up (unknown: each is recounted by the next claim that locks its key).
-- A consumer sends it before its first claim of a queue that counts (a start, a reload that made
-- it count): jobs it claimed while it did not count are in no counter.
-- The rows a peer's claim holds are skipped (flow_count_forget_keys, then flow_count_forget_set,
-- in one transaction): never a wait on a peer's claim; the trust bound covers those.
SELECT job_key FROM nq_flow_key FORCE INDEX (PRIMARY) WHERE queue = %(queue)s FOR UPDATE SKIP LOCKED

-- flow_count_forget_taken --
-- The keys of jobs a reaper takes back from a counting claim (liveness.take_back; the rows are
-- the caller's, locked), their key rows locked without a wait (SKIP LOCKED: a reaper waits on
-- no claim, a stopped one least of all): the caller sets their counters unknown
-- (flow_count_forget_set). Left high, a counter held the key's next job back while it was
-- trusted, and nothing woke the watcher when that ended: the job waited for the next put or
-- completion of the queue (an outside test saw 60 s).
-- The jobs first (STRAIGHT_JOIN), each key row then by its primary key.
SELECT DISTINCT nq_flow_key.queue, nq_flow_key.job_key FROM nq_job FORCE INDEX (PRIMARY)
STRAIGHT_JOIN nq_flow_key FORCE INDEX (PRIMARY)
  ON nq_flow_key.queue = nq_job.queue AND nq_flow_key.job_key = nq_job.job_key
WHERE nq_job.id IN %(ids)s AND nq_flow_key.running IS NOT NULL
FOR UPDATE SKIP LOCKED

-- flow_count_forget_set --
-- Also a retake's (queries.retake): a counting claim's jobs marked again after its COMMIT failed
-- (its counter change did not land) leave their keys' counters unknown, not low.
UPDATE nq_flow_key FORCE INDEX (PRIMARY) SET running = NULL WHERE queue = %(queue)s AND job_key IN %(keys)s

-- flow_count_add --
-- A counting claim's grant added to its keys' counters, in the claim's transaction, after its
-- mark (the rows are held by its KeyGate, recounted there when not trusted). store/flow.py
-- repeats the WHEN part. An unknown counter stays unknown (NULL + n).
UPDATE nq_flow_key FORCE INDEX (PRIMARY) SET running = running + CASE job_key WHEN %(key)s THEN %(n)s END
WHERE queue = %(queue)s AND job_key IN %(keys)s

-- flow_count_release --
-- The running jobs of `ids` still held by the counting claim `token` (the fence of the ack, the
-- outcome or the give-back that follows in the same transaction) taken off their keys'
-- counters, before their rows leave status 2. Counted on the server's rows, not the client's
-- list: a job taken back meanwhile (its fence failed) is not subtracted. Only a counting claim's
-- token is released (store/queries.py, counted_token): a job that no counter added is never
-- subtracted. Keys in key order (the grouped derived table's).
-- The jobs' rows are locked first (the derived table's locking read, read first: STRAIGHT_JOIN),
-- the key rows after: so the rows cannot change before the outcome's statement, and while this
-- waits for a key row (a peer's claim holds it until its COMMIT: a stopped process's for as long
-- as it is stopped) no reaper takes the jobs back. Joined the other way round, the key row was
-- locked (and waited for) first and the jobs' rows read after it: a live consumer's finished jobs
-- whose ack waited there past their lease went back to the queue, uncharged, and ran again.
UPDATE (
  SELECT queue, job_key, COUNT(*) AS n FROM nq_job FORCE INDEX (PRIMARY)
  WHERE id IN %(ids)s AND claim_token = %(token)s AND status = 2 AND job_key IS NOT NULL
  GROUP BY queue, job_key ORDER BY queue, job_key FOR UPDATE) c
STRAIGHT_JOIN nq_flow_key k FORCE INDEX (PRIMARY) ON k.queue = c.queue AND k.job_key = c.job_key
SET k.running = k.running - c.n

-- flow_key_ready --
-- One key's first ready jobs in claim order (priority, run_at, id) through ix_key: a key with
-- 50,000 ready jobs costs this read `limit` rows, not the others their turn. store/flow.py
-- joins one per key with UNION ALL into one statement.
(SELECT id, ready_key, key_prio, run_at FROM nq_job FORCE INDEX (ix_key)
  WHERE queue = %(queue)s AND ready_key = %(key)s ORDER BY key_prio, run_at, id LIMIT %(limit)s)

-- flow_key_firsts --
-- The first few ready jobs of each key in `keys`, in one statement: for each key's row a dive
-- into ix_key (a dependent subquery on the key: ref access, its first `offset` + 1 entries), one
-- derived part per offset (store/flow.py repeats it: offset 0, 1, ...), each id then read by
-- its primary key. A UNION ALL of one flow_key_ready per key read the same entries but cost
-- the server about four times as much to parse and plan (100 keys: 20 ms against 5 under load),
-- the largest part of a limited claim. For keys a claim may take a few jobs of (a limit's free
-- slots); a key it may take more of is read by flow_key_ready.
SELECT j.id, j.ready_key, j.key_prio, j.run_at FROM (
  SELECT (SELECT id FROM nq_job FORCE INDEX (ix_key)
          WHERE queue = %(queue)s AND ready_key = k.job_key ORDER BY key_prio, run_at, id
          LIMIT 1 OFFSET %(offset)s) AS id
  FROM nq_flow_key k FORCE INDEX (PRIMARY) WHERE k.queue = %(queue)s AND k.job_key IN %(keys)s
) f JOIN nq_job j FORCE INDEX (PRIMARY) ON j.id = f.id

-- flow_key_ready_for_version --
-- flow_key_ready past the jobs too new for the consumer's code `version`: read (FlowClaims.
-- for_version) only when the claim's locking read met such jobs and it still has room. A key's
-- first jobs, too new, hid the key's other jobs from an old consumer. min_version is not in
-- ix_key, so each entry read costs its row: kept out of flow_key_ready.
(SELECT id, ready_key, key_prio, run_at FROM nq_job FORCE INDEX (ix_key)
  WHERE queue = %(queue)s AND ready_key = %(key)s AND (min_version IS NULL OR min_version <= %(version)s)
  ORDER BY key_prio, run_at, id LIMIT %(limit)s)

-- flow_unkeyed_ready --
-- The first `limit` ready jobs in claim order, each with its key (NULL: none): the claim takes
-- the unkeyed ones (a limited queue's unkeyed jobs count under its `limit` only), and a head
-- full of keyed ones tells it to look deeper (flow_unkeyed_deep). Unkeyed jobs are found only
-- near the head of the queue: give every job of a fair queue a key.
SELECT j.id, j.key_prio, j.run_at, j.job_key FROM
  (SELECT id FROM nq_job FORCE INDEX (ix_state)
   WHERE status = 0 AND queue = %(queue)s ORDER BY prio_key, sort_at, id LIMIT %(limit)s) h
  JOIN nq_job j FORCE INDEX (PRIMARY) ON j.id = h.id

-- flow_lean_counters --
-- The lean claim's counters (store/flow.py, FlowClaims.lean_steps) for a queue of few keys:
-- its key rows, plain, with whether a claim may trust each counter (known, recounted within the
-- trust bound), at most `most` of them (one more than the claim's head can hold keys): a range
-- of the primary key, cheaper than a lookup a key (flow_lean_head_counted). A queue with more
-- rows than that (a key per customer) is read by flow_lean_head_counted from then on. Read with
-- the head (flow_lean_head) in the claim's first round trip, after the carried acks' release:
-- the claim's own acks are already off them.
SELECT job_key, running, COALESCE(running IS NOT NULL AND counted_at > NOW(6) - INTERVAL %(trust_s)s SECOND, 0)
FROM nq_flow_key FORCE INDEX (PRIMARY) WHERE queue = %(queue)s ORDER BY job_key LIMIT %(most)s

-- flow_lean_head --
-- The lean claim's head (store/flow.py, FlowClaims.lean_grant): flow_head_keys without the
-- times (claim order is the rows' order; 300 DATETIMEs decoded cost the consumer more than
-- the rest of the read).
SELECT id, prio_key, job_key FROM nq_job FORCE INDEX (ix_state)
WHERE status = 0 AND queue = %(queue)s ORDER BY prio_key, sort_at, id LIMIT %(limit)s

-- flow_lean_head_counted --
-- The lean claim's head with its keys' counters, for a queue of more keys than flow_lean_counters
-- reads: flow_lean_head, each job joined by its key to the key's row (a primary-key lookup a
-- job): the counter, plain, and whether a claim may trust it (known, recounted within the trust
-- bound; NULL: no row names the key). Only the head's keys are read, so a claim costs the head's
-- rows whatever the queue's number of keys (reading every key row cost a queue of a key per
-- customer all of them a claim).
SELECT h.id, h.prio_key, h.job_key, k.running,
       IF(k.job_key IS NULL, NULL,
          COALESCE(k.running IS NOT NULL AND k.counted_at > NOW(6) - INTERVAL %(trust_s)s SECOND, 0))
FROM (SELECT id, prio_key, sort_at, job_key FROM nq_job FORCE INDEX (ix_state)
      WHERE status = 0 AND queue = %(queue)s ORDER BY prio_key, sort_at, id LIMIT %(limit)s) h
LEFT JOIN nq_flow_key k FORCE INDEX (PRIMARY) ON k.queue = %(queue)s AND k.job_key = h.job_key
ORDER BY h.prio_key, h.sort_at, h.id

-- flow_lean_absent --
-- Read with flow_lean_head_counted: whether a key the lean claim's head does not hold may have a
-- free slot (its counter below the limit, or unknown): a named key whose jobs, if it has any, lie
-- behind a full head (FlowClaims.lean_grant then reads fully, now and then). One row at most: the key rows it
-- passes before it are the head's keys and the keys at their limit (each holds running jobs),
-- so it reads no more rows than the head's keys and the running jobs, whatever the queue's
-- number of keys. The queue's own row (the empty key) is not a key.
SELECT k.job_key FROM nq_flow_key k FORCE INDEX (PRIMARY)
WHERE k.queue = %(queue)s AND k.job_key <> '' AND (k.running IS NULL OR k.running < %(lim)s)
  AND k.job_key NOT IN (
    SELECT h.job_key FROM (SELECT job_key FROM nq_job FORCE INDEX (ix_state)
                           WHERE status = 0 AND queue = %(queue)s ORDER BY prio_key, sort_at, id
                           LIMIT %(limit)s) h
    WHERE h.job_key IS NOT NULL)
LIMIT 1

-- flow_head_keys --
-- A counting claim's head: the first ready jobs in claim order with their keys, from ix_state
-- alone (schema 10 holds the key; for a ready job prio_key, sort_at are its key_prio, run_at).
-- It serves as the free keys' candidates where it holds enough of them, and as the unkeyed read.
SELECT id, prio_key, sort_at, job_key FROM nq_job FORCE INDEX (ix_state)
WHERE status = 0 AND queue = %(queue)s ORDER BY prio_key, sort_at, id LIMIT %(limit)s

-- flow_unkeyed_deep --
-- The first `limit` jobs without a key among the first `depth` ready ones, in claim order (for
-- a ready job key_prio, run_at is its prio_key, sort_at): read only when flow_unkeyed_ready's
-- head was all (or nearly all) keyed jobs. A put_many of one key puts its jobs in a row, and a
-- key at its limit held them at the head: the unkeyed jobs behind them were never read, the
-- claim came back empty and drained, and the fleet idled with thousands of them ready.
SELECT j.id, j.key_prio, j.run_at FROM
  (SELECT id FROM nq_job FORCE INDEX (ix_state)
   WHERE status = 0 AND queue = %(queue)s ORDER BY prio_key, sort_at, id LIMIT %(depth)s) h
  JOIN nq_job j FORCE INDEX (PRIMARY) ON j.id = h.id
WHERE j.job_key IS NULL
ORDER BY j.key_prio, j.run_at, j.id LIMIT %(limit)s

-- flow_unkeyed_ready_for_version --
-- flow_unkeyed_ready among the first `limit` ready jobs the consumer's code `version` may run
-- (as flow_key_ready_for_version, read only when the locking read met jobs too new for it).
SELECT j.id, j.key_prio, j.run_at FROM
  (SELECT id FROM nq_job FORCE INDEX (ix_state)
   WHERE status = 0 AND queue = %(queue)s AND (min_version IS NULL OR min_version <= %(version)s)
   ORDER BY prio_key, sort_at, id LIMIT %(limit)s) h
  JOIN nq_job j FORCE INDEX (PRIMARY) ON j.id = h.id
WHERE j.job_key IS NULL

-- claim_lock --
-- Step 2: lock by primary key only. FORCE INDEX (PRIMARY) matters: on a small table the
-- optimizer may scan a covering secondary index and lock every row it passes. Rows another
-- consumer holds are skipped; rows it already claimed fail the status test (a current read).
-- `suspect` comes next to last: a suspect job is claimed alone (queries.claim). `min_version`
-- last: a job whose minimum is above the consumer's code version is left alone (queries.lock_window;
-- read off the row already fetched, so a job without a minimum costs nothing more). Only when
-- it met such jobs does the claim read its candidates again past them (*_for_version).
-- run_at and created_at as their text's bytes: the Job decodes them only if they are read
-- (jobs.claimed); decoded as DATETIMEs they cost the consumer more than any other column, on
-- every row. BINARY, not CHAR: the server sends the same text for 0 to 0.1 µs a row more (a
-- CAST AS CHAR cost it 0.3-0.45 µs a row: benchmarks/claim_columns.py). A DATETIME(6)'s text
-- has one width, so claim order (queries.in_claim_order) sorts it as the times.
SELECT id, payload, priority, attempts, max_attempts, CAST(run_at AS BINARY), CAST(created_at AS BINARY), dedup_key, job_key,
       suspect, min_version
FROM nq_job FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND (status = 0 OR (status = 1 AND run_at <= NOW(6)))
FOR UPDATE SKIP LOCKED

-- claim_mark --
-- Step 3: the attempt is counted at claim time (no extra write per job when it starts): a
-- job that kills its consumer every time still runs out of attempts and ends dead instead of
-- looping forever. Taking a claim back undoes the count where it cannot be pinned on the job
-- (return_shared), and giving back an unstarted job undoes it too. FORCE INDEX (PRIMARY), as
-- in step 2: with 100 ids in a small table the optimizer chose a full index scan, which locked
-- (and waited on, and deadlocked over) every other consumer's claimed rows.
UPDATE nq_job FORCE INDEX (PRIMARY)
SET status = 2, owner = %(owner)s, claim_token = %(token)s, claimed_at = NOW(6),
    lease_until = NOW(6) + INTERVAL %(lease_us)s MICROSECOND, attempts = attempts + 1
WHERE id IN %(ids)s

-- rate_keys --
-- Rates: the keys of a claim's candidates (rate_per_key) when its read did not return them:
-- what budgets they spend.
SELECT id, job_key FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN %(ids)s

-- rate_hold --
-- When the queue's held jobs are to be woken (NULL, or no row: nothing held).
SELECT wake_at FROM nq_rate_hold WHERE queue = %(queue)s

-- rate_slots_lock --
-- Rates (store/rates.py): the budgets' logs, locked until the claim's (or consume_rate's) COMMIT:
-- a claimer of the same budget waits here for that COMMIT, then sees what it spent. One
-- statement in primary-key order (the queue's own budget '' first, then the keys sorted), so
-- every claimer locks in one order. Slots past a budget's N (its rate lowered since) are not
-- part of it. `now`: the server's time once the rows are locked (SYSDATE, not NOW, which is the
-- statement's start, before any wait for a peer's COMMIT): what the starts are written as and
-- measured against, one clock for every consumer process and host.
SELECT rate_key, slot, started_at, claim_token, SYSDATE(6) AS now FROM nq_rate
WHERE queue = %(queue)s AND rate_key IN %(keys)s
  AND slot < IF(rate_key = '', %(queue_count)s, %(key_count)s)
ORDER BY rate_key, slot
FOR UPDATE

-- rate_slots_peek --
-- Rates (store/rates.py, hint): the budgets' logs as committed, a plain read before the claim
-- locks any job: which keys have no start free now, so that their jobs are not locked at all
-- and the candidates of keys with room fill the batch. Only a hint: what a claim spends is
-- decided by rate_slots_lock, after its rows are locked.
SELECT rate_key, slot, started_at, claim_token, SYSDATE(6) AS now FROM nq_rate
WHERE queue = %(queue)s AND rate_key IN %(keys)s
  AND slot < IF(rate_key = '', %(queue_count)s, %(key_count)s)

-- rate_now --
-- The server's time, with rate_slots_peek: a budget not used yet has no row to carry it.
SELECT SYSDATE(6)

-- rate_slot_add --
-- A budget's slots, made on its first use (or when its N grows) as never spent. Repeated per
-- row by executemany (one multi-row INSERT); IGNORE: a peer making the same slot wins, and
-- rate_slots_lock then waits for its COMMIT.
INSERT IGNORE INTO nq_rate (queue, rate_key, slot, started_at) VALUES (%(queue)s, %(key)s, %(slot)s, '1970-01-01')

-- rate_spend --
-- Starts taken from a budget: its oldest slots (each a whole period old) become `now`.
UPDATE nq_rate SET started_at = %(now)s, claim_token = %(token)s
WHERE queue = %(queue)s AND rate_key = %(key)s AND slot IN %(slots)s

-- rate_hold_set --
-- A claim held jobs back for want of a start: the watcher's wait ends when the first budget
-- frees one (`wake_at`), or earlier if a hold that is still ahead says so.
INSERT INTO nq_rate_hold (queue, wake_at) VALUES (%(queue)s, %(wake_at)s)
ON DUPLICATE KEY UPDATE wake_at = IF(wake_at > NOW(6), LEAST(wake_at, VALUES(wake_at)), VALUES(wake_at))

-- rate_hold_clear --
-- A claim that held nothing back ends a hold whose time has come (else the watcher would wake
-- for it again and again); one still ahead is some other budget's, and stays.
UPDATE nq_rate_hold SET wake_at = NULL WHERE queue = %(queue)s AND wake_at <= NOW(6)

-- unclaim_token --
-- A claim rerun after its COMMIT's outcome was lost returns what the first run may have taken:
-- the jobs its earlier attempts' marks named (`ids`), by primary key. Without the ids (no index
-- leads with owner or claim_token) the update went through ix_state's claimed range, every
-- claimed job of every queue, locking each entry and then its row: it waited on every peer's
-- ack and outcome under way, and deadlocked with them (an ack holds its row and then deletes
-- the entry this held), so under load each rerun lost again until the retry gave up.
UPDATE nq_job FORCE INDEX (PRIMARY)
SET status = 0, owner = NULL, claim_token = NULL, lease_until = NULL,
    attempts = GREATEST(attempts, 1) - 1
WHERE id IN %(ids)s AND owner = %(owner)s AND claim_token = %(token)s AND status = 2

-- ack_delete --
-- Fencing: only rows still held by this claim; a reclaimed job is someone else's now.
-- Primary key only (see claim_mark: on a small table a batch-sized IN list got a full table
-- scan). A single-table DELETE takes no index hint, so this is the multi-table form.
DELETE nq_job FROM nq_job FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND claim_token = %(token)s AND status = 2

-- ack_keep --
UPDATE nq_job FORCE INDEX (PRIMARY)
SET status = 3, finished_at = NOW(6), lease_until = NULL
WHERE id IN %(ids)s AND claim_token = %(token)s AND status = 2

-- attempt_acked --
-- Each acked job's attempt record, in the ack's own transaction and round trip (queries.Acks),
-- before the ack itself and under the same fence, so its row count is the ack's. Per-job
-- times come as offsets in microseconds from `at` (FIELD finds the job's place in id_list, ELT
-- picks its offset): `at` is the server's time of the jobs' claim (Claim.clock), the offsets
-- the client's monotonic clock from that moment. Nothing in them depends on when the statement
-- runs: an ack the server answers late, or sends again on a new connection, records the same
-- times. Without `at` (no claim's clock known), offsets from the statement's time (NOW(6)).
-- The attempt's consumer is the claim's owner.
INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, consumer, host, started_at, ended_at)
SELECT id, claim_token, attempts, queue, 'done', owner, %(host)s,
       COALESCE(CAST(%(at)s AS DATETIME(6)), NOW(6)) + INTERVAL ELT(FIELD(id, %(id_list)s), %(started_offsets)s) MICROSECOND,
       COALESCE(CAST(%(at)s AS DATETIME(6)), NOW(6)) + INTERVAL ELT(FIELD(id, %(id_list)s), %(ended_offsets)s) MICROSECOND
FROM nq_job FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND claim_token = %(token)s AND status = 2
FOR UPDATE

-- attempt_acked_dense --
-- attempt_acked for a batch whose ids lie close together (a backlog drains in id order): the
-- times' offsets are laid out by the id's offset from `base` (0 where no job of the batch has
-- that id), so ELT picks a row's at once. FIELD scans id_list for every row, twice: with 100
-- jobs a quarter of the record's server time. CAST: the offset of an unsigned id is never an error.
INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, consumer, host, started_at, ended_at)
SELECT id, claim_token, attempts, queue, 'done', owner, %(host)s,
       COALESCE(CAST(%(at)s AS DATETIME(6)), NOW(6)) + INTERVAL ELT(CAST(id AS SIGNED) - %(base)s, %(started_offsets)s) MICROSECOND,
       COALESCE(CAST(%(at)s AS DATETIME(6)), NOW(6)) + INTERVAL ELT(CAST(id AS SIGNED) - %(base)s, %(ended_offsets)s) MICROSECOND
FROM nq_job FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND claim_token = %(token)s AND status = 2
FOR UPDATE

-- attempt_result --
-- A handler's return value, kept when the queue keeps results: on the attempt record that
-- attempt_acked wrote in the same query (no row when that one was fenced out).
UPDATE nq_attempt SET result = %(result)s WHERE job_id = %(id)s AND claim_token = %(token)s

-- results_missing --
-- After result writes that changed fewer rows than asked (results.keep_results): which of these
-- records of the claim hold no result (a KILL QUERY's cut-short UPDATE; a rerun after a lost
-- COMMIT writes the same values again and changes nothing).
SELECT job_id FROM nq_attempt FORCE INDEX (PRIMARY)
WHERE job_id IN %(ids)s AND claim_token = %(token)s AND result IS NULL

-- attempt_failed --
-- A failed attempt's record, sent with its retry_later or bury in one round trip
-- (queries.reschedule_or_bury), under the same fence. dead: the caller buries it; a job cancelled while it ran ends
-- dead too (retry_later). interrupted: its consumer's shutdown grace ran out while it ran (interrupt), not a
-- failure of its code. The error and the traceback are cut by bytes (queries.error_text).
-- started_at, ended_at: the attempt's times on the server's clock, placed by its claim's clock
-- (Claim.clock: not by when this runs, which a server answering late or a send by the stop
-- delays); NULL (no claim's clock known): ages before the statement's time.
INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, consumer, host, started_at, ended_at,
                        error, traceback)
SELECT id, claim_token, attempts, queue,
       IF(cancel_requested, 'cancelled', IF(%(interrupted)s, 'interrupted',
          IF(%(snoozed)s, 'snoozed', IF(%(dead)s, 'dead', 'failed')))), owner, %(host)s,
       COALESCE(%(started_at)s, NOW(6) - INTERVAL %(started_age_us)s MICROSECOND),
       COALESCE(%(ended_at)s, NOW(6) - INTERVAL %(ended_age_us)s MICROSECOND),
       %(error)s, %(traceback)s
FROM nq_job FORCE INDEX (PRIMARY)
WHERE id = %(id)s AND claim_token = %(token)s AND status = 2
FOR UPDATE

-- attempt_landed --
-- A failure's outcome fenced out (its job no longer claimed by this claim): whether it landed
-- anyway, by another send of the same outcome (the stop's and the worker's, of a batch whose
-- worker's send the server answered late; or a try of this one whose reply was lost). Its own
-- record under the claim's token says so: the outcome sent, with the error sent (NULL for a
-- snooze). A reaper's take-back writes its record under the claim's token too, but as 'taken
-- back', or 'interrupted' or 'cancelled' with its own reason as the error: that is a job taken
-- from us, not ours landed.
SELECT outcome FROM nq_attempt FORCE INDEX (PRIMARY)
WHERE job_id = %(id)s AND claim_token = %(token)s AND outcome <> 'taken back' AND error <=> %(error)s

-- attempts_prune --
-- A job keeps its last %(kept)s records: sent with every failure and snooze, after its record.
-- By count, not by attempt number: a snooze spends no attempt and an operator's retry starts
-- the count again, so numbers repeat (a snoozing job wrote hundreds of records numbered 1).
-- `cut` is the newest record to go (none: nothing goes), read through the primary key's
-- job_id prefix; LIMIT makes it a derived table of its own, which a DELETE may read.
DELETE a FROM nq_attempt a
JOIN (SELECT ended_at, claim_token FROM nq_attempt FORCE INDEX (PRIMARY) WHERE job_id = %(id)s
      ORDER BY ended_at DESC, claim_token DESC LIMIT 1 OFFSET %(kept)s) cut
  ON a.job_id = %(id)s AND (a.ended_at < cut.ended_at
                            OR (a.ended_at = cut.ended_at AND a.claim_token <= cut.claim_token))

-- block_savepoint --
-- job.transaction(), as its block opens: a mark that lives exactly as long as the block's
-- transaction. COMMIT, ROLLBACK and every implicit COMMIT (START TRANSACTION, SET autocommit = 1,
-- LOCK TABLES, DDL) drop it; with autocommit off a transaction is always open, so it is kept.
SAVEPOINT nq_block

-- block_still_open --
-- The completion query's first statement: 1305 when the mark is gone (the block's transaction
-- ended inside it), and then the server runs nothing after it: no completion, and the worker
-- sends no COMMIT.
RELEASE SAVEPOINT nq_block

-- block_commit --
-- job.transaction(): sent alone, once the completion query's replies said that each of its
-- statements did its part (store/completion.py). Never in the completion query itself: a KILL
-- QUERY can cut a statement short with an OK reply (a DELETE or UPDATE that changed no row, a
-- subquery read as NULL), so only the worker, reading the replies, can tell that the COMMIT may go.
COMMIT

-- complete_delete --
-- job.transaction() / job.complete_in(): the completion, in the handler's own transaction,
-- fenced by the claim (its token, its attempt, still claimed). Its row count (1, or 0 when the
-- claim was taken back or a KILL QUERY cut it short) decides between COMMIT and ClaimLost (the
-- worker's check of the replies, or the caller's check of the row count on a caller's connection).
DELETE FROM nq_job WHERE id = %(id)s AND claim_token = %(token)s AND attempts = %(attempt)s AND status = 2

-- complete_keep --
UPDATE nq_job SET status = 3, finished_at = UTC_TIMESTAMP(6), lease_until = NULL
WHERE id = %(id)s AND claim_token = %(token)s AND attempts = %(attempt)s AND status = 2

-- complete_record --
-- The completion's attempt record, after the completion in the same transaction (committed only
-- once the claim held: the worker's check of the replies, or the caller's row count): the proof, after a COMMIT whose reply
-- was lost, that it landed (completions_landed). Values the worker knows: no read of nq_job.
-- UTC_TIMESTAMP(6): on a caller's connection the session time zone may be anything. Its start
-- placed by its claim's clock (Claim.clock; else its age before this statement), its end this
-- statement's time: the completion is the attempt's end.
INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, consumer, host, started_at, ended_at,
                        result)
VALUES (%(id)s, %(token)s, %(attempt)s, %(queue)s, 'done', %(owner)s, %(host)s,
        COALESCE(%(started_at)s, UTC_TIMESTAMP(6) - INTERVAL %(started_age_us)s MICROSECOND), UTC_TIMESTAMP(6),
        %(result)s)

-- wsrep_sync_wait --
-- On a Galera node, before asking whether a lost COMMIT landed: 1 makes the node apply every
-- write set the cluster committed before the read; 0 puts it back.
SET SESSION wsrep_sync_wait = %(level)s

-- completions_landed --
-- Which of these jobs a completion or an ack of this claim committed: after a COMMIT whose
-- reply was lost, after a handler that completed its job on its own connection (job.complete_in),
-- and after an ack that came up short (a try before it may have landed, its reply lost).
SELECT job_id FROM nq_attempt FORCE INDEX (PRIMARY) WHERE job_id IN %(ids)s AND claim_token = %(token)s AND outcome = 'done'

-- job_row_locked --
-- Whether a transaction holds this job's row now (a NOWAIT probe: the lock wait error says it
-- does, a row read says nobody does; the caller rolls back at once). A caller's connection whose
-- completion (complete_in) did not land holds its job's row while its transaction is open; a
-- server restart since ended that transaction, and the connection's id may be another's now.
SELECT id FROM nq_job WHERE id = %(id)s FOR UPDATE NOWAIT

-- retry_later --
-- A job cancelled while it ran is not retried: it ends cancelled (5), its error kept.
UPDATE nq_job
SET status = IF(cancel_requested, 5, 1),
    run_at = IF(cancel_requested, run_at, NOW(6) + INTERVAL %(delay_us)s MICROSECOND),
    finished_at = IF(cancel_requested, NOW(6), NULL), last_error = %(error)s,
    owner = NULL, claim_token = NULL, lease_until = NULL
WHERE id = %(id)s AND claim_token = %(token)s AND status = 2

-- snooze --
-- job.snooze(s) / raise notifyq.Snooze(s): back to scheduled, due in delay_us, the attempt counted
-- at claim undone (a snooze spends none). A job cancelled meanwhile ends cancelled instead.
UPDATE nq_job
SET status = IF(cancel_requested, 5, 1),
    run_at = IF(cancel_requested, run_at, NOW(6) + INTERVAL %(delay_us)s MICROSECOND),
    finished_at = IF(cancel_requested, NOW(6), NULL),
    last_error = IF(cancel_requested, %(error)s, last_error),
    attempts = IF(cancel_requested, attempts, GREATEST(attempts, 1) - 1),
    owner = NULL, claim_token = NULL, lease_until = NULL
WHERE id = %(id)s AND claim_token = %(token)s AND status = 2

-- interrupt --
-- Its consumer's shutdown grace ran out while the job ran (a soft stop: a deploy), by that live
-- process: back to ready at once, the attempt counted at claim undone, last_error kept (its
-- attempt record, 'interrupted', says why). Not a suspect: a crash is no interruption, and a
-- consumer's crash goes through the reaper, which charges a job alone in its hands. A job
-- cancelled meanwhile ends cancelled instead, as in give_back.
UPDATE nq_job
SET status = IF(cancel_requested, 5, 0),
    last_error = IF(cancel_requested, %(error)s, last_error),
    finished_at = IF(cancel_requested, NOW(6), NULL),
    attempts = IF(cancel_requested, attempts, GREATEST(attempts, 1) - 1),
    owner = NULL, claim_token = NULL, lease_until = NULL
WHERE id = %(id)s AND claim_token = %(token)s AND status = 2

-- ended_cancelled --
-- After a failure's retry_later, bury or snooze, in the same round trip: whether the job ended
-- cancelled (its cancel was requested while it ran), which the worker counts and logs as a cancel,
-- not as a failure.
SELECT status = 5 FROM nq_job FORCE INDEX (PRIMARY) WHERE id = %(id)s

-- bury --
-- Dead; or cancelled (5) when its cancel was requested while it ran.
UPDATE nq_job
SET status = IF(cancel_requested, 5, 4), last_error = %(error)s, finished_at = NOW(6), owner = NULL, claim_token = NULL,
    lease_until = NULL
WHERE id = %(id)s AND claim_token = %(token)s AND status = 2

-- give_back --
-- Claimed but never started (shutdown): not an attempt, so the count is undone. A job cancelled
-- meanwhile ends cancelled, not ready: it must never start. (Every assignment here and below reads
-- only columns it does not set: right whatever the order of evaluation, which MariaDB's
-- SIMULTANEOUS_ASSIGNMENT mode changes.)
UPDATE nq_job FORCE INDEX (PRIMARY)
SET status = IF(cancel_requested, 5, 0),
    last_error = IF(cancel_requested, %(cancelled)s, last_error),
    finished_at = IF(cancel_requested, NOW(6), NULL),
    owner = NULL, claim_token = NULL, lease_until = NULL,
    attempts = GREATEST(attempts, 1) - 1
WHERE id IN %(ids)s AND claim_token = %(token)s AND status = 2

-- extend_lease --
-- A live consumer's claim: the running job and the ones waiting behind it, one statement per
-- batch. Its row count tells the worker whether it still owns them all (claims_owned if not).
UPDATE nq_job FORCE INDEX (PRIMARY) SET lease_until = NOW(6) + INTERVAL %(lease_us)s MICROSECOND
WHERE id IN %(ids)s AND claim_token = %(token)s AND status = 2

-- register_consumer --
-- An upsert: a consumer that took its own lock back after a reconnect re-registers its id, with
-- the server it now holds the lock on (node: the lock session's CONCAT(@@hostname, ':', @@port);
-- on a Galera cluster after a failover, another node than before). flow: the flow settings it
-- applies per queue (JSON, presence.flow_record), for the console's flow pages, and whether its
-- claims of each keep the per-key counters (store/count_trust.py).
INSERT INTO nq_consumer (id, lock_name, host, pid, queues, wakeup, node, flow)
VALUES (%(id)s, %(lock_name)s, %(host)s, %(pid)s, %(queues)s, %(wakeup)s, %(node)s, %(flow)s)
ON DUPLICATE KEY UPDATE last_seen = NOW(6), wakeup = %(wakeup)s, node = %(node)s, flow = %(flow)s

-- consumers_flow --
-- The flow settings the registered consumers of a queue record (store/count_trust.py: whether
-- every one keeps the per-key counters). A few rows: nq_consumer holds one per process.
SELECT flow FROM nq_consumer WHERE FIND_IN_SET(%(queue)s, queues)

-- record_consumer_flow --
-- After a reload changed them: the flow settings the consumer applies from its next claims.
-- Information only, like the row's other columns but last_seen: no lock test (a row a reaper
-- deleted stays deleted).
UPDATE nq_consumer SET flow = %(flow)s WHERE id = %(id)s

-- touch_consumer --
-- Information only, but for a lock-mode consumer written only by the session holding its lock:
-- a touch that reconnected to a restarted server (Session.run reruns it) before the consumer took
-- its lock back there would tell a reaper it had (dead_consumers' since_s), and its free lock
-- would read as its death.
UPDATE nq_consumer SET last_seen = NOW(6), wakeup = %(wakeup)s
WHERE id = %(id)s AND (%(wakeup)s <> 'locks' OR IS_USED_LOCK(lock_name) = CONNECTION_ID())

-- server_uptime --
-- Between two server_clock reads: the second the server started in (liveness.restarted_since_s).
SHOW GLOBAL STATUS LIKE 'Uptime'

-- server_clock --
SELECT UNIX_TIMESTAMP()

-- server_clock_us --
SELECT UNIX_TIMESTAMP(NOW(6))

-- mark_stopping --
-- A consumer asked to stop (its shutdown's first step): what it still holds, should it die before
-- it settles them (a second SIGTERM, systemd's SIGKILL after TimeoutStopSec), the reaper gives
-- back as interrupted, not charged (liveness.take_back). The row goes at its clean exit anyway.
UPDATE nq_consumer SET stopping = 1 WHERE id = %(id)s

-- consumer_stopping --
-- Inside a reclaim, after the verdict: whether the dead consumer had been asked to stop.
SELECT stopping FROM nq_consumer WHERE id = %(id)s

-- unregister_consumer --
DELETE FROM nq_consumer WHERE id = %(id)s

-- claims_left --
-- A consumer's own at its exit: does it still hold a claim? Its row goes only if not
-- (liveness.unregister_unclaiming). One that does (a worker failed before it settled its batch)
-- keeps its row: its lock, free once it exited, is its death to the next reaper pass, which takes
-- those jobs back then, not at their lease's end. A plain read, apart from the DELETE: the claimed
-- range of ix_state is every consumer's, and the owner is tested on the row, so as a subquery of
-- the DELETE it took a shared lock on every claimed row it passed. It waited on a peer's ack
-- under way, and, once that ack went on to the index entry it had read-locked, deadlocked with
-- it: InnoDB rolled the ack back, past its lease, and its jobs ran again (the fault schedule).
-- Nothing claims under an exiting consumer's id (its workers have ended); a claim that did would
-- find no row, and come back as an orphan's (reclaim_orphan).
SELECT EXISTS (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 AND owner = %(id)s)

-- reap_needed --
-- The reaper's cheap question, asked every few seconds: is anyone dead or any lease over?
-- A consumer is judged by what it has: its liveness lock (wakeup 'locks'), or else its heartbeat
-- (wakeup 'polling': it never held the lock, so IS_FREE_LOCK would call it dead while it runs).
-- IF evaluates only the branch it picks.
-- Advisory locks are local to a server: only a consumer whose lock lives on this session's server
-- (node, or '' from before schema 4) is judged by it; one on another Galera node by its heartbeat.
SELECT (SELECT COUNT(*) FROM nq_consumer
        WHERE IF(wakeup = 'locks' AND node IN ('', CONCAT(@@hostname, ':', @@port)), IS_FREE_LOCK(lock_name) = 1,
                 last_seen < NOW(6) - INTERVAL %(stale_us)s MICROSECOND))
     + (SELECT COUNT(*) FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 AND sort_at < NOW(6))

-- orphans_exist --
-- reap_needed's rarer part (Presence asks it every ORPHAN_CHECK_S): is any job claimed by an
-- owner with no registration? A scan of the claimed range (a row lookup each: the owner is on the
-- row), stopped at the first.
SELECT EXISTS (SELECT 1 FROM nq_job FORCE INDEX (ix_state)
               WHERE status = 2 AND NOT EXISTS (SELECT 1 FROM nq_consumer c WHERE c.id = nq_job.owner))

-- orphan_owners --
-- Owners of claimed jobs that have no registration: a consumer that left holding them, or that
-- claimed under an id a reaper had judged dead already. Each is judged by its lock in the
-- reclaim's own transaction (liveness.reclaim_orphan). Bounded, as expired_leases.
SELECT DISTINCT owner FROM nq_job FORCE INDEX (ix_state)
WHERE status = 2 AND NOT EXISTS (SELECT 1 FROM nq_consumer c WHERE c.id = nq_job.owner)
LIMIT 1000

-- gone_claims_due --
-- Before an --exit-when-empty worker exits (liveness.gone_claims_due_s): microseconds until the
-- earliest lease of the queue's jobs claimed by an owner that is gone (no registration, or a
-- lock-mode consumer of this node whose lock is free) runs out; NULL if there is none. A reaper
-- pass may not judge such an owner yet (a server that restarted within the grace, reaper.reap):
-- its lease still brings the jobs back.
SELECT TIMESTAMPDIFF(MICROSECOND, NOW(6), MIN(j.lease_until))
FROM nq_job j FORCE INDEX (ix_state) LEFT JOIN nq_consumer c ON c.id = j.owner
WHERE j.status = 2 AND j.queue = %(queue)s
  AND (c.id IS NULL OR (c.wakeup = 'locks' AND c.node IN ('', CONCAT(@@hostname, ':', @@port))
                        AND IS_FREE_LOCK(c.lock_name) = 1))

-- dead_consumers --
-- The liveness test of lock-mode consumers: a registered consumer whose lock nobody holds has
-- lost its session. Polling consumers hold no lock: stale_consumers judges them. Nor does one
-- whose lock lives on another server (a Galera node: locks are node-local, so it reads as free
-- here while its holder runs): stale_consumers judges it by its heartbeat too. grace_us (0 but
-- on a Galera node, liveness.GALERA_LOCK_GRACE_S): its heartbeat must be silent that long too.
-- since_s (a server that restarted less than a grace ago, reaper.reap: the first whole second
-- after its start, liveness.restarted_since_s): only consumers that talked to it since are
-- judged, by the lock they took back on it; the others may be alive and about to take their lock
-- back. (Off Galera a lock-mode consumer's last_seen is written only by the session holding its
-- lock: register_consumer right after taking it, touch_consumer while it holds it. On a Galera
-- node its heartbeat writes it too, and a heartbeat that beats keeps it alive: grace_us.)
SELECT id, lock_name, queues FROM nq_consumer
WHERE wakeup = 'locks' AND node IN ('', CONCAT(@@hostname, ':', @@port)) AND IS_FREE_LOCK(lock_name) = 1
  AND (%(grace_us)s = 0 OR last_seen < NOW(6) - INTERVAL %(grace_us)s MICROSECOND)
  AND (%(since_s)s IS NULL OR last_seen >= FROM_UNIXTIME(%(since_s)s))

-- stale_consumers --
-- Consumers judged by heartbeat (polling ones, and lock-mode ones whose lock lives on another
-- server) whose heartbeat stopped (heartbeat.py beats well inside stale_us).
-- since_s: as in dead_consumers.
SELECT id, queues FROM nq_consumer
WHERE NOT (wakeup = 'locks' AND node IN ('', CONCAT(@@hostname, ':', @@port))) AND last_seen < NOW(6) - INTERVAL %(stale_us)s MICROSECOND
  AND (%(since_s)s IS NULL OR last_seen >= FROM_UNIXTIME(%(since_s)s))

-- drop_stale_consumer --
-- The judgement and the verdict in one statement: a heartbeat that lands first keeps the row,
-- and then nothing of that consumer is taken back.
-- since_s: as in dead_consumers, asked again here (the session may have reconnected to a server
-- that restarted since the list was read).
DELETE FROM nq_consumer
WHERE id = %(id)s AND NOT (wakeup = 'locks' AND node IN ('', CONCAT(@@hostname, ':', @@port)))
  AND last_seen < NOW(6) - INTERVAL %(stale_us)s MICROSECOND
  AND (%(since_s)s IS NULL OR last_seen >= FROM_UNIXTIME(%(since_s)s))

-- consumer_alive_after_all --
-- The verdict by lock, inside the reclaim: a row here means the consumer is not ours to take
-- back: it re-registered on another Galera node meanwhile and holds its lock there (free here),
-- or (grace_us, as in dead_consumers) its heartbeat beat again meanwhile, or (since_s, as in
-- dead_consumers, asked again: the session may have reconnected to a server that restarted since
-- the list was read) it has not talked to this server since it started.
SELECT 1 FROM nq_consumer
WHERE id = %(id)s AND (node NOT IN ('', CONCAT(@@hostname, ':', @@port))
                       OR (%(grace_us)s > 0 AND last_seen >= NOW(6) - INTERVAL %(grace_us)s MICROSECOND)
                       OR (%(since_s)s IS NOT NULL AND last_seen < FROM_UNIXTIME(%(since_s)s)))
FOR UPDATE

-- heartbeat --
-- A polling consumer's proof of life; no row means it was judged dead and must re-register.
UPDATE nq_consumer SET last_seen = NOW(6), wakeup = %(wakeup)s WHERE id = %(id)s

-- consumer_exists --
SELECT 1 FROM nq_consumer WHERE id = %(id)s

-- claims_owned --
-- Which of these jobs the claim still holds, when extend_lease changed fewer rows than asked.
SELECT id FROM nq_job FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND claim_token = %(token)s AND status = 2

-- claims_owned_lock --
-- claims_owned, locked (queries.retake): what the claim holds stays its own while the retake
-- waits for its keys' rows (flow_lock_wait), past the jobs' lease if a peer's claim holds one;
-- a plain read let a reaper take them back meanwhile, and the retake still called them ours.
SELECT id FROM nq_job FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND claim_token = %(token)s AND status = 2
FOR UPDATE

-- claims_of_owner --
-- Taking back a dead consumer's jobs (the reaper holds its lock), step 1: which are claimed under
-- its id, and by which claim, so that each is returned alone or shared (liveness.take_back). A
-- plain read: through the claimed range of ix_state (consumers x batch rows), the owner tested on
-- the row, so a locking read here locked, and waited on, every claimed row of every consumer
-- (a live one's ack under way; one stopped with its ack's transaction open, for the lock wait
-- timeout, on every retry). claims_lock then locks these by primary key.
SELECT id, claim_token FROM nq_job FORCE INDEX (ix_state)
WHERE status = 2 AND owner = %(owner)s

-- orphan_claims --
-- claims_of_owner for an owner with no registration (liveness.reclaim_orphan), with each job's
-- queue: no row names its queues.
SELECT id, claim_token, queue FROM nq_job FORCE INDEX (ix_state)
WHERE status = 2 AND owner = %(owner)s

-- claims_lock --
-- Step 2: the rows claims_of_owner read, locked by primary key if still claimed by the owner.
-- A row another transaction holds is skipped, never waited for (another reaper's pass, a
-- stopped process's open transaction): liveness.lock_whole_claims leaves its claim to a later
-- pass.
SELECT id, claim_token FROM nq_job FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND status = 2 AND owner = %(owner)s
FOR UPDATE SKIP LOCKED

-- expired_leases --
-- Whose leases ran out: a bounded read, so it names owners, not every job (a claim's rows can
-- straddle the limit; claims_expired then reads each owner's expired rows whole).
SELECT DISTINCT owner, queue FROM nq_job FORCE INDEX (ix_state)
WHERE status = 2 AND sort_at < NOW(6) LIMIT 1000

-- claims_expired --
-- Taking back jobs whose lease ran out, step 1: the owners' expired rows and their claims. By
-- owner, so every expired row of a claim is read in this pass: one job of a claim taken back
-- apart from the rest would count as alone and be charged. Through the claimed range of
-- ix_state, the lease tested in the index (a claimed job's sort_at is its lease_until), the owner
-- on the row. A plain read, as claims_of_owner (why there); claims_expired_lock locks them.
SELECT id, claim_token, owner FROM nq_job FORCE INDEX (ix_state)
WHERE status = 2 AND sort_at < NOW(6) AND owner IN %(owners)s

-- owners_stopping --
-- Of the owners whose leases ran out, those registered as asked to stop (mark_stopping): a
-- consumer that exited in a deploy without settling (the server was away at the grace's end)
-- keeps its registration; its jobs come back uncharged, by its lease as by its death.
SELECT id FROM nq_consumer WHERE id IN %(owners)s AND stopping = 1

-- claims_expired_lock --
-- Step 2: the rows claims_expired read, locked by primary key if still claimed and still expired
-- (their consumer may have extended or acked some since). Skipped if another transaction holds
-- them, as claims_lock.
SELECT id, claim_token FROM nq_job FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND status = 2 AND sort_at < NOW(6)
FOR UPDATE SKIP LOCKED

-- attempt_taken_back --
-- The record of an attempt whose claim a reaper takes back (its consumer died, or its lease ran
-- out), written before the job is returned (return_alone, return_shared), in the same
-- transaction: the rows are locked by the caller. outcome: 'taken back', or 'interrupted' when the
-- consumer had been asked to stop (mark_stopping). Its start is the claim's; its host the one its
-- consumer registered, while it is registered (a live one whose lease ran out, a dead one whose
-- registration goes after this; a stale polling consumer's went first: NULL).
INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, consumer, host, started_at, ended_at,
                        error)
SELECT nq_job.id, claim_token, attempts, queue, IF(cancel_requested, 'cancelled', %(outcome)s), owner,
       c.host, claimed_at, NOW(6), %(why)s
FROM nq_job FORCE INDEX (PRIMARY)
LEFT JOIN nq_consumer c ON c.id = nq_job.owner
WHERE nq_job.id IN %(ids)s AND status = 2 AND claim_token IS NOT NULL
ON DUPLICATE KEY UPDATE outcome = outcome

-- return_alone --
-- Step 2 for a job taken back alone from its claim: the only one its consumer still held when it
-- died, or the only one of its claim whose lease ran out. It was running (a live consumer acks
-- and gives back the others), so the attempt counted at claim time stands, and out of attempts
-- it is dead. A job cancelled while it ran ends cancelled (5) with the reason, never to run again. A
-- suspect from now on: it is claimed alone.
UPDATE nq_job FORCE INDEX (PRIMARY)
SET status = IF(cancel_requested, 5, IF(attempts >= max_attempts, 4, 0)),
    last_error = IF(cancel_requested, %(cancelled)s, IF(attempts >= max_attempts, %(error)s, last_error)),
    finished_at = IF(cancel_requested OR attempts >= max_attempts, NOW(6), NULL),
    suspect = 1, owner = NULL, claim_token = NULL, lease_until = NULL
WHERE id IN %(ids)s AND status = 2

-- return_shared --
-- Step 2 for jobs taken back together from one claim (a consumer that died or stalled with
-- several in hand): which one caused it is unknown, some may never have started, some may have
-- finished with their ack lost. So none is charged: the attempt counted at claim time is undone,
-- and each becomes a suspect, claimed alone from now on, so that a next crash names its culprit.
-- A job cancelled while it ran ends cancelled (5) with the reason and never runs again.
UPDATE nq_job FORCE INDEX (PRIMARY)
SET status = IF(cancel_requested, 5, 0),
    last_error = IF(cancel_requested, %(cancelled)s, last_error),
    finished_at = IF(cancel_requested, NOW(6), NULL),
    attempts = IF(cancel_requested, attempts, GREATEST(attempts, 1) - 1),
    suspect = 1, owner = NULL, claim_token = NULL, lease_until = NULL
WHERE id IN %(ids)s AND status = 2

-- watch_bell --
-- The watcher's idle cycle in one statement, as `watch` but choosing its bell by the locks held,
-- not by a row: a ringing producer holds one bell and rings only when a consumer watches
-- (store/bells.py, wakeup.py). Read the queue's enqueue count and, only if nothing new arrived
-- (or the queue is paused), wait: in GET_LOCK on bell `wait_on` when a ringer holds a bell, else
-- in SLEEP. `wait_on` is what the previous statement saw held at its end, before this
-- statement's read of the count, so any ring after that read releases the bell waited on (or
-- released it already: granted at once). NULL (a new turn): no bell wait this time, only the
-- read. A granted bell is released in the same statement, at once: its producer needs it for
-- the next ring. waited: 1 bell granted (and released), 0 bell wait timed out or was killed,
-- -1 slept, NULL did not wait. held: the bell held once this statement is done (after any
-- wait: the select list is evaluated in order), 0 or 1, NULL when no ringer holds one.
-- The wait comes right after the read (the count is read when the statement starts: its
-- snapshot), and reap and due_in_us after it: a ring there and back (a ring that released
-- `wait_on`, then one for a job committed after the read that took it again) has to fall in
-- that gap to leave the wait on a bell held again, and the reap tests every consumer's lock
-- (milliseconds with thousands of them). Their values do not depend on it: the same snapshot,
-- and NOW(6) is the statement's start. A ring moves the bell by taking the other one first, so
-- a ringer holds one at every instant; but a ring from bell 1 to bell 0 between a test of bell 0
-- and one of bell 1 makes both look free. Bell 0 is tested again after bell 1: one ring cannot
-- hide both (two rings during the tests are a count moved twice, which the bounded wait covers).
-- reap and due_in_us: as in `watch`; due_in_us is also when a rate frees a start for the jobs a
-- claim held back (nq_rate_hold, store/rates.py), if that comes first. lock_wait_s is wait_s as
-- GET_LOCK keeps it (advisory.lock_wait_s). `nap` (NULL: none) is a lock another session of the
-- process holds: with no bell, the wait is in GET_LOCK on it, not in SLEEP, whose KILL on MariaDB
-- may take 2 s (wakeup/nap.py); granted (its holder gone), it is let go at once; -1 however it ends.
SELECT s.total, q.watched_seq, q.paused,
       IF(s.total > q.watched_seq AND q.paused = 0, NULL,
          IF(%(use_bell)s AND (IS_USED_LOCK(%(bell0)s) IS NOT NULL OR IS_USED_LOCK(%(bell1)s) IS NOT NULL
                               OR IS_USED_LOCK(%(bell0)s) IS NOT NULL),
             IF(%(wait_on)s IS NULL, NULL,
                IF(GET_LOCK(IF(%(wait_on)s = 0, %(bell0)s, %(bell1)s), %(lock_wait_s)s) = 1,
                   RELEASE_LOCK(IF(%(wait_on)s = 0, %(bell0)s, %(bell1)s)), 0)),
             IF(IFNULL(IS_USED_LOCK(%(nap)s) <> CONNECTION_ID(), 0),
                IF(GET_LOCK(%(nap)s, %(lock_wait_s)s) = 1, RELEASE_LOCK(%(nap)s) - 2, -1),
                SLEEP(%(wait_s)s) - 1))) AS waited,
       (SELECT COUNT(*) FROM nq_consumer
        WHERE IF(wakeup = 'locks', IS_FREE_LOCK(lock_name) = 1,
                 last_seen < NOW(6) - INTERVAL %(stale_us)s MICROSECOND))
     + (SELECT COUNT(*) FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 AND sort_at < NOW(6))
       AS reap,
       TIMESTAMPDIFF(MICROSECOND, NOW(6),
         (SELECT LEAST(COALESCE(d.due, h.wake_at), COALESCE(h.wake_at, d.due))
          FROM (SELECT MIN(sort_at) AS due FROM nq_job FORCE INDEX (ix_state)
                WHERE status = 1 AND queue = %(queue)s AND prio_key = 0) d
          LEFT JOIN nq_rate_hold h ON h.queue = %(queue)s))
       AS due_in_us,
       CASE WHEN IS_USED_LOCK(%(bell0)s) IS NOT NULL THEN 0
            WHEN IS_USED_LOCK(%(bell1)s) IS NOT NULL THEN 1
            WHEN IS_USED_LOCK(%(bell0)s) IS NOT NULL THEN 0 END AS held
FROM nq_queue q,
     (SELECT COALESCE(SUM(seq), 0) AS total FROM nq_signal WHERE queue = %(queue)s) s
WHERE q.queue = %(queue)s

-- ring_look --
-- A ringing producer's COMMIT carries this read in its round trip (after the COMMIT, so what it
-- sees follows the jobs): is a consumer watching the queue, and which sessions hold the bells.
-- Nobody watching: no ring is needed, since whoever starts watching later reads the count first.
SELECT IS_USED_LOCK(%(watch)s), IS_USED_LOCK(%(bell0)s), IS_USED_LOCK(%(bell1)s)

-- ring --
-- Take the other bell, then release the held one: the watcher waiting on it is granted it. A
-- ringer never holds neither, so a watcher always has a held bell to wait on. Sent without
-- waiting for the reply (DO); the next ring_look says whether it rang (which bell is ours).
DO IF(GET_LOCK(%(next)s, %(wait_s)s) = 1, RELEASE_LOCK(%(held)s), 0)

-- ring_if_watched --
-- A ringer's wake() after the caller's own COMMIT (`put(conn=)`, transaction(), Django's on-commit):
-- the look and the ring in one statement, sent without waiting for its reply (their two round
-- trips were 0.3-0.5 ms between that COMMIT and the ring). It rings from whichever bell this
-- session holds, so it needs no client state the last such statement may have changed: nobody
-- watching, 10 + the bell held (no ring); rang, 20 + the bell held now; -1 when this session
-- holds neither bell or could not take the other (the Bell lets go of everything and arms again).
SELECT CASE CONNECTION_ID()
  WHEN IS_USED_LOCK(%(bell0)s) THEN
    IF(IS_USED_LOCK(%(watch)s) IS NULL, 10,
       IF(GET_LOCK(%(bell1)s, %(wait_s)s) = 1 AND RELEASE_LOCK(%(bell0)s) = 1, 21, -1))
  WHEN IS_USED_LOCK(%(bell1)s) THEN
    IF(IS_USED_LOCK(%(watch)s) IS NULL, 11,
       IF(GET_LOCK(%(bell0)s, %(wait_s)s) = 1 AND RELEASE_LOCK(%(bell1)s) = 1, 20, -1))
  ELSE -1 END

-- signal_total --
-- The queue's enqueue count: what a watcher's claim records as watched when it drains the queue.
SELECT COALESCE(SUM(seq), 0) FROM nq_signal WHERE queue = %(queue)s

-- mark_watched --
-- Everything enqueued up to `seq` has been claimed: run inside the watcher's claim when that
-- claim drained the queue, so the next watcher does not wake for work already taken.
UPDATE nq_queue SET watched_seq = GREATEST(watched_seq, %(seq)s) WHERE queue = %(queue)s

-- get_lock --
SELECT GET_LOCK(%(name)s, %(wait_s)s)

-- release_lock --
SELECT RELEASE_LOCK(%(name)s)

-- hand_watch_on --
-- The watcher hands the watch lock on right after its claim, sent without waiting for the reply
-- while the claim's COMMIT may still be in flight (Session.send_commit). The share lock on the
-- queue's row waits, on the server, for that COMMIT when the claim wrote the row (mark_watched,
-- whose reply was read before this was sent): the next watcher then reads the watched count
-- the claim recorded, and does not wake for work already taken. Held for this statement only
-- (autocommit), and the row's writers (claims, pause, resume) never wait for a user lock. If the
-- share lock fails (a lock wait timeout; on Galera a remote write set aborts it, 1213), the
-- release is not evaluated, and release_lock runs in its place (Session.send_later): never
-- a reconnect, which would free the liveness lock the first queue's watcher session holds.
-- One statement (the select list is evaluated in order, the locking read first), never two: the
-- instant wake KILLs QUERY this session, and a KILL QUERY that lands between two statements of
-- one query makes the server drop the rest unanswered (the first reply says more results
-- follow), so the client waited for a reply until its read timeout, and the watch lock stayed held.
-- A KILL that ends the share lock's wait makes its subquery NULL: the lock is released without
-- waiting, and the next watcher may wake once for work the claim took (one needless claim).
SELECT (SELECT COUNT(*) FROM nq_queue WHERE queue = %(queue)s LOCK IN SHARE MODE), RELEASE_LOCK(%(name)s)

-- hand_watch_on_claimed --
-- hand_watch_on after a claim that took jobs, whose last statements and COMMIT it sent without
-- waiting (queries.claim): the share lock is on one of its jobs, which the claim's locking read
-- holds already, so the release waits, on the server, for that COMMIT and the watched count it
-- records, whichever arrives first; a claim that failed frees the row unmarked, and the next
-- watcher then wakes for its jobs. As hand_watch_on otherwise (one statement; its fallback).
SELECT (SELECT COUNT(*) FROM nq_job WHERE id = %(job)s LOCK IN SHARE MODE), RELEASE_LOCK(%(name)s)

-- lock_holder --
SELECT IS_USED_LOCK(%(name)s)

-- lock_holder_and_me --
-- The holder's id, and this session's own as the server knows it: a proxy between client and
-- server gives the client another id in the handshake (wakeup.instant_wake checks the two).
SELECT IS_USED_LOCK(%(name)s), CONNECTION_ID()

-- kill_query --
KILL QUERY %(conn_id)s

-- kill_connection --
KILL CONNECTION %(conn_id)s

-- session_state --
-- One of our own sessions as the server sees it (the consumer's stall watch, consume/stall.py):
-- its command, whether it runs a statement now, and the seconds it has been in that state. A
-- client waiting for a reply from a session the server has listed without a statement for a
-- second waits for nothing. No row: the server has no such session.
SELECT COMMAND, INFO IS NOT NULL, TIME FROM information_schema.PROCESSLIST WHERE ID = %(conn_id)s

-- connection_from_port --
-- Whether the session of this id is still the one we opened from this client port: the server
-- lists a TCP session's host as host:port, and after a restart it gives ids from 1 again, so an
-- id alone may name another client's session. Our own user's sessions are visible without the
-- PROCESS privilege.
SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %(conn_id)s AND HOST LIKE %(host_like)s

-- connection_alive --
-- Our own user's sessions are visible without the PROCESS privilege.
SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %(conn_id)s

-- poll_signal --
-- Fallback without advisory locks: every idle consumer polls this one small read. With no
-- watcher to track scheduled jobs, each poller also learns when the earliest one is due, and,
-- as the watch statement tells a watcher, whether a reaper pass is needed: by heartbeat and
-- lease only (this server may refuse the lock functions). Without it a queue served only by
-- idle polling consumers left a hung handler's expired lease claimed for good. The earliest
-- due job's time is also a rate's refill for held jobs, if that comes first (as in watch_bell).
SELECT COALESCE(SUM(seq), 0), (SELECT paused FROM nq_queue WHERE queue = %(queue)s),
       TIMESTAMPDIFF(MICROSECOND, NOW(6),
         (SELECT LEAST(COALESCE(d.due, h.wake_at), COALESCE(h.wake_at, d.due))
          FROM (SELECT MIN(sort_at) AS due FROM nq_job FORCE INDEX (ix_state)
                WHERE status = 1 AND queue = %(queue)s AND prio_key = 0) d
          LEFT JOIN nq_rate_hold h ON h.queue = %(queue)s)),
       (SELECT COUNT(*) FROM nq_consumer
        WHERE wakeup <> 'locks' AND last_seen < NOW(6) - INTERVAL %(stale_us)s MICROSECOND)
     + (SELECT COUNT(*) FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 AND sort_at < NOW(6))
FROM nq_signal WHERE queue = %(queue)s

-- hold_session --
-- Lock sessions idle between statements while their owner runs a long batch or a producer waits
-- for input; an idle-timeout disconnect would silently drop the liveness lock or the bell.
SET SESSION wait_timeout = GREATEST(@@session.wait_timeout, %(wait_s)s)

-- keep_alive --
-- One tiny statement on a session whose owner is busy elsewhere: a session that is never silent
-- for its wait_timeout can have a short one (consume/keepalive.py).
DO 0

-- set_paused --
UPDATE nq_queue SET paused = %(paused)s WHERE queue = %(queue)s

-- queue_counts --
-- Per queue and status, with scheduled split into due and future; index-only on ix_state
-- (future and the earliest time count for ready and scheduled jobs only, whose sort_at is run_at).
SELECT queue, status, sort_at > NOW(6) AS future, COUNT(*), MIN(sort_at)
FROM nq_job FORCE INDEX (ix_state)
GROUP BY queue, status, future

-- flow_key_counts --
-- `notifyq status` of a limited or fair queue: the keys with the most ready jobs, each with its
-- claimed (running) and ready counts, and the queue's running jobs without a key. Reads the
-- queue's ready and claimed rows (ix_state ranges): an operator's command, not the hot path.
SELECT job_key, SUM(status = 2), SUM(status = 0) FROM nq_job FORCE INDEX (ix_state)
WHERE status IN (0, 2) AND queue = %(queue)s
GROUP BY job_key ORDER BY SUM(status = 0) DESC, job_key LIMIT %(limit)s

-- flow_running_total --
-- `notifyq status` of a limited or fair queue: all its running (claimed) jobs, keyed or not
-- (flow_key_counts reads only the top keys).
SELECT COUNT(*) FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 AND queue = %(queue)s

-- queue_rows --
SELECT queue, paused, watched_seq,
       (SELECT COALESCE(SUM(seq), 0) FROM nq_signal s WHERE s.queue = q.queue)
FROM nq_queue q

-- consumers --
-- alive: as the reaper judges it (reap_needed): by its lock, or by its heartbeat without one.
SELECT id, host, pid, queues, started_at, last_seen, wakeup,
       IF(wakeup = 'locks', IS_USED_LOCK(lock_name) IS NOT NULL,
          last_seen >= NOW(6) - INTERVAL %(stale_us)s MICROSECOND)
FROM nq_consumer ORDER BY started_at

-- server_now --
SELECT NOW(6)

-- ============================================================================================
-- Features: `notifyq jobs` admin commands, the periodic scheduler and retention, metrics and
-- status figures. Optional filters are written `(%(x)s IS NULL OR col = %(x)s)`: the driver
-- binds values client-side, so the server folds the test to a constant and can still use
-- the (queue, status) indexes.

-- job_get --
-- suspect: the job was held by a consumer that died or stalled; it is claimed alone from now on.
SELECT id, queue, status, priority, run_at, attempts, max_attempts, owner, claimed_at,
       lease_until, dedup_key, cancel_requested, suspect, payload, last_error, created_at, finished_at,
       cancelled_by, cancelled_at, job_key
FROM nq_job WHERE id = %(id)s

-- job_attempts --
-- `jobs show`: the job's attempt records (nq_attempt), oldest first; they outlive a deleted job.
SELECT attempt, outcome, consumer, host, started_at, ended_at, error, traceback, result
FROM nq_attempt WHERE job_id = %(id)s ORDER BY ended_at, attempt

-- job_result --
-- Producer.result(): the job's status and last error (NULL: no row), and its latest attempt
-- record's outcome and result (NULL: none). A purge's record is not an attempt: a done job
-- purged by retention keeps its result on the record before it, for result_ttl_s.
SELECT (SELECT status FROM nq_job WHERE id = %(id)s), (SELECT last_error FROM nq_job WHERE id = %(id)s),
       a.outcome, a.result
FROM (SELECT 1 AS one) x
LEFT JOIN (SELECT outcome, result FROM nq_attempt WHERE job_id = %(id)s AND outcome <> 'purged'
           ORDER BY ended_at DESC, attempt DESC LIMIT 1) a ON 1 = 1

-- jobs_status --
-- Producer.result()'s waits, all of a producer's at once: the status of each job still there
-- (a job with no row is gone: job_result then says why).
SELECT id, status FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN %(ids)s

-- job_list --
-- `jobs list`: oldest first, keyset-paged by id; the error is cut short for the table.
SELECT id, queue, status, priority, run_at, attempts, max_attempts, created_at, finished_at,
       cancel_requested, LEFT(last_error, 200), job_key
FROM nq_job
WHERE (%(queue)s IS NULL OR queue = %(queue)s)
  AND (%(status)s IS NULL OR status = %(status)s)
  AND (%(job_key)s IS NULL OR job_key = %(job_key)s)
  AND created_at <= NOW(6) - INTERVAL %(age_us)s MICROSECOND
  AND id > %(after)s
ORDER BY id LIMIT %(limit)s

-- job_ids --
-- One chunk of finished (dead or done) jobs for `retry --dead`, `purge` and retention:
-- keyset-paged by id so rows a chunk leaves behind are never read again.
SELECT id, queue FROM nq_job
WHERE status = %(status)s
  AND (%(queue)s IS NULL OR queue = %(queue)s)
  AND COALESCE(finished_at, created_at) <= NOW(6) - INTERVAL %(age_us)s MICROSECOND
  AND id > %(after)s
ORDER BY id LIMIT %(limit)s

-- job_retry --
-- Back to ready now with the attempts reset; the last error stays for the record, the
-- cancel's who and when do not (the job runs again: the attempt records keep the cancel). Never a
-- claimed job (it is running). A job that carries a dedup key is retried alone, under its
-- key's lock and only if no other pending job holds the key (admin_queries.retry_jobs).
-- A workflow's job (its edges from its parents, read by the child index: nothing for any other
-- job) waits again (status 6) for its parents still pending, each of its parents counted
-- afresh as the workflow counts them (waits_on: pending, parents_failed: dead or cancelled);
-- with none pending it is ready at once. A parent that ended dead or cancelled is not waited
-- for: the operator's retry runs the job without it (docs/workflows.md).
UPDATE nq_job FORCE INDEX (PRIMARY)
SET status = IF(EXISTS (SELECT 1 FROM nq_edge f FORCE INDEX (ix_child) WHERE f.child_id = nq_job.id AND f.state = 0),
                6, 0),
    waits_on = (SELECT COUNT(*) FROM nq_edge f FORCE INDEX (ix_child) WHERE f.child_id = nq_job.id AND f.state = 0),
    parents_failed = (SELECT COUNT(*) FROM nq_edge f FORCE INDEX (ix_child) WHERE f.child_id = nq_job.id AND f.state = 3),
    run_at = NOW(6), attempts = 0, finished_at = NULL, cancel_requested = 0,
    owner = NULL, claim_token = NULL, lease_until = NULL, cancelled_by = NULL, cancelled_at = NULL
WHERE id IN %(ids)s AND status IN (1, 3, 4, 5)

-- keyed_jobs --
-- The jobs of a retry chunk that carry a dedup key, with it: each is retried alone.
SELECT id, queue, dedup_key FROM nq_job FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND status IN (1, 3, 4, 5) AND dedup_key IS NOT NULL

-- job_record_gone --
-- Before a cancel deletes a pending job, or a purge a finished one: its record (claim token 0),
-- so that `jobs show` can say what became of it while retention keeps the records. `why`
-- names who did it. A job purged after it was retried and purged before keeps the latest.
-- A locking read: the rows it records are the ones the DELETE that follows removes.
INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, host, ended_at, error)
SELECT id, 0, attempts, queue, %(outcome)s, %(host)s, NOW(6), %(why)s
FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN %(ids)s AND status IN %(statuses)s
FOR UPDATE
ON DUPLICATE KEY UPDATE outcome = %(outcome)s, ended_at = NOW(6), error = %(why)s

-- job_purge --
-- The status is tested again: a job retried since its chunk was read is not deleted.
-- By primary key only, as the acks (the optimizer read a status index and locked more).
DELETE nq_job FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN %(ids)s AND status = %(status)s

-- job_cancel_kept --
-- A pending job of a workflow (waiting for its parents, or with children waiting for it): it
-- ends cancelled with its row kept, who asked and when, so that `jobs retry` can bring it back
-- and, with it, what its cancel cancelled down the line (workflows.revive). Its dedup key is
-- free (a key is held by pending jobs only). Any other pending job is deleted (job_cancel_pending).
UPDATE nq_job FORCE INDEX (PRIMARY)
SET status = 5, finished_at = NOW(6), cancelled_by = %(by)s, cancelled_at = NOW(6),
    last_error = CONCAT('not run: cancelled by ', %(by)s)
WHERE id = %(id)s AND status IN (0, 1, 6)
  AND (status = 6 OR EXISTS (SELECT 1 FROM nq_edge e FORCE INDEX (PRIMARY) WHERE e.parent_id = %(id)s AND e.state = 0))

-- job_cancel_pending --
-- Not yet claimed (ready or scheduled), and no workflow's (job_cancel_kept): gone, and its
-- dedup key with it.
DELETE FROM nq_job WHERE id = %(id)s AND status IN (0, 1)

-- job_cancel_running --
-- Claimed: the handler sees it through Job.cancel_requested() and stops when it can (a command
-- is stopped); the job then ends cancelled. Who asked and when are kept on the row.
UPDATE nq_job SET cancel_requested = 1, cancelled_by = %(by)s, cancelled_at = NOW(6)
WHERE id = %(id)s AND status = 2 AND cancel_requested = 0

-- jobs_cancel_check --
-- A batch's cooperative check in one statement (notifyq.cancelled(jobs), per-batch commands):
-- the jobs the claim still holds, with their cancel request; a job missing is no longer ours.
SELECT id, cancel_requested FROM nq_job FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND claim_token = %(token)s AND status = 2

-- job_cancel_check --
-- A handler's cooperative check; no row means the claim is no longer ours: stop as well.
SELECT cancel_requested FROM nq_job
WHERE id = %(id)s AND claim_token = %(token)s AND status = 2

-- steps_of_job --
-- Durable steps (store/steps.py): the finished steps of a job, read once per run as its first
-- step starts. Inside a job.transaction() block, a plain read in the block's transaction.
SELECT name, result FROM nq_step WHERE job_id = %(id)s

-- step_claim_held --
-- A step's fence, in the transaction that stores it: the job still claimed by this run's claim.
-- A locking read (LOCK IN SHARE MODE: MariaDB has no FOR SHARE) so that a take-back of the claim
-- (an UPDATE of the row) waits until the step has committed or rolled back: a run that takes
-- the job over then reads the step as it is, never one that commits after it looked.
SELECT id FROM nq_job WHERE id = %(id)s AND claim_token = %(token)s AND status = 2
LOCK IN SHARE MODE

-- step_insert --
-- In the step's own transaction after step_claim_held, or in the job.transaction() block the
-- step was taken in (whose completion is fenced by the claim).
INSERT INTO nq_step (job_id, name, result, claim_token, attempt, done_at)
VALUES (%(id)s, %(name)s, %(result)s, %(token)s, %(attempt)s, UTC_TIMESTAMP(6))

-- step_stored --
-- After a COMMIT whose reply was lost (Session.run's committed check): did it store the step?
SELECT 1 FROM nq_step WHERE job_id = %(id)s AND name = %(name)s AND claim_token = %(token)s

-- steps_purge --
-- Retention: the steps of these jobs go once their job and all its attempt records are gone.
-- Anti-joins by primary key: NOT EXISTS subqueries were materialised by a scan of every job's
-- and every record's index.
DELETE s FROM nq_step s FORCE INDEX (PRIMARY)
LEFT JOIN nq_attempt a FORCE INDEX (PRIMARY) ON a.job_id = s.job_id
LEFT JOIN nq_job j FORCE INDEX (PRIMARY) ON j.id = s.job_id
WHERE s.job_id IN %(ids)s AND a.job_id IS NULL AND j.id IS NULL

-- periodic_last_tick --
SELECT last_tick FROM nq_periodic WHERE queue = %(queue)s AND name = %(name)s

-- periodic_start --
-- First sight of an entry: its current tick is the baseline, not a job (a new entry does not
-- fire for a time before it existed). IGNORE: another scheduler may have just done the same.
INSERT IGNORE INTO nq_periodic (queue, name, last_tick) VALUES (%(queue)s, %(name)s, %(tick)s)

-- periodic_advance --
-- The exactly-once guard. It commits together with the tick's job; two schedulers that both
-- think they lead (a failover overlap) serialise on the row and only one sees a row change.
UPDATE nq_periodic SET last_tick = %(tick)s
WHERE queue = %(queue)s AND name = %(name)s AND last_tick < %(tick)s

-- periodic_rows --
SELECT queue, name, last_tick FROM nq_periodic ORDER BY queue, name

-- claim_ages --
-- Status: the longest-running claim and the pending cancel requests per queue. Claimed rows
-- are few (batch size x consumers), the claimed range of ix_state.
SELECT queue, MIN(claimed_at), SUM(cancel_requested)
FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 GROUP BY queue

-- queue_depth --
-- queue_counts for one queue: what a consumer's metrics endpoint reports for its own queues, at
-- every scrape. Each state is its own range of ix_state, so counting the work never reads the
-- kept history (done and dead jobs, often most of the table), and the history is counted only
-- up to %(cap)s rows. Rows as queue_counts: (status, future, count, min run_at).
(SELECT 0, 0, COUNT(*), MIN(sort_at) FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 0 AND queue = %(queue)s)
UNION ALL
(SELECT 1, 0, COUNT(*), MIN(sort_at) FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at <= NOW(6))
UNION ALL
(SELECT 1, 1, COUNT(*), MIN(sort_at) FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at > NOW(6))
UNION ALL
(SELECT 2, 0, COUNT(*), NULL FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 2 AND queue = %(queue)s)
UNION ALL
(SELECT 3, 0, COUNT(*), NULL FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 3 AND queue = %(queue)s LIMIT %(cap)s) done)
UNION ALL
(SELECT 4, 0, COUNT(*), NULL FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 4 AND queue = %(queue)s LIMIT %(cap)s) dead)
UNION ALL
(SELECT 5, 0, COUNT(*), NULL FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 5 AND queue = %(queue)s LIMIT %(cap)s) cancelled)

-- retention_ids --
-- One chunk of a queue's done or dead jobs that finished before the cutoff, oldest first: a
-- range of ix_state that holds exactly the rows to delete. No paging: a purged row leaves
-- the range, and so does one retried meanwhile (its status changed), which job_purge skips.
-- A finished job's prio_key is 0 and its sort_at its finished_at.
SELECT id FROM nq_job FORCE INDEX (ix_state)
WHERE status = %(status)s AND queue = %(queue)s AND prio_key = 0
  AND sort_at <= NOW(6) - INTERVAL %(age_us)s MICROSECOND
ORDER BY sort_at LIMIT %(limit)s

-- attempts_retention_ids --
-- Retention of attempt records: a queue's jobs with records that ended before the cutoff, a
-- range of ix_ended. Their old records go (attempts_purge), the job's newer ones stay.
SELECT job_id FROM nq_attempt FORCE INDEX (ix_ended)
WHERE queue = %(queue)s AND ended_at <= NOW(6) - INTERVAL %(age_us)s MICROSECOND
ORDER BY ended_at LIMIT %(limit)s

-- attempts_purge --
DELETE FROM nq_attempt
WHERE job_id IN %(ids)s AND ended_at <= NOW(6) - INTERVAL %(age_us)s MICROSECOND

-- gone_attempts_ids --
-- Retention with retention_s = 0 (finished jobs kept for ever): the next chunk of a queue's
-- attempt records older than the cutoff, after the last one a pass saw ((after_at, after_id):
-- keyset paging, so the records of jobs still there are passed once, not at every pass), in
-- ix_ended's order, each with whether its job is gone. Those of jobs gone go (attempts_purge).
-- A job is deleted with a record of that moment (its ack's, its purge's, its cancel's), so the
-- records of a job that goes later are met again when that record passes the cutoff.
SELECT a.job_id, a.ended_at, j.id IS NULL
FROM nq_attempt a FORCE INDEX (ix_ended)
LEFT JOIN nq_job j FORCE INDEX (PRIMARY) ON j.id = a.job_id
WHERE a.queue = %(queue)s AND a.ended_at <= NOW(6) - INTERVAL %(age_us)s MICROSECOND
  AND (a.ended_at > %(after_at)s OR (a.ended_at = %(after_at)s AND a.job_id > %(after_id)s))
ORDER BY a.ended_at, a.job_id LIMIT %(limit)s

-- demo_marker_create --
-- `notifyq demo` works in a database it creates itself and marks with a random token; it may
-- drop a database only when this table holds the token it wrote (schema.drop_database).
CREATE TABLE nq_demo_marker (token CHAR(32) NOT NULL PRIMARY KEY)

-- demo_marker_set --
INSERT INTO nq_demo_marker (token) VALUES (%(token)s)

-- demo_marker_get --
SELECT token FROM nq_demo_marker

-- ============================================================================================
-- The status page (notifyq web). Every read rides ix_state or a primary key: a page costs the
-- same with a million jobs queued (tests/integration/test_explain_web.py pins the plans).

-- web_queue_page --
-- One page of the overview: the queues named after %(after)s, in name order (the primary key).
SELECT queue, paused FROM nq_queue WHERE queue > %(after)s ORDER BY queue LIMIT %(limit)s

-- web_depth --
-- One queue's jobs by state, each state its own range of ix_state, counted up to %(cap)s
-- entries (a count at the cap is shown as "cap+"): index-only, except `retrying`, which reads
-- the rows of the %(sample)s not-yet-due scheduled jobs due soonest for their attempts (a
-- scheduled job that has run before is a retry waiting out its backoff; beyond the sample the
-- page estimates). Row reads cost ~8x an index entry. Due scheduled jobs are ready. Each row
-- names its queue: a page of queues is read as one statement, this repeated per queue
-- (admin_queries.web_queue_figures), and so are web_oldest and web_rate.
(SELECT 'ready', COUNT(*), %(queue)s FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 0 AND queue = %(queue)s LIMIT %(cap)s) r)
UNION ALL
(SELECT 'due', COUNT(*), %(queue)s FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state)
    WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at <= NOW(6) LIMIT %(cap)s) d)
UNION ALL
(SELECT 'scheduled', COUNT(*), %(queue)s FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state)
    WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at > NOW(6) LIMIT %(cap)s) s)
UNION ALL
(SELECT 'retrying', COALESCE(SUM(attempts > 0), 0), %(queue)s FROM
  (SELECT attempts FROM nq_job FORCE INDEX (ix_state)
    WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at > NOW(6) LIMIT %(sample)s) t)
UNION ALL
(SELECT 'claimed', COUNT(*), %(queue)s FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 AND queue = %(queue)s LIMIT %(cap)s) c)
UNION ALL
(SELECT 'done', COUNT(*), %(queue)s FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 3 AND queue = %(queue)s LIMIT %(cap)s) f)
UNION ALL
(SELECT 'dead', COUNT(*), %(queue)s FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 4 AND queue = %(queue)s LIMIT %(cap)s) x)
UNION ALL
(SELECT 'cancelled', COUNT(*), %(queue)s FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 5 AND queue = %(queue)s LIMIT %(cap)s) k)

-- web_oldest --
-- The earliest run_at of one queue's ready jobs and of its scheduled ones, by index probes.
-- Ready jobs sort by priority first, so their earliest is the least of each priority's first
-- entry: this reads the first entry of the highest priority ('ready': its prio_key and time)
-- and the lowest priority in use ('last', one entry from the end); web_oldest_after then finds
-- the priorities between, one probe each (admin_queries.web_oldest). A GROUP BY prio_key
-- with MIN(sort_at) lost its loose index scan on schema 10's ix_state: with the primary key's
-- column named in the index, MariaDB checks that every column the query touches is in it,
-- and it counts the columns prio_key and sort_at are generated from (priority, run_at,
-- lease_until, finished_at); it read every ready entry. A scheduled job's prio_key is 0, so
-- its earliest is the first entry of its range (MIN: one probe, "Select tables optimized away").
(SELECT 'ready', prio_key, sort_at, %(queue)s FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 0 AND queue = %(queue)s ORDER BY prio_key, sort_at LIMIT 1)
UNION ALL
(SELECT 'last', prio_key, NULL, %(queue)s FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 0 AND queue = %(queue)s ORDER BY prio_key DESC LIMIT 1)
UNION ALL
(SELECT 'scheduled', 0, MIN(sort_at), %(queue)s FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 1 AND queue = %(queue)s AND prio_key = 0)

-- web_oldest_after --
-- The next priority in use after %(after)s among one queue's ready jobs, and its earliest
-- time: the first entry of a range of ix_state, one probe. Per queue, as web_oldest.
(SELECT 'ready', prio_key, sort_at, %(queue)s FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 0 AND queue = %(queue)s AND prio_key > %(after)s ORDER BY prio_key, sort_at LIMIT 1)

-- web_oldest_rest --
-- The earliest time among one queue's ready jobs of the priorities after %(after)s, read
-- whole: for a queue with more priorities in use than admin_queries.WEB_OLDEST_ROUNDS probes
-- (index-only, the range's entries). Per queue, as web_oldest.
(SELECT 'ready', NULL, MIN(sort_at), %(queue)s FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 0 AND queue = %(queue)s AND prio_key > %(after)s)

-- web_rate --
-- Jobs of one queue that finished in each of the last %(minutes)s minutes, done and dead:
-- the newest %(cap)s of each range of ix_state (a finished job's sort_at is its finished_at),
-- index-only. Done jobs are there only where the queue keeps them (keep_done). The LIMIT
-- (minutes + 1 groups: never reached) keeps MariaDB from dropping ORDER BY NULL in a union,
-- which then sorted the groups.
(SELECT 3, TIMESTAMPDIFF(MINUTE, at, NOW(6)), COUNT(*), %(queue)s FROM
  (SELECT sort_at AS at FROM nq_job FORCE INDEX (ix_state)
    WHERE status = 3 AND queue = %(queue)s AND prio_key = 0
      AND sort_at > NOW(6) - INTERVAL %(minutes)s MINUTE
    ORDER BY sort_at DESC LIMIT %(cap)s) d GROUP BY 2 ORDER BY NULL LIMIT %(buckets)s)
UNION ALL
(SELECT 4, TIMESTAMPDIFF(MINUTE, at, NOW(6)), COUNT(*), %(queue)s FROM
  (SELECT sort_at AS at FROM nq_job FORCE INDEX (ix_state)
    WHERE status = 4 AND queue = %(queue)s AND prio_key = 0
      AND sort_at > NOW(6) - INTERVAL %(minutes)s MINUTE
    ORDER BY sort_at DESC LIMIT %(cap)s) x GROUP BY 2 ORDER BY NULL LIMIT %(buckets)s)

-- web_jobs --
-- The jobs page: one queue's jobs in one state, in ix_state's own order: ready jobs in claim
-- order, scheduled ones by due time, claimed ones by lease end. No filesort, and the read stops
-- at %(limit)s entries. Every queue: this per queue, the copies in one statement merged by
-- their sort columns (admin_queries.web_jobs). Naming `queue` in the ORDER BY, though it is
-- fixed, made MariaDB 10.11 sort.
SELECT id, queue, status, priority, run_at, attempts, max_attempts, created_at, finished_at,
       cancel_requested, LEFT(last_error, 200), dedup_key, prio_key, sort_at
FROM nq_job FORCE INDEX (ix_state)
WHERE status = %(status)s AND queue = %(queue)s
ORDER BY prio_key, sort_at, id LIMIT %(limit)s

-- web_jobs_newest --
-- web_jobs for done and dead jobs: the most recently finished first.
SELECT id, queue, status, priority, run_at, attempts, max_attempts, created_at, finished_at,
       cancel_requested, LEFT(last_error, 200), dedup_key, prio_key, sort_at
FROM nq_job FORCE INDEX (ix_state)
WHERE status = %(status)s AND queue = %(queue)s
ORDER BY prio_key DESC, sort_at DESC, id DESC LIMIT %(limit)s

-- web_dedup_job --
-- The job that took a queue's dedup key last (it holds the key while it is pending).
SELECT job_id FROM nq_dedup WHERE queue = %(queue)s AND dedup_key = %(key)s

-- web_claims_by_owner --
-- Jobs in each consumer's hands: the claimed range of ix_state (batch size x consumers rows).
SELECT owner, COUNT(*) FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 GROUP BY owner ORDER BY NULL

-- web_lock_holder --
-- The session holding a queue's periodic leader lock, and the client address it came from
-- (a user sees its own sessions in the process list without the PROCESS privilege).
SELECT IS_USED_LOCK(%(lock)s) AS holder,
       (SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK(%(lock)s))

-- mdl_schema_on --
-- `notifyq status --locks` (store/metadata_locks.py), read on demand only: whether the server runs
-- performance_schema at all (a server built without it has no such variable: error 1193).
SELECT @@performance_schema

-- mdl_instrument --
-- Whether the metadata-lock instrument is on: MySQL 8.0 enables it by default, MariaDB does not
-- (performance_schema_instrument='wait/lock/metadata/sql/mdl=ON'); without it metadata_locks is
-- empty. Reading it needs SELECT on performance_schema.* (error 1142 otherwise).
SELECT ENABLED FROM performance_schema.setup_instruments WHERE NAME = 'wait/lock/metadata/sql/mdl'

-- mdl_locks --
-- Who holds (GRANTED) and who waits (PENDING) on the named advisory locks: a GET_LOCK is a
-- 'USER LEVEL LOCK' whose OBJECT_NAME is the lock's name, on both servers. The owner's thread
-- gives its connection id, user, client host (no port) and seconds in its current state.
SELECT m.OBJECT_NAME, m.LOCK_STATUS, t.PROCESSLIST_ID, t.PROCESSLIST_USER, t.PROCESSLIST_HOST,
       t.PROCESSLIST_TIME
FROM performance_schema.metadata_locks m
LEFT JOIN performance_schema.threads t ON t.THREAD_ID = m.OWNER_THREAD_ID
WHERE m.OBJECT_TYPE = 'USER LEVEL LOCK' AND m.OBJECT_NAME IN %(names)s
  AND m.LOCK_STATUS IN ('GRANTED', 'PENDING')
ORDER BY m.OBJECT_NAME, m.LOCK_STATUS = 'GRANTED' DESC, t.PROCESSLIST_TIME DESC, t.PROCESSLIST_ID

-- ---------------------------------------------------------------- workflows (store/workflows.py)

-- insert_edges --
-- Only the VALUES row is used, after the head: one row per (parent, child).
INSERT INTO nq_edge (parent_id, child_id, child_queue) VALUES (%s, %s, %s)

-- parents_read --
-- The parents named by a put with after=: a plain read, no lock. A share lock held until the
-- put commits made a parent's ack wait for the put's transaction, however long the caller
-- kept it open (an application's own, put(conn=)), and fail after innodb_lock_wait_timeout,
-- taking its consumer down. A parent that ends between this read and the put's COMMIT (or
-- after the caller's snapshot began) is counted pending: its end's release does not see the
-- new edge, which stays waiting with its parent ended, and the sweep (edges_ended) settles it.
-- Never early: a child is counted down only by the edges an end marks.
SELECT id, status FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN %(ids)s

-- parents_gone --
-- Parents with no row, by their records: done (their ack's; the row went with the ack), or
-- cancelled before they ran (the cancel's record). No record: unknown. A locking read (a
-- current one, not a snapshot's), in a short transaction of the producer's own session: for a
-- put on a caller's connection, parents_state reads here, on that session, the parents the
-- caller's transaction does not see (a REPEATABLE READ snapshot older than them, or than their
-- ack), so that nothing is locked for as long as the caller's transaction lasts.
SELECT job_id, MAX(outcome = 'done') FROM nq_attempt FORCE INDEX (PRIMARY)
WHERE job_id IN %(ids)s AND outcome IN ('done', 'cancelled', 'purged')
GROUP BY job_id LOCK IN SHARE MODE

-- children_waiting --
-- A workflow's children, right after their INSERT (status 6): their parents' count and mode.
UPDATE nq_job FORCE INDEX (PRIMARY) SET waits_on = %(n)s, after_mode = %(mode)s WHERE id IN %(ids)s AND status = 6

-- edges_mark_done --
-- The ack's release, first step, in the ack's own transaction (queries.Acks) after the ack and its
-- records: the edges of the parents this claim acked (their 'done' record under its token, written
-- in this transaction: the fence) go from waiting to marked. An edge is marked once, ever.
UPDATE nq_edge FORCE INDEX (PRIMARY) SET state = 1
WHERE parent_id IN %(ids)s AND state = 0
  AND parent_id IN (SELECT job_id FROM nq_attempt WHERE job_id IN %(ids)s AND claim_token = %(token)s
                    AND outcome = 'done')

-- edges_mark_done_any --
-- edges_mark_done for parents known to have ended done (a put after them, the sweep): no fence.
UPDATE nq_edge FORCE INDEX (PRIMARY) SET state = 1 WHERE parent_id IN %(ids)s AND state = 0

-- children_count_down --
-- Each child of the marked edges counts its parents down by how many of its edges were marked
-- (the row lock on the child orders two parents' acks: the second reads the first's count).
-- The children by primary key, after the edges (STRAIGHT_JOIN, FORCE INDEX): every statement
-- of a release locks its waiting children and nothing else. On a small table the optimizer read
-- nq_job whole and the derived table by c.id, and that UPDATE locked (and waited on) every row
-- it passed: a claim's locked rows too, while that claim's unwaited mark waited for a lock the
-- release held (a workflow put's queue row), so the deadlock took the claim after its job
-- started, and the job ran twice. A waiting child is no claim's (status 6 is never claimed).
UPDATE (SELECT child_id, COUNT(*) AS n FROM nq_edge FORCE INDEX (PRIMARY)
        WHERE parent_id IN %(ids)s AND state IN (1, 4) GROUP BY child_id) d
STRAIGHT_JOIN nq_job c FORCE INDEX (PRIMARY) ON c.id = d.child_id
SET c.waits_on = c.waits_on - LEAST(c.waits_on, d.n)
WHERE c.status = 6

-- children_failed_count --
-- A failed parent's children that run anyway (after_mode 1, 2) count the failure. By primary
-- key after the edges, as children_count_down (which says why).
UPDATE (SELECT child_id, COUNT(*) AS n FROM nq_edge FORCE INDEX (PRIMARY)
        WHERE parent_id IN %(ids)s AND state = 4 GROUP BY child_id) d
STRAIGHT_JOIN nq_job c FORCE INDEX (PRIMARY) ON c.id = d.child_id
SET c.parents_failed = c.parents_failed + d.n
WHERE c.status = 6 AND c.after_mode > 0

-- children_release --
-- Children of the marked edges with no parent left: ready (or scheduled, when put with a delay
-- still ahead), exactly once (status 6 is left only here and by a cancel). An on_dead callback
-- (after_mode 2) whose parents all ended done is not needed: it ends cancelled, with the reason.
-- (Every assignment reads only columns it does not set.) The children by primary key after the
-- edges, as in children_count_down (which says why).
UPDATE nq_edge e FORCE INDEX (PRIMARY) STRAIGHT_JOIN nq_job c FORCE INDEX (PRIMARY) ON c.id = e.child_id
SET c.status = IF(c.after_mode = 2 AND c.parents_failed = 0, 5, IF(c.run_at > UTC_TIMESTAMP(6), 1, 0)),
    c.finished_at = IF(c.after_mode = 2 AND c.parents_failed = 0, UTC_TIMESTAMP(6), NULL),
    c.last_error = IF(c.after_mode = 2 AND c.parents_failed = 0, 'not run: no parent ended dead or cancelled',
                      c.last_error),
    c.cancelled_by = IF(c.after_mode = 2 AND c.parents_failed = 0, 'workflow', c.cancelled_by)
WHERE e.parent_id IN %(ids)s AND e.state IN (1, 4) AND c.status = 6 AND c.waits_on = 0

-- children_released_queues --
-- The queues of the children this release made ready or scheduled (marked edges live only
-- inside this transaction): the consumer that commits it wakes their idle consumers after its
-- COMMIT, as a put's producer does (consume/release_wake.py).
SELECT DISTINCT e.child_queue FROM nq_edge e FORCE INDEX (PRIMARY)
JOIN nq_job c ON c.id = e.child_id
WHERE e.parent_id IN %(ids)s AND e.state IN (1, 4) AND c.status IN (0, 1) AND c.waits_on = 0

-- children_wake --
-- The released children's queues, each bumped by how many it got, as a put bumps them: idle
-- consumers wake for the children. A child released here is ready now with a marked edge of
-- these parents (a marked edge lives only inside this transaction). Each queue's slot is taken
-- as bump_signal takes it: the first one no other transaction holds from the random `slot` on.
INSERT INTO nq_signal (queue, slot, seq)
SELECT e.child_queue, COALESCE(
    (SELECT s.slot FROM nq_signal s WHERE s.queue = e.child_queue AND s.slot >= %(slot)s
     ORDER BY s.slot LIMIT 1 FOR UPDATE SKIP LOCKED),
    (SELECT s.slot FROM nq_signal s WHERE s.queue = e.child_queue AND s.slot < %(slot)s
     ORDER BY s.slot LIMIT 1 FOR UPDATE SKIP LOCKED),
    %(slot)s), COUNT(*) FROM nq_edge e FORCE INDEX (PRIMARY)
JOIN nq_job c ON c.id = e.child_id
WHERE e.parent_id IN %(ids)s AND e.state IN (1, 4) AND c.status IN (0, 1) AND c.waits_on = 0
GROUP BY e.child_queue
ON DUPLICATE KEY UPDATE seq = seq + VALUES(seq)

-- edges_counted --
-- Last: the marked edges are counted (2 done, 3 failed); a retried ack finds none to count again.
UPDATE nq_edge FORCE INDEX (PRIMARY) SET state = IF(state = 1, 2, 3) WHERE parent_id IN %(ids)s AND state IN (1, 4)

-- children_to_count --
-- A release's check, before its count-down: the waiting children of the marked edges, each of
-- which the count-down must change (by these parents' edges only).
SELECT COUNT(*) FROM nq_job c
JOIN (SELECT DISTINCT child_id FROM nq_edge FORCE INDEX (PRIMARY)
      WHERE parent_id IN %(ids)s AND state IN (1, 4)) d ON d.child_id = c.id
WHERE c.status = 6

-- children_left_waiting --
-- A release's check, after it: no child of the marked edges waits with no parent left.
SELECT COUNT(*) FROM nq_job c
JOIN (SELECT DISTINCT child_id FROM nq_edge FORCE INDEX (PRIMARY)
      WHERE parent_id IN %(ids)s AND state IN (1, 4)) d ON d.child_id = c.id
WHERE c.status = 6 AND c.waits_on = 0

-- edges_mark_failed --
-- A parent that ended dead or cancelled: its waiting edges marked failed (4), counted below.
UPDATE nq_edge FORCE INDEX (PRIMARY) SET state = 4 WHERE parent_id IN %(ids)s AND state = 0

-- children_cancel --
-- Children of a failed parent that need every parent done (after_mode 0): cancelled, with the
-- reason; their own children are settled in turn (workflows.settle_failed). By primary key
-- after the edges, as children_count_down (which says why).
UPDATE nq_edge e FORCE INDEX (PRIMARY) STRAIGHT_JOIN nq_job c FORCE INDEX (PRIMARY) ON c.id = e.child_id
SET c.status = 5, c.finished_at = UTC_TIMESTAMP(6), c.cancelled_by = 'workflow', c.cancelled_at = UTC_TIMESTAMP(6),
    c.last_error = CONCAT('not run: parent ', e.parent_id, ' ended ', %(why)s)
WHERE e.parent_id IN %(ids)s AND e.state = 4 AND c.status = 6 AND c.after_mode = 0

-- children_cancelled_ids --
-- The children children_cancel just cancelled (their edge from these parents is still marked).
SELECT DISTINCT e.child_id FROM nq_edge e FORCE INDEX (PRIMARY) JOIN nq_job c ON c.id = e.child_id
WHERE e.parent_id IN %(ids)s AND e.state = 4 AND c.status = 5 AND c.cancelled_by = 'workflow'

-- parents_revive --
-- A dead or cancelled parent retried (`notifyq jobs retry`): its failed edges wait again.
UPDATE nq_edge FORCE INDEX (PRIMARY) SET state = 0 WHERE parent_id IN %(ids)s AND state = 3

-- children_recount --
-- After parents_revive: the children of these parents that still wait (they run anyway and
-- counted the failure, or a retry let them wait without the failed parent) wait for the
-- retried parent again: each counts its pending and failed parents afresh, from its edges (a
-- retried parent's edges were all settled: those waiting now are the revived ones). Else its
-- count, one short, released it before its other parents ended. By primary key after the
-- edges, as children_count_down (which says why).
UPDATE (SELECT child_id FROM nq_edge FORCE INDEX (PRIMARY)
        WHERE parent_id IN %(ids)s AND state = 0 GROUP BY child_id) d
STRAIGHT_JOIN nq_job c FORCE INDEX (PRIMARY) ON c.id = d.child_id
SET c.waits_on = (SELECT COUNT(*) FROM nq_edge f FORCE INDEX (ix_child) WHERE f.child_id = c.id AND f.state = 0),
    c.parents_failed = (SELECT COUNT(*) FROM nq_edge f FORCE INDEX (ix_child) WHERE f.child_id = c.id AND f.state = 3)
WHERE c.status = 6

-- children_revivable --
-- The children a workflow cancelled because of these parents, that no other parent failed:
-- they wait again (each counts its waiting parents afresh), and so do their own children.
-- STRAIGHT_JOIN: the edges of these parents first, then each child by primary key (the
-- optimizer otherwise read the cancelled jobs first and scanned the edges' index for each).
SELECT DISTINCT c.id FROM nq_edge e FORCE INDEX (PRIMARY) STRAIGHT_JOIN nq_job c FORCE INDEX (PRIMARY) ON c.id = e.child_id
WHERE e.parent_id IN %(ids)s AND c.status = 5 AND c.cancelled_by = 'workflow'
  AND NOT EXISTS (SELECT 1 FROM nq_edge f WHERE f.child_id = c.id AND f.state = 3)
FOR UPDATE

-- children_wait_again --
-- By primary key (see claim_mark): the optimizer read ix_state's cancelled range instead.
UPDATE nq_job c FORCE INDEX (PRIMARY)
SET c.status = 6, c.finished_at = NULL, c.cancelled_by = NULL, c.cancelled_at = NULL, c.last_error = NULL,
    c.waits_on = (SELECT COUNT(*) FROM nq_edge f WHERE f.child_id = c.id AND f.state = 0)
WHERE c.id IN %(ids)s AND c.status = 5

-- sweep_needed --
-- Whether the sweep (workflows.settle) has anything to do: a waiting edge whose parent ended
-- (edges_ended's), or a settled edge whose child is gone (edges_of_gone's). One statement, so a
-- consumer process can ask it on every sweep turn for the price of one read; each EXISTS stops
-- at its first row.
SELECT EXISTS (SELECT 1 FROM nq_edge e FORCE INDEX (ix_state) LEFT JOIN nq_job p ON p.id = e.parent_id
               WHERE e.state = 0 AND (p.id IS NULL OR p.status IN (3, 4, 5)))
    OR EXISTS (SELECT 1 FROM nq_edge e FORCE INDEX (ix_state) LEFT JOIN nq_job c ON c.id = e.child_id
               WHERE e.state IN (2, 3) AND c.id IS NULL)

-- edges_ended --
-- The sweep (workflows.settle): waiting edges whose parent has ended (done, dead or cancelled,
-- its row there or gone) though no transaction settled it: a KILL QUERY that cut a release
-- short, a burial by the reaper. A parent with no row ended done when its ack's record says so,
-- else it was cancelled before it ran (deleted) or purged.
SELECT DISTINCT e.parent_id, p.status,
       EXISTS (SELECT 1 FROM nq_attempt a WHERE a.job_id = e.parent_id AND a.outcome = 'done')
FROM nq_edge e FORCE INDEX (ix_state) LEFT JOIN nq_job p ON p.id = e.parent_id
WHERE e.state = 0 AND (p.id IS NULL OR p.status IN (3, 4, 5))
LIMIT %(limit)s

-- edges_of_gone --
-- The sweep: settled edges whose child is gone (done and deleted, purged): nothing reads them.
SELECT DISTINCT e.child_id FROM nq_edge e FORCE INDEX (ix_state) LEFT JOIN nq_job c ON c.id = e.child_id
WHERE e.state IN (2, 3) AND c.id IS NULL
LIMIT %(limit)s

-- edges_drop --
-- By the child index (multi-table form: a single-table DELETE takes no hint; on a small table it
-- scanned, and locked, every edge).
DELETE nq_edge FROM nq_edge FORCE INDEX (ix_child) WHERE child_id IN %(ids)s

-- job_progress --
-- A job's parents counted by edge state and parent status (a batch's progress is its
-- callback's), each parent by primary key: an edge counted done stays so when its parent, kept,
-- is retried (it runs again), so a parent is counted by its row while there is one, by its edge
-- once the row is gone (workflows.parents_now). web_job_progress is this, capped.
SELECT e.state, p.status, COUNT(*) FROM nq_edge e FORCE INDEX (ix_child)
LEFT JOIN nq_job p FORCE INDEX (PRIMARY) ON p.id = e.parent_id
WHERE e.child_id = %(id)s
GROUP BY e.state, p.status ORDER BY NULL

-- parent_results --
-- A child's parents' results: each parent's latest 'done' record (results kept per queue).
SELECT e.parent_id, a.result FROM nq_edge e FORCE INDEX (ix_child)
LEFT JOIN nq_attempt a ON a.job_id = e.parent_id AND a.outcome = 'done'
WHERE e.child_id = %(id)s
ORDER BY e.parent_id, a.ended_at

-- ---------------------------------------------------------------- the operations console (notifyq web)
-- A job's task is the "task" of its payload (@notifyq.task puts {"task": NAME, ...}), inside the
-- envelope of a job stored with a trace context (jobs/envelope.py: its text begins with MARKER;
-- valid JSON with that after its first character is such an envelope); a payload that is not JSON has none (JSON_VALID first: MySQL raises on
-- JSON_EXTRACT of other text).

-- web_running --
-- What runs now: the claimed range of ix_state (consumers x batch size rows), by queue then
-- lease end (the index's own order: no sort), each job's owner, claim time, lease and task.
-- The LIMIT bounds the read however many run.
SELECT id, queue, owner, claimed_at, lease_until, attempts, max_attempts, cancel_requested,
       IF(JSON_VALID(payload), JSON_UNQUOTE(JSON_EXTRACT(payload, IF(SUBSTRING(payload, 2, 16) = '"notifyq:trace":', '$.payload.task', '$.task'))), NULL) AS task
FROM nq_job FORCE INDEX (ix_state)
WHERE status = 2
ORDER BY queue, prio_key, sort_at, id LIMIT %(limit)s

-- web_history --
-- One queue's ended attempts in the last %(minutes)s minutes, newest first: a range of
-- nq_attempt's ix_ended (queue, ended_at), at most %(cap)s rows, each joined to its job by
-- primary key for its task and its due time (run_at). The queue wait is known for a job's
-- latest attempt while the job is stored (its run_at is then that attempt's due time); done
-- jobs that were deleted at their ack (keep_done off) have no task and no wait here.
SELECT a.outcome, a.ended_at, TIMESTAMPDIFF(MICROSECOND, a.started_at, a.ended_at) AS run_us,
       IF(j.attempts = a.attempt, TIMESTAMPDIFF(MICROSECOND, j.run_at, a.started_at), NULL) AS wait_us,
       IF(JSON_VALID(j.payload), JSON_UNQUOTE(JSON_EXTRACT(j.payload, IF(SUBSTRING(j.payload, 2, 16) = '"notifyq:trace":', '$.payload.task', '$.task'))), NULL) AS task
FROM nq_attempt a FORCE INDEX (ix_ended)
LEFT JOIN nq_job j FORCE INDEX (PRIMARY) ON j.id = a.job_id
WHERE a.queue = %(queue)s AND a.ended_at > NOW(6) - INTERVAL %(minutes)s MINUTE
ORDER BY a.ended_at DESC LIMIT %(cap)s

-- web_search --
-- A payload search, bounded: the first %(scan)s entries of one queue's range of ix_state in
-- one state (in the jobs page's order; for finished jobs only those finished after %(since)s,
-- a time range of the same index), of which the jobs whose payload holds %(text)s (bytes,
-- case-sensitive) or whose task is %(task)s. At most %(scan)s rows are read, however big the
-- table: never a scan of the table.
SELECT id, queue, status, priority, run_at, attempts, max_attempts, created_at, finished_at,
       cancel_requested, LEFT(last_error, 200), dedup_key, prio_key, sort_at
FROM (SELECT id, queue, status, priority, run_at, attempts, max_attempts, created_at, finished_at,
             cancel_requested, last_error, dedup_key, prio_key, sort_at, payload
      FROM nq_job FORCE INDEX (ix_state)
      WHERE status = %(status)s AND queue = %(queue)s AND sort_at >= %(since)s
      ORDER BY prio_key, sort_at, id LIMIT %(scan)s) s
WHERE (%(text)s = '' OR LOCATE(%(text)s, payload) > 0)
  AND (%(task)s = '' OR IF(JSON_VALID(payload), JSON_UNQUOTE(JSON_EXTRACT(payload, IF(SUBSTRING(payload, 2, 16) = '"notifyq:trace":', '$.payload.task', '$.task'))), NULL) = %(task)s)
ORDER BY prio_key, sort_at, id LIMIT %(limit)s

-- web_search_newest --
-- web_search for done, dead and cancelled jobs: the most recently finished first.
SELECT id, queue, status, priority, run_at, attempts, max_attempts, created_at, finished_at,
       cancel_requested, LEFT(last_error, 200), dedup_key, prio_key, sort_at
FROM (SELECT id, queue, status, priority, run_at, attempts, max_attempts, created_at, finished_at,
             cancel_requested, last_error, dedup_key, prio_key, sort_at, payload
      FROM nq_job FORCE INDEX (ix_state)
      WHERE status = %(status)s AND queue = %(queue)s AND sort_at >= %(since)s
      ORDER BY prio_key DESC, sort_at DESC, id DESC LIMIT %(scan)s) s
WHERE (%(text)s = '' OR LOCATE(%(text)s, payload) > 0)
  AND (%(task)s = '' OR IF(JSON_VALID(payload), JSON_UNQUOTE(JSON_EXTRACT(payload, IF(SUBSTRING(payload, 2, 16) = '"notifyq:trace":', '$.payload.task', '$.task'))), NULL) = %(task)s)
ORDER BY prio_key DESC, sort_at DESC, id DESC LIMIT %(limit)s

-- web_periodic_disable --
-- A periodic entry switched off: its last tick is set past any tick a cron can reach
-- (PERIODIC_OFF), so the scheduler's exactly-once guard (periodic_advance: last_tick < T)
-- refuses every tick, on every consumer of any version, with no column of its own. An entry
-- that never ticked gets its row now.
INSERT INTO nq_periodic (queue, name, last_tick) VALUES (%(queue)s, %(name)s, %(off)s)
ON DUPLICATE KEY UPDATE last_tick = %(off)s

-- web_periodic_enable --
-- Switched on again: the last tick becomes now, so the next tick of its cron is enqueued and
-- the ticks missed while it was off are not (as after downtime: catch-up enqueues only the
-- latest missed one, and there is none before now).
UPDATE nq_periodic SET last_tick = NOW(6)
WHERE queue = %(queue)s AND name = %(name)s AND last_tick = %(off)s

-- ---------------------------------------------------------------- the console's flow control and workflows
-- Each read is bounded by a LIMIT on an index range whatever the queue's backlog
-- (tests/integration/test_explain_web.py pins the plans; admin_queries names the bounds).

-- web_consumer_flows --
-- The live consumers (alive as `consumers` judges them), each with the queues it consumes and
-- the flow settings it records (NULL: it does not record them). nq_consumer is small (a row
-- per live process): read once per flow page and server, up to a LIMIT all the same.
SELECT id, host, pid, queues, flow FROM nq_consumer
WHERE IF(wakeup = 'locks', IS_USED_LOCK(lock_name) IS NOT NULL,
         last_seen >= NOW(6) - INTERVAL %(stale_us)s MICROSECOND)
ORDER BY started_at, id
LIMIT %(limit)s

-- web_flow_running --
-- A queue's running jobs by key: the first %(cap)s entries of its claimed range of ix_state
-- (what the consumers hold: batch size x consumers), each one's key from its row.
SELECT job_key, COUNT(*) FROM
  (SELECT job_key FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 AND queue = %(queue)s LIMIT %(cap)s) r
GROUP BY job_key ORDER BY NULL

-- web_flow_ready --
-- A queue's ready jobs, counted up to %(cap)s entries of its ready range of ix_state (index-only).
SELECT COUNT(*) FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 0 AND queue = %(queue)s LIMIT %(cap)s) r

-- web_flow_key_ready --
-- One key's ready jobs, counted up to %(cap)s entries of ix_key (a ref, index-only); repeated
-- per key in one statement (admin_queries.web_flow_key_ready), each copy with its key bound.
(SELECT %(key)s, COUNT(*) FROM
  (SELECT 1 FROM nq_job FORCE INDEX (ix_key) WHERE queue = %(queue)s AND ready_key = %(key)s LIMIT %(cap)s) r)

-- web_job_parents --
-- A job's parents, at most %(limit)s (the child index, in parent order), each with its queue
-- and status by primary key (none: its row is gone).
SELECT e.parent_id, e.state, p.queue, p.status FROM nq_edge e FORCE INDEX (ix_child)
LEFT JOIN nq_job p FORCE INDEX (PRIMARY) ON p.id = e.parent_id
WHERE e.child_id = %(id)s ORDER BY e.parent_id LIMIT %(limit)s

-- web_job_children --
-- A job's children, at most %(limit)s (the edges' primary key, in child order), each with its
-- queue and status.
SELECT e.child_id, e.state, c.queue, c.status FROM nq_edge e FORCE INDEX (PRIMARY)
LEFT JOIN nq_job c FORCE INDEX (PRIMARY) ON c.id = e.child_id
WHERE e.parent_id = %(id)s ORDER BY e.child_id LIMIT %(limit)s

-- web_job_progress --
-- A job's parents counted by edge state and parent status (a batch's progress is its
-- callback's): the first %(cap)s of its edges, each parent by primary key, done ones too: an
-- edge counted done stays so when its parent, kept, is retried (it runs again), so the page
-- counts a parent by its row while there is one, by its edge once the row is gone.
SELECT e.state, p.status, COUNT(*) FROM
  (SELECT parent_id, state FROM nq_edge FORCE INDEX (ix_child) WHERE child_id = %(id)s LIMIT %(cap)s) e
LEFT JOIN nq_job p FORCE INDEX (PRIMARY) ON p.id = e.parent_id
GROUP BY e.state, p.status ORDER BY NULL

-- web_workflow_edges --
-- The workflow page's walk, one step: the edges from and to the jobs of %(ids)s (the edges'
-- primary key, the child index), at most %(limit)s each way.
(SELECT parent_id, child_id, state FROM nq_edge FORCE INDEX (PRIMARY) WHERE parent_id IN %(ids)s
  LIMIT %(limit)s)
UNION ALL
(SELECT parent_id, child_id, state FROM nq_edge FORCE INDEX (ix_child) WHERE child_id IN %(ids)s
  LIMIT %(limit)s)

-- web_workflow_jobs --
-- The workflow page's members by primary key: state, attempts, what they wait for.
SELECT id, queue, status, attempts, max_attempts, LEFT(last_error, 200), waits_on, after_mode
FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN %(ids)s

-- ready_left --
-- Whether the queue has a ready job a consumer of code `version` may run: a cron run's worker
-- (--exit-when-empty) whose claim a limit left empty asks it before it exits (queries.ready_left).
SELECT 1 FROM nq_job FORCE INDEX (ix_state)
WHERE status = 0 AND queue = %(queue)s AND (min_version IS NULL OR min_version <= %(version)s)
LIMIT 1

-- claimable_left --
-- Whether the queue has a ready or due job a consumer of code `version` may run: an idle
-- consumer whose claim came back empty asks it, and claims again now and then while there is
-- one, which another session's locks held (queries.claimable_left). A due job counts: the
-- claim's promotion passes over a row another session holds (due_ids).
(SELECT 1 FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 0 AND queue = %(queue)s AND (min_version IS NULL OR min_version <= %(version)s)
  LIMIT 1)
UNION ALL
(SELECT 1 FROM nq_job FORCE INDEX (ix_state)
  WHERE status = 1 AND queue = %(queue)s AND prio_key = 0 AND sort_at <= NOW(6)
    AND (min_version IS NULL OR min_version <= %(version)s)
  LIMIT 1)

-- flow_keys_unused --
-- Retention's sweep of a limited or fair queue's key rows (store/key_sweep.py), a plain read:
-- the next keys after `after`, in key order, with no ready job (ix_key) and none claimed. A
-- key used once (an order id) would otherwise keep its row for ever; a key that comes back is
-- found again by a claim's discovery and named anew.
SELECT k.job_key FROM nq_flow_key k
WHERE k.queue = %(queue)s AND k.job_key > %(after)s
  AND NOT EXISTS (SELECT 1 FROM nq_job j FORCE INDEX (ix_key) WHERE j.queue = k.queue AND j.ready_key = k.job_key)
  AND NOT EXISTS (SELECT 1 FROM nq_job c FORCE INDEX (ix_state)
                  WHERE c.status = 2 AND c.queue = k.queue AND c.job_key = k.job_key)
ORDER BY k.job_key LIMIT %(limit)s

-- flow_keys_drop --
-- The sweep's delete tests again, under the rows' locks (a claim holding a key's row is waited
-- for): a key that got a ready or claimed job meanwhile stays.
DELETE FROM nq_flow_key
WHERE queue = %(queue)s AND job_key IN %(keys)s
  AND NOT EXISTS (SELECT 1 FROM nq_job j FORCE INDEX (ix_key)
                  WHERE j.queue = nq_flow_key.queue AND j.ready_key = nq_flow_key.job_key)
  AND NOT EXISTS (SELECT 1 FROM nq_job c FORCE INDEX (ix_state)
                  WHERE c.status = 2 AND c.queue = nq_flow_key.queue AND c.job_key = nq_flow_key.job_key)

-- rate_keys_idle --
-- Retention's sweep of a queue's per-key rate logs (nq_rate), a plain read: the next keys after
-- `after` whose every slot is more than a period old, so hold no start any more. The queue's
-- own budget ('') stays.
SELECT rate_key FROM nq_rate
WHERE queue = %(queue)s AND rate_key > %(after)s
GROUP BY rate_key HAVING MAX(started_at) < NOW(6) - INTERVAL %(period_us)s MICROSECOND
ORDER BY rate_key LIMIT %(limit)s

-- rate_keys_drop --
-- Their slots, tested again row by row: a slot a claim spent meanwhile stays (with the slots
-- gone beside it, which the next claim of the key makes again as never spent).
DELETE FROM nq_rate
WHERE queue = %(queue)s AND rate_key IN %(keys)s
  AND started_at < NOW(6) - INTERVAL %(period_us)s MICROSECOND
