"""How idle consumers learn of new work without polling the jobs table: a producer's Waker
(waker.py) after each COMMIT, a consumer's Waiter (waiter.py) while it idles.

Consumer processes of a queue that have nothing to do queue up in GET_LOCK(watch) (granted in
arrival order on MariaDB; MySQL leaves the order undefined, and nothing here relies on it: any one
queued consumer becoming the watcher is all the protocol needs), each on its watcher session for that queue, which one idle worker of the process uses
at a time (consume/presence.py); its other idle workers wait for that seat in the process.
The one holding it, the watcher, runs one statement in a loop (sql `watch_bell`): it reads the
queue's enqueue count (the sum of its nq_signal slots) and, only if nothing new arrived, waits
inside that same statement: in GET_LOCK on a bell when a long-running producer rings
this queue, otherwise asleep with exponential backoff (poll_initial_s doubling up to
poll_max_s, and never past the earliest scheduled job's run_at): in SLEEP, or on MariaDB in
GET_LOCK on a lock its worker's work session holds, whose KILL never takes the server 2 s
(nap.py). When the count moved or the bell rang, the watcher claims a batch while still
holding the watch lock. That claim reads the count again in its first round trip, just before its candidate read, and if the batch drained
the queue it records that count as watched in its own COMMIT (queries.claim, as_watcher), so the
next watcher does not wake for work already taken. Then it releases the watch lock (without
waiting for the reply) before running the batch: the next idle consumer becomes the watcher.
A burst therefore wakes consumers one after another while batches come back full, and a
single job wakes exactly one.

From a ring to the handler: the producer's ring statement (GET_LOCK of its other bell, then
RELEASE_LOCK of the held one, sent without waiting for its reply), the grant ending the watch statement (which releases the bell
itself), then the claim's two round trips (count + candidates, the locking read) and its last
query unwaited (the mark, the watched count, the COMMIT), and the handler starts. An instant
wake's KILL ends the watch statement with an error instead of the grant: the watcher claims at once.

Wake-ups only make pick-up fast; correctness never depends on them. Every wait is bounded,
and after every wait either the count is read again or a claim looks at the jobs table.

Bells: a producer ringer holds one of bell0/bell1 (waker.py's Bell, store/bells.py). One per queue and
server: a GET_LOCK waits on one name, and only its holder can release it, so a second ringer could
never end the watcher's wait. The first producer to become ringer holds the ringer lock; the others
interrupt the watcher's wait (waker.py's InstantWake, `wakeup.instant_wake`), else their jobs are
found by the watcher's poll. Which way a producer's put wakes is its Waker's to choose (waker.py). Its COMMIT carries, in the
same round trip, a read of who holds the watch lock and the bells. Only when a consumer holds
the watch lock does it ring: in one statement it takes the other bell and releases the held one,
so it always holds at least one. Nobody watching after the COMMIT means nobody needs a ring:
whoever becomes the watcher later reads the count after the COMMIT. A look that saw nobody
holds for QUIET_LOOK_S (waker.py's Look): the puts in that window skip it (under load, where nobody idles, that
is nearly every put). A watcher that began inside the window reads the count again after its
first wait, which FIRST_WAIT_S (waiter.py) bounds whatever poll_initial_s says (a look sees
nobody in a hand-off's gap too), and the first put after the window looks and rings it. The watcher waits on the
bell its previous statement saw held at that statement's end; a new turn's first statement
only reads. That choice is made before the statement's read of the count, so:
  - a commit after the read is followed by a ring that releases the bell held at the choice
    (or, if a ring came between the choice and the read, the count already shows its jobs);
  - the released bell is granted at once if the release came before the GET_LOCK.
The watch statement releases a granted bell at once (the producer needs it for its next ring),
and the watcher goes to claim. Two grants on the same bell with the same count mean a bell held
by something that is no ringer (a producer arming, dying, or of an older version): that
watcher's next waits sleep instead until the count moves, so a free bell can never become a
spin (at most one needless claim per consumer). Two rings between one statement's choice and
its GET_LOCK would leave it waiting on a bell held again: a ring that released it (one for jobs
the count already showed, or already claimed: a COMMIT is seen before its committer's look
runs), then a ring for a job committed after the read, which takes it back. So the statement
waits right after its read (the reap, which tests every consumer's lock, and the due time come
after the wait): the second ring's COMMIT, look and ring would have to fall between the read and
the GET_LOCK of one statement; its bounded wait covers that. A ringer holds a bell at every
instant, but a ring from bell 1 to bell 0 between the statement's tests of bell 0 and bell 1
makes both look free (it would sleep through the ring): bell 0 is tested again after bell 1.
While no ringer holds a bell the watcher sleeps, so a ring reaches it only once it has read the
locks again: a new ringer's first put, and a put whose look finds the bell lost while a consumer
watches, wake it with the instant wake instead, where the producer may (Waker._way).

Reconnects: the watcher session's advisory locks die with its connection (the first queue's
also holds the process's liveness lock). Session.run reconnects (tenacity) and reruns the
statement, so after every statement the Waiter (waiter.py: the consumer's side) compares the session's generation and, if it
changed, gives up its turn: the worker re-registers (takes its liveness lock back, or a new
one) before it waits or claims again. A producer's bell session raises its own
wait_timeout (advisory.hold_session): it sits idle while the producer waits for input, and an
idle-timeout disconnect would drop the bell. The watcher session that holds a consumer's liveness lock has
a short one instead (consumer.session_idle_s), kept alive while its workers are busy
(consume/presence.py), so that the liveness lock of a host that vanished is freed soon.

Without advisory locks (wakeup.use_locks = false, or the server refuses them: Galera's 1235,
a proxy's 1105) every idle consumer polls the signal row itself with the same backoff: correct,
but the cost grows with the number of consumers, and `notifyq status` says so.
"""

from notifyq.wakeup.waker import QUIET_LOOK_S
from notifyq.wakeup.waiter import FIRST_WAIT_S, READ_MARGIN_S, SAFETY_S, Waiter
from notifyq.wakeup.waker import Waker

__all__ = ["FIRST_WAIT_S", "QUIET_LOOK_S", "READ_MARGIN_S", "SAFETY_S", "Waiter", "Waker"]
