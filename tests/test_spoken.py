"""Names as they are spoken in the call (issue 26): operator introductions, self-introductions
and 'in for' phrases, linked to the participant they name. The sentences are the corpus's own."""

from __future__ import annotations

from tkg.resolve.spoken import call_mentions, link, names_agree, spoken_forms


def _chunks(*turns: tuple[str, str]) -> list[dict]:
    return [{"chunk_id": f"c{index}", "speaker": speaker, "text": text, "kind": "speech"}
            for index, (speaker, text) in enumerate(turns)]


def test_the_operator_names_the_next_speaker_in_a_short_form():
    chunks = _chunks(("Operator", "Our next question comes from the line of Joe Moore with Morgan Stanley."),
                     ("Joseph Lawrence Moore", "Thank you. I wonder if you could talk about the data center."),
                     ("Operator", "Our next question is coming from Chris Daneley from Citigroup."),
                     ("Christopher Brett Danely", "Hey, thanks guys."))
    rows, unlinked = call_mentions(chunks, ["Joseph Lawrence Moore", "Christopher Brett Danely", "Sanjay Mehrotra"])
    assert [(r["spoken"], r["participant"], r["method"]) for r in rows] == [
        ("Joe Moore", "Joseph Lawrence Moore", "turn"),
        ("Chris Daneley", "Christopher Brett Danely", "turn"),  # a spelling slip, confirmed by the turn
    ] and unlinked == 0


def test_the_host_and_self_introductions_link_to_the_speaker():
    chunks = _chunks(("Operator", "It is now my pleasure to introduce your host, Laura Graves. Please go ahead."),
                     ("Laura A. Graves", "Thank you, and welcome to AMD's First Quarter 2019 Conference Call."),
                     ("Marilyn Mora", "This is Marilyn Mora, Head of Investor Relations."))
    rows, _ = call_mentions(chunks, ["Laura A. Graves", "Lisa T. Su", "Marilyn Mora"])
    assert {(r["spoken"], r["participant"], r["kind"]) for r in rows} == {
        ("Laura Graves", "Laura A. Graves", "operator"), ("Marilyn Mora", "Marilyn Mora", "self")}


def test_in_for_names_the_colleague_on_the_list_or_at_the_company():
    forms = spoken_forms("Hi. This is Bill Peterson calling in for Harlan. My question is on DRAM pricing.",
                         "Bill Peterson", None)
    assert [(form.spoken, form.kind) for form in forms] == [("Bill Peterson", "self"), ("Harlan", "in_for")]
    in_for = forms[1]
    assert link(in_for, ["Harlan Sur", "Bill Peterson"]) == ("Harlan Sur", "participants")
    # off this call's list: the one Harlan among the company's participants
    assert link(in_for, ["Bill Peterson"], ["Harlan Sur", "Sanjay Mehrotra"]) == ("Harlan Sur", "company_participants")
    assert link(in_for, ["Bill Peterson"], ["Harlan Sur", "Harlan Jones"]) is None  # two Harlans: nobody


def test_without_the_turn_the_list_decides_by_nickname_and_initial_rules():
    form = spoken_forms("Our final question will come from Bob Peck of SunTrust.", "Operator", None)[0]
    assert link(form, ["Robert Peck", "Ambrish Srivastava"]) == ("Robert Peck", "participants")
    assert link(form, ["Robert Peck", "Bob Peck"]) is None  # ambiguous
    assert names_agree("Alex Zukin", "Aleksandr J. Zukin", turn=False)
    assert names_agree("R. Dassen", "Roger J. M. Dassen", turn=False)
    assert not names_agree("Stacy Smith", "Stacy Aaron Rasgon", turn=False)
    assert not names_agree("Vivek Arya", "Vivek Nair", turn=False)
    assert names_agree("Vivek Aria", "Vivek Arya", turn=True)  # a slip, with the turn's evidence


def test_phrases_that_are_not_names_yield_nothing():
    assert spoken_forms("Our next question comes from the line of Bank of America.", "Operator", None) == []
    assert spoken_forms("Now on behalf of ASML's board and management, I'd like to thank you all.", "Craig DeYoung", None) == []
    rows, unlinked = call_mentions(_chunks(("Operator", "Our next question comes from John Pitzer with Credit Suisse."),
                                           ("Farhan Ahmad", "Thanks for taking my question.")), ["Farhan Ahmad"])
    assert rows == [] and unlinked == 1  # the named analyst is not the next speaker nor on the list
