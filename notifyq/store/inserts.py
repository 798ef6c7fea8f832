"""The job INSERTs of an enqueue: values bound once, statements sized against the server's
max_allowed_packet, and the ids the server gave. Run on the caller's cursor: the Producer's
transaction on a notifyq session, or the caller's own connection (transactional enqueue).
"""

from __future__ import annotations

import codecs
import functools
import operator
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import MySQLdb
import MySQLdb.connections
import MySQLdb.cursors
from MySQLdb.constants import CLIENT

from notifyq import errors
from notifyq.store import dedup
from notifyq.store.driver import RECONNECT_CODES, cut_short, describe, error_code
from notifyq.store.queries import HOST, SIGNAL_SLOTS, bump_signal
from notifyq.store.sql import QUERIES as Q

# What a statement holds besides its rows (the INSERT's head, RETURNING or the increment read, the
# signal bump: well under 1 KB), plus the protocol's own bytes, kept free of max_allowed_packet.
PACKET_MARGIN_BYTES = 4096
T = TypeVar("T")
_random = random.random


def max_allowed_packet(cur) -> int:
    cur.execute(Q["max_allowed_packet"])
    return int(cur.fetchone()[0])


def returns_ids(conn) -> bool:
    """MariaDB has INSERT ... RETURNING, MySQL has not. From the handshake: no round trip."""
    return "MariaDB" in conn.get_server_info()


def check_fits(rows: list[tuple], max_packet: int, conn: Any = None) -> None:
    """Raise InputError for the first row too big for the server even in an INSERT of its own.

    An upper bound first (escaping at most doubles a string's bytes), so the usual row costs no
    rendering; a row over it is rendered exactly on `conn` (a MySQLdb connection) to decide."""
    budget = max_packet - PACKET_MARGIN_BYTES
    for i, row in enumerate(rows):
        size = _bound(row)
        if size > budget and isinstance(conn, MySQLdb.connections.Connection):
            size = _ROW_BYTES + sum(len(conn.literal(value)) for value in row)
        if size > budget:
            raise _too_big(i, len(rows), size, max_packet)


def require_version(cur, ids: list[int], version: int) -> None:
    """The jobs just inserted (in the caller's transaction) need consumers of at least this
    code version (queries.sql, require_version)."""
    # A plain tuple: on a caller's connection (put(conn=)) only the driver's own conversions apply
    cur.execute(Q["require_version"], {"ids": tuple(int(i) for i in ids), "version": int(version)})


def put_jobs(cur, queue: str, rows: list[tuple], *, unique: bool, max_rows: int, max_packet: int,
             replace: bool = False, min_version: int | None = None) -> list[int]:
    """The statements of a put (_put_jobs), and with min_version the jobs' minimum consumer code
    version, before the COMMIT (the producer refuses it with a dedup key: the id returned may be
    another put's job)."""
    if min_version is None:
        return _put_jobs(cur, queue, rows, unique=unique, max_rows=max_rows, max_packet=max_packet, replace=replace)
    ids = _put_jobs(cur, queue, rows, unique=unique, max_rows=max_rows, max_packet=max_packet, replace=replace)
    require_version(cur, ids, min_version)
    return ids


def _put_jobs(cur, queue: str, rows: list[tuple], *, unique: bool, max_rows: int, max_packet: int,
              replace: bool = False) -> list[int]:
    """The statements of a put: the rows, and the queue's signal bumped by as many. unique: one
    row whose dedup key a pending job may hold already; that job wins (its id is returned, and
    nothing is written but the key's lock), or with `replace` the new one does (_replace).
    Rows too big for the server's max_allowed_packet raise InputError before any INSERT is
    sent (insert_jobs plans every chunk first)."""
    if not unique:
        return insert_jobs(cur, rows, max_rows=max_rows, max_packet=max_packet, signal=(queue, len(rows)))
    check_fits(rows, max_packet, getattr(cur, "connection", None))
    row = rows[0]
    if replace:
        return [_replace(cur, queue, row, max_packet)]
    held = dedup.holder(cur, queue, row[6])
    if held is not None:
        return [held]
    job_id = insert_jobs(cur, [row], max_rows=1, max_packet=max_packet, signal=(queue, 1))[0]
    dedup.take(cur, queue, row[6], job_id)
    return [job_id]


def _replace(cur, queue: str, row: tuple, max_packet: int) -> int:
    """A put that replaces (debounce): the new job is inserted and takes the key, and the ready
    or scheduled job that held it is deleted, all under the key's lock; a claimed one is left
    to run, the new job pending beside it. A new job and id rather than the old row updated in
    place: whether a put whose COMMIT lost its reply landed is then whether its id exists
    (jobs_stored), and the old job's attempts stay its own."""
    old_id = dedup.replaceable(cur, queue, row[6])
    job_id = insert_jobs(cur, [row], max_rows=1, max_packet=max_packet, signal=(queue, 1))[0]
    if old_id is None:
        dedup.take(cur, queue, row[6], job_id)
    else:
        dedup.drop_replaced(cur, queue, row[6], old_id, job_id, HOST)
    return job_id


def insert_jobs(cur, rows: list[tuple], *, max_rows: int, max_packet: int,
                signal: tuple[str, int] | None = None) -> list[int]:
    """rows: (queue, status, priority, delay_us, max_attempts, payload_json, dedup_key, job_key),
    or for a put at a given time (queue, at, priority, at, max_attempts, payload_json, dedup_key,
    job_key) with `at` a naive UTC datetime in both places: the server decides the status
    (insert_job_at). Every row of one call is of one kind.

    Multi-row INSERTs of at most max_rows rows, each statement within the server's
    max_allowed_packet (a bigger one fails as a lost connection, 2006, and was retried for a
    minute). Every chunk is planned before the first is sent: a row too big for the server
    raises InputError with nothing written. (executemany() cannot batch this: mysqlclient only
    rewrites VALUES of bare placeholders, and run_at is computed by the server, so that
    producers' clocks never matter.)

    The ids: one row's is lastrowid. A multi-row INSERT's ids are consecutive steps of
    auto_increment_increment (InnoDB reserves them at once for a known row count), but that
    increment changes in open sessions when a Galera node leaves or joins: on MariaDB the INSERT
    returns its ids (RETURNING), on MySQL the increment is read right after it, in its round trip.

    signal=(queue, n) bumps the queue's signal row by n in the same transaction. On a
    mysqlclient cursor the bump rides in the last INSERT's round trip, as a further statement
    of one multi-statement query (mysqlclient enables them by default; every value in both is
    bound, as always): for put() per job that is 2 round trips with the COMMIT instead of 3,
    the same as a bare INSERT + COMMIT. If the INSERT fails the server never runs the bump.

    Rows that differ only in their payloads (a put_many's) take _insert_uniform's way there:
    the same statements, with the text around each payload bound once per call, and jobs
    ready now with no key in insert_job_ready's shorter row.
    """
    if not isinstance(cur, MySQLdb.cursors.BaseCursor):  # another driver's cursor: its own binding
        return _insert_with_driver(cur, rows, max_rows, max_packet, signal)
    db = cur.connection
    combine = bool(db.client_flag & CLIENT.MULTI_STATEMENTS)
    if len(rows) == 1 and signal is not None and combine:
        return [_insert_one(db, rows[0], signal, max_packet)]
    if combine and (texts := _uniform_payloads(rows)) is not None:
        return _insert_uniform(db, rows[0], texts, max_rows, max_packet, signal)
    values = _render(db, rows)
    width = len(rows[0])
    if sum(map(len, values)) + len(rows) * _ROW_BYTES <= max_packet - PACKET_MARGIN_BYTES:
        chunks = [(i, min(i + max_rows, len(rows))) for i in range(0, len(rows), max_rows)]
    else:  # not all in one statement's bytes: size every row
        sizes = [_ROW_BYTES + sum(map(len, values[i:i + width])) for i in range(0, len(values), width)]
        chunks = _chunks(sizes, max_rows, max_packet)
    returning = returns_ids(db)
    at = _at(rows)
    ids: list[int] = []
    for start, end in chunks:
        last = end == len(rows)
        ids += _insert_chunk(cur, end - start, values[start * width:end * width], returning, combine,
                             signal if last else None, at)
    return ids


def _at(rows: list[tuple]) -> bool:
    """Whether the rows are put at a given time (insert_job_at) rather than after a delay."""
    return rows[0][3].__class__ is not int


def _insert_chunk(cur, n: int, values: list[bytes], returning: bool, combine: bool,
                  signal: tuple[str, int] | None, at: bool) -> list[int]:
    db = cur.connection
    returning = returning and n > 1
    read_increment = n > 1 and not returning
    statements = [_encoded(_insert_sql(n, returning, at), db.encoding) % tuple(values)]
    if read_increment and combine:
        statements.append(_encoded(Q["auto_increment_increment"], db.encoding))
    if signal is not None and combine:
        statements.append(_rendered_bump(db, *signal))
    cur.execute(b";\n".join(statements))
    if cur.rowcount != n:  # a KILL QUERY's OK reply to an INSERT it cut short
        raise cut_short(f"insert of {n} jobs: {cur.rowcount} stored")
    if returning:
        ids = [row[0] for row in cur.fetchall()]
    else:
        ids = [cur.lastrowid]  # the INSERT's (its first row's): read before moving on
    if read_increment:
        if combine:
            cur.nextset()
            increment = int(cur.fetchone()[0])
        else:
            increment = _increment(cur)
        ids = [ids[0] + i * increment for i in range(n)]
    if signal is not None:
        if combine:
            cur.nextset()  # the bump's result; raises the bump's error if it failed
            if cur.rowcount < 1:  # cut short: the jobs would commit with no wake-up for them
                raise cut_short("the signal bump of an insert")
        else:  # a caller's connection opened with multi_statements=False
            bump_signal(cur, *signal)
    return ids


def _insert_one(db, row: tuple, signal: tuple[str, int], max_packet: int) -> int:
    """put()'s statements for one job on a mysqlclient connection that takes multi-statement
    queries: its INSERT and the signal bump as one query, sent and read with the connection's
    own calls. Through the cursor (execute, then nextset for the bump's reply) the driver's
    Python cost a put about as much as all the rest of its own; the values are bound as
    cursor.execute(sql, args) binds them.

    Every value but the payload is usually the same from one put to the next (the queue, the
    defaults of the options), so the text around the payload is rendered once for them
    (_one_statement); a job with a dedup key, a key or a run_at is rendered whole, as
    insert_jobs does.

    The bump: on MariaDB the plain one on a random slot, refused rather than waited on if
    another open transaction holds that row (bump_signal_nowait; then _bump_unheld, one more
    round trip); on MySQL bump_signal, a slot nobody holds at once. _insert_uniform's the same."""
    text = row[5]
    queue, n = signal
    slot = int(_random() * SIGNAL_SLOTS)
    nowait = "MariaDB" in db.get_server_info()  # from the handshake (returns_ids): no round trip
    if row[6] is None and row[7] is None and row[3].__class__ is int:
        payload = db.string_literal(text.encode(db.encoding)) if text.__class__ is str else db.literal(text)
        key = (db.encoding, row[:5], queue, n, nowait)
        made = _ONE_STATEMENTS.get(key)
        if made is None:
            made = _one_statement(db, row, queue, n, nowait)
            if len(_ONE_STATEMENTS) >= ONE_STATEMENTS_KEPT:  # options that vary call by call (a delay)
                _ONE_STATEMENTS.clear()
            _ONE_STATEMENTS[key] = made
        head, tails, others = made
        size = _ROW_BYTES + others + len(payload)
        statement = head + payload + tails[slot]
    else:
        values = _render(db, [row])
        size = _ROW_BYTES + sum(map(len, values))
        statement = (_encoded(_insert_sql(1, False, _at([row])), db.encoding) % tuple(values) + b";\n"
                     + _bump_text(db.encoding, db.literal(queue), slot, n, _BUMP_NOWAIT if nowait else _BUMP))
    if size > max_packet - PACKET_MARGIN_BYTES:
        raise _too_big(0, 1, size, max_packet)
    db.query(statement)  # raises the INSERT's error; the server then runs no bump
    job_id, stored = db.insert_id(), db.affected_rows()
    try:
        db.next_result()  # the bump's reply; raises the bump's error if it failed
    except MySQLdb.OperationalError as e:
        if not nowait or e.args[0] != LOCK_WAIT_TIMEOUT or stored != 1:
            raise
        _bump_unheld(db, queue, slot, n, e)
    if stored != 1 or db.affected_rows() < 1:  # a KILL QUERY's OK reply to a statement it cut short
        raise cut_short(f"insert of a job: {stored} stored, bump {db.affected_rows()}")
    return job_id


def _bump_unheld(db, queue: str, slot: int, n: int, refused: Exception) -> None:
    """put()'s bump after bump_signal_nowait was refused (another open transaction holds its
    random slot), on MariaDB. First bump_signal, on a slot row nobody holds, refused rather than
    waited on too: with no such row (every row held; a queue's 16 rows are made before its first
    bump, store/slot_rows.py), its own fallback is the held random slot. Then each
    other slot by turns, refused rather than waited on: a slot with no row yet is made, and a
    row held by an open transaction is passed by. Only when all 16 are refused does it wait, on
    its random slot. Raises `refused` if the server rolled the whole transaction back
    (innodb_rollback_on_timeout): the job is gone."""
    literal = db.literal(queue)
    tries = [_NOWAIT_PREFIX + _bump_text(db.encoding, literal, slot, n, _BUMP)]
    tries += [_bump_text(db.encoding, literal, (slot + i) % SIGNAL_SLOTS, n, _BUMP_NOWAIT)
              for i in range(1, SIGNAL_SLOTS)]
    for statement in tries:
        db.query(_encoded(Q["in_transaction"], db.encoding))
        if not int(db.store_result().fetch_row()[0][0]):
            raise refused
        try:
            db.query(statement)
            return
        except MySQLdb.OperationalError as e:
            if e.args[0] != LOCK_WAIT_TIMEOUT:
                raise
            refused = e
    db.query(_bump_text(db.encoding, literal, slot, n, _BUMP))


# bump_signal refused rather than waited on (MariaDB's SET STATEMENT, as bump_signal_nowait).
_NOWAIT_PREFIX = b"SET STATEMENT innodb_lock_wait_timeout = 0 FOR\n"


# _one_statement's texts, by (encoding, the row's values before its payload, the signal's queue
# and n, the bump's form). Cleared whole when full: a put's options are the producer's defaults, or a few, as a rule.
_ONE_STATEMENTS: dict[tuple, tuple[bytes, tuple[bytes, ...], int]] = {}
ONE_STATEMENTS_KEPT = 256


def _one_statement(db, row: tuple, queue: str, n: int, nowait: bool) -> tuple[bytes, tuple[bytes, ...], int]:
    """_insert_one's query around the payload for a job's other values (queue, status, priority,
    delay_us, max_attempts; no dedup key, no key, no run_at): (the INSERT up to its payload; the
    rest of it and the bump, for each signal slot; the bytes of the other values as bound)."""
    rendered = _render(db, [(*row[:5], None, None, None)])
    del rendered[5]  # the payload's place
    parts = _encoded(_insert_sql(1, False), db.encoding).split(b"%s")  # the 8 values' places
    head = b"".join(part + value for part, value in zip(parts[:5], rendered[:5])) + parts[5]
    tail = parts[6] + b"".join(value + part for value, part in zip(rendered[5:], parts[7:])) + b";\n"
    queue_literal = rendered[0] if row[0] == queue else db.literal(queue)
    name = _BUMP_NOWAIT if nowait else _BUMP
    bumps = (_bump_text(db.encoding, queue_literal, slot, n, name) for slot in range(SIGNAL_SLOTS))
    return head, tuple(tail + bump for bump in bumps), sum(map(len, rendered))


# A row's values but its payload, and its payload (insert_jobs' row layout).
_OTHERS = operator.itemgetter(0, 1, 2, 3, 4, 6, 7)
_PAYLOAD = operator.itemgetter(5)
_STR_ONLY = {str}


def _uniform_payloads(rows: list[tuple]) -> list[str] | None:
    """The payload texts of rows whose other values are the same in every row, as a put_many's
    are (its options hold for every job), or None. Told by the values' equality: values that
    are equal and of two types (1 and True) are bound as the same value in SQL all the same."""
    try:
        if len(set(map(_OTHERS, rows))) != 1:
            return None
    except TypeError:  # an unhashable value: not a row the producer makes
        return None
    texts = list(map(_PAYLOAD, rows))
    return texts if set(map(type, texts)) == _STR_ONLY else None


def _insert_uniform(db, row: tuple, texts: list[str], max_rows: int, max_packet: int,
                    signal: tuple[str, int] | None) -> list[int]:
    """insert_jobs for rows that differ only in their payloads (_uniform_payloads), on a
    mysqlclient connection that takes multi-statement queries. The text of a row around its
    payload is bound once (_uniform_row, as cursor.execute binds each value), every payload is
    escaped by the driver (string_literal, what literal() does for a str) and the rows joined
    in one call; the statements are sent and read with the connection's own calls, as put()'s
    are (_insert_one). Jobs ready now with no key go in insert_job_ready's shorter row."""
    encoding = db.encoding
    escape = db.string_literal
    if _is_utf8(encoding):
        payloads = list(map(escape, map(str.encode, texts)))
    else:
        payloads = [escape(text.encode(encoding)) for text in texts]
    head, pre, post = _uniform_row(db, row)
    fixed = len(pre) + len(post) + 1  # the row's text around its payload, and its comma
    n_all = len(payloads)
    if sum(map(len, payloads)) + n_all * fixed <= max_packet - PACKET_MARGIN_BYTES:
        chunks = [(i, min(i + max_rows, n_all)) for i in range(0, n_all, max_rows)]
    else:  # not all in one statement's bytes: size every row (a row too big raises here, before any INSERT)
        chunks = _chunks([fixed + len(p) for p in payloads], max_rows, max_packet)
    returning = returns_ids(db)  # MariaDB: also the bump that is refused rather than waited on
    between = post + b"," + pre
    ids: list[int] = []
    for start, end in chunks:
        n = end - start
        statements = [head + pre + between.join(payloads[start:end]) + post]
        if n > 1:
            if returning:
                statements[0] += _RETURNING_BYTES
            else:
                statements.append(_encoded(Q["auto_increment_increment"], encoding))
        bump = signal is not None and end == n_all
        if bump:
            statements.append(_rendered_bump(db, *signal, nowait=returning))
        db.query(b";\n".join(statements))  # raises the INSERT's error; the server then runs nothing after it
        if n > 1 and returning:
            got = [r[0] for r in db.store_result().fetch_row(0)]
            stored = len(got)
        else:
            got, stored = [db.insert_id()], db.affected_rows()  # the INSERT's (its first row's)
        if stored != n:  # a KILL QUERY's OK reply to an INSERT it cut short
            raise cut_short(f"insert of {n} jobs: {stored} stored")
        if n > 1 and not returning:
            db.next_result()
            increment = int(db.store_result().fetch_row()[0][0])
            got = [got[0] + i * increment for i in range(n)]
        if bump:
            try:
                db.next_result()  # the bump's reply; raises the bump's error if it failed
            except MySQLdb.OperationalError as e:
                if not returning or e.args[0] != LOCK_WAIT_TIMEOUT:
                    raise
                _bump_unheld(db, signal[0], int(_random() * SIGNAL_SLOTS), signal[1], e)
            if db.affected_rows() < 1:  # cut short: the jobs would commit with no wake-up for them
                raise cut_short("the signal bump of an insert")
        ids += got
    return ids


@functools.lru_cache(maxsize=16)
def _is_utf8(encoding: str) -> bool:
    """Whether str.encode()'s default (UTF-8) is the connection's encoding: then it is called bare."""
    return codecs.lookup(encoding).name == "utf-8"


def _uniform_row(db, row: tuple) -> tuple[bytes, bytes, bytes]:
    """(the INSERT's head up to its first row; a row's text before its payload; after it), bound,
    for rows whose values but the payload are row's: made once for each such set of values.
    Not kept for a row with a dedup key or a job key: a string's escaping depends on the
    connection's sql_mode (NO_BACKSLASH_ESCAPES on a caller's), an int's or a queue name's not."""
    if row[6] is not None or row[7] is not None:
        return _make_uniform_row(db, row)
    key = (db.encoding, _OTHERS(row))
    made = _UNIFORM_ROWS.get(key)
    if made is None:
        made = _make_uniform_row(db, row)
        if len(_UNIFORM_ROWS) >= ONE_STATEMENTS_KEPT:  # options that vary call by call (a delay)
            _UNIFORM_ROWS.clear()
        _UNIFORM_ROWS[key] = made
    return made


_UNIFORM_ROWS: dict[tuple, tuple[bytes, bytes, bytes]] = {}


def _make_uniform_row(db, row: tuple) -> tuple[bytes, bytes, bytes]:
    at = _at([row])
    if not at and row[3] == 0 and row[6] is None and row[7] is None:  # ready now, no keys
        head, sql = _HEAD_READY, _ROW_READY
        values, payload_at = [row[0], row[1], row[2], row[4], None], 4
    else:
        head, sql = _HEAD, _ROW_AT if at else _ROW
        values, payload_at = [*row[:5], None, row[6], row[7]], 5
    rendered = _render(db, [tuple(values)])
    parts = _encoded(sql, db.encoding).split(b"%s")  # the values' places
    pre = b"".join(part + value for part, value in zip(parts[:payload_at], rendered[:payload_at])) + parts[payload_at]
    post = parts[payload_at + 1] + b"".join(
        value + part for value, part in zip(rendered[payload_at + 1:], parts[payload_at + 2:]))
    return _encoded(f"{head} VALUES ", db.encoding), pre, post


def _insert_with_driver(cur, rows: list[tuple], max_rows: int, max_packet: int,
                        signal: tuple[str, int] | None) -> list[int]:
    """Another driver's cursor binds its own values: chunks are sized by the upper bound."""
    ids: list[int] = []
    for start, end in _chunks([_bound(row) for row in rows], max_rows, max_packet):
        chunk = rows[start:end]
        cur.execute(_insert_sql(len(chunk), False, _at(chunk)), [value for r in chunk for value in r])
        first = cur.lastrowid
        increment = _increment(cur) if len(chunk) > 1 else 1
        ids += [first + i * increment for i in range(len(chunk))]
    if signal is not None:
        bump_signal(cur, *signal)
    return ids


def _increment(cur) -> int:
    cur.execute(Q["auto_increment_increment"])
    return int(cur.fetchone()[0])


def _render(db, rows: list[tuple]) -> list[bytes]:
    """Every row's values, in one flat list, each bound exactly as cursor.execute(sql, args) binds
    it (connection.literal()). A column that holds one value in every row (in a put_many chunk,
    all but the payload) is rendered once and laid into its places by a slice assignment, not
    through literal() and a lookup per value, which a bulk producer paid on every row."""
    literal = db.literal
    if len(rows) == 1:  # put(): nothing repeats. An int and None render as literal() renders
        # them, without its type tests: they are most of put()'s values.
        return [b"%d" % v if v.__class__ is int else b"NULL" if v is None else literal(v) for v in rows[0]]
    width, n = len(rows[0]), len(rows)
    out: list[bytes] = [b""] * (width * n)
    for i, first in enumerate(rows[0]):
        column = [row[i] for row in rows]
        # One value throughout, told by the list's own loops (count, map), not a Python test per
        # row: the class too, as 1 and True are equal
        if column.count(first) == n and len(set(map(type, column))) == 1:
            out[i::width] = [literal(first)] * n
        elif first.__class__ is str:  # the payloads: a str is bound as literal() binds it, without its type tests
            escape, encoding = db.string_literal, db.encoding
            out[i::width] = [escape(v.encode(encoding)) if v.__class__ is str else literal(v) for v in column]
        else:
            out[i::width] = [literal(v) for v in column]
    return out


def _chunks(sizes: list[int], max_rows: int, max_packet: int) -> list[tuple[int, int]]:
    """(start, end) of each INSERT: at most max_rows rows and max_packet less the margin bytes."""
    budget = max_packet - PACKET_MARGIN_BYTES
    chunks, start, used = [], 0, 0
    for i, size in enumerate(sizes):
        if size > budget:
            raise _too_big(i, len(sizes), size, max_packet)
        if i > start and (i - start >= max_rows or used + size > budget):
            chunks.append((start, i))
            start, used = i, 0
        used += size
    chunks.append((start, len(sizes)))
    return chunks


def _bound(row: tuple) -> int:
    """At least the row's bytes in the statement: a string's bytes escaped at most double, any
    other value (an integer, a quoted datetime with microseconds) at most 32."""
    return _ROW_BYTES + sum(2 * len(v.encode()) + 2 if isinstance(v, str) else 32 for v in row)


def _too_big(index: int, count: int, size: int, max_packet: int) -> errors.InputError:
    which = f"payload {index + 1} of {count}" if count > 1 else "payload"
    return errors.InputError(
        f"{which} is too big for the server: about {size} bytes as SQL, and the server's "
        f"max_allowed_packet of {max_packet} bytes takes at most {max_packet - PACKET_MARGIN_BYTES}"
        " (raise max_allowed_packet on the server, or send smaller payloads)")


def _rendered_bump(db, queue: str, n: int, nowait: bool = False) -> bytes:
    """The bump statement, bound. put() sends one per job, and binding it afresh (mogrify) would
    cost every put; the bound text only depends on the queue, the slot, n and the connection's
    charset, so it is rendered once (the slot is where bump_signal starts looking). nowait:
    bump_signal_nowait, for a caller that sends _bump_unheld when it is refused."""
    return _bump_text(db.encoding, db.literal(queue), int(_random() * SIGNAL_SLOTS), n,
                      _BUMP_NOWAIT if nowait else _BUMP)


@functools.lru_cache(maxsize=1024)
def _bump_text(encoding: str, queue_literal: bytes, slot: int, n: int, name: str = "bump_signal") -> bytes:
    params = {"queue": queue_literal, "slot": str(slot).encode(), "n": str(int(n)).encode()}
    return Q[name].encode(encoding) % {k.encode(): v for k, v in params.items()}


# put()'s and put_many()'s bump on MariaDB, refused rather than waited on (then _bump_unheld);
# every other bump takes bump_signal's slot nobody holds at once.
_BUMP, _BUMP_NOWAIT = "bump_signal", "bump_signal_nowait"
LOCK_WAIT_TIMEOUT = 1205


@functools.lru_cache(maxsize=64)
def _encoded(sql: str, encoding: str) -> bytes:
    return sql.encode(encoding)


_HEAD, _ROW = (part.strip() for part in Q["insert_job"].split("VALUES", 1))
_ROW_AT = Q["insert_job_at"].split("VALUES", 1)[1].strip()
_RETURNING = Q["insert_job_returning"]
_RETURNING_BYTES = f" {_RETURNING}".encode()
_HEAD_READY, _ROW_READY = (part.strip() for part in Q["insert_job_ready"].split("VALUES", 1))
# A row's text around its values, and its comma (the longer of the two kinds).
_ROW_BYTES = max(len(row.replace("%s", "")) for row in (_ROW, _ROW_AT)) + 1


@functools.lru_cache(maxsize=64)
def _insert_sql(n: int, returning: bool, at: bool = False) -> str:
    rows = ",".join([_ROW_AT if at else _ROW] * n)
    return f"{_HEAD} VALUES {rows}" + (f" {_RETURNING}" if returning else "")


def outside_transaction(conn, cur) -> bool:
    """Whether a caller's connection commits every statement by itself: autocommit on (asked of
    the driver, no round trip) and no transaction opened with BEGIN (asked of the server)."""
    autocommit = getattr(conn, "get_autocommit", None)
    if not callable(autocommit) or not autocommit():  # DB-API's default: always in a transaction
        return False
    cur.execute(Q["savepoint_probe"])
    try:
        cur.execute(Q["caller_transaction_open"])
    except Exception as e:  # noqa: BLE001 - any driver's error class; told apart by its code
        if _code(e) == NO_SUCH_SAVEPOINT:
            return True
        raise
    return False


def in_own_transaction(conn, cur, body: Callable[[Any], T]) -> T:
    """body(cur) in a transaction of its own on a caller's connection in autocommit mode.
    What raises has stored nothing, or raises OutcomeUnknown (the COMMIT's reply was lost)."""
    cur.execute(Q["begin_own_transaction"])
    try:
        result = body(cur)
    except BaseException:
        try:
            conn.rollback()
        except Exception:  # noqa: BLE001 - gone: the server rolls back with the connection
            pass
        raise
    try:
        conn.commit()
    except Exception as e:  # noqa: BLE001
        if _code(e) in RECONNECT_CODES:
            raise errors.OutcomeUnknown(f"conn: connection lost during COMMIT ({describe(e)}): the "
                                        "outcome is unknown") from None
        raise
    return result


def _code(exc: BaseException) -> int | None:
    """The server's error code of any driver's error (PyMySQL's too: args[0])."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def jobs_stored(cur, ids: list[int], written_by: float) -> bool:
    """Whether the jobs an enqueue transaction inserted are stored: Session.run's `committed`
    test for an enqueue whose COMMIT lost its reply. A transaction commits whole, so its first
    job tells, if it is that job: its row was written by `written_by` (time.monotonic(): as the
    COMMIT went out), so it is at least as old, by the server's clock, as that is ago. A server that crashed before the transaction was
    durable may hand its ids to another put after the restart; that put's row is younger, and
    taking it for ours said "stored" of jobs that were lost. One case reads as not stored
    although it was: a consumer ran and deleted the job (ack with retention 0) between the lost
    reply and this read; it is then enqueued again, a second run, as at-least-once delivery
    allows (as it is when the server's clock stepped back meanwhile)."""
    if not ids:
        return False
    older_than_us = max(0, int((time.monotonic() - written_by) * 1e6))
    cur.execute(Q["job_stored"], {"id": int(ids[0]), "older_than_us": older_than_us})
    return cur.fetchone() is not None


NO_SUCH_TABLE = 1146
NO_SUCH_SAVEPOINT = 1305


def caller_error(exc: BaseException) -> BaseException:
    """notifyq's own error for the two ways a caller's connection (`conn=`) cannot take a job:
    it is closed or lost, or its database has no notifyq tables. Anything else (a deadlock the
    caller reruns its transaction on, say) is the caller's own driver error, unchanged."""
    code = error_code(exc)
    if code in RECONNECT_CODES or isinstance(exc, MySQLdb.InterfaceError):
        return errors.DatabaseError(
            f"conn: the connection is closed or was lost ({describe(exc)}); nothing was enqueued: "
            "open a new connection and run the transaction again")
    if code == NO_SUCH_TABLE:
        return errors.InputError(
            f"conn: its database has no notifyq tables ({describe(exc)}): use a connection to the "
            "database notifyq uses (the DSN's), or run `notifyq init` there")
    return exc
