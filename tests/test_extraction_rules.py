"""Offline extraction pieces: offices from titles, fiscal periods, labels, validity and triplets."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pytest

from tkg.core.models import (
    RawEntity,
    RawExtraction,
    RawStatement,
    RawTriplet,
    StatementType,
    TemporalType,
    TemporalValidityRange,
    parse_datetime_utc,
)
from tkg.core.roles import parse_offices
from tkg.extract.base import (
    DocumentContext,
    apply_validity_rules,
    drop_dangling_triplets,
    split_sentences,
)
from tkg.extract.offline import OfflineExtractor, label_statement
from tkg.extract.periods import PeriodResolver, find_date

NVDA = DocumentContext("NVDA", "NVIDIA Corporation", "NVIDIA", "Earnings Call Transcript",
                       datetime(2020, 8, 19, 21, tzinfo=timezone.utc), "Q2 2021", date(2020, 5, 1), date(2020, 7, 31), 1)
HLIO = DocumentContext("HLIO", "Helio Robotics, Inc.", "Helio", "Earnings Call Transcript",
                       datetime(2024, 8, 6, 21, tzinfo=timezone.utc), "Q2 2024", date(2024, 4, 1), date(2024, 6, 30), 12)


@pytest.mark.parametrize(
    "title, offices",
    [
        ("Interim CEO, Executive VP & CFO", [("CEO", None, "Interim"), ("EVP", None, None), ("CFO", None, None)]),
        ("Director & CEO of Google", [("Director", None, None), ("CEO", "Google", None)]),
        ("CEO - Google Inc.", [("CEO", "Google Inc.", None)]),
        ("SVP, CFO, and Treasurer", [("SVP", None, None), ("CFO", None, None), ("Treasurer", None, None)]),
        ("VP of Finance and Director of IR", [("VP of Finance", None, None), ("Director of IR", None, None)]),
        ("Chairman of the Management Board, CEO and President",
         [("Chairman of the Management Board", None, None), ("CEO", None, None), ("President", None, None)]),
        ("Executive Chairman", [("Chairman", None, None)]),
        ("-", []),
    ],
)
def test_offices_from_titles(title, offices):
    assert [(o.role, o.organization, o.qualifier) for o in parse_offices(title)] == offices


def test_fiscal_periods_follow_the_company_calendar():
    resolver = PeriodResolver(NVDA)
    assert resolver.find("revenue for the quarter was", forward=False).label == "Q2 2021"
    third = resolver.find("for the third quarter we expect", forward=True)
    assert (third.label, third.start.date(), third.end.date()) == ("Q3 2021", date(2020, 8, 1), date(2020, 11, 1))
    assert resolver.find("next quarter", forward=True).label == "Q3 2021"
    assert resolver.find("fiscal 2021", forward=True).start.date() == date(2020, 2, 1)
    assert find_date("effective July 1, 2024")[0] == datetime(2024, 7, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "sentence, labels",
    [
        ("Revenue for the quarter was $326 million, up 26% year-over-year.", (StatementType.FACT, TemporalType.STATIC)),
        ("For the third quarter, we expect revenue of approximately $355 million.", (StatementType.PREDICTION, TemporalType.DYNAMIC)),
        ("We are very pleased with the momentum in the business.", (StatementType.OPINION, TemporalType.STATIC)),
        ("Helio has three manufacturing sites in Ohio.", (StatementType.FACT, TemporalType.DYNAMIC)),
    ],
)
def test_statement_labels(sentence, labels):
    assert label_statement(sentence) == labels


def test_sentences_keep_abbreviations_together():
    text = "Intel Corp. and AMD Inc. grew. We expect U.S. sales to rise!\n    1. 2Q17 revenue = $52.9b."
    assert [text[s:e] for s, e in split_sentences(text)] == [
        "Intel Corp. and AMD Inc. grew.", "We expect U.S. sales to rise!", "1. 2Q17 revenue = $52.9b."]


def test_guidance_becomes_a_dynamic_fact_that_can_be_revised():
    extractor = OfflineExtractor()
    from tkg.core.models import Chunk

    chunk = Chunk(chunk_id="c", transcript_id="t", company="HLIO", chunk_index=0, kind="speech", section="Presentation",
                  speaker="Marcus J. Ortega", start=0, end=10,
                  text="For the full year 2024, we now expect revenue of approximately $1.35 billion, up from our prior outlook of $1.20 billion.")
    statements = extractor.extract_statements([chunk], HLIO)[0]
    guidance = [s for s in statements if s.statement_type == StatementType.FACT]
    assert [s.statement for s in guidance] == ["Helio's FY2024 revenue guidance is $1.35 billion."]
    assert guidance[0].temporal_type == TemporalType.DYNAMIC
    extraction = extractor.extract_triplets(guidance, HLIO)[0]
    assert [(t.predicate.value, t.object_name, t.value) for t in extraction.triplets] == [
        ("TARGETS", "Helio FY2024 revenue guidance", "$1.35 billion")]


@pytest.mark.parametrize("text, expected", [
    ("For the full year 2024, we are raising our revenue guidance by $50 million to $1.40 billion.",
     ["Helio's FY2024 revenue guidance is $1.40 billion."]),
    ("For the full year 2024, we are raising our revenue guidance by approximately $50 million.", []),
    ("For the full year 2024, we expect revenue to grow more than $80 million over 2023.", []),
])
def test_a_guidance_change_is_not_the_guided_level(text, expected):
    """'by $X to $Y' guides $Y; 'by $X' alone is a change, not a level a later call could revise."""
    from tkg.core.models import Chunk

    chunk = Chunk(chunk_id="c", transcript_id="t", company="HLIO", chunk_index=0, kind="speech", section="Presentation",
                  speaker="Marcus J. Ortega", start=0, end=10, text=text)
    statements = OfflineExtractor().extract_statements([chunk], HLIO)[0]
    assert [s.statement for s in statements if s.statement.startswith("Helio's ")] == expected


def test_appointments_carry_their_effective_date():
    extractor = OfflineExtractor()
    from tkg.core.models import Chunk

    chunk = Chunk(chunk_id="c", transcript_id="t", company="HLIO", chunk_index=0, kind="speech", section="Presentation",
                  speaker="Priya Raman", start=0, end=10,
                  text="Dana Whitfield stepped down as Chief Financial Officer, and Marcus Ortega joined Helio as CFO effective July 1, 2024.")
    derived = [s for s in extractor.extract_statements([chunk], HLIO)[0] if s.statement.startswith("Marcus")]
    assert derived[0].statement == "Marcus Ortega became CFO of Helio Robotics, Inc on July 1, 2024."
    validity = extractor.extract_validity(derived, HLIO)[0]
    assert validity.valid_at == datetime(2024, 7, 1, tzinfo=timezone.utc)
    triplet = extractor.extract_triplets(derived, HLIO)[0].triplets[0]
    assert (triplet.predicate.value, triplet.object_name) == ("HOLDS_ROLE", "CFO of Helio Robotics, Inc.")


def test_validity_post_rules():
    published = datetime(2024, 8, 6, tzinfo=timezone.utc)
    static = RawStatement(statement="x", statement_type="FACT", temporal_type="STATIC")
    extracted = TemporalValidityRange(valid_at="2024-04-01", invalid_at="2024-07-01")
    assert apply_validity_rules(static, extracted, published).invalid_at is None
    dynamic = RawStatement(statement="x", statement_type="FACT", temporal_type="DYNAMIC")
    assert apply_validity_rules(dynamic, None, published).valid_at == published
    atemporal = RawStatement(statement="x", statement_type="FACT", temporal_type="ATEMPORAL")
    assert apply_validity_rules(atemporal, extracted, published) == TemporalValidityRange()


def test_model_validators_normalise_llm_output():
    assert RawStatement(statement="x", statement_type="prediction", temporal_type="Dynamic").statement_type == StatementType.PREDICTION
    assert parse_datetime_utc("2017") == datetime(2017, 1, 1, tzinfo=timezone.utc)
    assert parse_datetime_utc("2017-06-01").tzinfo == timezone.utc
    assert parse_datetime_utc("not a date") is None
    with pytest.raises(ValueError, match="before valid_at"):
        TemporalValidityRange(valid_at="2020-01-01", invalid_at="2019-01-01")
    assert RawEntity(entity_idx="2", name="AMD", type="company").type.value == "Organization"


def test_dangling_triplets_are_dropped_and_counted():
    from tkg.core.results import StageStats

    extraction = RawExtraction(
        entities=[RawEntity(entity_idx=0, name="AMD", type="Organization")],
        triplets=[RawTriplet(subject_name="AMD", subject_id=0, predicate="LAUNCHED", object_name="Ryzen", object_id=7)],
    )
    stats = StageStats()
    assert drop_dangling_triplets(extraction, stats).triplets == []
    assert stats.dropped["triplet_entity_index_out_of_range"] == 1


@pytest.mark.parametrize("spoken, written", [
    ("We're very excited about the new robot line.", "Helio is very excited about the new robot line."),
    ("We’ve shipped 400 units this quarter.", "Helio has shipped 400 units this quarter."),
    ("We'll open a plant in Ohio next year.", "Helio will open a plant in Ohio next year."),
    ("We have a strong balance sheet.", "Helio has a strong balance sheet."),
    ("Our margins improved.", "Helio's margins improved."),
])
def test_statements_keep_the_speakers_words(spoken, written):
    """Issue 13: 'We're' became "Apple're" in 2,027 statements of the real corpus."""
    from tkg.extract.offline import _resolve_coreference

    assert _resolve_coreference(spoken, HLIO) == written


def test_the_predicate_vocabulary_agrees_with_itself():
    """Issue 13: the enum, the definitions and the contradiction groups describe one vocabulary."""
    from tkg.core.models import PREDICATE_DEFINITIONS, Predicate
    from tkg.core.policy import POLICY

    assert set(PREDICATE_DEFINITIONS) == set(Predicate) and all(d.strip() for d in PREDICATE_DEFINITIONS.values())
    grouped = [p for group in POLICY.groups for p in group]
    assert len(grouped) == len(set(grouped)) == len(Predicate)  # each predicate in exactly one group
    assert set(POLICY.group_of) == set(Predicate)


def _code_versions(**given) -> dict[str, str]:
    """Every stage's code version under the settings `given`, as `tkg build` and the assets compute them."""
    from tkg.build import catalog
    from tkg.providers import fingerprints
    from tkg.settings import Settings

    return catalog.code_versions(fingerprints(Settings.resolve(**given)))


def _invalidation_steps() -> set[str]:
    """The steps the policy shapes: blocking by predicate group, candidates, the judge and the
    retirements (the invalidation phase's stages, split into shards since issue 23)."""
    from tkg.build import catalog

    steps = {stage.name for stage in catalog.STAGES if stage.group == "invalidation"}
    assert {"fact_blocks", "judged_pairs", "invalidated_events"} <= steps
    return steps


def test_editing_the_vocabulary_changes_code_versions_and_cache_keys(monkeypatch):
    """A new definition marks triplets and invalidation stale and never reuses an old answer;
    the stages it does not shape keep their versions (and their paid-for answers)."""
    from tkg.core import models
    from tkg.core.models import Predicate
    from tkg.llm.settings import settings_from_env

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    before = {"offline": _code_versions(backend="offline"), "llm": _code_versions()}
    fingerprints = {stage: settings_from_env().fingerprint(stage) for stage in ("statements", "triplets", "judge")}
    edited = {**models.PREDICATE_DEFINITIONS, Predicate.SELLS: "The subject offers the object for sale to customers."}
    monkeypatch.setattr(models, "PREDICATE_DEFINITIONS", edited)
    for name, versions in (("offline", _code_versions(backend="offline")), ("llm", _code_versions())):
        shaped = {"triplets", *_invalidation_steps()}
        assert all(versions[stage] != before[name][stage] for stage in shaped)
        assert {k: v for k, v in versions.items() if k not in shaped} == {k: v for k, v in before[name].items() if k not in shaped}
    after = {stage: settings_from_env().fingerprint(stage) for stage in fingerprints}
    assert after["statements"] == fingerprints["statements"]
    assert after["triplets"] != fingerprints["triplets"] and after["judge"] != fingerprints["judge"]


def test_editing_the_invalidation_policy_changes_only_the_judges_versions(monkeypatch):
    """Issue 13: the policy (tkg.core.policy) is part of the invalidation steps' code versions
    and the LLM judge's cache key; extraction stages keep theirs."""
    from dataclasses import replace

    from tkg.core import policy
    from tkg.llm.settings import settings_from_env

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    before = {"offline": _code_versions(backend="offline"), "llm": _code_versions()}
    judge_key = settings_from_env().fingerprint("judge")
    monkeypatch.setattr(policy, "POLICY", replace(policy.POLICY, offices=policy.POLICY.offices | {"CRO"}))
    shaped = _invalidation_steps()
    for name, versions in (("offline", _code_versions(backend="offline")), ("llm", _code_versions())):
        assert all(versions[stage] != before[name][stage] for stage in shaped)
        assert {k: v for k, v in versions.items() if k not in shaped} == {
            k: v for k, v in before[name].items() if k not in shaped}
    assert settings_from_env().fingerprint("judge") != judge_key
    assert "CRO" in policy.POLICY.describe_single_valued()


def test_every_rule_of_the_policy_is_in_its_fingerprint():
    """Issue 22: a rule added to the policy cannot be left out of the fingerprint (and so of the
    judges' code versions and cache keys): changing any field changes it."""
    from dataclasses import fields, replace

    from tkg.core.models import Predicate
    from tkg.core.policy import POLICY

    edited = {"statement_types": ("FACT", "OPINION"), "never": (), "groups": POLICY.groups[:-1], "min_cosine": 0.6,
              "top_k": 11, "offices": POLICY.offices | {"CRO"}, "single_valued": frozenset({Predicate.TARGETS}),
              "guidance_key": POLICY.guidance_key[:-1], "figure_judge": "rules:figure-revisions-edited", "tolerance": 1e-6,
              "single_holder_offices": POLICY.single_holder_offices[:-1], "absence_ends": (),
              "one_firm_at_a_time": False, "titles_replace_titles": False,
              "firm_generic_words": POLICY.firm_generic_words - {"capital"}, "firm_spellings": ()}
    assert set(edited) == {field.name for field in fields(POLICY)}, "a new policy field needs an edit here too"
    for name, value in edited.items():
        assert replace(POLICY, **{name: value}).fingerprint() != POLICY.fingerprint(), name
    assert replace(POLICY).fingerprint() == POLICY.fingerprint()


def test_the_judge_prompt_and_the_check_read_the_policy(monkeypatch):
    from dataclasses import replace

    from tkg.core import policy
    from tkg.llm.prompts import render
    from tkg.store import checks

    office_check = next(check for check in checks.CHECKS if check.name == "one_holder_per_office")
    assert set(office_check.parameters[0]) == set(policy.POLICY.offices)
    monkeypatch.setattr(policy, "POLICY", replace(policy.POLICY, offices=policy.POLICY.offices | {"Chief Risk Officer"}))
    prompt = render("invalidation_judge.j2", primary={"statement": "x", "statement_type": "FACT", "temporal_type": "DYNAMIC",
                                                      "valid_at": "2020-01-01", "invalid_at": None, "triplets": []},
                    candidates=[], single_valued=policy.POLICY.describe_single_valued())
    assert "Chief Risk Officer" in prompt.instructions
