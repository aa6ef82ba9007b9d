"""Financial figures in a statement: what was reported or guided, for which period, in base units.

'Revenue for the quarter was $50.6 billion' is a reported `revenue` of 5.06e10 USD for the
quarter the call reports; 'we expect revenue to be between $89 billion and $93 billion' is
`revenue` guidance for the next quarter with low 8.9e10, high 9.3e10 and value their midpoint.

The rules read one clause at a time ('..., and we remain on path for full-year operating
expense of ...' is a second figure with its own metric and period) and attach each amount to
the nearest metric named before it. An amount is left out, rather than recorded as the
period's total, when it is a trap:
- a run rate, a currency or other headwind/tailwind, backlog or contracted revenue, bookings;
- a comparison: 'up from $1.2 billion', 'a year ago', 'ahead of our outlook of $280 million';
- a long-term target ('by 2020', 'over time', a fiscal year two or more years out);
- a part of the total the registry does not name as a segment ('services revenue' at a company
  without a Services segment), or a sub-amount ('with about $2.3 billion from LinkedIn');
- a change ('reduced capex by $0.5 billion to $11.5 billion' records only $11.5 billion);
- an amount of the wrong kind for the metric (a percentage read as revenue).
A percentage right after a revenue figure and a growth word ('up 14% year-over-year') is
`revenue_growth`; '15.2% of revenue' after operating income is `operating_margin`.

Hand-written on purpose: the libraries that parse quantities (quantulum3, price-parser) know
amounts and units but none of the earnings-call context that decides what an amount is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import lru_cache

from tkg.core.companies import get_company, load_companies
from tkg.core.models import PERCENT_METRICS, RawFigure
from tkg.extract.base import DocumentContext
from tkg.extract.periods import PeriodResolver

FIGURE_RULES_VERSION = "figures-10"

# Synonyms, longest first so 'operating expense' wins over 'operating'.
_SYNONYMS = {
    "revenue": ("total net revenues", "total net revenue", "net revenues", "net revenue", "total revenues", "total revenue",
                "net sales", "total sales", "revenues", "revenue", "top line", "sales"),
    "gross_margin": ("gross profit margin", "gross margins", "gross margin"),
    "operating_margin": ("operating profit margin", "operating margins", "operating margin"),
    "operating_income": ("income from operations", "operating income", "operating profit", "operating loss"),
    "operating_expenses": ("operating expenses", "operating expense", "operating costs", "opex"),
    "net_income": ("net income", "net earnings", "net profit", "net loss"),
    "eps": ("diluted earnings per share", "earnings per share", "eps"),
    "capex": ("capital expenditures", "capital expenditure", "capital spending", "capex"),
    "free_cash_flow": ("free cash flow",),
}
_METRIC_OF = {synonym: metric for metric, synonyms in _SYNONYMS.items() for synonym in synonyms}
METRIC_WORDS = re.compile(r"\b(" + "|".join(sorted((re.escape(s) for s in _METRIC_OF), key=len, reverse=True)) + r")\b",
                          re.IGNORECASE)

_SCALES = {"trillion": Decimal(10) ** 12, "billion": Decimal(10) ** 9, "bn": Decimal(10) ** 9, "b": Decimal(10) ** 9,
           "million": Decimal(10) ** 6, "mn": Decimal(10) ** 6, "m": Decimal(10) ** 6, "thousand": Decimal(10) ** 3,
           "k": Decimal(10) ** 3}
_CURRENCIES = {"$": "USD", "us$": "USD", "usd": "USD", "€": "EUR", "eur": "EUR", "euro": "EUR", "euros": "EUR",
               "£": "GBP", "gbp": "GBP", "¥": "JPY", "jpy": "JPY", "yen": "JPY"}
_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_SCALE = r"(?:\s*(?:trillion|billion|million|thousand|bn|mn|b|m|k)\b)"
_CURRENCY = r"(?:US\$|\$|€|£|¥|(?:USD|EUR|GBP|JPY)\s?)"
# One amount: '$1.48 billion', 'EUR 1.6 billion', '1.6 billion euros', '61.9%', '41 percent'.
_ONE = (rf"(?:(?P<Pcur>{_CURRENCY})\s?(?P<Pnum>{_NUMBER})(?P<Pscale>{_SCALE})?(?P<Pcur2>\s+euros?)?"
        rf"|(?P<Pbare>{_NUMBER})(?:(?P<Ppct>\s?(?:%|percent\b|per cent\b))|(?P<Pbscale>{_SCALE})(?P<Pbcur>\s+(?:euros?|dollars))?))")


def _side(prefix: str) -> str:
    return _ONE.replace("?P<P", f"?P<{prefix}")
AMOUNT = re.compile(
    _side("a") +
    # a range: '$89 billion to $93 billion', '$89 to $93 billion', '41% to 42%', '$43.5-45.5b', 'between X and Y'
    rf"(?:\s*(?P<joint>-|–|to|and)\s*(?P<bplus>\+\s?)?(?:{_side('b')}|(?P<bplain>{_NUMBER})(?P<bplainscale>{_SCALE})?(?!\d)))?"
    # plus or minus: '$10.5 billion plus or minus 5%', '64% plus or minus 50 basis points'
    rf"(?:,?\s*(?:plus or minus|\+/-|±)\s*(?:(?P<pmcur>{_CURRENCY})\s?)?(?P<pmnum>{_NUMBER})"
    rf"(?P<pmunit>\s?(?:%|percent\b|percentage points?\b|points?\b|basis points?\b|bps\b)|{_SCALE})?)?",
    re.IGNORECASE,
)

# Clause boundaries: figures in different clauses have their own metric, period and kind.
_CLAUSE = re.compile(r";|,\s+(?:and|while|but|whereas|with)\s+|\s+while\s+|,\s+(?=(?:we|our|and we)\b)", re.IGNORECASE)

_GUIDANCE_CUE = re.compile(
    r"\b(?:expects?|expected|expecting|anticipates?|anticipated|anticipating|forecast(?:s|ed|ing)?|outlook|guidance|"
    r"guide[sd]?|guiding|projects?|projected|projecting|estimates?|plan(?:s|ning)? (?:for|to)|will(?: be)?|should(?: be)?|"
    r"to be (?:between|in|approximately|about|around|roughly)|remain on (?:path|track)|on track|on path|reaffirm(?:s|ed|ing)?|"
    r"rais(?:e|es|ed|ing)|lower(?:s|ed|ing)?|going to|range from|ranging from|be in the range|midpoint|mid-point)\b",
    re.IGNORECASE,
)
_PAST_OUTLOOK = re.compile(
    r"\b(?:(?:in line with|consistent with|above|below|ahead of|exceed(?:ed|ing|s)?|beat(?:ing)?|better than|(?:the )?(?:high|low|top|"
    r"upper|lower) end of|the midpoint of|within|versus|vs\.?|compared (?:to|with)|relative to)\s+(?:\w+\s+){0,3}?"
    r"(?:guidance|outlook|expectations?|forecast|guide)|as (?:we |I )?(?:had )?(?:expected|anticipated|forecast(?:ed)?|guided|projected))\b",
    re.IGNORECASE)
# The level measured against an outlook: 'within our guidance range at $50.6 billion' ('at' the level).
_LEVEL_AGAINST_OUTLOOK = re.compile(r"\b(?:within|in line with|at the (?:high|low|upper|lower|top) end of|above|ahead of)\s+"
                                    r"(?:\w+\s+){0,3}?(?:guidance|outlook|expectations?)(?: range)?,?\s+at\s*$", re.IGNORECASE)
_REPORTED_CUE = re.compile(
    r"\b(?:was|were|came in|totaled|totalled|reached|grew|rose|increased|decreased|declined|fell|reported|delivered|"
    r"generated|posted|achieved|ended|finished|had|climbed|dropped|improved)\b",
    re.IGNORECASE,
)
_GROWTH = re.compile(r"\b(?:up|grew|grow(?:th|ing|s)?|increased?|rose|climbed|gain(?:ed)?|higher)\b(?:\s+\w+){0,2}\s*$",
                     re.IGNORECASE)
# Just before an amount: the amount is a change or an earlier figure, not the level.
_APPROXIMATELY = r"(?:approximately |about |roughly |nearly |almost |around |over |more than |just over |just under )?"
_CHANGE_BEFORE = re.compile(rf"(?:\bby|\b(?:up|down|grew|grow|grows|increased|decreased|rose|fell|declined|improved|climbed|"
                            rf"dropped|gained|expanded|contracted|higher|lower)|"
                            # 'an improvement of $155 million': the change, not the level
                            rf"\b(?:improvement|increase|decrease|reduction|decline|deterioration|swing|change|benefit|drop|gain)\s+of)"
                            rf"\s+{_APPROXIMATELY}$", re.IGNORECASE)
_NEGATIVE_BEFORE = re.compile(r"\b(?:negative|minus|a loss of|loss of)\s+$", re.IGNORECASE)
# Anywhere in the clause: the figures are not for a fiscal period.
_CLAUSE_TRAP = re.compile(r"\b(?:(?:last|trailing|past|previous) (?:12|twelve) months|TTM|LTM|trailing|holding currency constant|"
                          # 'From 2013 to 2015 ... revenue grew 5%': a span of years, not a fiscal period
                          r"(?:from|between) (?:fiscal )?(?:19|20)\d\d (?:to|through|and) (?:fiscal )?(?:19|20)\d\d|"
                          r"in fixed[- ](?:FX|currency|exchange[- ]rates?)(?: terms)?|"
                          r"(?:on|at) a constant currency basis|at constant currency|excluding (?:the impact of )?(?:FX|foreign exchange|"
                          r"currency))\b", re.IGNORECASE)
# An opener restating the sentence without currency moves: 'Excluding the $184 million year-over-year
# favorable foreign exchange impact, revenue growth was 28%'.
_EX_CURRENCY_OPENER = re.compile(r"^\W*excluding\s+[^,;]{0,80}?\b(?:FX|foreign exchange|currenc(?:y|ies))\b[^,;]*,", re.IGNORECASE)
_COMPARISON_BEFORE = re.compile(
    r"\b(?:from|compared (?:to|with)|versus|vs\.?|relative to|ahead of|above|below|in line with|within|exceed(?:ed|ing)?|"
    # a threshold: 'crossed the $1 billion mark', 'topped $9b for the first time'
    r"cross(?:ed|es|ing)|surpass(?:ed|es|ing)|topp(?:ed|ing)|passed|broke|"
    r"beat|prior|previous|original(?:ly)?|last year|a year ago|year-ago|prior[- ]year|would have been|including|includ(?:es|ed))\b",
    re.IGNORECASE,
)
# Anywhere between the metric and the amount, or just after it: the amount is not the metric's total.
_TRAP = re.compile(
    r"\b(?:run[- ]rate|annuali[sz]ed|headwinds?|tailwinds?|impact(?:ed)?|foreign exchange|FX|currenc(?:y|ies)|"
    r"backlog|contracted|not (?:yet )?recogni[sz]ed|remaining performance obligations?|unearned|deferred|bookings|orders|"
    r"long[- ]term|over time|target model|financial model|dividends?|buy ?backs?|repurchase[sd]?|share repurchases?|"
    r"restructuring|charges?|tax|acquisition|benefits?|sequential(?:ly)?|cumulative|per year|each year|annually|TAM|market|"
    r"accretion|goals?|targets?|aspirations?|ambitions?|toward|towards|EBITDA|EBIT|average|cross[- ]cycle)\b",
    re.IGNORECASE,
)
_AFTER_TRAP = re.compile(
    r"^\W{0,3}(?:(?:a |per )(?:diluted )?share,?\s+)?(?:(?:\w+\W+){0,2}?(?:run[- ]rate|headwinds?|tailwinds?|impact|in backlog|of backlog)|a year ago|last year|level\b|"
    r"in the (?:prior|previous|year-ago|same)|in constant currency|sequentially|(?:mark|milestone|threshold)\b|on a sequential|attributable|related to|due to|"
    r"associated with|(?:from|over|versus|vs\.?|compared (?:to|with)) (?:the )?(?:previous|prior|last|preceding|year-ago) quarter|"
    # 'grew 20% over the first quarter': sequential, unless a year names the quarter compared with
    r"(?:from|over|versus|vs\.?|compared (?:to|with)) (?:the |our )?(?:(?:first|second|third|fourth)(?: fiscal)? quarter\b"
    r"(?! (?:of |in |fiscal |FY)?'?\d)|Q[1-4]\b(?!\s*(?:FY|fiscal)?\s*'?\d))|"
    r"quarter[- ]over[- ]quarter|q/q|QoQ|from (?:our|the) (?:previous|prior|last|original|earlier) (?:guid\w*|outlook|forecast|expectations?)|"
    r"respectively)",
    re.IGNORECASE,
)
# Right after the amount, with no comma between: the amount is a difference from a reference
# ('EPS was $1.23, $0.13 above our guide'), whereas '$13.5 billion, ahead of our outlook' is the level.
_DIFFERENCE_AFTER = re.compile(
    r"^\s+(?:above|below|ahead of|better than|higher than|lower than|short of|more than|less than|over|under|shy of)\s+"
    r"(?:the\s+|our\s+|its\s+)?(?:high|low|top|mid|guid|outlook|expect|consensus|forecast|estimate|last|prior|previous|"
    r"a year|year|same|original|plan|street)", re.IGNORECASE)
# The amount belongs to what follows it: '44% net income growth', 'EUR 550 million R&D'.
_OTHER_AFTER = re.compile(
    r"^\s+(?:(?:(?!(?:and|or|but|while|with|as)\b)[\w-]+\s+){0,2}?(?:" + METRIC_WORDS.pattern.removeprefix(r"\b(").removesuffix(r")\b") + r")\b|"
    r"(?:of |in |for |on )?(?:R&D|SG&A|research|marketing|interest|depreciation|amortization|inventor(?:y|ies)|cash|dividends?|"
    r"stock|shares|tax(?:es)?|costs?|price|prices|ASPs?|bits?|units?)\b)",
    re.IGNORECASE,
)
# Something else the amount is 'of' or 'in': '$33.1 billion in operating cash flow', '$2 billion of buybacks'.
_AMOUNT_OF_OTHER = re.compile(r"^\s+(?:in|of|for|from|on)\s+(?!(?:the |our |its |fiscal |FY|Q[1-4]|\d|first|second|third|fourth|"
                              r"full|this|next|each|revenue|sales|net sales|the quarter|the year))\w", re.IGNORECASE)
# Before an amount in its clause: what the figure would have been ('this would hypothetically have
# resulted in revenue of around EUR 3.6 billion'), not what it was.
_HYPOTHETICAL = re.compile(r"\b(?:would|could) (?:\w+ )?have (?:been|resulted|come|reached|grown|increased|decreased|declined)\b|"
                           r"\bhypothetical(?:ly)?\b", re.IGNORECASE)
_LONG_TERM = re.compile(r"\b(?:by|through) (?:fiscal |FY\s?)?20\d\d\b(?! (?:and|to) )|\bover the next (?:few|two|three|four|five|\d+) years\b",
                        re.IGNORECASE)
_PER_SHARE = re.compile(r"^\s*(?:a|per)\s+(?:diluted\s+|basic\s+)?share\b", re.IGNORECASE)
_PERCENT_OF_REVENUE = re.compile(r"^\s*(?:of|as a percent(?:age)? of)\s+(?:total\s+|net\s+)?(?:revenues?|sales|net sales)\b",
                                 re.IGNORECASE)
# 'excluding FX' restates at other exchange rates; it is no basis
_NON_GAAP = re.compile(r"\b(?:non[- ]GAAP|adjusted|pro forma|excluding(?!\s+(?:[\w$.,-]+\s+){0,6}?(?:FX|foreign exchange|"
                       r"currenc)))\b", re.IGNORECASE)
_BOTH_BASES = re.compile(r"\bGAAP\b.*\bnon[- ]GAAP\b.*\brespectively\b", re.IGNORECASE)
_GAAP = re.compile(r"\bGAAP\b")
# Comparison phrases hold words ('the year', 'quarter') the period rules would read as the figure's period.
_COMPARISON_PHRASE = re.compile(
    r"\b(?:year[- ]over[- ]year|year[- ]on[- ]year|(?:the |a )?year[- ]ago(?: quarter| period)?|(?:the )?(?:prior|previous|last) "
    r"(?:fiscal )?(?:year|quarter)|(?:the )?same (?:quarter|period) (?:of )?last year|from the prior year|"
    # 'up 60 basis points from the fourth quarter': the period compared with, not the figure's
    r"(?:from|versus|vs\.?|compared (?:to|with)|over|than|against)\s+(?:the\s+|our\s+)?(?:fourth|third|second|first|prior|"
    r"previous|last|same|year-ago|Q[1-4])\b[^,;]*)",
    re.IGNORECASE,
)
# Words that may stand before a metric without making it a part of the total.
_PLAIN_QUALIFIERS = {
    "total", "net", "overall", "consolidated", "company", "companywide", "record", "gaap", "non-gaap", "adjusted", "reported",
    "quarterly", "fiscal", "full", "year", "full-year", "quarter", "annual", "calendar", "first", "second", "third", "fourth",
    "first-quarter", "second-quarter", "third-quarter", "fourth-quarter", "fiscal-year", "q1", "q2", "q3", "q4", "fy",
    "corporate", "all-time", "group",
}
# What may stand between a segment's name and its metric: 'Gaming segment revenue'.
_SEGMENT_NOUNS = {"segment", "segments", "business", "businesses", "group", "division", "unit", "line"}
# Words that end the walk back from a metric: what stands before them is not a modifier.
_BOUNDARY_WORDS = {
    "the", "our", "its", "their", "this", "that", "these", "a", "an", "of", "for", "in", "on", "at", "to", "with", "and", "or",
    "as", "while", "was", "were", "is", "are", "be", "been", "had", "have", "has", "by", "from", "expect", "expects", "expected",
    "expecting", "reported", "report", "delivered", "generated", "achieved", "posted", "grew", "see", "saw", "guide", "guiding",
    "anticipate", "forecast", "raise", "raising", "raised", "lower", "lowering", "reaffirm", "reaffirming", "now", "then", "so",
    "also", "and", "but", "record", "strong", "solid", "healthy", "higher", "lower", "increased", "decreased", "improved",
    "into", "about", "approximately", "around", "roughly", "where", "when", "which", "who", "both", "all", "your", "my",
    "we", "i", "you", "it", "they", "us", "whose", "total", "on", "path", "track", "toward", "towards", "remain", "remains",
}


@dataclass(frozen=True)
class Section:
    """What a paragraph's section opener set: a period phrase, a registry segment, a basis."""

    period: str | None = None
    segment: str | None = None
    basis: str | None = None
    previous: str = ""  # the sentence just before the statement: the income a bare margin is the ratio of


_NO_SECTION = Section()
_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+")
# A sentence that opens a section names its topic first: 'Moving to full year.', 'Turning to the
# outlook for Q3,', 'Now for Automotive.', 'In Data Center, ...', 'Looking at fiscal 2020, ...'.
_SECTION_OPENER = re.compile(
    r"^\W*(?:(?:and |so |now |next |finally |lastly |let me |let's |i'll |i will |i'd like to |to )*(?:now )?(?:mov(?:e|ing)|"
    r"turn(?:ing)?|go(?:ing)?|look(?:ing)?|switch(?:ing)?|shift(?:ing)?|start(?:ing)?|com(?:e|ing)|transition(?:ing)?|"
    r"wrap(?:ping)? up|clos(?:e|ing)|cover(?:ing)?|talk(?:ing)? about|review(?:ing)?|focus(?:ing)?|discuss(?:ing)?)"
    r"(?: now| on| over| back| out)?(?: (?:to|at|with|on))?|for|in|on|within|regarding|as for)\s+(?:the\s+|our\s+)?"
    r"(?:outlook for (?:the\s+)?|guidance for (?:the\s+)?)?(?P<topic>.{2,80})", re.IGNORECASE)
_SECTION_PERIOD = re.compile(r"(?:the\s+)?(?:(?:full |whole |entire )?fiscal year|full[- ]year|fiscal (?:year )?'?\d{2,4}|"
                             r"(?:fiscal )?year '?\d{2,4}|FY\s?'?\d{2,4}|"
                             r"(?:the |this )?(?:full |whole |entire )year\b|(?:the|this) year\b|(?:the )?(?:first|second|third|fourth|1st|2nd|3rd|4th) "
                             r"(?:fiscal )?quarter|Q[1-4]\b)", re.IGNORECASE)
# A sentence looking back on a year heads that year's figures at a fourth-quarter call.
_YEAR_IN_REVIEW = re.compile(r"\b((?:19|20)\d\d) (?:was|has been|proved to be|turned out to be)\b[^.;]{0,60}\byear\b", re.IGNORECASE)
# A sentence with figures that opens on its period moves the paragraph there: after '2019 was an
# outstanding year for AMD. Fourth quarter revenue was $2.13 billion, ...', 'Gross margin was 45%'
# is the fourth quarter's.
_PERIOD_LEAD = re.compile(r"^\W*(?:(?:and|so|now|then|also)\s+)?(?:(?:in|for|during)\s+)?", re.IGNORECASE)
_THE_QUARTER_LEAD = re.compile(r"(?:the|this) quarter\b", re.IGNORECASE)
_AMOUNT_CUE = re.compile(r"[$€£¥%]|\d+(?:\.\d+)?\s*(?:percent|billion|million|basis points)\b", re.IGNORECASE)
_TOTAL_TOPIC = re.compile(r"^\W*(?:(?:and |so |now )?(?:total|overall|consolidated|company(?:wide)?)\b|overall,)", re.IGNORECASE)


@dataclass(frozen=True)
class Segment:
    name: str
    pattern: re.Pattern


def segment_patterns(segments: dict[str, tuple[str, ...]]) -> tuple[Segment, ...]:
    """Registry segments ({name: aliases}) as patterns, longest names first."""
    found = []
    for name, aliases in segments.items():
        words = sorted({name, *aliases}, key=len, reverse=True)
        # punctuation is not part of a name: 'Enterprise embedded and semi-custom' is 'Enterprise, Embedded and Semi-Custom'
        spelled = (re.escape(word).replace(",\\ ", ",?\\s+").replace("\\ ", "\\s+") for word in words)
        found.append(Segment(name, re.compile(r"\b(?:" + "|".join(spelled) + r")\b", re.IGNORECASE)))
    return tuple(found)


@dataclass
class _Amount:
    start: int
    end: int
    value: Decimal
    low: Decimal | None
    high: Decimal | None
    unit: str  # currency code or 'percent'
    scaled: bool  # a money amount with a scale word (or a large number)
    text: str
    change_then_level: bool = False  # 'by X to Y': only Y is a level


def _currency(code: str | None) -> str:
    return _CURRENCIES.get((code or "$").strip().lower(), "USD")


def _one(match: re.Match, p: str) -> tuple[Decimal, str, bool] | None:
    """Value, unit and whether a money amount carries a scale, of one side of AMOUNT."""
    if match[f"{p}num"] is not None:
        number = Decimal(match[f"{p}num"].replace(",", ""))
        scale = (match[f"{p}scale"] or "").strip().lower()
        unit = _currency(match[f"{p}cur"] if not match[f"{p}cur2"] else "eur")
        return number * _SCALES.get(scale, Decimal(1)), unit, bool(scale) or number >= 10 ** 6
    if match[f"{p}bare"] is not None:
        number = Decimal(match[f"{p}bare"].replace(",", ""))
        if match[f"{p}pct"]:
            return number, "percent", False
        currency = (match[f"{p}bcur"] or "").strip().lower()
        unit = "EUR" if currency.startswith("euro") else "USD" if currency == "dollars" else "number"
        return number * _SCALES[match[f"{p}bscale"].strip().lower()], unit, True
    return None


def _amounts(clause: str) -> list[_Amount]:
    found = []
    position = 0
    while match := AMOUNT.search(clause, position):
        position = match.end()
        first = _one(match, "a")
        if first is None:
            continue
        value, unit, scaled = first
        low = high = None
        end, text = match.end(), match.group(0)
        second = _one(match, "b") if match["joint"] else None
        if match["joint"] and second is None and match["bplain"] is not None:
            number = Decimal(match["bplain"].replace(",", ""))
            scale = _SCALES.get((match["bplainscale"] or "").strip().lower())
            if scale is None and unit not in ("percent",) and match["ascale"]:
                scale = _SCALES[match["ascale"].strip().lower()]
            second = (number * (scale or 1), unit, bool(scale))
        change_then_level = False
        if second is not None:
            joint = match["joint"].lower()
            before = clause[max(0, match.start() - 30):match.start()].lower()
            if joint == "and" and "between" not in before:
                second = None  # 'revenue of $5 billion and 40% margin' is two figures, not a range
            elif joint == "to" and (_CHANGE_BEFORE.search(before) or re.search(r"\bfrom\s+(?:approximately |about )?$", before)
                                    and not re.search(r"\brang(?:e|ing) from\s*$", before)):
                change_then_level = True  # 'by $0.5 billion to $11.5 billion', 'from $1.2 billion to $1.35 billion'
        if second is not None:
            other, other_unit, other_scaled = second
            if not match["ascale"] and match["anum"] is not None and other_scaled and other_unit == unit:
                scale_word = (match["bscale"] or match["bplainscale"] or "").strip().lower()
                value *= _SCALES.get(scale_word, Decimal(1))  # '$89 to $93 billion'
                scaled = True
            if other_unit != unit and other_unit != "number":
                second = None
        if second is not None and change_then_level:
            level_text = clause[match.end("joint"):end].strip()
            found.append(_Amount(match.start(), end, second[0], None, None, unit, scaled or second[2], level_text, True))
            continue
        first_value = value
        if second is not None:
            low, high = sorted((value, second[0]))
            value = (low + high) / 2
        elif match["joint"]:
            # Not a range ('up 14% to $271 million'): the amount ends before the joint word, and
            # what follows it is read again as an amount of its own.
            end = position = match.start("joint")
            text = clause[match.start():end]
        if match["pmnum"] is not None and second is None:
            spread = Decimal(match["pmnum"].replace(",", ""))
            pm_unit = (match["pmunit"] or "").strip().lower()
            if pm_unit in ("%", "percent") and unit != "percent":
                spread = value * spread / 100
            elif pm_unit.startswith("basis") or pm_unit == "bps":
                spread = spread / 100
            elif pm_unit in _SCALES:
                spread = spread * _SCALES[pm_unit]
            low, high = value - spread, value + spread
        if _NEGATIVE_BEFORE.search(clause[max(0, match.start() - 12):match.start()]):
            if second is not None and match["bplus"]:
                # 'between a loss of $70 million and income of $10 million': only the low end is a loss
                low, high = -first_value, second[0]
                value = (low + high) / 2
            else:
                value, low, high = -value, None if high is None else -high, None if low is None else -low
        found.append(_Amount(match.start(), end, value, low, high, unit, scaled, text))
    return found


def _basis(text: str, last: bool) -> str | None:
    """GAAP or non-GAAP, by the cue nearest the amount (before it: the last one)."""
    cues = [(m.start(), "non-GAAP") for m in _NON_GAAP.finditer(text)]
    cues += [(m.start(), "GAAP") for m in _GAAP.finditer(text) if not re.search(r"non[- ]$", text[:m.start()], re.IGNORECASE)]
    if not cues:
        return None
    return (max(cues) if last else min(cues))[1]


_DIGIT = re.compile(r"\d")
# An opener that restates the whole sentence at other exchange rates: 'In constant currency, revenue grew 9%'.
_CONSTANT_CURRENCY_OPENER = re.compile(r"^\W*(?:in|on an?|at) (?:fixed|constant)[- ](?:FX|currency|exchange[- ]rates?)(?: terms| basis)?\W*$",
                                       re.IGNORECASE)
# A basis stated for what follows: 'On a non-GAAP basis, ...', 'In GAAP terms, ...', 'Non-GAAP:'.
_BASIS_PHRASE = re.compile(r"\b(?:on an? |in |from an? )(non[- ]GAAP|GAAP)\s+(?:basis|terms|perspective)\b|^\W*(non[- ]GAAP|GAAP)\s*[:,-]", re.IGNORECASE)


# A sentence opening with its basis ('Non-GAAP net income was $833 million, and EPS was $1.33') states it
# for the income figures of its later clauses; revenue rarely has a basis of its own.
_LEADING_BASIS = re.compile(r"^\W*(?:(?:Q[1-4]|the|our|and)\s+)?(non[- ]GAAP|GAAP)\s+(?!basis)", re.IGNORECASE)
_REVENUE_LIKE = frozenset({"revenue", "segment_revenue", "revenue_growth", "capex"})


def _stated_basis(text: str) -> str | None:
    """The basis the last basis phrase of `text` states, if any."""
    found = list(_BASIS_PHRASE.finditer(text))
    if not found:
        return None
    said = (found[-1][1] or found[-1][2]).lower()
    return "GAAP" if said == "gaap" else "non-GAAP"


# The positive end of a range whose low end is a loss: 'between a loss of $70 million and income
# of $10 million' becomes '... and +$10 million', which AMOUNT reads as the range's signed high end.
_SIGNED_RANGE = re.compile(r"(\b(?:loss|negative) of (?:US)?\$?\s?[\d.,]+(?:\s?(?:billion|million|thousand))?\s+(?:and|to))\s+"
                           r"(?:an?\s+)?(?:net\s+|operating\s+)?(?:income|profit|gain|positive)(?:\s+of)?\s+(?=(?:US)?\$|\d)",
                           re.IGNORECASE)
_RANGE_OF_PERCENTS = re.compile(r"\b(\d+(?:\.\d+)?)\s*(to|-|–)\s*(\d+(?:\.\d+)?)\s?(%|percent\b)", re.IGNORECASE)
# 'cost of revenues', 'percent of sales': the metric word names something else.
_NOT_THE_METRIC = re.compile(r"(?:\b(?:cost|costs|percent|percentage|share|portion|half|mix|multiple)|%)\s+of\s+(?:[\w-]+\s+){0,3}$",
                             re.IGNORECASE)
# After a metric: 'revenue in the quarter' names a period, 'revenue from China' a part of the total.
_PERIOD_AFTER = re.compile(r"(?:the\s+|this\s+|that\s+)?(?:quarter|year|period|first|second|third|fourth|full|fiscal|FY|Q[1-4]|"
                           r"\d|calendar|constant currency|\$|€|EUR|USD|total|all|each|every|our guidance|the guidance|"
                           # 'revenue in the range of $2.8 billion to $3.1 billion' names the amount, not a part
                           r"(?:an?\s+|the\s+)?(?:range|line|amount|neighborhood|ballpark|area|mid|high|low|upper|lower)\b)", re.IGNORECASE)
_BARE_YEAR = re.compile(r"\b(?:in|for|of|during|calendar|year)\s+(20\d\d)\b(?!\s*(?:and|to|-)\s*20)|"
                        # '2019 revenue was $6.73 billion': the year names the figure's period
                        # ('Intel expect 2020 CapEx of approximately $17 billion')
                        r"(?:^|[.;:]\s*|(?<![$€£¥\d.,])\b(?=20\d\d\s))(20\d\d)\s+(?=(?:[\w-]+\s+){0,2}?(?:revenues?|sales|"
                        r"gross margin|operating|net income|earnings|EPS|free cash flow|capital|capex)\b)", re.IGNORECASE)
_ANNUAL = re.compile(r"\b(?:annual|for the year)\b", re.IGNORECASE)
_RANGE_WORDS = re.compile(r"\b(?:rang(?:e|ing) from|in the range of)\s*$", re.IGNORECASE)


class FigureParser:
    """Figures in the statements of one call (one fiscal calendar, one set of segments)."""

    def __init__(self, resolver: PeriodResolver, company_names: tuple[str, ...], segments: tuple[Segment, ...] = ()) -> None:
        self.resolver = resolver
        self.segments = segments
        names = "|".join(re.escape(name.lower()) for name in company_names if name)
        self._own = re.compile(rf"^(?:{names})(?:'s|’s)?$") if names else re.compile(r"(?!)")
        # The offline statements stage parses a sentence for its derived guidance statement, and
        # the figures stage parses it again in the same worker: the second time is a lookup.
        self._parsed: dict[tuple[str, bool], list[RawFigure]] = {}

    def parse(self, statement: str, prediction: bool = False, scope: str = "") -> list[RawFigure]:
        """The figures a statement states; `prediction` is the statement's label (a PREDICTION
        with no cue of its own is guidance). `scope` is the paragraph before the statement (the
        speaker's turn so far): a section it opens ('Moving to full year.', 'Turning to
        Automotive.', 'On a non-GAAP basis:') holds for the statement unless it says otherwise."""
        if not _DIGIT.search(statement) or (not METRIC_WORDS.search(statement) and "per share" not in statement.lower()):
            return []
        section = self.section(scope)
        key = (statement, prediction, section)
        if key not in self._parsed:
            if len(self._parsed) > 20_000:
                self._parsed.clear()
            self._parsed[key] = self._parse(statement, prediction, section)
        return list(self._parsed[key])

    def section(self, scope: str) -> Section:
        """The period, segment and basis the paragraph's last section opener states."""
        if not scope:
            return _NO_SECTION
        period = segment = None
        basis = _stated_basis(scope[-400:])
        for sentence in _SENTENCE_END.split(scope[-900:]):
            opener = _SECTION_OPENER.match(sentence)
            if opener is not None:
                topic = opener["topic"][:60]
            elif len(sentence.split()) <= 12 and not _AMOUNT_CUE.search(sentence):
                topic = sentence  # a short sentence without a figure heads what follows: 'Data Center.'
            else:
                if _TOTAL_TOPIC.match(sentence):
                    segment = None  # 'Total revenue ...' / 'Overall, ...' leaves a segment's paragraph
                lead = sentence[_PERIOD_LEAD.match(sentence).end():]
                if (found := _SECTION_PERIOD.match(lead)) is not None:
                    period = found[0]
                elif _THE_QUARTER_LEAD.match(lead):
                    period = None  # back to the quarter the call reports
                continue
            if (found := _SECTION_PERIOD.search(topic)) is not None and not _COMPARISON_PHRASE.search(topic):
                period, segment = found[0], None
            elif (review := _YEAR_IN_REVIEW.search(topic)) is not None:
                period, segment = f"fiscal year {review[1]}", None  # '2017 was another record year for Intel.' 
            elif re.search(r"\b(?:the|this|our) (?:quarter|results for the quarter)\b", topic, re.IGNORECASE):
                period = None  # back to the quarter the call reports
            if (named := next((seg.name for seg in self.segments if seg.pattern.search(topic)), None)) is not None:
                segment = named
            elif re.match(r"(?:the\s+|our\s+)?(?:total|overall|consolidated|company)\b", topic, re.IGNORECASE):
                segment = None
        previous = next((sentence for sentence in reversed(_SENTENCE_END.split(scope[-900:].strip())) if sentence), "")
        return Section(period, segment, basis, previous)

    def _parse(self, statement: str, prediction: bool, section: Section = None) -> list[RawFigure]:
        section = section or _NO_SECTION
        statement = _RANGE_OF_PERCENTS.sub(r"\1\4 \2 \3\4", statement)  # '41 to 42%' is '41% to 42%'
        statement = _SIGNED_RANGE.sub(r"\1 +", statement) if "of" in statement else statement  # '... a loss of $70 million and income of $10 million'
        figures: list[RawFigure] = []
        default_kind = "guidance" if prediction else "reported"
        starts = [0] + [m.end() for m in _CLAUSE.finditer(statement)]
        ends = [m.start() for m in _CLAUSE.finditer(statement)] + [len(statement)]
        for start, end in zip(starts, ends):
            clause_kind, found = self._clause(statement[start:end], statement[:start], default_kind, section)
            default_kind = clause_kind or default_kind
            figures.extend(found)
        unique: dict[tuple, RawFigure] = {}
        for figure in figures:
            unique.setdefault(figure.key + (figure.value, figure.low, figure.high, figure.unit), figure)
        return list(unique.values())

    def _clause(self, clause: str, earlier: str, default_kind: str, section: Section = None) -> tuple[str | None, list[RawFigure]]:
        """Figures of one clause; `earlier` is the statement's text before it (where a period
        such as 'For the full year 2024, we expect ...' may stand)."""
        amounts = _amounts(clause)
        if not amounts or _CLAUSE_TRAP.search(clause) or _EX_CURRENCY_OPENER.match(earlier + clause) or (not _DIGIT.search(earlier) and (
                _CLAUSE_TRAP.search(earlier) or _CONSTANT_CURRENCY_OPENER.search(earlier))):
            return None, []  # also an opener that holds for the statement: 'Holding currency constant, our revenue grew 25%'

        mentions = [(m.start(), m.end(), _METRIC_OF[m[1].lower()]) for m in METRIC_WORDS.finditer(clause)
                    if not _NOT_THE_METRIC.search(clause[:m.start()])]
        figures, kind, window_start = [], None, 0
        compared = False  # the amount before was a comparison: '... compared to $27 million or $0.03 per share'
        for index, amount in enumerate(amounts):
            joined = index > 0 and re.fullmatch(r"[^$€£¥;%]{0,30}?(?:,\s*)?\b(?:or|and)\s+",
                                                clause[amounts[index - 1].end:amount.start]) is not None
            if compared and joined:
                window_start = amount.end
                continue
            compared = _COMPARISON_BEFORE.search(clause[max(window_start, amount.start - 40):amount.start]) is not None
            # The period is read before the amount first, then after it up to the next amount (a
            # later period may belong to something else), then in the statement before the clause.
            region_end = amounts[index + 1].start if index + 1 < len(amounts) else len(clause)
            # the period named since the previous amount first: '... for the quarter was $1.7 billion and, for the
            # full year, was $3.3 billion'
            periods = (clause[window_start:amount.start], clause[:amount.start], clause[amount.end:region_end], earlier)
            kind = self._kind(clause[:amount.start], default_kind)
            mention = next(((s, e, m) for s, e, m in reversed(mentions) if e <= amount.start), None)
            if mention is None and _PER_SHARE.search(clause[amount.end:]) and re.search(
                    r"\b(?:earnings|income|EPS)\b", clause[:amount.start], re.IGNORECASE):
                mention = (amount.start, amount.start, "eps")  # 'earnings of $0.60 per share'
            if mention is not None and (figure := self._attach(mention, amount, kind, clause, periods, window_start,
                                                                             section or _NO_SECTION)):
                figures.append(figure)
            window_start = amount.end
        if any(figure.segment for figure in figures):
            # a clause about a segment ('storage business unit posted revenue of $719 million ... with an
            # operating loss of $62 million'): its other figures are the segment's, which have no row
            figures = [figure for figure in figures if figure.segment or figure.metric.value == "revenue"
                       and re.search(r"\b(?:total|company|consolidated)\b", clause, re.IGNORECASE)]
        return kind, figures

    @staticmethod
    def _kind(before: str, default_kind: str) -> str:
        """The last cue before the amount decides: 'was' reports, 'expect' guides. A cue that
        refers back to an earlier outlook ('at the high end of our guidance', 'as we expected')
        is no cue: the figure is the result measured against it."""
        before = _PAST_OUTLOOK.sub(" ", before)
        cues = [(m.start(), "guidance") for m in _GUIDANCE_CUE.finditer(before)]
        cues += [(m.start(), "reported") for m in _REPORTED_CUE.finditer(before)]
        return max(cues)[1] if cues else default_kind

    def _attach(self, mention: tuple[int, int, str], amount: _Amount, kind: str, clause: str, period_texts: tuple[str, ...],
                window_start: int, section: Section) -> RawFigure | None:
        start, end, metric = mention
        between, after = clause[end:amount.start], clause[amount.end:]
        just_before = clause[max(0, start - 30):start].rpartition(",")[2]
        if (_TRAP.search(between) or _TRAP.search(just_before) or _AFTER_TRAP.search(after) or _AMOUNT_OF_OTHER.search(after)
                or _DIFFERENCE_AFTER.search(after)
                or (_OTHER_AFTER.search(after) and not (amount.unit == "percent" and _PERCENT_OF_REVENUE.search(after)))
                or _BOTH_BASES.search(clause)):
            return None
        if _HYPOTHETICAL.search(clause[:amount.start]):
            return None
        if len(between) > 90 or (METRIC_WORDS.search(between) and metric != "eps"):
            return None  # too far from its metric, or another metric stands between them
        if re.match(r"\s*(?:guidance|outlook|forecast|expectations?|target)\s+(?:was|were|had been)\b", between, re.IGNORECASE):
            return None  # 'the gross margin guidance was 57% to 60%': an earlier outlook recalled, neither result nor guidance
        before = period_texts[-1] + clause[:start]
        if re.search(r"\b(?:excluding|ex-|without)\s+(?:the\s+)?(?:[\w&-]+\s+){0,3}?$", before, re.IGNORECASE) or any(
                re.search(r"\b(?:excluding|without)\s+(?:the\s+)?$", before[:found.start()], re.IGNORECASE)
                for seg in self.segments for found in seg.pattern.finditer(before)):
            return None  # 'Excluding LinkedIn, our revenue was ...': neither the total nor the segment
        segment, known = self._segment(clause, start, end, period_texts[-1])
        if not known:
            return None
        if segment is None and section.segment is not None and not re.search(
                r"\b(?:total|overall|consolidated|company|companywide|corporate)\b", clause[:end], re.IGNORECASE):
            # 'Revenue rose 4% to $189 million' in the paragraph 'Turning to Automotive.'; a statement
            # naming another segment ('our Internet of Things business ... revenue record') is that one's
            named = {seg.name for seg in self.segments for found in seg.pattern.finditer(period_texts[-1] + clause[:start])
                     if not re.search(r"\b(?:excluding|ex|without|other than|outside(?: of)?)\W*$",
                                      (period_texts[-1] + clause[:start])[:found.start()], re.IGNORECASE)}
            if re.search(r"\b(?:excluding|ex|without)\b", clause[:start], re.IGNORECASE):
                return None  # 'Excluding LinkedIn, our revenue was ...': neither the total nor the segment
            segment = section.segment if not named or named == {section.segment} else (named.pop() if len(named) == 1 else None)
            if segment is None:
                return None

        since_previous = clause[max(window_start, end):amount.start]
        if amount.unit == "percent" and metric == "revenue" and _GROWTH.search(since_previous) \
                and not re.search(r"\b(?:and|with|while)\b", since_previous):
            metric = "revenue_growth"  # 'revenue was $271 million, up 14%'
        else:
            near = _RANGE_WORDS.sub(" ", clause[max(window_start, end, amount.start - 40):amount.start])
            near = _LEVEL_AGAINST_OUTLOOK.sub(" at ", near)  # 'landed within our guidance range at $50.6 billion'
            if not amount.change_then_level and (_COMPARISON_BEFORE.search(near) or _CHANGE_BEFORE.search(near)):
                return None  # 'up from $1.20 billion', 'ahead of our outlook of $280 million', 'by $50 million'
            if amount.unit == "percent" and _PERCENT_OF_REVENUE.search(after):
                metric = {"operating_income": "operating_margin"}.get(metric, metric)  # '$55 million, or 15.2% of revenue'
        if _PER_SHARE.search(after):
            if metric not in ("eps", "net_income"):
                return None  # a dividend or other amount per share
            metric = "eps"
        if metric == "eps":
            if amount.unit in ("percent", "number") or amount.scaled or amount.value >= 100:
                return None
        elif metric in PERCENT_METRICS:
            if amount.unit != "percent":
                return None
        elif amount.unit == "percent" or not amount.scaled:
            return None  # 'revenue guidance is 30%', or '$3': not an amount of money the size of a total
        if segment is not None:
            if metric == "revenue":
                metric = "segment_revenue"
            elif metric != "revenue_growth":
                return None  # a segment's margin or income is not the company's, and the vocabulary has no place for it
        if metric == "operating_margin" and segment is None and "margin" in clause[start:end].lower():
            income = self._income_before(period_texts[-1] + clause[:start], section.previous)
            if income is None:
                return None  # the margin of a part of the business: 'Google operating income was ..., and the operating margin was 25%'
            if income and not _basis(clause, last=True):
                section = replace(section, basis=income)  # 'Non-GAAP operating income was $7.6 billion. The operating margin was 34%.'
        if re.search(r"\bloss\b", clause[start:end], re.IGNORECASE) and amount.value > 0:
            # 'The non-GAAP net loss for the quarter was $48 million': a loss is negative, as 'a net loss of $48 million' is
            amount = replace(amount, value=-amount.value, low=None if amount.high is None else -amount.high,
                             high=None if amount.low is None else -amount.low)
        return self._figure(metric, segment, amount, kind, clause, period_texts, section)

    def _income_before(self, statement: str, previous: str) -> str | None:
        """A margin is the ratio of the operating income stated just before it, in the statement or
        in the sentence before: '' when that income is the company's (or none was stated), its
        basis when it states one, None when it is a part's ('Google operating income')."""
        for text in (statement, previous):
            incomes = [found for found in METRIC_WORDS.finditer(text) if _METRIC_OF[found[1].lower()] == "operating_income"]
            if incomes:
                qualified, known = self._qualifier(text[:incomes[-1].start()])
                if qualified is not None or not known:
                    return None
                return _basis(text, last=True) or ""
        return ""

    def _segment(self, clause: str, metric_start: int, metric_end: int, earlier: str) -> tuple[str | None, bool]:
        """The registry segment the metric is qualified by (None: the total), and False when
        a part of the business the registry does not name qualifies it ('services revenue').
        `earlier` is the statement before the clause ('In Intelligent Cloud, we expect ...')."""
        if re.search(r"\b(?:total|overall|consolidated|company(?:wide)?|corporate)\s+(?:net\s+)?$", clause[:metric_start],
                     re.IGNORECASE) or re.match(r"total\b", clause[metric_start:metric_end], re.IGNORECASE):
            return None, True  # 'and total revenue was ...' after a segment's figure
        qualified, known = self._qualifier(clause[:metric_start])
        if qualified is not None or not known:
            return qualified, known  # 'Xbox software and services revenue', 'Network advertising revenues': a part
        # far enough back for 'The Intelligent Cloud segment delivered approximately $6.8 billion in revenue, growing 11%'
        # and 'our productivity and business processes segment delivered results above our expectations with nearly
        # $7 billion in revenue'
        window = (earlier + clause[:metric_start])[-160:]
        tail = re.match(r"\s+(from|in|for)\s+(?:the\s+|our\s+|its\s+)?", clause[metric_end:])
        following = clause[metric_end + tail.end():] if tail else ""
        # the segment named nearest before the metric: 'Mac revenue was $7.2b and iPad revenue was $6b'
        nearest = max(((found.end(), segment.name) for segment in self.segments for found in segment.pattern.finditer(window)),
                      default=None)
        if nearest is not None:
            return nearest[1], True
        for segment in self.segments:
            if following and segment.pattern.match(following):
                return segment.name, True
        if tail and not _PERIOD_AFTER.match(following) and (
                tail[1] != "for" or re.match(r"[\w&-]+(?:\s+[\w&-]+)?\s+(?:business|segment|group|division|unit|products?)\b", following)):
            return None, False  # 'revenue from emerging markets', 'revenue for the storage business'
        if re.search(r"\b(?:group|business|segment|division|unit|products?|services)\b[^.$;]{0,30}$", window, re.IGNORECASE):
            return None, False
        return None, True

    def _qualifier(self, before: str) -> tuple[str | None, bool]:
        """What the words right before a metric name, walking back to the first word that ends the
        noun phrase: (segment, True) for a registry segment ('Data Center Group revenue'),
        (None, False) for a part of the business the registry does not name ('services revenue',
        'Xbox software and services revenue', 'Dynamics 365 revenue', 'Network advertising
        revenues' — a product line inside or across segments), (None, True) for no qualifier."""
        spans = [(found.start(), found.end(), segment.name) for segment in self.segments
                 for found in segment.pattern.finditer(before, max(0, len(before) - 120))]
        # a name inside a longer one is that one ('Graphics' in 'Computing and Graphics')
        spans = [span for span in spans if not any(o[0] <= span[0] and span[1] <= o[1] and o[:2] != span[:2] for o in spans)]
        named, position, noun = set(), len(before), False
        for word in reversed(list(re.finditer(r"[\w'’&.-]+|[,:(]", before))):
            if word.start() >= position:
                continue  # inside the segment name just read
            inside = next((span for span in spans if span[0] <= word.start() < span[1]), None)
            if inside is not None:
                named.add(inside[2])
                position = inside[0]
                continue
            text = word[0]
            lower = text.lower().rstrip(".")
            verb = re.fullmatch(r"[a-z]{3,}(?:ed|ing|ly)", text) is not None  # 'reduced capex', 'expecting revenue'
            if (lower in _BOUNDARY_WORDS and text not in ("US", "U.S")) or verb or text in ",:(" or self._own.match(lower):
                break
            if lower in _SEGMENT_NOUNS:
                noun = True
                continue
            if lower in _PLAIN_QUALIFIERS or re.fullmatch(
                    r"'?\d{2}|(?:19|20)\d{2}|fy'?\d{2,4}|q[1-4]", lower):
                continue  # '2019 revenue', 'Gaming segment revenue'; but 'Dynamics 365 revenue' names a product
            return None, False
        if len(named) > 1 or (noun and not named):
            return None, False  # 'YouTube advertising revenues': across two segments; 'the PC business revenue'
        return (named.pop(), True) if named else (None, True)

    def _figure(self, metric: str, segment: str | None, amount: _Amount, kind: str, clause: str, period_texts: tuple[str, ...],
                section: Section = None) -> RawFigure | None:
        section = section or _NO_SECTION
        period = self._period(period_texts, forward=kind == "guidance", section=section.period)
        if period is None or amount.unit == "number":
            return None
        quarter, year = (int(period.label[1]), int(period.label[3:])) if period.label.startswith("Q") else (None, int(period.label[2:]))
        publication = self.resolver.context.publication_date
        if kind == "reported" and period.start > publication:
            kind = "guidance"
        if kind == "reported" and period.end > publication:
            return None  # a remark about a period still under way ('this year we have grown ...') is no result
        if kind == "guidance":
            if period.end <= publication:
                return None  # guidance for a period already over is an old figure cited for comparison
            reported_year = self.resolver.reported[1] if self.resolver.reported else publication.year
            if year > reported_year + 1 or _LONG_TERM.search(clause):
                return None  # a long-term target, not guidance for a period
        # after the amount, not what a new subject states: 'gross margins was 60.4% and non-GAAP was 61%'
        # nor an alternative amount's ('up 8% or 19% excluding Wind River')
        after = re.split(r"\b(?:and|while|but|whereas|with)\s+(?:the\s+)?(?:non[- ]GAAP|GAAP)\b|\bor\s+(?:approximately\s+)?[$€£¥\d]",
                         clause[amount.end:], maxsplit=1, flags=re.IGNORECASE)[0]
        leading = _LEADING_BASIS.match(period_texts[-1]) if metric not in _REVENUE_LIKE else None
        basis = (_basis(clause[:amount.start], last=True) or _basis(after, last=False) or _stated_basis(period_texts[-1])
                 or (("GAAP" if leading[1].upper() == "GAAP" else "non-GAAP") if leading else None) or section.basis)
        unit = "percent" if amount.unit == "percent" else f"{amount.unit}/share" if metric == "eps" else amount.unit
        return RawFigure(metric=metric, segment=segment, basis=basis, kind=kind, fiscal_year=year, fiscal_quarter=quarter,
                         value=float(amount.value), low=None if amount.low is None else float(amount.low),
                         high=None if amount.high is None else float(amount.high), unit=unit,
                         text=re.sub(r"\s+and\s+", " to ", " ".join(amount.text.split())))

    def _period(self, texts: tuple[str, ...], forward: bool, section: str | None = None):
        """The first period `texts` name, in order, then the period the paragraph's section
        opened with; with none named, a result is for the quarter the call reports and guidance
        for the next one."""
        for text in (*texts, *((section,) if section else ())):
            text = _COMPARISON_PHRASE.sub(" ", text)
            period = self.resolver.find(text, forward=forward)
            if period is not None:
                return period
            if _ANNUAL.search(text):
                return self.resolver.find("the full year", forward=forward)
            if year := _BARE_YEAR.search(text):  # 'gross margin for 2015 was 46.1%'
                return self.resolver.fiscal_year(int(year[1] or year[2]))
        return self.resolver.shift(1 if forward else 0)


@lru_cache(maxsize=64)
def figure_parser(context: DocumentContext) -> FigureParser:
    """The parser for one call: its fiscal calendar, its company's names and segments."""
    company = get_company(context.ticker)
    return FigureParser(PeriodResolver(context), (company.name, *company.aliases, context.short_name, context.main_entity),
                        segment_patterns(dict(company.segments)))


def segments_fingerprint() -> str:
    """The registry's segments: part of the figures code version, since they decide segment figures."""
    import hashlib

    text = repr(sorted((ticker, company.segments) for ticker, company in load_companies().items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_METRIC_WORDS_OF = {"eps": "EPS", "capex": "capex"}


def guidance_phrase(figure: RawFigure) -> str:
    """'FY2024 revenue guidance is $1.35 billion': how a derived statement names a guided figure."""
    period = f"Q{figure.fiscal_quarter} {figure.fiscal_year}" if figure.fiscal_quarter else f"FY{figure.fiscal_year}"
    metric = _METRIC_WORDS_OF.get(figure.metric.value, figure.metric.value.replace("_", " "))
    if figure.segment:
        metric = f"{figure.segment} {'revenue' if figure.metric.value == 'segment_revenue' else metric}"
    basis = f"{figure.basis} " if figure.basis else ""
    return f"{period} {basis}{metric} guidance is {figure.text}"
