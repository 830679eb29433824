"""The ``calltape`` command line (SPEC section 5); the entry point is :func:`calltape.cli.app.main`."""
