"""Alembic migrations, shipped inside the package so they run from an installed wheel."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

VERSION_TABLE = "calltape_alembic_version"
"""Our own version table, so calltape can share a database with an application's Alembic."""


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head
