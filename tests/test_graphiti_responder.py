"""The Graphiti responder answers like a model reading the prompt: entities found in the message,
merges of names that are the same entity, and contradictions by tkg's functional rules."""

from __future__ import annotations

import json

from fakes.graphiti_responder import GraphitiResponder

AMD = "Advanced Micro Devices, Inc."


def edge_prompt(message: str, reference_time: str, entities: list[str]) -> str:
    """The parts of Graphiti's extract_edges prompt the responder reads."""
    return (f"<PREVIOUS_MESSAGES>\n[]\n</PREVIOUS_MESSAGES>\n\n<CURRENT_MESSAGE>\n{message}\n</CURRENT_MESSAGE>\n\n"
            f"<ENTITIES>\n{json.dumps([{'name': n, 'entity_types': ['Entity']} for n in entities])}\n</ENTITIES>\n\n"
            f"<REFERENCE_TIME>\n{reference_time}  # ISO 8601 (UTC); used to resolve relative time mentions\n</REFERENCE_TIME>\n")


def resolve_prompt(new_fact: str, existing: list[str], candidates: list[str]) -> str:
    """Graphiti's dedupe_edges.resolve_edge renders its lists as Python reprs."""
    existing_context = [{"idx": i, "fact": fact} for i, fact in enumerate(existing)]
    candidate_context = [{"idx": len(existing) + i, "fact": fact} for i, fact in enumerate(candidates)]
    return (f"<EXISTING FACTS>\n{existing_context}\n</EXISTING FACTS>\n\n<FACT INVALIDATION CANDIDATES>\n"
            f"{candidate_context}\n</FACT INVALIDATION CANDIDATES>\n\n<NEW FACT>\n{new_fact}\n</NEW FACT>\n")


def test_entities_are_found_in_the_message_speaker_first() -> None:
    responder = GraphitiResponder()
    message = (f"Lisa Su (President and CEO, {AMD}): We launched Ryzen desktop processors together with Dell "
               "and Lenovo this quarter. Revenue for the fourth quarter was $1.11 billion.")
    prompt = (f"<PREVIOUS MESSAGES>\n{json.dumps([{'content': 'Operator: Welcome.', 'timestamp': '2017-01-31T22:00:00+00:00'}])}\n"
              f"</PREVIOUS MESSAGES>\n\n<CURRENT MESSAGE>\n{message}\n</CURRENT MESSAGE>\n")

    names = [entity["name"] for entity in responder.entities(prompt)["extracted_entities"]]

    assert names[0] == "Lisa Su"
    assert {AMD, "Dell", "Lenovo"} <= set(names)
    assert any(name.startswith("Ryzen") for name in names)
    assert not {"Revenue", "We", "Operator"} & set(names)  # no sentence starts, pronouns or context-only speakers
    edges = responder.edges(edge_prompt(message, "2017-01-31 22:01:00+00:00", names))["edges"]
    assert {"Lisa Su", AMD} <= {edges[0]["source_entity_name"], edges[0]["target_entity_name"]}
    assert all(e["source_entity_name"] in names and e["target_entity_name"] in names for e in edges)
    assert any(e["relation_type"] == "HAS_REVENUE" and "$1.11 billion" in e["fact"] for e in edges)


def test_names_of_the_same_entity_are_merged_and_others_kept_apart() -> None:
    responder = GraphitiResponder()
    extracted = [{"id": 0, "name": "AMD"}, {"id": 1, "name": "Polaris"}, {"id": 2, "name": "Dell Inc."},
                 {"id": 3, "name": "Lisa T. Su"}, {"id": 4, "name": "Lisa Spencer"}]
    existing = [{"candidate_id": 0, "name": AMD}, {"candidate_id": 1, "name": "Dell"}, {"candidate_id": 2, "name": "Vega"},
                {"candidate_id": 3, "name": "Lisa Su"}]
    prompt = f"<ENTITIES>\n{json.dumps(extracted)}\n</ENTITIES>\n<EXISTING ENTITIES>\n{json.dumps(existing)}\n</EXISTING ENTITIES>\n"

    resolutions = responder.node_duplicates(prompt)["entity_resolutions"]

    assert [(r["id"], r["duplicate_candidate_id"]) for r in resolutions] == [(0, 0), (1, -1), (2, 1), (3, 3), (4, -1)]


def test_a_newer_holder_of_the_office_invalidates_and_a_restatement_is_a_duplicate() -> None:
    responder = GraphitiResponder()
    old = f"Rory Read (CEO, {AMD}): Thank you all for joining."
    new = f"Lisa Su (CEO, {AMD}): Thank you, and welcome."
    old_fact = responder.edges(edge_prompt(old, "2014-07-17 21:00:00+00:00", ["Rory Read", AMD]))["edges"][0]["fact"]
    new_fact = responder.edges(edge_prompt(new, "2015-01-20 21:00:00+00:00", ["Lisa Su", AMD]))["edges"][0]["fact"]
    assert (old_fact, new_fact) == (f"Rory Read is CEO of {AMD}", f"Lisa Su is CEO of {AMD}")

    # the older holder is contradicted; the newer one is not contradicted by the older one
    assert responder.edge_duplicates(resolve_prompt(new_fact, [], [old_fact])) == {"duplicate_facts": [], "contradicted_facts": [0]}
    assert responder.edge_duplicates(resolve_prompt(old_fact, [], [new_fact]))["contradicted_facts"] == []
    # the same fact again is a duplicate, not a contradiction
    assert responder.edge_duplicates(resolve_prompt(new_fact, [new_fact], [])) == {"duplicate_facts": [0], "contradicted_facts": []}
