"""Producing: the Producer API (put, put_many, transactional enqueue) and the line reader behind
`notifyq produce`. Imports wakeup, store and the ground floor; never the consumer or ops.
"""
