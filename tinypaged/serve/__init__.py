"""The OpenAI-compatible HTTP server (optional extra `serve`: FastAPI + uvicorn).

A thin client of the engine loop: it checks requests, submits them through the
LLM, and turns the outputs into OpenAI's JSON and server-sent events.
"""
