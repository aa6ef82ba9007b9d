"""Extraction: the `Extractor` interface, the offline rules (statements, validity ranges,
triplets, financial figures, fiscal periods); the statements, temporal_events, triplets,
figures and entities stages. The LLM extractor lives in tkg.llm."""
