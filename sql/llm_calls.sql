-- description: LLM accounting per step, stage and partition: requests, cache hits, tokens, retries, 429s, re-asks, partial batched answers, dropped items, latency percentiles and estimated cost; `mode` says whether the requests were synchronous ('sync') or went through OpenAI's Batch API ('batch', half price; NULL in rows written before tkg recorded it), and `sync_cost_usd` what the same tokens cost synchronously.
-- upstream_assets: statements, temporal_events, triplets, entities, invalidated_events
CREATE OR REPLACE VIEW llm_calls AS
SELECT step, stage, company, quarter, backend, mode, model, requests, cache_hits, input_tokens, cached_input_tokens,
       output_tokens, retries, rate_limited, reasks, partial_answers, dropped, dropped_by_reason, repaired_by_reason,
       latency_p50_ms, latency_p95_ms, latency_p99_ms, estimated_cost_usd,
       coalesce(sync_cost_usd, estimated_cost_usd) AS sync_cost_usd, recorded_at
FROM raw.llm_calls;
