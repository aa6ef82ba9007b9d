"""The LLM path: OpenAI or any OpenAI-compatible server, with a response cache, bounded and
adaptive concurrency, retries, validation with repair, and token/cost accounting."""
