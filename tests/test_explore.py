"""`tkg explore` in a real browser: Debian's chromium driven by Playwright, against the server
the test starts on 127.0.0.1 over the bundled sample's graph.

The browser tests skip when chromium or playwright is missing, and fail instead under CI
(CI=true), where .ci/run installs both. The HTTP tests (bad input, a missing or half-built file,
20 readers while `tkg build` republishes) need no browser.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, time as clock, timezone
from pathlib import Path

import duckdb
import pytest

from tests.conftest import run_tkg
from tests.services import free_port, in_ci

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def browser_missing(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so the browser tests must run: .ci/run installs chromium)", pytrace=False)
    pytest.skip(reason)


class Server:
    """`tkg explore --home HOME` in a subprocess, as a user starts it."""

    def __init__(self, home: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        environment = {**os.environ, "TKG_HOME": str(home)}
        environment.pop("DAGSTER_HOME", None)
        self.process = subprocess.Popen([sys.executable, "-m", "tkg.cli", "explore", "--home", str(home), "--port",
                                         str(self.port)], env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"tkg explore exited {self.process.returncode}: {self.process.stdout.read()[-2000:]}")
            try:
                urllib.request.urlopen(self.base + "/static/explore.css", timeout=2).read()
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.3)
        self.stop()
        raise AssertionError("tkg explore did not answer within 120 s")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=60) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def stop(self) -> str:
        self.process.terminate()
        try:
            output, _ = self.process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            output, _ = self.process.communicate()
        return output or ""


@pytest.fixture(scope="module")
def graph_home(sample_home, tmp_path_factory) -> Path:
    """A folder holding only a copy of the sample's tkg.duckdb: the page reads nothing else."""
    home = tmp_path_factory.mktemp("explore")
    shutil.copy2(sample_home / "tkg.duckdb", home / "tkg.duckdb")
    return home


@pytest.fixture(scope="module")
def server(graph_home):
    started = Server(graph_home)
    yield started
    log = started.stop()
    assert "Traceback" not in log, log[-3000:]


@pytest.fixture(scope="module")
def db(graph_home):
    with duckdb.connect(str(graph_home / "tkg.duckdb"), read_only=True) as connection:
        yield connection


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if path is None:
        browser_missing("chromium is not installed (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        browser_missing("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    # The page must work without any network: any request leaving 127.0.0.1 fails the test.
    outside = []
    context.route("**/*", lambda route: (route.continue_() if route.request.url.startswith(server.base)
                                         else (outside.append(route.request.url), route.abort())))
    opened = context.new_page()
    yield opened
    context.close()
    assert not outside, f"the page asked for {outside}"


def end_of(day: str) -> datetime:
    return datetime.combine(date.fromisoformat(day), clock.max, tzinfo=timezone.utc)


def not_blank(path: Path) -> None:
    """A screenshot that shows something: many colours, not one flat fill."""
    from PIL import Image, ImageStat

    image = Image.open(path).convert("RGB")
    assert image.width >= 800 and image.height >= 400
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, f"{path} has {len(colours or [])} colours"
    assert max(ImageStat.Stat(image).stddev) > 20, f"{path} is nearly flat"


def screenshot(page, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    not_blank(path)


def person_id(db, name: str) -> str:
    return db.execute("SELECT canonical_id FROM canonical_entities WHERE name = ?", [name]).fetchone()[0]


# --- the browser ---------------------------------------------------------------------------------


def test_search_finds_a_person_by_a_nickname_and_opens_the_timeline(page, server, db, tmp_path):
    # "Tom Becker" is in no alias list: the search matches people by name parts and nicknames.
    assert not db.execute("SELECT 1 FROM entity_aliases WHERE alias = 'Tom Becker'").fetchall()
    page.goto(server.base + "/")
    screenshot(page, tmp_path, "index")
    page.fill("input[name=q]", "Tom Becker")
    page.click("form.search button")
    page.wait_for_url("**/search?q=Tom+Becker")
    results = page.locator("a.result")
    assert results.first.inner_text() == "Thomas Becker"
    screenshot(page, tmp_path, "search")
    results.first.click()
    page.wait_for_url(f"**/entity/{person_id(db, 'Thomas Becker')}")
    assert page.locator("h1").inner_text().startswith("Thomas Becker")


def _held(page) -> set[str]:
    return set(page.eval_on_selector_all("svg.timeline a.bar.held", "bars => bars.map(b => b.dataset.fact)"))


def _expected_held(db, canonical_id: str, day: str) -> set[str]:
    """The fact periods facts_as_of says were held at the end of `day`, straight from the file."""
    rows = db.execute(
        """
        SELECT DISTINCT h.fact_id FROM facts_as_of(?) AS f
        JOIN fact_history AS h
          ON split_part(h.fact_id, '-', 1) = md5(concat_ws('|', f.subject_id, f.predicate, f.object_id, coalesce(f.value, '')))
         AND h.began_at <= ? AND (h.ended_at IS NULL OR h.ended_at > ?)
        WHERE f.subject_id = ? OR f.object_id = ?
        """, [end_of(day), end_of(day), end_of(day), canonical_id, canonical_id]).fetchall()
    return {row[0] for row in rows}


def test_moving_the_as_of_date_changes_which_bars_are_held(page, server, db, tmp_path):
    # The sample's CEO succession: the fact retired between the two dates must change state.
    ceo = person_id(db, "Thomas Becker")
    retired = db.execute("SELECT began_at, ended_at FROM fact_history WHERE subject_id = ? AND ended_at IS NOT NULL "
                         "ORDER BY ended_at LIMIT 1", [ceo]).fetchone()
    assert retired is not None, "the sample's CEO succession retires a fact of Thomas Becker"
    before = (retired[0] + (retired[1] - retired[0]) / 2).date().isoformat()
    after = retired[1].date().isoformat()
    page.goto(f"{server.base}/entity/{ceo}?as_of={before}")
    held_before = _held(page)
    assert held_before == _expected_held(db, ceo, before) and held_before
    page.fill("form.asof input[name=as_of]", after)
    page.click("form.asof button")
    page.wait_for_url(f"**/entity/{ceo}?as_of={after}")
    held_after = _held(page)
    assert held_after == _expected_held(db, ceo, after)
    assert held_before - held_after, "a bar retired between the two dates is still drawn as held"
    # the bar that stopped being held carries the mark of the statement that retired it
    assert page.locator("svg.timeline a.retired").count() >= 1
    believed = page.locator("#believed tbody tr").count() if page.locator("#believed").count() else 0
    assert believed == db.execute("SELECT count(DISTINCT (subject_id, predicate, object_id, value)) FROM facts_as_of(?) "
                                  "WHERE subject_id = ? OR object_id = ?", [end_of(after), ceo, ceo]).fetchone()[0]
    screenshot(page, tmp_path, "timeline")


def test_a_guidance_chain_shows_the_values_metrics_as_of_held(page, server, db, tmp_path):
    ticker = db.execute("SELECT company FROM metrics WHERE kind = 'guidance' GROUP BY company, metric, fiscal_year, "
                        "fiscal_quarter ORDER BY count(*) DESC, company LIMIT 1").fetchone()[0]
    page.goto(server.base + "/")
    page.click(f"a[href='/company/{ticker}']")
    page.wait_for_url(f"**/company/{ticker}")
    assert page.locator("svg.timeline a.bar").count() == db.execute(
        "SELECT count(*) FROM officer_tenures WHERE company = ? AND organization IN "
        "(SELECT alias FROM entity_aliases WHERE canonical_id = 'cmp_' || ?)", [ticker, ticker]).fetchone()[0]
    screenshot(page, tmp_path, "company")
    page.locator("figure.chain figcaption a").first.click()
    page.wait_for_url("**/guidance?**")
    query = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    metric, year = query["metric"][0], int(query["year"][0])
    quarter = int(query["quarter"][0]) if "quarter" in query else None
    steps = page.eval_on_selector_all("#chain tr.step", "rows => rows.map(r => [r.dataset.call, r.dataset.value])")
    assert len(steps) >= 2
    for call_date, value in steps:
        standing = db.execute(
            "SELECT list(value) FROM metrics_as_of(?) WHERE company = ? AND kind = 'guidance' AND metric = ? "
            "AND fiscal_year = ? AND fiscal_quarter IS NOT DISTINCT FROM ? AND segment IS NULL AND call_date = ?",
            [end_of(call_date), ticker, metric, year, quarter, date.fromisoformat(call_date)]).fetchone()[0]
        assert float(value) in standing, (call_date, value, standing)
    # what stands after the last call is the last step
    last = db.execute("SELECT list(value) FROM metrics_as_of(?) WHERE company = ? AND kind = 'guidance' AND metric = ? "
                      "AND fiscal_year = ? AND fiscal_quarter IS NOT DISTINCT FROM ? AND segment IS NULL",
                      [end_of(steps[-1][0]), ticker, metric, year, quarter]).fetchone()[0]
    assert float(steps[-1][1]) in last
    actual = db.execute("SELECT value FROM metrics WHERE company = ? AND kind = 'reported' AND metric = ? AND fiscal_year = ? "
                        "AND fiscal_quarter IS NOT DISTINCT FROM ? AND segment IS NULL ORDER BY call_date DESC LIMIT 1",
                        [ticker, metric, year, quarter]).fetchone()
    shown = page.locator("#actual").get_attribute("data-value")
    assert (float(shown) if shown else None) == (actual[0] if actual else None)
    screenshot(page, tmp_path, "guidance")


def test_a_bar_leads_to_its_statement_speaker_and_call(page, server, db, tmp_path):
    ceo = person_id(db, "Thomas Becker")
    page.goto(f"{server.base}/entity/{ceo}")
    bar = page.locator("svg.timeline a.bar").first
    event_id = bar.get_attribute("href").rsplit("/", 1)[1]
    bar.click()
    page.wait_for_url(f"**/statement/{event_id}")
    statement, speaker, call_date = db.execute(
        "SELECT e.statement, c.speaker, t.call_date FROM events e JOIN chunks c USING (chunk_id) "
        "JOIN transcripts t ON t.transcript_id = e.transcript_id WHERE e.event_id = ?", [event_id]).fetchone()
    assert page.locator("#statement").inner_text() == statement
    if speaker:
        assert speaker in page.locator("#speaker").inner_text()
    screenshot(page, tmp_path, "statement")
    page.click("#call")
    page.wait_for_url("**/call/**")
    assert call_date.isoformat() in page.locator("h1").inner_text()
    assert page.locator(f"a[href='/statement/{event_id}']").count() == 1
    screenshot(page, tmp_path, "call")


def test_the_subgraph_draws_the_entity_its_neighbours_and_figures(page, server, db, tmp_path):
    ticker = db.execute("SELECT min(company) FROM transcripts").fetchone()[0]
    day = db.execute("SELECT max(call_date) FROM transcripts WHERE company = ?", [ticker]).fetchone()[0].isoformat()
    page.goto(f"{server.base}/subgraph/cmp_{ticker}?as_of={day}")
    # every officer of the company on that day is drawn, joined to it by the office they held
    officers = db.execute(
        "SELECT DISTINCT person FROM officer_tenures WHERE company = ? AND started_at <= ? "
        "AND (ended_at IS NULL OR ended_at > ?) AND organization IN (SELECT alias FROM entity_aliases "
        "WHERE canonical_id = 'cmp_' || ?)", [ticker, end_of(day), end_of(day), ticker]).fetchall()
    drawn = set(page.eval_on_selector_all("svg.subgraph .node text", "texts => texts.map(t => t.textContent)"))
    assert officers and {row[0] for row in officers} <= drawn
    assert page.locator("svg.subgraph .node.figure").count() >= 1
    screenshot(page, tmp_path, "subgraph")


# --- bad input, a missing file, readers during a republish (plain HTTP) ----------------------------


@pytest.mark.parametrize("path, status, says", [
    ("/entity/ent_does_not_exist", 404, "no entity with id"),
    ("/entity/cmp_HLIO?as_of=2024-13-40", 400, "is not a date"),
    ("/entity/cmp_HLIO?as_of=yesterday", 400, "is not a date"),
    ("/search?q=" + "x" * 500, 400, "at most 200"),
    ("/search?q=%00%01", 400, "control characters"),
    ("/company/NOPE", 404, "no calls of a company"),
    ("/company/HLIO/guidance?metric=revenue&year=abc", 400, "not a whole number"),
    ("/company/HLIO/guidance?metric=revenue&year=1999", 404, "no guidance chain"),
    ("/statement/%27%20OR%201%3D1%20--", 404, "no statement"),
    ("/call/..%2F..%2Fetc%2Fpasswd", 404, "there is no page"),
    ("/static/..%2Fserver.py", 404, "there is no page"),
    ("/subgraph/x?as_of=2024-02-30", 400, "is not a date"),
    ("/no/such/page", 404, "there is no page"),
])
def test_bad_input_gets_a_clear_message_and_a_4xx(server, path, status, says):
    code, body = server.get(path)
    assert code == status, body[-500:]
    assert says in body
    assert "Traceback" not in body and "duckdb" not in body.lower()


def test_hostile_search_text_is_only_searched_for(server, db):
    before = db.execute("SELECT count(*) FROM facts").fetchone()[0]
    for text in ("'; DROP TABLE facts; --", "Robert'); SELECT * FROM read_csv('/etc/passwd') --", "<script>alert(1)</script>"):
        code, body = server.get("/search?q=" + urllib.parse.quote(text))
        assert code == 200 and "<script>alert" not in body
    assert db.execute("SELECT count(*) FROM facts").fetchone()[0] == before


def test_a_missing_or_half_built_file_says_how_to_build_it(tmp_path):
    home = tmp_path / "empty"
    home.mkdir()
    started = Server(home)
    try:
        code, body = started.get("/")
        assert code == 503 and "does not exist yet" in body and "tkg build --home" in body
        with duckdb.connect(str(home / "tkg.duckdb")) as connection:  # a file with only part of the graph
            connection.execute("CREATE TABLE facts (x INTEGER)")
        code, body = started.get("/")
        assert code == 503 and "not a complete tkg graph" in body and "tkg build" in body
        (home / "tkg.duckdb").write_bytes(b"not a database at all" * 100)
        code, body = started.get("/entity/cmp_HLIO")
        assert code == 503 and "cannot be read as a tkg graph" in body
    finally:
        log = started.stop()
    assert "Traceback" not in log, log[-3000:]


def test_twenty_readers_while_tkg_build_republishes(sample_home, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(sample_home, home, ignore=shutil.ignore_patterns("*.lock"))
    started = Server(home)
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        ticker = connection.execute("SELECT min(company) FROM transcripts").fetchone()[0]
        person = connection.execute("SELECT person_id FROM officer_tenures WHERE company = ? LIMIT 1", [ticker]).fetchone()[0]
    paths = ["/", "/search?q=CFO", f"/company/{ticker}", f"/entity/cmp_{ticker}?as_of=2024-06-30", f"/entity/{person}",
             f"/subgraph/cmp_{ticker}"]
    before = os.stat(home / "tkg.duckdb").st_ino
    done = threading.Event()
    outcomes: list[tuple[str, int | str]] = []

    def reader(number: int) -> None:
        index = number
        while not done.is_set():
            path = paths[index % len(paths)]
            index += 1
            try:
                code, body = started.get(path)
                outcomes.append((path, code if "Traceback" not in body else "traceback"))
                time.sleep(0.05)
            except Exception as error:  # noqa: BLE001 - any failure to answer is what this test looks for
                outcomes.append((path, f"{type(error).__name__}: {error}"))

    try:
        with ThreadPoolExecutor(20) as pool:
            for number in range(20):
                pool.submit(reader, number)
            try:
                build = run_tkg(home, "build", "--force", timeout=900)
            finally:
                time.sleep(2)  # a few rounds on the new file
                done.set()
    finally:
        log = started.stop()
    assert build.returncode == 0, build.stderr[-2000:]
    assert os.stat(home / "tkg.duckdb").st_ino != before, "the build did not republish the file"
    failures = [outcome for outcome in outcomes if outcome[1] != 200]
    assert not failures, failures[:10]
    assert len(outcomes) >= 40
    assert "Traceback" not in log, log[-3000:]
    summary = {"requests": len(outcomes), "paths": len(paths)}
    print(json.dumps(summary))
