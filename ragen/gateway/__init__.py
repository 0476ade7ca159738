"""An OpenAI-compatible endpoint for agent programs that records the exact tokens (docs/gateway.md).

``toolcalls``: tool-call parsers per model family; ``record``: the records of each call and the merge rule that
turns an episode's calls into training rows; ``render``: chat messages -> prompt ids that keep earlier sampled ids;
``server``: the aiohttp server over any ``ragen.rollout.base.Engine``.
"""
