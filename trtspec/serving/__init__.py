"""Serving: the Triton models (``serving.triton``), the server launcher
(``serving.launcher``) and the client (``serving.client``); the wire protocol they
speak is ``trtspec.wire``. See docs/serving.md.

Nothing is imported here: the Triton models run inside Triton's Python stub,
the client side needs ``tritonclient``; each imports only what it uses.
"""
