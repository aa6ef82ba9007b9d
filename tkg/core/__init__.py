"""What every phase shares: the models that are the contract between stages and with the LLM,
the Arrow schemas of every table, the invalidation policy and predicate vocabulary, stamps
and versions, content ids, name and role parsing, the partition space, the company registry,
the embedder interface and the offline embedder, and what a stage gets and gives back."""
