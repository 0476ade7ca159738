"""Agent programs to train with ``env=agent_program`` (docs/gateway.md): plain Python over the OpenAI chat API."""
