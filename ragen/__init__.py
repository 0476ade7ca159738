"""ragen: training LLM agents with multi-turn reinforcement learning.

Importing ragen changes nothing in the process (no environment variables, no allocator settings): the programs ragen
starts apply their process settings themselves (``ragen.allocator.tune_process``).
"""

__version__ = "0.1.0"
