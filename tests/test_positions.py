"""Positions end by evidence (issue 26): the participants lists of successive calls end jobs at
another firm, titles replaced at the same firm, single-holder offices taken by someone else,
and the host's office by absence. The lists below are real lines of the corpus."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from tkg.core.names import firm_key, same_firm
from tkg.core.policy import POLICY
from tkg.core.roles import parse_offices
from tkg.ingest.parsing import parse_participant_sections
from tkg.invalidate.positions import ABSENCE, STATEMENT, Listing, end_positions, office_class, title_key

RULER = "=" * 80


def _call(company: str, day: str, corporate: list[str], conference: list[str] = ()) -> list[Listing]:
    """The listings of one call: each participant's offices, as the extractor states them (one
    HOLDS_ROLE per office). People are keyed by surname, as resolution would merge them."""
    text = f"{RULER}\nCorporate Participants\n{RULER}\n\n" + "\n".join(corporate) + "\n\n"
    if conference:
        text += f"{RULER}\nConference Call Participiants\n{RULER}\n\n" + "\n".join(conference) + "\n"
    at = datetime.fromisoformat(day).replace(tzinfo=timezone.utc)
    listings = []
    for participant in parse_participant_sections(text):
        corporate_person = participant.kind == "corporate"
        organization = participant.organization or company
        for office in parse_offices(participant.title, organization):
            title = office.role if office.organization == organization else f"{office.role} of {office.organization}"
            listings.append(Listing(
                event_id=f"{company}-{day}-{participant.name}-{title}", call=f"{company}_{day}", company=company,
                at=at, known_at=at, person_id=participant.name.split()[-1], person=participant.name,
                office_id=f"{title} of {organization}", title=title, firm=participant.organization,
                corporate=corporate_person))
    return listings


def _entry(name: str, line: str) -> str:
    return f" * {name}\n   {line}"


DARYANANI_RBC = _entry("Amit Jawaharlaz Daryanani", "RBC Capital Markets, LLC, Research Division - Analyst")
DARYANANI_EVERCORE = _entry("Amit Jawaharlaz Daryanani", "Evercore ISI Institutional Equities, Research Division - "
                                                         "Senior MD & Fundamental Research Analyst")
COOK = _entry("Timothy D. Cook", "Apple Inc. - CEO & Director")
GRAVES = _entry("Laura Graves", "Advanced Micro Devices, Inc. - Corporate Vice President, IR")
GRAVES_LATER = _entry("Laura A. Graves", "Advanced Micro Devices, Inc. - Corporate VP of IR")
COTTER = _entry("Ruth Cotter", "Advanced Micro Devices, Inc. - SVP of Worldwide Marketing, HR & IR")
MORALI = _entry("Liz Morali", "AMD - Director, IR")
SU = _entry("Lisa T. Su", "Advanced Micro Devices, Inc. - President, CEO & Non-Independent Director")
KUMAR = _entry("Devinder Kumar", "Advanced Micro Devices, Inc. - Senior VP, CFO & Treasurer")


def _ends(*calls: list[Listing]) -> dict[str, object]:
    return end_positions([listing for call in calls for listing in call])


def test_a_later_firm_ends_the_earlier_one_at_the_call_that_shows_it():
    first = _call("AAPL", "2017-08-01", [COOK], [DARYANANI_RBC])
    second = _call("AAPL", "2018-05-01", [COOK], [DARYANANI_RBC])
    moved = _call("AAPL", "2019-07-30", [COOK], [DARYANANI_EVERCORE])
    ends = _ends(first, second, moved)
    rbc = [listing for listing in first + second if listing.person_id == "Daryanani"]
    assert rbc and all(ends[listing.event_id].invalid_at == moved[0].at for listing in rbc)
    end = ends[rbc[0].event_id]
    assert end.evidence == STATEMENT and end.invalidated_by in {listing.event_id for listing in moved}
    assert "Evercore" in end.reason and "one firm at a time" in end.reason
    assert not any(listing.event_id in ends for listing in moved)  # the new firm holds
    assert not any(listing.event_id in ends for listing in first + second + moved if listing.person_id == "Cook")


def test_one_firm_spelled_two_ways_is_one_firm():
    """'Sanford C. Bernstein & Co.' and 'Bernstein Research' are one firm: nothing ends."""
    long_name = _entry("Stacy Aaron Rasgon", "Sanford C. Bernstein & Co., LLC., Research Division - Senior Analyst")
    short_name = _entry("Stacy Aaron Rasgon", "Bernstein Research - Senior Analyst")
    assert _ends(_call("AMD", "2017-05-01", [SU], [long_name]), _call("AMD", "2017-07-25", [SU], [short_name])) == {}
    assert same_firm(firm_key("BofA Securities"), firm_key("Bank of America Merrill Lynch"))
    assert same_firm(firm_key("J.P. Morgan Securities LLC"), firm_key("JPMorgan Chase & Co, Research Division"))
    assert not same_firm(firm_key("Morgan Stanley, Research Division"), firm_key("JPMorgan Chase & Co"))
    assert not same_firm(firm_key("RBC Capital Markets"), firm_key("Evercore ISI"))


def test_a_later_title_at_the_same_firm_replaces_the_earlier_title():
    analyst = _entry("Kevin Edward Cassidy", "Stifel, Nicolaus & Company, Incorporated, Research Division - Senior Analyst")
    director = _entry("Kevin Edward Cassidy", "Stifel, Nicolaus & Company, Incorporated, Research Division - Director")
    first, second = _call("AMD", "2018-04-25", [SU], [analyst]), _call("AMD", "2019-04-30", [SU], [director])
    ends = _ends(first, second)
    old = next(listing for listing in first if listing.person_id == "Cassidy")
    assert ends[old.event_id].invalid_at == second[0].at and "replaces Senior Analyst" in ends[old.event_id].reason
    assert not any(listing.event_id in ends for listing in second)


def test_a_title_spelled_differently_or_listed_again_later_is_not_ended():
    """'Corporate Vice President, IR' and 'Corporate VP of IR' are one title; an office a list
    leaves out once ('President, CEO' between two 'President, CEO & Director') is listed again
    later, so its tenure is not cut in between."""
    assert title_key("General Manager IR") == title_key("General Manager of Investor Relations")
    assert title_key("Sr. Director IR") == title_key("Senior Director of IR")
    ends = _ends(_call("AMD", "2017-01-31", [GRAVES, SU]), _call("AMD", "2018-07-25", [GRAVES_LATER, SU]))
    assert ends == {}
    with_director = _entry("Sanjay Mehrotra", "Micron Technology, Inc. - President, CEO & Director")
    without = _entry("Sanjay Mehrotra", "Micron Technology, Inc. - President, CEO")
    calls = [_call("MU", "2017-06-29", [with_director]), _call("MU", "2017-09-26", [without]),
             _call("MU", "2017-12-19", [with_director])]
    assert _ends(*calls) == {}


def test_a_different_person_listed_in_a_single_holder_office_ends_the_earlier_holder():
    """AMD's investor-relations head: Liz Morali, then Ruth Cotter, then Laura Graves; the CEO and
    the CFO stay with the judge and are not touched."""
    morali = _call("AMD", "2016-01-19", [MORALI, SU, KUMAR])
    cotter = _call("AMD", "2016-04-21", [COTTER, SU, KUMAR])
    graves = _call("AMD", "2017-01-31", [GRAVES, SU, KUMAR])
    ends = _ends(morali, cotter, graves)
    ir_morali = next(listing for listing in morali if listing.person_id == "Morali" and office_class(listing.title))
    assert ends[ir_morali.event_id].invalid_at == cotter[0].at
    assert "investor relations head is held by one person at a time" in ends[ir_morali.event_id].reason
    ir_cotter = [listing for listing in cotter if listing.person_id == "Cotter" and office_class(listing.title)]
    assert ir_cotter and all(ends[listing.event_id].invalid_at == graves[0].at for listing in ir_cotter)
    assert not any(listing.event_id in ends for listing in morali + cotter + graves if listing.person_id in {"Su", "Kumar"})


def test_two_holders_listed_at_once_both_hold():
    dave, shelly = (_entry("Dave Fildes", "Amazon.com, Inc. - Director of IR"),
                    _entry("Shelly Kay Pfeiffer", "Amazon.com, Inc. - Director of IR"))
    assert _ends(_call("AMZN", "2019-10-24", [dave, shelly]), _call("AMZN", "2020-01-30", [shelly, dave])) == {}


def test_a_host_who_is_never_listed_again_ends_by_absence_and_says_so():
    manney = _entry("Darin Manney", "Amazon.com, Inc. - Head of IR")
    olsavsky = _entry("Brian T. Olsavsky", "Amazon.com, Inc. - CFO & Senior VP")
    first, second = _call("AMZN", "2017-07-27", [manney, olsavsky]), _call("AMZN", "2017-10-26", [olsavsky])
    ends = _ends(first, second)
    end = ends[next(listing.event_id for listing in first if listing.person_id == "Manney")]
    assert end.evidence == ABSENCE and end.invalidated_by is None and end.invalid_at == second[0].at
    assert end.reason == "absent from the participants from the AMZN call of 2017-10-26 on"
    assert not any(listing.event_id in ends for listing in first if listing.person_id == "Olsavsky")
    # listed again at a later call: the gap was a skipped call, not an ending
    assert _ends(first, second, _call("AMZN", "2018-02-01", [manney, olsavsky])) == {}


def test_each_named_segment_has_one_head():
    shenoy = _entry("Navin Shenoy", "Intel Corporation - Executive VP & GM of Data Center Group")
    other = _entry("Sandra L. Rivera", "Intel Corporation - Executive VP & GM of Data Center Group")
    client = _entry("Gregory M. Bryant", "Intel Corporation - Senior VP & GM of Client Computing Group")
    assert office_class("GM of Data Center Group") == ("segment head", "data center")
    first, second = _call("INTC", "2018-07-26", [shenoy, client]), _call("INTC", "2020-07-23", [other, client])
    ends = _ends(first, second)
    gm = next(listing for listing in first if listing.person_id == "Shenoy" and office_class(listing.title))
    assert ends[gm.event_id].invalidated_by in {listing.event_id for listing in second}
    assert not any(listing.event_id in ends for listing in first if listing.person_id == "Bryant")


def test_the_result_does_not_depend_on_the_order_of_the_listings():
    calls = [_call("AAPL", "2017-08-01", [COOK], [DARYANANI_RBC]), _call("AAPL", "2019-07-30", [COOK], [DARYANANI_EVERCORE]),
             _call("AMD", "2016-01-19", [MORALI, SU]), _call("AMD", "2016-04-21", [COTTER, SU]),
             _call("AMD", "2017-01-31", [GRAVES, SU])]
    listings = [listing for call in calls for listing in call]
    expected = end_positions(listings)
    assert expected
    for seed in range(3):
        shuffled = listings[:]
        random.Random(seed).shuffle(shuffled)
        assert end_positions(shuffled) == expected


@pytest.mark.parametrize("entry", POLICY.single_holder_offices, ids=lambda entry: entry[0])
def test_every_single_holder_office_says_why(entry):
    name, pattern, reason = entry
    assert name and pattern and len(reason.split()) >= 5
