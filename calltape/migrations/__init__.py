"""Alembic migrations, shipped inside the package so they run from an installed wheel."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config

HEAD = "0006"
"""The newest revision, kept here so opening a store needs no Alembic import (a test checks it)."""

VERSION_TABLE = "calltape_alembic_version"
"""Our own version table, so calltape can share a database with an application's Alembic."""


def alembic_config() -> Config:
    """The Alembic configuration of calltape's own migrations (shipped in the package)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent))
    cfg.attributes["version_table"] = VERSION_TABLE  # env.py reads it here, not from this package
    return cfg


def head_revision() -> str:
    """The newest migration revision: what a store must be at to be used."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head
