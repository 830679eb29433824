"""``calltape serve``: the webhook receiver for hosted voice platforms (Vapi, Retell, Bland)."""

from calltape.extras import requires_extra

with requires_extra("serve"):
    import prometheus_client  # noqa: F401  (GET /metrics)
    import starlette  # noqa: F401  (the receiver's framework, named in the error when absent)
    import uvicorn  # noqa: F401

    from calltape.server.app import ReceiverConfig, create_app, run_server

__all__ = ["ReceiverConfig", "create_app", "run_server"]
