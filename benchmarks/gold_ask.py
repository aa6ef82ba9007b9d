"""Score `tkg ask --json` on the gold questions of ../shared/eval: the financial ones
(gold_financial_dev.jsonl: the answer line states the gold amount, and a trap's wrong number is
not given as the figure) and the officer ones (gold_dev.jsonl, kind role_as_of: the holder is
in the answer line or the top 3 facts).

    python benchmarks/gold_ask.py --home /tmp/h25 [--eval ../shared/eval]

Each question runs the CLI in a child process, as an analyst would; nothing is special-cased
per question. Prints one line per case and the totals; exits 1 if a file is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

NAMES = {"INTC": "Intel", "AMD": "AMD", "NVDA": "NVIDIA", "MSFT": "Microsoft", "AAPL": "Apple", "CSCO": "Cisco",
         "MU": "Micron", "ASML": "ASML", "AMZN": "Amazon", "GOOGL": "Alphabet"}


def ask(home: Path, question: str) -> dict:
    environment = {key: value for key, value in os.environ.items() if key != "OPENAI_API_KEY"}
    done = subprocess.run([sys.executable, "-m", "tkg.cli", "ask", "--json", "--offline", "--home", str(home), question],
                          capture_output=True, text=True, env=environment, timeout=600)
    if done.returncode != 0:
        return {"answer": None, "facts": [], "error": done.stderr[-500:]}
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as error:
        return {"answer": None, "facts": [], "error": f"not JSON ({error}): {done.stdout[:300]!r}"}


def _amounts(case: dict, text: str) -> list[str]:
    """How the answer line spells the gold amount(s): '$50.6 billion', '46%', '$0.75 ... per share'."""
    unit = case["unit"]

    def spell(number: str) -> str:
        number = f"{float(number):g}"
        if unit == "percent":
            return f"{number}%"
        if unit == "USD per share":
            return f"${float(number):.2f}"
        return f"${number} {unit.split()[1]}"
    if "low" in case and "high" in case:
        return [spell(case["low"]), spell(case["high"])]
    return [spell(case[text])]


def _states(answer: str, amounts: list[str]) -> bool:
    return all(re.search(re.escape(amount) + r"(?![\d.])", answer) for amount in amounts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--eval", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "eval")
    options = parser.parse_args()
    financial, officers = options.eval / "gold_financial_dev.jsonl", options.eval / "gold_dev.jsonl"
    if not financial.exists() or not officers.exists():
        print(f"gold files not found under {options.eval}", file=sys.stderr)
        return 1
    right = total = 0
    for case in map(json.loads, financial.read_text().splitlines()):
        result = ask(options.home, case["question"])
        # With no answer line (facts only), the top fact's statement is what the analyst reads.
        answer = result.get("answer") or " ".join(fact["statement"] for fact in result.get("facts", [])[:1])
        if case["kind"] == "trap":
            expected = case["answer"].split(" (")[0]
            wrong = _amounts(case, "wrong_value")[0]
            ok = expected in answer and not re.search(re.escape(wrong) + r"(?![\d.])", answer)
        else:
            ok = _states(answer, _amounts(case, "value"))
        right += ok
        total += 1
        print(f"{'OK ' if ok else 'BAD'} {case['id']}: {case['question']}\n      -> {answer or result.get('error')}")
    for case in map(json.loads, officers.read_text().splitlines()):
        if case["kind"] != "role_as_of":
            continue
        day = date.fromisoformat(case["as_of"])
        question = f"Who was {NAMES[case['company']]}'s {case['role']} in {day:%B %Y}?"
        result = ask(options.home, question)
        answer = result.get("answer") or ""
        top = [fact["subject"] for fact in result.get("facts", [])[:3]]
        ok = any(alias in answer for alias in case["aliases"]) or bool(set(top) & set(case["aliases"]))
        right += ok
        total += 1
        print(f"{'OK ' if ok else 'BAD'} {case['id']}: {question}\n      -> {answer or top}")
    print(f"{right}/{total} right")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
