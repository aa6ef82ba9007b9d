"""The offline, rule-based extractor: no network, no API key, deterministic.

It does what the LLM does, with less recall:
- the participants list becomes one HOLDS_ROLE statement per office ('Robert H. Swan is CFO
  of Intel Corporation.'), dated by the call;
- speech becomes sentence-level statements, labelled by cue words, with 'we'/'our' resolved
  to the company; guidance sentences and appointments also yield a canonical DYNAMIC FACT
  ('Helio's FY2024 revenue guidance is $1.35 billion.') that a later revision can retire;
- validity ranges come from explicit dates and fiscal period expressions;
- triplets come from patterns for roles, revenue, growth, guidance, launches and partners.
"""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

from tkg.core.models import (
    Chunk,
    EntityType,
    Predicate,
    RawEntity,
    RawExtraction,
    RawFigure,
    RawStatement,
    RawTriplet,
    StatementType,
    TemporalType,
    TemporalValidityRange,
)
from tkg.core.names import company_for_name
from tkg.core.policy import VOCABULARY_STAGES, vocabulary_fingerprint
from tkg.core.results import Counted
from tkg.core.roles import ROLE_START, parse_offices
from tkg.extract.base import DocumentContext, split_sentences
from tkg.extract.figures import (
    FIGURE_RULES_VERSION,
    figure_parser,
    guidance_phrase,
    segments_fingerprint,
)
from tkg.extract.periods import PeriodResolver, find_date
from tkg.ingest.parsing import parse_participant_sections

RULES_VERSION = "offline-rules-4"

_SKIP = re.compile(
    r"^(?:thank|thanks|good (?:morning|afternoon|evening|day)|hi\b|hello|okay|ok\b|yes\b|no\b|sure\b|great\.|"
    r"(?:and )?our next question|\(operator instructions\)|operator|ladies and gentlemen|welcome)|"
    r"forward-looking statements|safe harbor|non-GAAP financial measures? (?:and|are)|press release",
    re.IGNORECASE,
)
_PREDICTION = re.compile(
    r"\b(?:expects?|expected to|expecting|anticipates?|anticipating|forecast(?:s|ing)?|guid(?:e|ing) (?:to|for)|"
    r"will|going to|plans? to|intends? to|projects? (?:to|that)|should (?:be|see|grow)|look(?:ing)? forward|"
    r"outlook (?:for|is|calls)|(?:raising|lowering|reaffirming|increasing|reducing) (?:our |the )?(?:outlook|guidance))\b",
    re.IGNORECASE,
)
_OPINION = re.compile(
    r"\b(?:believe|think|feel|confident|pleased|proud|excited|exciting|happy|delighted|optimistic|encouraged|"
    r"great|terrific|fantastic|phenomenal|tremendous|amazing|remarkable|incredible|well[- ]positioned|impressive|"
    r"thrilled|love)\b",
    re.IGNORECASE,
)
_PAST_EVENT = re.compile(
    r"\b(?:was|were|grew|rose|fell|declined|increased|decreased|launched|introduced|announced|closed|completed|"
    r"acquired|signed|shipped|delivered|reported|achieved|generated|returned|repurchased|paid|ended|began|started|"
    r"won|secured|posted|expanded|joined|hired|opened|released|unveiled|set|reached|totaled|came in|did|made|bought)\b",
    re.IGNORECASE,
)
_PRESENT_STATE = re.compile(
    r"\b(?:is|are|has|have|remains?|continues? to|holds?|serves?|employs?|operates?|owns?|leads?|supplies|"
    r"represents?|accounts? for)\b",
    re.IGNORECASE,
)

_MONEY = r"\$\s?\d[\d,]*(?:\.\d+)?(?:\s*(?:billion|million|thousand|trillion|bn|b|m|k)\b)?"
MONEY = re.compile(_MONEY)
# Words a pattern cannot match without: a cheap `in` test first skips most sentences, since the
# patterns themselves scan every position of every sentence.
_DIGIT = re.compile(r"\d")
_LAUNCH_WORDS = ("launched", "introduced", "unveiled", "shipping", "released", "announced the")
_OFFICE_WORDS = re.compile(r"CEO|CFO|COO|CTO|Chief|President|Chairman")
_PERCENT = r"\d+(?:\.\d+)?\s?(?:%|percent\b)"
_AMOUNT = rf"(?:{_MONEY}|{_PERCENT}|\d+ basis points)"
# '$43.5-45.5b', '$1.2 billion to $1.3 billion', '$14 billion, plus or minus $500 million'
_RANGE = rf"{_AMOUNT}(?:\s*(?:-|to)\s*\$?\d[\d,]*(?:\.\d+)?(?:\s*(?:billion|million|bn|b|m)\b|\s?%)?)?(?:,?\s*plus or minus\s*{_AMOUNT})?"
_REVENUE_METRIC = r"(?i:revenues?|sales)"
_METRIC = (
    r"(?i:revenues?|sales|gross margins?|operating margins?|operating income|operating expenses|opex|net income|"
    r"earnings per share|EPS|free cash flow|cash flow from operations|operating cash flow|capital expenditures|capex|"
    r"bookings|shipments|backlog|R&D (?:expenses|spending))"
)
# Segment names are capitalised ('Data Center Group revenue'); the qualifiers are not.
_QUALIFIER = (
    r"(?:(?!(?:So|And|But|The|This|That|Our|We|In|On|For|With|As|At|Also|Then|Now|Yes|Well|Its|Their)\b)[A-Z][\w&+-]*|"
    r"(?i:total|net|non-GAAP|GAAP|quarterly|record|segment|full[- ]year))\s+"
)
_QUALIFIED_METRIC = rf"(?P<metric>(?:{_QUALIFIER}){{0,4}}{_METRIC})"
_QUALIFIED_REVENUE = rf"(?P<metric>(?:{_QUALIFIER}){{0,4}}{_REVENUE_METRIC})"
_APPROX = r"(?i:a record |an all-time record |record |approximately |about |roughly |nearly |around |over |more than |just over |almost )?"

# 'The client computing group had revenue of $8.9 billion' names a segment, not the company total.
SEGMENT = re.compile(r"(?P<segment>(?:[A-Za-z][\w&'-]*\s+){1,4}(?i:group|business|segment|division|unit))\b[^.$;]{0,30}?(?i:revenue|sales)")
REVENUE = re.compile(
    rf"{_QUALIFIED_REVENUE}\b[^$%.;]{{0,60}}?\b(?i:was|were|of|came in at|totaled|reached|at|=|grew to|rose to|increased to)\s+"
    rf"{_APPROX}(?P<value>{_MONEY})"
)
CHANGE = re.compile(
    rf"{_QUALIFIED_METRIC}\s+(?i:was |were |is |are )?(?P<direction>(?i:up|grew|increased|rose|climbed|expanded|improved|"
    rf"down|declined|decreased|fell|dropped|contracted))\s+(?i:by\s+)?{_APPROX}(?P<value>{_AMOUNT})"
)
GUIDANCE = re.compile(
    rf"\b(?i:expects?|expecting|anticipates?|forecast(?:s|ing)?|guid(?:e|es|ing)|outlook|projects?|sees?|reaffirm(?:s|ing)?|"
    rf"raise[sd]?|raising|lower(?:s|ed|ing)?|increas(?:e|es|ed|ing)|reduc(?:e|es|ed|ing))\b[^.;]{{0,80}}?"
    rf"{_QUALIFIED_METRIC}\b[^$%.;]{{0,50}}?(?i:of|to be|at|to|in the range of|between|=)?\s*{_APPROX}(?P<value>{_RANGE})"
)
_NAME = r"[A-Z][\w&'.-]*(?:\s+(?:[A-Z][\w&'.-]*|&|of|de|du|and(?=\s+[A-Z])))*"
LAUNCH = re.compile(
    r"\b(?:launched|introduced|unveiled|began shipping|started shipping|released|announced the (?:launch|availability) of)\s+"
    r"(?:(?:our|the|a|an|its|new|next[- ]generation|first|latest)\s+)*(?P<product>[A-Z0-9][\w+.-]*(?:\s+[A-Z0-9][\w+.-]*){0,4})"
)
PARTNER = re.compile(
    rf"\b(?:partnership|collaboration|partnering|partnered|collaborating|collaborate|alliance|working closely)\s+with\s+(?P<org>{_NAME})"
)
SUPPLIER = re.compile(rf"\bsupply (?:agreement|deal|contract) with\s+(?P<org>{_NAME})")
ACQUISITION = re.compile(rf"\b(?:acquisition of|acquired|investment in|invested in)\s+(?P<org>{_NAME})")
_PERSON = r"[A-Z][a-z]+(?:\s+[A-Z]\.)*(?:\s+[A-Z][a-z'-]+)+"
_OFFICE = r"(?:interim\s+)?(?:CEO|CFO|COO|CTO|Chief\s+\w+\s+Officer|President|Chairman)"
APPOINTMENT = re.compile(
    rf"(?P<person>{_PERSON})\s+(?:has\s+)?(?:joined(?:\s+(?:us|[A-Z]\w+))?|was\s+appointed|was\s+named|became|"
    rf"has\s+been\s+(?:appointed|named)|took\s+over)\s+as\s+(?:our\s+)?(?:new\s+|next\s+)?(?P<role>{_OFFICE})"
    rf"|(?:appointed|named|promoted)\s+(?P<person2>{_PERSON})\s+(?:as|to)\s+(?:our\s+)?(?:new\s+|next\s+)?(?P<role2>{_OFFICE})"
)

# Canonical statements written by this extractor; the triplet rules read them back.
ROLE_STATEMENT = re.compile(
    r"^(?P<person>[A-Z][\w'.-]*(?:\s+[A-Z][\w'.-]*){1,4}) (?:is|became) (?:(?P<qualifier>interim|acting) )?"
    r"(?P<role>(?:" + ROLE_START.pattern.lstrip("^") + r").*?) (?P<prep>of|at) (?P<org>[A-Z0-9].*?)"
    r"(?: on (?P<date>[A-Z][a-z]+ \d{1,2}, \d{4}))?\.$"
)
GUIDANCE_STATEMENT = re.compile(r"^(?P<company>.+?)'s (?P<target>(?:FY\d{4}|Q[1-4] \d{4}) .+? guidance) is (?P<value>.+)\.$")


def _clean(sentence: str) -> str:
    sentence = re.sub(r"^\s*(?:[IVX]+|\d{1,2})\.\s+", "", sentence)  # list numbers in Event Briefs
    return " ".join(sentence.split())


_THIRD_PERSON = {"are": "is", "were": "was", "have": "has"}
# "We're" must not become "Apple're": a contraction is spelled out for the company.
_CONTRACTED = {"re": "is", "ve": "has", "ll": "will", "d": "would"}


def _resolve_coreference(sentence: str, context: DocumentContext) -> str:
    """'We'/'Our'/'Co.' at the start of a sentence are the company (the main entity)."""
    name = context.short_name
    sentence = re.sub(r"^(?:We|we)['’](re|ve|ll|d)\b", lambda m: f"{name} {_CONTRACTED[m[1]]}", sentence)
    sentence = re.sub(r"^(?:We|we) (are|were|have)\b", lambda m: f"{name} {_THIRD_PERSON[m[1]]}", sentence)
    sentence = re.sub(r"^(?:We|we)\b(?!['’])", name, sentence)
    sentence = re.sub(r"^(?:Our|our)\b", f"{name}'s", sentence)
    sentence = re.sub(r"\bCo\.(?=\s|'s)", name, sentence)
    return sentence


def label_statement(sentence: str) -> tuple[StatementType, TemporalType]:
    """Statement and temporal type from cue words (REFERENCE 1.3 label definitions)."""
    if _PREDICTION.search(sentence):
        return StatementType.PREDICTION, TemporalType.DYNAMIC
    if _OPINION.search(sentence):
        return StatementType.OPINION, TemporalType.STATIC
    if _PAST_EVENT.search(sentence) or ("$" in sentence and MONEY.search(sentence)):
        return StatementType.FACT, TemporalType.STATIC
    if _PRESENT_STATE.search(sentence):
        return StatementType.FACT, TemporalType.DYNAMIC
    return StatementType.FACT, TemporalType.ATEMPORAL


def _money_text(value: str) -> str:
    return " ".join(value.replace("$ ", "$").split())


# Guidance for these metrics is derived from the figure rules; the GUIDANCE pattern covers the others (bookings, ...).
_VOCABULARY_METRIC = re.compile(r"(?i:revenues?|sales|gross margins?|operating margins?|operating income|operating expenses|opex|"
                                r"net income|earnings per share|EPS|free cash flow|capital expenditures|capex)")

# 'raising revenue guidance by $1.3 billion to $61.3 billion': the amount after 'by' is a change.
_CHANGE_GAP = re.compile(rf"(?i:\bby|\bgrow(?:s|th)?|\bup)\s+{_APPROX}$")
_LEVEL_AFTER_CHANGE = re.compile(rf"{_AMOUNT}\s+(?i:to)\s+{_APPROX}(?P<level>{_RANGE})")


def _guidance_level(sentence: str, match: re.Match) -> str | None:
    """The guided level of a GUIDANCE match: the level after 'by <change> to', None for a change alone."""
    if not _CHANGE_GAP.search(sentence[match.end("metric"):match.start("value")]):
        return _money_text(match["value"])
    after = _LEVEL_AFTER_CHANGE.match(sentence, match.start("value"))
    return _money_text(after["level"]) if after else None


class OfflineExtractor(Counted):
    """Rule-based `Extractor`; see the module docstring for what it finds."""

    name = "offline"
    counters = ("statements", "validity", "triplets", "figures")

    def settings_fingerprint(self, stage: str) -> str:
        vocabulary = vocabulary_fingerprint() if stage in VOCABULARY_STAGES else ""
        if stage in ("statements", "figures"):  # derived guidance statements come from the figure rules
            vocabulary += f":{FIGURE_RULES_VERSION}:{segments_fingerprint()}"
        return hashlib.sha256(f"{RULES_VERSION}:{stage}:{vocabulary}".encode()).hexdigest()[:16]

    # -- statements ---------------------------------------------------------------------------

    def extract_statements(self, chunks: Sequence[Chunk], context: DocumentContext) -> list[list[RawStatement]]:
        return [self._statements_for(chunk, context) for chunk in chunks]

    def _statements_for(self, chunk: Chunk, context: DocumentContext) -> list[RawStatement]:
        if chunk.kind == "participants":
            return self._participant_statements(chunk.text, context)
        if chunk.speaker == "Operator":
            return []
        statements: list[RawStatement] = []
        for start, end in split_sentences(chunk.text):
            sentence = _clean(chunk.text[start:end])
            if len(sentence.split()) < 5 or sentence.endswith("?") or _SKIP.search(sentence):
                continue
            sentence = _resolve_coreference(sentence, context)
            statement_type, temporal_type = label_statement(sentence)
            statements.append(RawStatement(statement=sentence, statement_type=statement_type, temporal_type=temporal_type))
            statements.extend(self._derived_statements(sentence, context, statement_type, chunk.text[:start]))
        return statements

    def _participant_statements(self, text: str, context: DocumentContext) -> list[RawStatement]:
        statements = []
        for participant in parse_participant_sections(text):
            organization = participant.organization
            if participant.kind == "corporate":
                # The company's own people: name the organisation as the registry does.
                own = company_for_name(organization) if organization else None
                if organization is None or (own is not None and own.ticker == context.ticker):
                    organization = context.main_entity
            if not organization:
                continue
            for office in parse_offices(participant.title, organization):
                org = office.organization or organization
                qualifier = f"{office.qualifier.lower()} " if office.qualifier else ""
                preposition = "of" if participant.kind == "corporate" else "at"
                statements.append(
                    RawStatement(statement=f"{participant.name} is {qualifier}{office.role} {preposition} {org.rstrip('.')}.",
                                 statement_type=StatementType.FACT, temporal_type=TemporalType.DYNAMIC)
                )
        return statements

    def _derived_statements(self, sentence: str, context: DocumentContext, statement_type: StatementType,
                            scope: str = "") -> list[RawStatement]:
        """Canonical DYNAMIC facts behind guidance and appointments, which later statements revise.
        `scope` is the paragraph before the sentence (its section decides a figure's period)."""
        derived = []
        guided = [figure for figure in figure_parser(context).parse(sentence, statement_type == StatementType.PREDICTION, scope)
                  if figure.kind.value == "guidance"] if "?" not in sentence and _DIGIT.search(sentence) else []
        for figure in guided:
            derived.append(RawStatement(statement=f"{context.short_name}'s {guidance_phrase(figure)}.",
                                        statement_type=StatementType.FACT, temporal_type=TemporalType.DYNAMIC))
        if not guided and "?" not in sentence and _DIGIT.search(sentence) and (match := GUIDANCE.search(sentence)) \
                and not _VOCABULARY_METRIC.search(match["metric"]):
            period = PeriodResolver(context).find(sentence, forward=True)
            level = _guidance_level(sentence, match)
            if period is not None and level is not None:
                metric = " ".join(match["metric"].lower().split())
                metric = re.sub(r"^(?:full[- ]year|quarterly|total)\s+", "", metric)
                derived.append(RawStatement(
                    statement=f"{context.short_name}'s {period.label} {metric} guidance is {level}.",
                    statement_type=StatementType.FACT, temporal_type=TemporalType.DYNAMIC))
        if _OFFICE_WORDS.search(sentence) and (match := APPOINTMENT.search(sentence)):
            person, role = match["person"] or match["person2"], match["role"] or match["role2"]
            offices = parse_offices(" ".join(role.split()))
            if offices:
                office = offices[0]
                qualifier = f"{office.qualifier.lower()} " if office.qualifier else ""
                when = find_date(sentence)
                suffix = f" on {when[0]:%B} {when[0].day}, {when[0].year}" if when else ""
                verb = "became" if when else "is"
                derived.append(RawStatement(
                    statement=f"{person} {verb} {qualifier}{office.role} of {context.main_entity.rstrip('.')}{suffix}.",
                    statement_type=StatementType.FACT, temporal_type=TemporalType.DYNAMIC))
        return derived

    # -- validity ranges ----------------------------------------------------------------------

    def extract_validity(
        self, statements: Sequence[RawStatement], context: DocumentContext
    ) -> list[TemporalValidityRange | None]:
        resolver = PeriodResolver(context)
        ranges: list[TemporalValidityRange | None] = []
        for statement in statements:
            if statement.temporal_type == TemporalType.ATEMPORAL:
                ranges.append(None)  # no call: ATEMPORAL statements have no range
                continue
            ranges.append(self._validity(statement, context, resolver))
        return ranges

    def _validity(self, statement: RawStatement, context: DocumentContext, resolver: PeriodResolver) -> TemporalValidityRange:
        text = statement.statement
        publication = context.publication_date
        if ROLE_STATEMENT.match(text) or GUIDANCE_STATEMENT.match(text):
            role = ROLE_STATEMENT.match(text)
            start = find_date(role["date"])[0] if role and role["date"] else publication
            return TemporalValidityRange(valid_at=start)
        if statement.statement_type == StatementType.PREDICTION:
            period = resolver.find(text, forward=True)
            return TemporalValidityRange(valid_at=publication, invalid_at=period.end if period and period.end > publication else None)
        explicit = find_date(text)
        if explicit and explicit[0] <= publication:
            return TemporalValidityRange(valid_at=explicit[0])
        period = resolver.find(text, forward=False)
        if period is not None and period.start <= publication:
            end = period.end if statement.temporal_type == TemporalType.DYNAMIC and period.end <= publication else None
            return TemporalValidityRange(valid_at=period.start, invalid_at=end)
        return TemporalValidityRange(valid_at=publication)

    # -- triplets -----------------------------------------------------------------------------

    def extract_triplets(self, statements: Sequence[RawStatement], context: DocumentContext) -> list[RawExtraction]:
        resolver = PeriodResolver(context)
        return [self._triplets_for(statement, context, resolver) for statement in statements]

    def _triplets_for(self, statement: RawStatement, context: DocumentContext, resolver: PeriodResolver) -> RawExtraction:
        text = statement.statement
        builder = _ExtractionBuilder()
        if match := ROLE_STATEMENT.match(text):
            role, org = _split_role_and_org(match, context)
            person = builder.entity(match["person"], EntityType.PERSON, f"Person holding {role} at {org}")
            office = builder.entity(f"{role} of {org}", EntityType.ROLE, f"The office of {role} at {org}")
            value = f"{match['qualifier']} {role}" if match["qualifier"] else role
            builder.triplet(person, Predicate.HOLDS_ROLE, office, value)
            return builder.build()
        company = builder.lazy_company(context)
        if match := GUIDANCE_STATEMENT.match(text):
            target = builder.entity(f"{context.short_name} {match['target']}", EntityType.METRIC,
                                    f"{context.main_entity}'s guidance for {match['target'].replace(' guidance', '')}")
            builder.triplet(company(), Predicate.TARGETS, target, match["value"])
            return builder.build()
        forward = statement.statement_type == StatementType.PREDICTION
        # A result with no period named is about the quarter the call reports.
        period = resolver.find(text, forward=forward) or (None if forward else resolver.shift(0))
        period_label = f" {period.label}" if period else ""
        has_digit = _DIGIT.search(text) is not None
        if statement.statement_type == StatementType.PREDICTION:
            if has_digit and (match := GUIDANCE.search(text)) and (level := _guidance_level(text, match)) is not None:
                metric = self._metric_entity(builder, context, match["metric"], period_label)
                builder.triplet(company(), Predicate.TARGETS, metric, level)
        else:
            if "$" in text and (match := REVENUE.search(text)):
                segment = SEGMENT.search(text)
                name = f"{_strip_determiners(segment['segment'])} revenue" if segment else match["metric"]
                metric = self._metric_entity(builder, context, name, period_label)
                # 'reaffirming our revenue outlook of $1.20 billion' is guidance, not revenue earned
                kinds = {figure.kind.value for figure in figure_parser(context).parse(text)
                         if figure.metric.value in ("revenue", "segment_revenue")}
                predicate = Predicate.TARGETS if kinds == {"guidance"} else Predicate.HAS_REVENUE
                builder.triplet(company(), predicate, metric, _money_text(match["value"]))
            for match in CHANGE.finditer(text) if has_digit else ():
                metric = self._metric_entity(builder, context, match["metric"], period_label)
                up = match["direction"].lower() in {"up", "grew", "increased", "rose", "climbed", "expanded", "improved"}
                builder.triplet(company(), Predicate.INCREASED if up else Predicate.DECREASED, metric, _money_text(match["value"]))
        if any(word in text for word in _LAUNCH_WORDS) and (match := LAUNCH.search(text)):
            product = builder.entity(match["product"].rstrip(".,"), EntityType.PRODUCT, f"Product of {context.main_entity}")
            builder.triplet(company(), Predicate.LAUNCHED, product)
        for pattern, predicate, reverse, words in ((PARTNER, Predicate.COLLABORATES_WITH, False, ("with",)),
                                                   (SUPPLIER, Predicate.SUPPLIES, True, ("supply ",)),
                                                   (ACQUISITION, Predicate.INVESTS_IN, False, ("acqui", "invest"))):
            if any(word in text for word in words) and (match := pattern.search(text)):
                org_name = match["org"].rstrip(".,")
                if company_for_name(org_name) is not None and company_for_name(org_name).ticker == context.ticker:
                    continue
                org = builder.entity(org_name, EntityType.ORGANIZATION, "Organisation named in an earnings call")
                builder.triplet(org, predicate, company()) if reverse else builder.triplet(company(), predicate, org)
        return builder.build()

    # -- figures ------------------------------------------------------------------------------

    def extract_figures(self, statements: Sequence[RawStatement], context: DocumentContext,
                        scopes: Sequence[str] | None = None) -> list[list[RawFigure]]:
        parser = figure_parser(context)
        scopes = scopes or [""] * len(statements)
        return [parser.parse(statement.statement, statement.statement_type == StatementType.PREDICTION, scope)
                for statement, scope in zip(statements, scopes)]

    @staticmethod
    def _metric_entity(builder: _ExtractionBuilder, context: DocumentContext, metric: str, period_label: str) -> int:
        metric = " ".join(metric.split())
        metric = re.sub(r"^(?:record|total|quarterly)\s+", "", metric, flags=re.IGNORECASE)
        return builder.entity(f"{context.short_name} {metric.lower()}{period_label}", EntityType.METRIC,
                              f"{context.main_entity}'s {metric.lower()}{period_label}")


def _strip_determiners(phrase: str) -> str:
    return re.sub(r"^(?:(?:the|our|its|their|a|an|[A-Z]\w*'s)\s+)+", "", phrase.strip(), flags=re.IGNORECASE)


def _split_role_and_org(match: re.Match, context: DocumentContext) -> tuple[str, str]:
    """'VP of IR of Intel Corporation': the organisation is the company when the sentence ends
    with its name, else what follows the last ' of ' (the first ' at ' for analysts)."""
    tail = f"{match['role']} {match['prep']} {match['org']}"
    company = context.main_entity.rstrip(".")
    if tail.endswith(f" of {company}"):
        return tail[: -len(f" of {company}")], context.main_entity
    if match["prep"] == "at":
        return match["role"], match["org"]
    role, _, org = tail.rpartition(" of ")
    return role, org


class _ExtractionBuilder:
    """Collects entities (deduplicated by name and type) and triplets for one statement."""

    def __init__(self) -> None:
        self.entities: list[RawEntity] = []
        self.triplets: list[RawTriplet] = []

    def entity(self, name: str, entity_type: EntityType, description: str) -> int:
        for existing in self.entities:
            if existing.name == name and existing.type == entity_type:
                return existing.entity_idx
        self.entities.append(RawEntity(entity_idx=len(self.entities), name=name, type=entity_type, description=description))
        return len(self.entities) - 1

    def lazy_company(self, context: DocumentContext):
        return lambda: self.entity(context.main_entity, EntityType.ORGANIZATION, f"{context.main_entity} ({context.ticker})")

    def triplet(self, subject: int, predicate: Predicate, obj: int | None, value: str | None = None) -> None:
        self.triplets.append(RawTriplet(
            subject_name=self.entities[subject].name, subject_id=subject, predicate=predicate,
            object_name=self.entities[obj].name if obj is not None else (value or ""), object_id=obj, value=value))

    def build(self) -> RawExtraction:
        used = {t.subject_id for t in self.triplets} | {t.object_id for t in self.triplets if t.object_id is not None}
        return RawExtraction(entities=[e for e in self.entities if e.entity_idx in used], triplets=self.triplets)
