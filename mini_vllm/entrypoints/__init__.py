"""The serving side of mini_vllm: text out of tokens, parsers, the async front end, the HTTP server.

Mirrors ``vllm/entrypoints/`` and ``vllm/v1/engine/`` (``async_llm.py``, ``detokenizer.py``); see
each module. Importing this package imports neither FastAPI nor vllm.
"""
