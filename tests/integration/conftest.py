"""Fixtures of the engine-level integration tests (servers come from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa


@pytest.fixture
def mysql_capture(mysql_url: str, mysql_db: str, tmp_path: Path) -> Iterator[Any]:
    """Like ``capture``, on MySQL/MariaDB: a factory of engine setups on this test's
    database (tests/integration/engine_harness)."""
    from tests.integration.engine_harness import Capture

    url = sa.make_url(mysql_url).set(database=mysql_db).render_as_string(hide_password=False)
    made: list[Capture] = []

    def make(**kwargs: Any) -> Capture:
        directory = tmp_path / f"capture{len(made)}"
        directory.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("kind", "mysql")
        cap = Capture(url, mysql_db, directory, **kwargs)
        made.append(cap)
        return cap

    yield make
    for cap in made:
        cap.cleanup()
