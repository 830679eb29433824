from calltape.migrations import HEAD, head_revision


def test_head_constant_matches_the_alembic_scripts():
    # open_store compares against HEAD without importing Alembic; a new migration must move it.
    assert head_revision() == HEAD
