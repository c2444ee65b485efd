"""Multi-turn, tool-using VLM agents (``model.type=vlm_agent``; docs/agents.md).

``environment`` (the contract: ``reset`` / ``step``), ``tools`` (functions + schemas, safe calls), ``parsing``
(``<tool_call>`` blocks), ``trajectory`` (the token record), ``policy`` (the turn loop and the one-forward log-probs),
``kv_cache`` (continuing turns from the cache), ``rewards``, ``outputs`` (evaluation trajectories) and ``config`` (the
``vlm_agent`` model config). Nothing is imported here: importing the package stays light."""
