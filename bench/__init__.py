"""calltape's benchmark suite: calltape against raw PostgreSQL and against the `eventsourcing` library.

Run ``python -m bench --help``. Bench-only dependencies (``eventsourcing[postgres]``) come with the
``bench`` extra; nothing here is imported by the ``calltape`` package.
"""
