"""Issue 26's measures on a built home: valid investor-relations holders per company and
people valid at two or more firms, on given dates; spoken-form aliases; and the share of the
name forms in the operator's lines that link to a participant, with a sample of 30 to check
by hand.

    PYTHONPATH=. python benchmarks/positions.py /tmp/h26/tkg.duckdb [2018-06-01 2020-06-01]
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict

import duckdb

from tkg.core.names import company_for_name, firm_key, same_firm

IR = re.compile(r"\bIR\b|Investor Relations", re.IGNORECASE)


def firms(keys: list[frozenset[str]]) -> int:
    """How many different firms a list of firm keys names ('Bernstein' = 'Sanford C. Bernstein')."""
    clusters: list[list[frozenset[str]]] = []
    for key in sorted(keys, key=sorted):
        matching = [cluster for cluster in clusters if any(same_firm(key, seen) for seen in cluster)]
        merged = [key] + [seen for cluster in matching for seen in cluster]  # spellings chain
        clusters = [cluster for cluster in clusters if cluster not in matching] + [merged]
    return len(clusters)


def main(path: str, days: list[str]) -> None:
    connection = duckdb.connect(path, read_only=True)
    for day in days:
        rows = connection.execute("""
            SELECT company, person_id, any_value(person), role, organization FROM officers
            WHERE valid_at <= ?::TIMESTAMPTZ AND (invalid_at IS NULL OR invalid_at > ?::TIMESTAMPTZ)
            GROUP BY ALL""", [day, day]).fetchall()
        ir: dict[str, set[str]] = defaultdict(set)
        by_person: dict[str, list[frozenset[str]]] = defaultdict(list)
        orgs: dict[str, set[str]] = defaultdict(set)
        names = {}
        for company, person_id, person, role, organization in rows:
            own = company_for_name(organization)
            names[person_id] = person
            orgs[person_id].add(organization)
            if own is not None and own.ticker == company:
                by_person[person_id].append(frozenset({f"company:{company}"}))
                if IR.search(role or ""):
                    ir[company].add(person)
            else:
                by_person[person_id].append(firm_key(organization))
        several = sorted(f"{names[p]} {sorted(orgs[p])}" for p, keys in by_person.items() if firms(keys) >= 2)
        print(f"{day}: IR holders valid {sum(len(v) for v in ir.values())} across {len(ir)} companies: "
              + ", ".join(f"{c} {len(v)}" for c, v in sorted(ir.items())))
        print(f"{day}: people valid at 2+ firms: {len(several)} e.g. {several[:8]}")
    try:
        spoken = connection.execute("SELECT count(*) FROM entity_aliases WHERE source = 'spoken'").fetchone()[0]
        print(f"spoken-form aliases: {spoken}")
    except duckdb.Error:
        pass
    counts = Counter(dict(connection.execute(
        "SELECT coalesce(end_evidence, 'none'), count(*) FROM officer_tenures GROUP BY ALL").fetchall())
        if "end_evidence" in [c[0] for c in connection.execute("DESCRIBE officer_tenures").fetchall()] else {})
    print(f"officer_tenures endings by evidence: {dict(counts)}")
    operator_sample(connection)


def operator_sample(connection, size: int = 30, seed: int = 26) -> None:
    """Every name form in the operator's lines, linked as tkg.resolve.spoken links it against
    the call's participants list; the share linked and a seeded sample to check by hand."""
    import random

    from tkg.ingest.parsing import parse_participant_sections
    from tkg.resolve.spoken import link, spoken_forms

    calls: dict[str, list[tuple]] = defaultdict(list)
    for row in connection.execute("SELECT transcript_id, kind, speaker, text FROM chunks ORDER BY transcript_id, chunk_index").fetchall():
        calls[row[0]].append(row[1:])
    forms = []
    for transcript_id, chunks in calls.items():
        listed = [p.name for kind, _, text in chunks if kind == "participants" for p in parse_participant_sections(text)]
        speakers = [speaker for _, speaker, _ in chunks]
        for position, (_, speaker, text) in enumerate(chunks):
            if speaker != "Operator":
                continue
            following = next((s for s in speakers[position + 1:] if s and s != speaker), None)
            for form in spoken_forms(text, speaker, following):
                forms.append((transcript_id, form.spoken, following, link(form, listed)))
    linked = sum(found is not None for *_, found in forms)
    print(f"operator name forms: {len(forms)}, linked to a participant: {linked} ({linked / max(len(forms), 1):.1%})")
    for transcript_id, spoken, following, found in random.Random(seed).sample(forms, min(size, len(forms))):
        print(f"  {transcript_id} | {spoken} -> {found[0] if found else None} ({found[1] if found else '-'}) | next speaker: {following}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["2018-06-01", "2020-06-01"])
