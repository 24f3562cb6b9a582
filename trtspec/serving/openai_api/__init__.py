"""An OpenAI-compatible HTTP endpoint (FastAPI + uvicorn) in front of ``spec_decode``.

``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(streaming as server-sent events), ``GET /health``, ``GET /metrics``; each
request is forwarded to Triton over a gRPC stream. ``trtspec serve
--openai-port PORT`` runs it beside tritonserver; in code,
:class:`~trtspec.serving.openai_api.server.OpenAIServer`. docs/serving.md has
the field-by-field contract.
"""
