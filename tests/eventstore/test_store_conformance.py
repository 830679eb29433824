"""calltape's own stores pass the conformance suite it ships for third-party backends
(:mod:`calltape.testing.store_conformance`): SQLite, PostgreSQL (``$CALLTAPE_TEST_PG_URL``) and
Citus (``$CALLTAPE_TEST_CITUS_URL``; skipped without a cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calltape.eventstore import EventStore, open_store
from calltape.eventstore.citus import CitusEventStore
from calltape.eventstore.postgres import PostgresEventStore
from calltape.eventstore.sqlite import SqliteEventStore
from calltape.testing.store_conformance import CHECKS, StoreConformance


class TestSQLite(StoreConformance):
    @pytest.fixture(autouse=True)
    def _database(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path}/calltape.db"

    async def open_store(self) -> EventStore:
        store = await open_store(self.url)
        assert isinstance(store, SqliteEventStore)
        return store


class TestPostgres(StoreConformance):
    @pytest.fixture(autouse=True)
    def _database(self, pg_url: str) -> None:
        self.url = pg_url  # one database for the run: every check writes sessions of its own

    async def open_store(self) -> EventStore:
        store = await open_store(self.url)
        assert isinstance(store, PostgresEventStore)
        return store


@pytest.mark.citus
class TestCitus(TestPostgres):
    async def open_store(self) -> EventStore:
        store = await open_store(self.url)
        assert isinstance(store, CitusEventStore)
        return store


def test_every_check_is_a_test_of_the_suite() -> None:
    tests = [name for name in dir(StoreConformance) if name.startswith("test_")]
    assert sorted(tests) == sorted(CHECKS) and len(CHECKS) >= 15


def test_a_store_that_breaks_a_promise_fails_the_suite(tmp_path: Path) -> None:
    """The suite can fail: a store whose append ignores ``expected_seq`` is caught (and the check it
    breaks is the only one that fails)."""

    class Careless(StoreConformance):
        async def open_store(self) -> EventStore:
            store = await open_store(f"sqlite:///{tmp_path}/careless.db")
            append = store.append

            async def careless(events, *, expected_seq=None):  # type: ignore[no-untyped-def]
                return await append(events)

            store.append = careless  # type: ignore[method-assign]
            return store

    suite = Careless()
    with pytest.raises(AssertionError, match="expected ConcurrencyConflict"):
        suite.run_check(CHECKS["test_expected_seq_refuses_a_writer_that_fell_behind"])
    suite.run_check(CHECKS["test_append_numbers_each_session_from_one_without_gaps"])
