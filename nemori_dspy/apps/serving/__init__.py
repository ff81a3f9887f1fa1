"""Serving ``Memory`` to agents: a background worker (``worker``), the REST API (``http``, FastAPI)
and the MCP server (``mcp``). ``http`` and ``mcp`` need the ``serve`` extra
(``pip install 'nemori-dspy[serve]'``); import them directly."""

__all__: list[str] = []
