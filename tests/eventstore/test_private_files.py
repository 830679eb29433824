"""The embedded database holds transcripts: calltape creates it, its directory and its WAL readable by
the owner only (issue 16, data at rest), whatever the process umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from eventstore_support import started

from calltape.eventstore import open_store


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_new_embedded_store_is_private(tmp_path: Path, session_id: str) -> None:
    old = os.umask(0o022)  # the usual umask, which would make files 0644 and directories 0755
    try:
        home = tmp_path / "fresh" / "calltape"
        store = await open_store(f"sqlite:///{home}/calltape.db")
        try:
            await store.append([started(session_id)])
            await store.erase(session_id)  # creates the erasure counter subscriptions watch
            assert mode(home) == 0o700
            for name in ("calltape.db", "calltape.db-wal", "calltape.db-shm", "calltape.db-erasures"):
                assert mode(home / name) == 0o600, name
        finally:
            await store.close()
    finally:
        os.umask(old)


async def test_an_existing_file_keeps_its_owners_mode(tmp_path: Path, session_id: str) -> None:
    path = tmp_path / "shared.db"
    path.touch(mode=0o640)
    os.chmod(path, 0o640)
    store = await open_store(f"sqlite:///{path}")
    try:
        await store.append([started(session_id)])
    finally:
        await store.close()
    assert mode(path) == 0o640
