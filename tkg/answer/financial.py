"""Financial and office questions answered from the warehouse's own tables, offline.

A question that names a figure ('NVIDIA revenue, fiscal Q2 2018', 'how did Microsoft's FY2017
opex guidance change') is answered from `metrics`, not from statements ranked by meaning: the
company's own fiscal calendar decides the period, a result is the reported row (guidance only
when the question asks for it, or when nothing was reported), two companies are answered side
by side, and a revision question gets the whole chain. An office question over a span ('Intel
CFO timeline 2016-2020') lists every holder from `officer_tenures`. A company whose calls the
graph does not hold, or a period it has no figure for, is said to be out of the data rather than
answered with whatever statements come closest.

Every answer is one line of text plus the rows it used (statement, call date, event id).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timezone

from tkg.answer.query import Fact, Figure, Graph, QueryError
from tkg.answer.questions import ORDINALS, ROLES, read_period
from tkg.core.companies import Company
from tkg.core.names import company_for_name, fold
from tkg.extract.figures import segment_patterns

# Metric words a question may use, longest first ('operating expense' before 'operating').
_METRIC_WORDS = {
    "revenue_growth": ("revenue growth", "sales growth"),
    "gross_margin": ("gross profit margin", "gross margins", "gross margin"),
    "operating_margin": ("operating margins", "operating margin"),
    "operating_income": ("income from operations", "operating income", "operating profit"),
    "operating_expenses": ("operating expenses", "operating expense", "operating costs", "opex"),
    "net_income": ("net income", "net earnings", "net profit"),
    "eps": ("earnings per share", "eps"),
    "capex": ("capital expenditures", "capital expenditure", "capital spending", "capex"),
    "free_cash_flow": ("free cash flow",),
    "revenue": ("net revenues", "net revenue", "net sales", "revenues", "revenue", "sales", "top line"),
}
_METRIC_PATTERN = re.compile(r"\b(" + "|".join(sorted((re.escape(w) for ws in _METRIC_WORDS.values() for w in ws),
                                                      key=len, reverse=True)) + r")\b", re.IGNORECASE)
_METRIC_OF = {word: metric for metric, words in _METRIC_WORDS.items() for word in words}
_METRIC_LABEL = {"eps": "EPS", "capex": "capex", "segment_revenue": "revenue"}

_GUIDANCE_WORDS = re.compile(r"\b(?:guid\w*|outlook|expect\w*|forecast\w*|project\w*|anticipat\w*)\b", re.IGNORECASE)
_CHANGE_WORDS = re.compile(r"\b(?:chang\w*|revis\w*|evolv\w*|history|over time|raise[sd]?|lower(?:ed)?|cut|moved?)\b",
                           re.IGNORECASE)
_TIMELINE_WORDS = re.compile(r"\b(?:timeline|history|succession|all|every|each|list|over)\b", re.IGNORECASE)
_NON_GAAP = re.compile(r"\b(?:non[- ]GAAP|adjusted)\b", re.IGNORECASE)
_GAAP = re.compile(r"(?<![-\w])GAAP\b")

_QUARTER = re.compile(
    r"\b(?P<fiscal>fiscal\s+|calendar\s+)?(?:q(?P<q>[1-4])|(?P<ord>first|second|third|fourth|1st|2nd|3rd|4th)[\s-]+"
    r"(?:fiscal\s+)?quarter)(?:\s+(?:of\s+)?(?P<fy>fiscal\s+(?:year\s+)?|fy\s*|calendar\s+)?(?:'?(?P<y2>\d{2})\b|(?P<y4>\d{4})))?",
    re.IGNORECASE)
# 'FY18 Q2', 'FY2018 Q2'
_QUARTER_LABEL = re.compile(r"\bfy\s?'?(?:(?P<y2>\d{2})\b|(?P<y4>\d{4}))\s*q(?P<q>[1-4])\b", re.IGNORECASE)
_FISCAL_YEAR = re.compile(r"\b(?:(?:full[- ]year\s+)?fiscal\s+(?:year\s+)?|fy\s?)'?(\d{4}|\d{2})\b", re.IGNORECASE)
_MONTH_QUARTER = re.compile(r"\b(?:the\s+)?(" + "|".join(calendar.month_name[1:]) + r")\s+(\d{4})\s+quarter\b", re.IGNORECASE)
_FULL_YEAR = re.compile(r"\b(?:full[- ]year|annual|whole year|for the year)\b", re.IGNORECASE)
_CALENDAR_YEAR = re.compile(r"\b(?:calendar\s+(?:year\s+)?)?(20\d{2}|19\d{2})\b", re.IGNORECASE)
_AS_OF = re.compile(r"\b(?:as of|as at|on|in|at)\s+(?:(\d{4})-(\d{2})-(\d{2})|(" + "|".join(calendar.month_name[1:]) +
                    r")\s+(?:(\d{1,2}),?\s+)?(\d{4}))\b", re.IGNORECASE)
_SPAN = re.compile(r"\b(?:from\s+|between\s+)?((?:19|20)\d{2})\s*(?:-|–|—|to|through|until|and)\s*((?:19|20)\d{2})\b", re.IGNORECASE)
_MONTHS = {name.lower(): number for number, name in enumerate(calendar.month_name) if name}


@dataclass
class FiscalPeriod:
    year: int | None
    quarter: int | None
    said: str
    full_year: bool = False


@dataclass
class Financial:
    """A one-line answer, the rows it rests on, and what the reader understood."""

    answer: str
    facts: list[Fact] = field(default_factory=list)
    # False: an office at one moment, where the general reader's ranked facts are the evidence
    # and this answer is their one-line summary.
    own_facts: bool = True
    plan: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    calls: list[tuple[str, dict, int]] = field(default_factory=list)  # (tool, arguments, results)


def companies_named(question: str) -> list[Company]:
    """The configured companies a question names, in the order it names them ('Intel vs AMD')."""
    words = re.findall(r"[\w&.\-]+(?:'s|’s)?", question)
    words = [re.sub(r"(?:'s|’s)$|[.,?!]+$", "", word) for word in words]
    found: list[tuple[int, Company]] = []
    taken: set[int] = set()
    for size in (4, 3, 2, 1):
        for begin in range(len(words) - size + 1):
            span = set(range(begin, begin + size))
            if span & taken:
                continue
            text = " ".join(words[begin:begin + size])
            if size == 1 and (text.islower() or len(text) < 2):
                continue  # 'intel' in lower case is rare in a question; 'us' and 'it' are words
            company = company_for_name(text)
            if company is not None and all(company.ticker != other.ticker for _, other in found):
                found.append((begin, company))
                taken |= span
    return [company for _, company in sorted(found, key=lambda pair: pair[0])]


def metric_named(question: str) -> str | None:
    found = _METRIC_PATTERN.search(question)
    return _METRIC_OF[found[1].lower()] if found else None


def _year(two: str | None, four: str | None) -> int | None:
    if four:
        return int(four)
    return 2000 + int(two) if two else None


def fiscal_period(question: str, company: Company) -> tuple[FiscalPeriod | None, list[str]]:
    """The fiscal period a financial question names, on `company`'s calendar. Quarter labels are
    the company's own ('Q2 2018' at NVIDIA is May-July 2017, as its calls say), unless the
    question says 'calendar'; 'the March 2016 quarter' is the fiscal quarter holding that month."""
    notes: list[str] = []
    text = _AS_OF.sub(" ", question) if re.search(r"\bas (?:of|at)\b", question, re.IGNORECASE) else question
    if (found := _QUARTER_LABEL.search(text)) is not None:
        quarter, year = int(found["q"]), _year(found["y2"], found["y4"])
        return FiscalPeriod(year, quarter, found[0]), notes
    if (found := _MONTH_QUARTER.search(text)) is not None:
        month, year = _MONTHS[found[1].lower()], int(found[2])
        quarter, fiscal_year = _fiscal_of_month(company, year, month)
        notes.append(f"'{found[0]}' is Q{quarter} of {company.ticker}'s fiscal {fiscal_year}")
        return FiscalPeriod(fiscal_year, quarter, found[0]), notes
    if (found := _QUARTER.search(text)) is not None:
        quarter = int(found["q"]) if found["q"] else ORDINALS[found["ord"].lower()]
        year = _year(found["y2"], found["y4"])
        if year is None and (other := _CALENDAR_YEAR.search(text[found.end():]) or _CALENDAR_YEAR.search(text)):
            year = int(other[1])
        calendar_said = "calendar" in fold(f"{found['fiscal'] or ''} {found['fy'] or ''}")
        if calendar_said and year is not None:
            month = 3 * quarter
            quarter, year = _fiscal_of_month(company, year, month)
            notes.append(f"calendar {found[0]} is Q{quarter} of {company.ticker}'s fiscal {year}")
        elif company.fiscal_year_end_month != 12:
            first, last = company.fiscal_period(quarter, year) if year else (None, None)
            notes.append(f"'{found[0]}' read as {company.ticker}'s own fiscal quarter" + (f" ({first} to {last})" if first else ""))
        return FiscalPeriod(year, quarter, found[0]), notes
    if (found := _FISCAL_YEAR.search(text)) is not None:
        return FiscalPeriod(_year(*((found[1], None) if len(found[1]) == 2 else (None, found[1]))), None, found[0], True), notes
    if (found := _CALENDAR_YEAR.search(text)) is not None:
        year = int(found[1])
        if company.fiscal_year_end_month != 12:
            notes.append(f"'{found[0]}' read as {company.ticker}'s fiscal {year}")
        return FiscalPeriod(year, None, found[0], True), notes
    return None, notes


def _fiscal_of_month(company: Company, year: int, month: int) -> tuple[int, int]:
    """The fiscal quarter and year of `company` that hold calendar month `month` of `year`."""
    for fiscal_year in (year, year + 1):
        for quarter in (1, 2, 3, 4):
            first, last = company.fiscal_period(quarter, fiscal_year)
            if first <= date(year, month, 1) <= last:
                return quarter, fiscal_year
    raise ValueError(f"no fiscal quarter of {company.ticker} holds {year}-{month:02d}")  # unreachable for a 12-month year


def as_of_date(question: str) -> date | None:
    """'as of December 2016' is 2016-12-01 (what stood when the month began); 'as of 2017-03-01'."""
    found = re.search(r"\bas (?:of|at)\s+(.*)$", question, re.IGNORECASE)
    if found is None or (match := _AS_OF.search("as of " + found[1])) is None:
        return None
    if match[1]:
        return date(int(match[1]), int(match[2]), int(match[3]))
    return date(int(match[6]), _MONTHS[match[4].lower()], int(match[5]) if match[5] else 1)


def _segment(question: str, company: Company) -> str | None:
    for segment in segment_patterns(dict(company.segments)):
        if segment.pattern.search(question):
            return segment.name
    return None


def _fact(figure: Figure, name: str) -> Fact:
    metric = _METRIC_LABEL.get(figure.metric, figure.metric.replace("_", " "))
    what = " ".join(filter(None, (figure.segment, figure.basis, metric)))
    return Fact(event_id=figure.event_id, company=figure.company, call_date=figure.call_date, subject=name,
                predicate=f"{figure.kind} {what}", object=figure.period, value=figure.amount(), statement=figure.statement,
                valid_at=figure.valid_at, invalid_at=figure.invalid_at, invalidated_by=figure.invalidated_by)


def _cite(figure: Figure) -> str:
    return f"(call of {figure.call_date}, [{figure.event_id}])"


def _short_name(company: Company) -> str:
    return company.aliases[0] if company.aliases else company.name


def _choose_reported(rows: list[Figure]) -> Figure | None:
    """The reported figure of a period: as stated at the first call that reported it (later calls
    cite it for comparison, sometimes rounded), the value said most often there, GAAP before an
    unstated basis before non-GAAP only to break ties."""
    if not rows:
        return None
    first_call = min(row.call_date for row in rows)
    at_first = [row for row in rows if row.call_date == first_call]
    counts: dict[tuple, int] = {}
    for row in at_first:
        counts[(row.value, row.low, row.high)] = counts.get((row.value, row.low, row.high), 0) + 1
    return max(at_first, key=lambda r: (counts[(r.value, r.low, r.high)], r.basis is None, str(r.event_id)))


def _chain(rows: list[Figure]) -> list[Figure]:
    """Guidance in call order, one row per call and value (a restatement at the same call counts once)."""
    seen: dict[tuple, Figure] = {}
    for row in sorted(rows, key=lambda r: (r.call_date, str(r.event_id))):
        seen.setdefault((row.call_date, row.value, row.low, row.high), row)
    return list(seen.values())


def answer_financial(graph: Graph, question: str) -> Financial | None:
    """An answer from `metrics` / `officer_tenures` when the question asks for a figure or an
    office at named companies; None when it does not (the general reader answers it)."""
    metric = metric_named(question)
    folded = f" {fold(question)} "

    roles = [role for role, spellings in ROLES.items() if any(f" {s} " in folded for s in (role, *spellings))]
    if metric is None and not roles:
        return None
    companies = companies_named(question)
    if not companies:
        return _not_covered(graph, question, metric, roles)
    uncovered = [c for c in companies if graph.coverage(c.ticker)[0] == 0]
    if uncovered:
        covered = ", ".join(sorted(row["company"] for row in graph.rows("SELECT DISTINCT company FROM transcripts")))
        names = " and ".join(c.name for c in uncovered)
        return Financial(f"Not in the data: the graph holds no calls of {names}, so it cannot say. It covers {covered}.",
                         notes=[f"{names}: no transcripts in the graph"])
    if metric is None:
        return _offices(graph, question, companies[0], roles[0])
    return _figures(graph, question, companies, metric)


def _not_covered(graph: Graph, question: str, metric: str | None, roles: list[str]) -> Financial | None:
    """A figure or office question about a company that is not configured: say so, naming the
    capitalised words that were read as its name, unless the question names no such word."""
    skip = {fold(w) for w in ("who", "what", "which", "when", "how", "did", "does", "was", "is", "the", "q1", "q2", "q3", "q4",
                                "fy", "gaap", "non-gaap", "ceo", "cfo", "coo", "cto", "eps", "vs")} | set(_MONTHS)
    candidates = [w for w in re.findall(r"\b[A-Z][\w&.-]*", question) if fold(re.sub(r"(?:'s|’s)$", "", w)) not in skip
                  and fold(w) not in ROLES_FOLDED and not re.fullmatch(r"Q[1-4]|FY\d*", w)]
    if not candidates:
        return None
    run = re.match(r"[A-Z][\w&.-]*(?:\s+[A-Z][\w&.-]*)*", question[question.index(candidates[0]):])[0]
    try:
        known = graph.find_entity(re.sub(r"(?:'s|’s)$", "", run), limit=1)
    except QueryError:
        known = []
    if known and known[0].score >= 90 and known[0].type != "Organization":
        return None  # a person or product the graph knows: the general reader answers it
    covered = ", ".join(sorted(row["company"] for row in graph.rows("SELECT DISTINCT company FROM transcripts")))
    name = re.sub(r"(?:'s|’s)$", "", candidates[0])
    return Financial(f"Not in the data: {name} is not a company whose calls the graph holds, so it cannot say. "
                     f"It covers {covered}.", notes=[f"no configured company named in the question; read {name!r} as one"])


ROLES_FOLDED = {"chief", "executive", "financial", "officer", "operating", "president", "chairman", "technology"}


def _offices(graph: Graph, question: str, company: Company, role: str) -> Financial:
    """Holders of an office: at a moment or month ('in June 2017'), or over a span of years."""
    title = {"ceo": "CEO", "cfo": "CFO", "coo": "COO", "cto": "CTO", "president": "President", "chairman": "Chairman"}.get(role, role)
    span = _SPAN.search(question)
    moment = as_of_date(question)

    if span is not None:
        start, end = f"{span[1]}-01-01", f"{span[2]}-12-31"
        said = f"{span[1]} to {span[2]}"
    elif moment is not None:
        start = end = moment.isoformat()
        said = start
    else:
        period, _ = read_period(question, company.ticker)
        if period is None:
            start = end = None
            said = "any time"
        else:
            start, end, said = period.start.date().isoformat(), period.end.date().isoformat(), period.said
    holders = graph.office_holders(company.ticker, title, start, end)
    plan = [f"holders of {title} at {company.ticker} in {said} (officer_tenures)"]
    calls = [("office_holders", {"company": company.ticker, "role": title, "start": start, "end": end}, len(holders))]
    if not holders:
        count, first, last = graph.coverage(company.ticker)
        return Financial(f"Not in the data: no {title} of {_short_name(company)} is recorded for {said} (its {count} calls, "
                         f"{first} to {last}, name none).", plan=plan, calls=calls)
    timeline = span is not None or (_TIMELINE_WORDS.search(question) is not None and len(holders) > 1)
    if not timeline and start is not None and start == end:
        # one moment: the holder whose tenure holds it, latest start first (an interim one ends there)
        day = datetime.fromisoformat(start).replace(tzinfo=timezone.utc)
        holding = [h for h in holders if (h["started_at"] is None or h["started_at"] <= day.replace(hour=23, minute=59))
                   and (h["ended_at"] is None or h["ended_at"] > day)]
        holders = sorted(holding or holders, key=lambda h: h["started_at"] or datetime.min.replace(tzinfo=timezone.utc))[-1:]

    def tenure(h: dict) -> str:
        began = f"{h['started_at']:%Y-%m-%d}" if h["started_at"] else "?"
        ended = f"{h['ended_at']:%Y-%m-%d}" if h["ended_at"] else "open"
        return f"{h['person']} ({began} to {ended}) [{h['event_id']}]"

    facts = [Fact(event_id=h["event_id"], company=company.ticker, call_date=h["started_at"].date() if h["started_at"] else None,
                  subject=h["person"], predicate="HOLDS_ROLE", object=f"{title} of {company.name}", value=h["title"],
                  statement=h["statement"], valid_at=h["started_at"], invalid_at=h["ended_at"]) for h in holders]
    if len(holders) == 1 and not timeline:
        answer = f"{_short_name(company)}'s {title} in {said}: {tenure(holders[0])}."
    else:
        answer = f"{_short_name(company)}'s {title}s in {said}: " + "; ".join(tenure(h) for h in holders) + "."
    return Financial(answer, facts, plan=plan, calls=calls, own_facts=timeline)


def _figures(graph: Graph, question: str, companies: list[Company], metric: str) -> Financial:
    wants_guidance = _GUIDANCE_WORDS.search(question) is not None
    wants_chain = wants_guidance and _CHANGE_WORDS.search(question) is not None
    basis = "non-GAAP" if _NON_GAAP.search(question) else "GAAP" if _GAAP.search(question) else None
    moment = as_of_date(question) if wants_guidance else None
    parts, facts, plan, notes, calls = [], [], [], [], []
    for company in companies:
        period, period_notes = fiscal_period(question, company)
        notes.extend(period_notes)
        segment = _segment(question, company)
        asked_metric = "segment_revenue" if segment and metric == "revenue" else metric
        name = _short_name(company)
        what = " ".join(filter(None, (segment, basis, _METRIC_LABEL.get(asked_metric, asked_metric.replace("_", " ")))))
        arguments = {"company": company.ticker, "metric": asked_metric, "fiscal_year": period.year if period else None,
                     "fiscal_quarter": period.quarter if period else None, "full_year": bool(period and period.full_year),
                     "segment": segment, "basis": basis}
        label = (f"Q{period.quarter} FY{period.year}" if period.quarter else f"FY{period.year}") if period and period.year else "the latest period"
        rows = graph.metrics(**arguments)
        calls.append(("metrics", arguments, len(rows)))
        reported = [r for r in rows if r.kind == "reported"]
        guidance = [r for r in rows if r.kind == "guidance"]
        if period is None or period.year is None:
            # no period named: the newest reported period
            if reported:
                newest = max((r.fiscal_year, r.fiscal_quarter or 5) for r in reported)
                reported = [r for r in reported if (r.fiscal_year, r.fiscal_quarter or 5) == newest]
                label = reported[0].period
            guidance = []
        if wants_chain:
            plan.append(f"{name}'s {label} {what} guidance, every revision (metrics)")
            chain = _chain(guidance)
            if not chain:
                parts.append(f"Not in the data: no {what} guidance of {name} for {label}.")
                continue
            steps, previous = [], None
            for r in chain:  # a restatement of the same value extends the step before it
                if previous is not None and (previous.value, previous.low, previous.high) == (r.value, r.low, r.high):
                    steps[-1] += f", restated {r.call_date} [{r.event_id}]"
                else:
                    restated = f" (restated until {r.last_stated_on})" if r.restatements > 1 else ""
                    steps.append(f"{r.amount()}{' (' + r.basis + ')' if r.basis else ''} on {r.call_date}{restated} [{r.event_id}]")
                previous = r
            steps = "; then ".join(steps)
            text = f"{name}'s {label} {what} guidance: {steps}"
            if (actual := _choose_reported(reported)) is not None:
                text += f"; reported at {actual.amount()} on {actual.call_date} [{actual.event_id}]"
                chain.append(actual)
            parts.append(text + ".")
            facts.extend(_fact(r, name) for r in chain)
            continue
        if wants_guidance:
            if moment is not None:
                standing = graph.metrics(**arguments, kind="guidance", as_of=moment)
                calls.append(("metrics_as_of", {**arguments, "as_of": moment.isoformat()}, len(standing)))
                plan.append(f"{name}'s {label} {what} guidance as it stood on {moment} (metrics_as_of)")
            else:
                last = max((r.call_date for r in guidance), default=None)
                standing = [r for r in guidance if r.call_date == last]
                plan.append(f"{name}'s latest {label} {what} guidance (metrics)")
            standing = _chain(standing)
            if not standing:
                parts.append(f"Not in the data: no {what} guidance of {name} for {label}"
                             + (f" stood on {moment}." if moment else "."))
                continue
            best = standing[-1]
            parts.append(f"{name} guided {label} {what} to {best.amount()} {_cite(best)}"
                         + (f", as it stood on {moment}" if moment else "") + ".")
            facts.extend(_fact(r, name) for r in reversed(standing))
            continue
        plan.append(f"{name}'s reported {label} {what} (metrics)")
        actual = _choose_reported(reported)
        if actual is not None:
            others = sorted({f"{r.amount()}{' ' + r.basis if r.basis else ''} ({r.call_date})" for r in reported
                             if r.amount() != actual.amount()})
            basis_said = f" ({actual.basis})" if actual.basis and not basis else ""
            parts.append(f"{name} reported {label} {what} of {actual.amount()}{basis_said} {_cite(actual)}."
                         + (f" Other figures stated for that period: {', '.join(others)}." if others else ""))
            facts.append(_fact(actual, name))
            facts.extend(_fact(r, name) for r in reported if r is not actual)
        elif guidance:
            last = _chain([r for r in guidance if r.call_date == max(g.call_date for g in guidance)])[-1]
            parts.append(f"No reported {label} {what} of {name} is in the data; the latest guidance was "
                         f"{last.amount()} {_cite(last)}.")
            facts.append(_fact(last, name))
        else:
            calls_held, first, latest = graph.coverage(company.ticker)
            parts.append(f"Not in the data: no {label} {what} of {name} (its {calls_held} calls run {first} to {latest}).")
    return Financial(" ".join(parts), facts, plan=plan, notes=notes, calls=calls)
