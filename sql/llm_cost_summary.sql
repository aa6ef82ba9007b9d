-- description: LLM usage and estimated cost per stage, model and mode (sync or batch), over all partitions, with what the same tokens would cost as synchronous requests and the saving.
-- depends_on: llm_calls
CREATE OR REPLACE VIEW llm_cost_summary AS
SELECT stage, model, mode, sum(requests) AS requests, sum(cache_hits) AS cache_hits,
       sum(input_tokens) AS input_tokens, sum(cached_input_tokens) AS cached_input_tokens,
       sum(output_tokens) AS output_tokens, sum(retries) AS retries, sum(rate_limited) AS rate_limited,
       sum(dropped) AS dropped, round(sum(estimated_cost_usd), 4) AS estimated_cost_usd,
       round(sum(sync_cost_usd), 4) AS sync_cost_usd,
       round(sum(sync_cost_usd) - sum(estimated_cost_usd), 4) AS saving_usd
FROM llm_calls
GROUP BY ALL
ORDER BY estimated_cost_usd DESC;
