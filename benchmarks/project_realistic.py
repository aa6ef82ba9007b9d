"""What the recorded slots-model runs would take on the realistic provider: a projection, not a
measurement.

    python benchmarks/project_realistic.py          # reads results/graphiti.json, writes results/realistic_projection.json

`bench_graphiti.py` was recorded against the older provider model (300 ms per request, 32
slots). Re-running Graphiti on the realistic provider was out of reach here: one by one it
sends its requests one after another, so at gpt-4.1-mini's measured speed (0.93 s to the first
token, 77.2 output tokens/s) its four calls would take over an hour. So this script takes each
system's recorded requests, tokens and mean concurrency and computes the realistic provider's
lower bound for it: the largest of

- generation tokens (input + output) / TPM and successful requests / RPM (the budgets),
- Σ latency / mean requests in flight, with Σ latency = generation requests × TTFT + output
  tokens / (tokens/s) + embedding requests × 0.3 s: a system whose concurrency comes from its
  own structure (Graphiti one by one: 1.0) cannot overlap more than it did.

For tkg the same bound is computed two ways: at its recorded concurrency (pessimistic: with
header pacing its concurrency rises to what the budgets allow) and at the budgets alone.
Bounds are lower bounds; every ratio is between bounds, for tiers 1 and 2 of gpt-4.1-mini.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TTFT_S, TOKENS_PER_S, EMBEDDING_S = 0.93, 77.2, 0.3
TIERS = {"tier 1 (500 RPM, 200k TPM)": (500, 200_000), "tier 2 (5,000 RPM, 2M TPM)": (5_000, 2_000_000)}


def bound(run: dict, rpm: int, tpm: int, in_flight: float | None) -> dict:
    by_endpoint = run["requests_by_endpoint"]
    embeddings = by_endpoint.get("embeddings", 0)
    generation = max(0, run["successful_requests"] - embeddings)
    tokens = run["generation_input_tokens"] + run["output_tokens"]
    latency = generation * TTFT_S + run["output_tokens"] / TOKENS_PER_S + embeddings * EMBEDDING_S
    terms = {"tokens_over_tpm_s": tokens / tpm * 60, "requests_over_rpm_s": run["successful_requests"] / rpm * 60}
    if in_flight:
        terms["latency_over_in_flight_s"] = latency / in_flight
    return {"bound_s": round(max(terms.values()), 1), "terms_s": {k: round(v, 1) for k, v in terms.items()},
            "sum_latency_s": round(latency, 1)}


def main() -> None:
    recorded = json.loads((HERE / "results" / "graphiti.json").read_text())
    runs = {run["config"]: run for run in recorded["runs"]}
    out: dict = {"source": "results/graphiti.json (recorded on the slots model: 300 ms, 32 slots)",
                 "model": {"ttft_s": TTFT_S, "output_tokens_per_s": TOKENS_PER_S, "embedding_latency_s": EMBEDDING_S},
                 "tiers": {}}
    lines = []
    for tier, (rpm, tpm) in TIERS.items():
        rows = {}
        for config, run in runs.items():
            rows[config] = bound(run, rpm, tpm, run.get("mean_in_flight"))
        rows["tkg_default_batch, budgets only"] = bound(runs["tkg_default_batch"], rpm, tpm, None)
        tkg = rows["tkg_default_batch"]["bound_s"]
        for config, row in rows.items():
            row["over_tkg_at_recorded_concurrency"] = round(row["bound_s"] / tkg, 2)
        out["tiers"][tier] = rows
        lines += [f"\n{tier}", "| run | mean in flight (recorded) | Σ latency s | bound s | ÷ tkg's bound |", "|---|---:|---:|---:|---:|"]
        for config, row in rows.items():
            in_flight = runs.get(config, {}).get("mean_in_flight", "budgets")
            lines.append(f"| {config} | {in_flight} | {row['sum_latency_s']:,.0f} | {row['bound_s']:,.1f} | "
                         f"{row['over_tkg_at_recorded_concurrency']:.2f} |")
    (HERE / "results" / "realistic_projection.json").write_text(json.dumps(out, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
