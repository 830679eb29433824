"""A team's existing LiveKit test, written the way LiveKit documents testing (``session.run`` and
``RunResult`` assertions, an LLM judge), unmodified by calltape. It is not collected by pytest here
(its file name does not start with ``test_``): tests/testing/test_sweep_livekit.py sweeps it.

In the team's repository ``_llm()`` returns their real model (``openai.LLM(model="gpt-4o-mini")``);
here it is a model that refuses to go to the network, so a sweep that left the test's own model in
place would fail."""

from __future__ import annotations

from typing import Any

from livekit.agents import Agent, AgentSession, RunContext, function_tool, llm

CHARGES: list[tuple[str, str]] = []
"""(order, the run's marker) of every card charge the agent really made."""


class NetworkOnlyLLM(llm.LLM[Any]):
    """The team's real model, as far as this offline machine is concerned."""

    def chat(self, **kwargs: Any) -> llm.LLMStream:
        raise ConnectionError("no network in this test environment")


def _llm() -> llm.LLM[Any]:
    return NetworkOnlyLLM()


class Shop(Agent):
    def __init__(self) -> None:
        super().__init__(instructions="You are a shop's phone agent. Charge an order when asked.")

    @function_tool
    async def charge_card(self, ctx: RunContext[Any], order: str) -> str:
        """Charges the customer's card for an order."""
        CHARGES.append((order, "charged"))
        return f"order {order} charged"


async def test_charges_the_order() -> None:
    async with _llm() as model, AgentSession(llm=model) as session:
        await session.start(Shop())
        result = await session.run(user_input="Please charge my order 42")
        result.expect.next_event().is_message(role="assistant")
        result.expect.next_event().is_function_call(name="charge_card", arguments={"order": "42"})
        result.expect.next_event().is_function_call_output()
        await result.expect.next_event().is_message(role="assistant").judge(model, intent="confirms the charge")
        result.expect.no_more_events()
