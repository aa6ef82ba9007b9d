"""Test doubles, kept out of the wheel: an OpenAI-compatible server that behaves like a
rate-limited provider (openai_server.py) and the responders that answer tkg's and Graphiti's
requests from the text with tkg's offline rules (responders.py, graphiti_responder.py). The
tests and benchmarks import them from a checkout; run the server with
`python -m fakes.openai_server --help` from the repository's root."""
