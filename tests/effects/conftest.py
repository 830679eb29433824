"""The effect tests run the real ``calltape`` console script where they test the CLI, as tests/cli does."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.conftest import Cli


@pytest.fixture
def cli(store_url: str, tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home", store_url)
