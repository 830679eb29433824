"""``calltape serve``: the webhook receiver for hosted voice platforms (Vapi, Retell, Bland)."""

from calltape.server.app import ReceiverConfig, create_app, run_server

__all__ = ["ReceiverConfig", "create_app", "run_server"]
