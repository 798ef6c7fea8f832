"""Producing: the Producer API (producer.py: put, put_many, transactional enqueue; put(conn=)'s
connection, conns.py; result(), results.py), its asyncio face (aio.py), and the line reader
behind `notifyq produce` (lines.py, stream.py). A put's wake-up is its Waker's (wakeup/waker.py),
one call per put after the insert. Imports wakeup,
store and the ground floor, and ops only for result()'s wording of a missing job; never the
consumer.
"""
