"""Framework adapters (each behind its extra): Pipecat, LiveKit Agents, OpenAI Realtime, Vapi, Retell, Bland."""
