"""Invalidation and retention: the judges, candidate selection, the bi-temporal history of
which facts retired which, guidance revisions of financial figures, and relevance scores;
the invalidated_events and fact_relevance stages. The rules themselves are in tkg.core.policy."""
