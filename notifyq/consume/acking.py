"""PendingAcks: a worker's finished successes between their batch's end and the ack that lands
them, and how it lands.

A busy worker's successes ride its next claim: queries.claim sends them first in the claim's
final query (a limited queue's claim: in its first statements), so one fsync'd COMMIT settles
the last batch and takes the next (queries.Acks).
That COMMIT is left on the wire while the new batch starts; it is read (and the acks counted)
before the next claim, or acked again on their own if it failed. A worker that does anything
but claim next (it idles, stops, runs a reaper pass, registers again) flushes them: they go
out on their own first. Acks that were not sent, or were sent in a claim that raised (so
rolled back), or acked on their own by an ack that gave up on a transient error, wait for the
next claim or flush.

The worker calls claim() and flush(); its batch's run hands over what it finished with keep().
Counting is the Outcomes' (acked, or lost: fenced out by the claim token). An ack the server
refuses for want of a grant gives its jobs back (ready, uncharged) rather than leaving them
claimed until a reaper pass: they run again once the grant is there, and the worker ends
(GrantMissing: exit 3).
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from notifyq import errors
from notifyq.consume.outcomes import Outcomes
from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.flow import FlowClaims
from notifyq.store.pipeline import Pending
from notifyq.store.rates import Rates

log = logging.getLogger("notifyq.consumer")


class PendingAcks:
    def __init__(self, outcomes: Outcomes):
        self.outcomes = outcomes
        self._waiting: queries.Acks | None = None  # for the next claim to carry
        # Carried by the last claim, whose COMMIT may still be on the wire (None: unread)
        self._riding: tuple[queries.Acks, Pending | None] | None = None
        self._released = False  # an ack since the last released_children() released workflow children
        # Every Acks handed over (keep) and not known landed yet: waiting, carried by a claim whose
        # COMMIT was not read, or on the wire (a claim's or an ack's that a frozen server holds).
        # The shutdown sends them again if its worker could not (send_at_exit); its batch was
        # settled when it handed them over, so no batch says they are still ours to ack.
        self._unlanded: list[queries.Acks] = []
        self._unlanded_lock = threading.Lock()

    @property
    def waiting(self) -> bool:
        """Successes wait for the next claim (or a flush)."""
        return self._waiting is not None

    def keep(self, acks: queries.Acks | None) -> None:
        """A batch's successes (None: none), for the next claim to carry. The claim that took
        the batch carried the acks that waited before it, so none wait now."""
        self._waiting = acks
        if acks is not None:
            with self._unlanded_lock:
                self._unlanded.append(acks)

    def unlanded(self) -> bool:
        """Successes handed over are not known landed (nor lost): the worker still holds them."""
        return bool(self._unlanded)

    def send_at_exit(self, session: Session) -> None:
        """The shutdown's (its own thread and session, after the grace): the successes whose ack
        the worker could not land are acked again here, as the stop sends a batch's unsent
        outcomes (BatchRun.abandon). Fenced by the claim's token, so an ack the worker still has
        on the wire lands once, and counts once (Outcomes.first_count; each send counts on a
        copy of its own: Acks.landed is a send's)."""
        with self._unlanded_lock:
            pending = list(self._unlanded)
        for acks in pending:
            self.outcomes.ack(session, dataclasses.replace(acks, landed=None))
            self._landed(acks)

    def _landed(self, acks: queries.Acks) -> None:
        """`acks` sent and answered (landed, or fenced out and counted lost): no longer held."""
        with self._unlanded_lock:
            self._unlanded = [a for a in self._unlanded if a is not acks]

    def claim(self, session: Session, queue: str, owner: str, batch_size: int, lease_s: float,
              as_watcher: bool = False, rates: Rates | None = None, version: int = 0,
              flow: FlowClaims | None = None, watch: str | None = None) -> queries.Claim:
        """queries.claim, carrying the successes that wait; the last claim's acks are counted
        first (or acked again: its COMMIT failed). version: the consumer's code version. watch:
        the queue's watch lock, whose holder a limited claim reads with its mark (Acks.watch):
        the slot wake (outcomes.freed) after it runs only if a consumer held it then."""
        # (A limited queue's claim counts its keys' running jobs from the claimed rows: it sends
        # the successes that wait first, in its own transaction, so that they count as running
        # no longer, queries.claim. Acked on their own before it, they cost a COMMIT more.)
        self._land_riding(session)
        acks, self._waiting = self._waiting, None
        if acks is not None:
            acks.watch = watch
        try:
            claim = queries.claim(session, queue, owner, batch_size, lease_s, as_watcher, acks, rates,
                                  version=version, flow=flow)
        except BaseException:
            self._waiting = acks  # not sent, or sent and rolled back: they wait still
            raise
        if acks is not None:
            self._note_release(acks)
            self.outcomes.report_release(acks)  # (an ack on its own reports in Outcomes.ack)
            self._riding = (acks, claim.commit)
            if not claim.jobs:
                self._land_riding(session)  # nothing runs next on this session to read the COMMIT
            if self.outcomes.freed is not None:
                # Its COMMIT may still be on the wire: a watcher woken before it lands finds the
                # signal moved past what its claim saw, and claims again. (Nobody watched when
                # its mark ran: the wake sends no look of its own, which would find nobody; a
                # consumer that starts watching after that reads the bumped signal first, or
                # finds it by its first polls, as one that starts inside the look's quiet
                # window does.)
                self.outcomes.freed(claim.watched)
        return claim

    def released_children(self) -> bool:
        """Whether an ack since the last call released workflow children: a worker then claims
        again at once rather than wait for the wake-up (the chain's hand-off). Resets."""
        released, self._released = self._released, False
        return released

    def _note_release(self, acks: queries.Acks) -> None:
        self._released = self._released or bool(acks.released)

    def flush(self, session: Session) -> None:
        """Before anything but a claim: what waits for one is acked on its own, now."""
        self._land_riding(session)
        if self._waiting is not None:
            acks, self._waiting = self._waiting, None
            try:
                self._ack(session, acks)
            except errors.TransientDBError:
                self._waiting = acks  # not landed: they wait still (a worker may claim again)
                raise
            if self.outcomes.freed is not None:
                self.outcomes.freed()

    def _land_riding(self, session: Session) -> None:
        """The acks the last claim carried: counted once its COMMIT is read, or acked on their
        own if it failed (or came back with no counts)."""
        if self._riding is None:
            return
        (acks, commit), self._riding = self._riding, None
        if commit is not None:
            session.pipeline.read_reply()  # read now if still on the wire (else a later statement did)
        if commit is None or commit.failed or not commit.rowcounts:
            try:
                self._ack(session, acks)
            except errors.TransientDBError:
                self._riding = (acks, None)  # not landed: acked on their own next time
                raise
        else:
            self.outcomes.count_acked(acks, queries.acked_in_all(session, acks, commit.rowcounts[acks.counted]))
            self._landed(acks)

    def _ack(self, session: Session, acks: queries.Acks) -> None:
        try:
            self.outcomes.ack(session, acks)
            self._landed(acks)
            self._note_release(acks)
        except errors.GrantMissing:
            self._landed(acks)  # (given back below, or left to the reaper: not ours to ack again)
            queue, stats = self.outcomes.queue, self.outcomes.stats
            try:
                n = queries.give_back(session, queue, acks.ids, acks.token)
                stats.given_back += n
                log.warning("gave back finished jobs whose ack the server refused: they run again once the "
                            "grant is applied queue=%s n=%d", queue, n)
            except errors.NotifyqError as e:
                log.warning("could not give back finished jobs whose ack the server refused: the reaper takes "
                            "them back queue=%s n=%d error=%s", queue, len(acks.ids), e)
            raise
