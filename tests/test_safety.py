"""Safe to leave running (issue 10): a failure never publishes a worse graph with exit 0, bad
rows are skipped and named, kills leave nothing behind, and the graph does not depend on build
history. Each test is one row of the issue's table, tried as a user would: `tkg build` in a
subprocess, faults from the local OpenAI-compatible server, crafted sources, signals."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fakes.openai_server import OpenAICompatibleServer
from fakes.responders import PipelineResponder
from tests.conftest import CORPUS, needs_corpus
from tkg.ingest.sources import SAMPLE_PATH

# Two of the sample's calls are enough for the LLM-path tests.
QNTX_FIRST_HALF = ["--company", "QNTX", "--until", "2024-06-30"]


def tkg(home: Path, *args: str, env: dict | None = None, timeout: float = 600, wait: bool = True):
    environment = {**os.environ, "TKG_HOME": str(home), **(env or {})}
    for name in ("OPENAI_API_KEY", "TKG_LLM", "DAGSTER_HOME", *((env or {}).get("_unset", ()))):
        environment.pop(name, None)
    environment.pop("_unset", None)
    command = [sys.executable, "-m", "tkg.cli", *args]
    if not wait:
        return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout)


def facts_digest(home: Path) -> tuple[int, str] | None:
    """(row count, sha256 of every row of `facts`), or None when nothing is published."""
    path = home / "tkg.duckdb"
    if not path.exists():
        return None
    with duckdb.connect(str(path), read_only=True) as connection:
        rows = connection.execute("SELECT * FROM facts ORDER BY ALL").fetchall()
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


def parquet_stamps(home: Path) -> dict[str, str]:
    from tkg.core.versions import read_stamp

    # The stamped files: not the manifest, nor a shard step's split data (`v=<version>/`), whose
    # stamps live in their step's own file.
    return {str(p.relative_to(home)): read_stamp(p).version for p in sorted((home / "parquet").rglob("*.parquet"))
            if "llm_calls" not in p.parts and "_manifest" not in p.parts
            and not any(part.startswith("v=") for part in p.parts)}


@pytest.fixture(scope="module")
def provider():
    with OpenAICompatibleServer(PipelineResponder(), latency_s=0.0, max_in_flight=64, retry_after_s=0.1) as server:
        yield server


@pytest.fixture
def llm(provider):
    provider.reset_stats()
    provider.clear_faults()
    provider.configure(p_429=0.0, p_500=0.0, latency_s=0.0)
    return {"OPENAI_BASE_URL": provider.base_url, "TKG_LLM_ATTEMPTS": "2", "_unset": ("TKG_EMBEDDINGS",)}


@pytest.fixture(scope="module")
def llm_built(provider, tmp_path_factory):
    """QNTX's first two calls built over the LLM path once: (home, generation requests it took,
    facts). Generation requests are counted, not embeddings: two partitions built at once may
    both embed a name they share before either has cached it, so embedding counts vary by a few."""
    provider.reset_stats()
    provider.clear_faults()
    home = tmp_path_factory.mktemp("llm_built")
    environment = {"OPENAI_BASE_URL": provider.base_url, "TKG_LLM_ATTEMPTS": "2", "_unset": ("TKG_EMBEDDINGS",)}
    built = tkg(home, "build", *QNTX_FIRST_HALF, env=environment)
    assert built.returncode == 0, built.stderr[-3000:]
    return home, generations(provider), facts_digest(home)


def generations(provider: OpenAICompatibleServer) -> int:
    return provider.stats().requests.get("responses", 0)


def write_source(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def sample_lines(company: str | None = None) -> list[bytes]:
    lines = [line for line in SAMPLE_PATH.read_bytes().splitlines() if line.strip()]
    return [line for line in lines if company is None or json.loads(line)["company"] == company]


# --- a partition never gets worse silently ----------------------------------------------------


def test_provider_down_keeps_the_last_good_graph(tmp_path, provider, llm, llm_built):
    home = tmp_path / "home"
    shutil.copytree(llm_built[0], home)
    good, stamps = facts_digest(home), parquet_stamps(home)

    # a new statements model forces uncached work while the provider answers only 500s
    provider.configure(p_500=1.0)
    down = tkg(home, "build", *QNTX_FIRST_HALF, env={**llm, "TKG_MODEL_STATEMENTS": "gpt-4.1-nano"})
    assert down.returncode == 1, down.stderr[-3000:]
    assert "QNTX|2024-01-01" in down.stderr and "QNTX|2024-04-01" in down.stderr and "incomplete" in down.stderr
    assert "kept their last good output" in down.stderr
    assert facts_digest(home) == good and parquet_stamps(home) == stamps
    # the lost requests are still accounted, per partition
    usage = [row for path in (home / "parquet" / "llm_calls").rglob("*.parquet")
             for row in __import__("pyarrow.parquet").parquet.read_table(path).to_pylist()]
    assert any(row["stage"] == "statements" and row["dropped"] > 0 for row in usage)

    provider.configure(p_500=0.0)
    back = tkg(home, "build", *QNTX_FIRST_HALF, env={**llm, "TKG_MODEL_STATEMENTS": "gpt-4.1-nano"})
    assert back.returncode == 0, back.stderr[-3000:]
    assert facts_digest(home)[0] == good[0]


def test_malformed_answers_fail_then_a_rerun_asks_only_for_what_is_missing(tmp_path, provider, llm, llm_built):
    _, cold_requests, expected = llm_built

    home = tmp_path / "home"
    provider.reset_stats()
    provider.queue_faults(*["garbage"] * 40)
    failed = tkg(home, "build", *QNTX_FIRST_HALF, env=llm)
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "without" in failed.stderr and "answer" in failed.stderr
    assert facts_digest(home) is None  # nothing published from a partial graph
    assert provider.stats().garbage == 40
    usable = generations(provider) - 40

    provider.reset_stats()
    rerun = tkg(home, "build", *QNTX_FIRST_HALF, env=llm)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    # every usable answer of the failed build was kept: nothing is paid for twice
    assert 0 < generations(provider) <= cold_requests - usable
    assert facts_digest(home) == expected


def test_a_partial_result_is_asked_for_and_says_what_is_missing(tmp_path, provider, llm):
    home = tmp_path / "home"
    provider.queue_faults(*["garbage"] * 40)
    partial = tkg(home, "build", *QNTX_FIRST_HALF, "--allow-partial", env=llm)
    assert partial.returncode == 3, partial.stderr[-3000:]
    assert "partial" in partial.stderr
    published = facts_digest(home)
    assert published is not None
    # the next plain build retries what is missing, and completes the graph
    again = tkg(home, "build", *QNTX_FIRST_HALF, env=llm)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "incomplete" not in again.stderr and facts_digest(home)[0] >= published[0]


def test_an_unparseable_row_keeps_the_partition_built_from_it(tmp_path, sample_home):
    home = tmp_path / "home"
    shutil.copytree(sample_home, home)
    good, stamps = facts_digest(home), parquet_stamps(home)

    lines = sample_lines()
    broken = json.loads(lines[2])
    broken["transcript"] = "Helio Robotics call, text lost in an export"
    lines[2] = json.dumps(broken).encode()
    source = write_source(tmp_path / "calls.jsonl", lines)
    result = tkg(home, "build", "--source", str(source))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "calls.jsonl line 3" in result.stderr and "section rulers" in result.stderr
    assert facts_digest(home) == good and parquet_stamps(home) == stamps


def test_the_same_call_twice_is_built_once(tmp_path, sample_home):
    twice = tmp_path / "twice"
    lines = sample_lines()
    result = tkg(twice, "build", "--source", str(write_source(tmp_path / "twice.jsonl", lines + lines[1:2])))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "twice.jsonl line 9 repeats twice.jsonl line 2" in result.stderr
    assert facts_digest(twice) == facts_digest(sample_home)
    with duckdb.connect(str(twice / "tkg.duckdb"), read_only=True) as connection:
        ids = connection.execute("SELECT transcript_id FROM transcripts").fetchall()
    assert len(ids) == len(set(ids)) == 8


def test_bad_rows_are_skipped_and_named_and_the_rest_is_built(tmp_path):
    lines = sample_lines()
    different = json.loads(lines[0])
    different["transcript"] += "\nA different ending."
    bad = [
        b'{"company": "HLIO", "date": "2024-09-01", "transcript": "caf\xe9 au lait"}',  # latin-1, not UTF-8
        b'{"company": "HLIO", "date": ',  # a garbage line
        json.dumps({"company": "QNTX", "date": "2031-01-05", "transcript": "from the future"}).encode(),
        json.dumps({"company": "QNTX", "date": "2024-13-40", "transcript": "x"}).encode(),
        json.dumps({"company": "QNTX", "date": "2024-05-01", "transcript": "  "}).encode(),
        json.dumps(different).encode(),  # the first call again, with another text
    ]
    source = write_source(tmp_path / "calls.jsonl", lines + bad)
    result = tkg(tmp_path / "home", "build", "--source", str(source))
    assert result.returncode == 3, result.stderr[-3000:]
    skipped = [line for line in result.stderr.splitlines() if line.startswith("source row skipped")]
    n = len(lines)
    for fragment in (f"line {n + 1}: is not UTF-8", f"line {n + 2}: is not JSON", f"line {n + 3}, field 'date': 2031-01-05 is outside",
                     f"line {n + 4}, field 'date': '2024-13-40' is not a date", f"line {n + 5}, field 'transcript': is empty",
                     f"has different texts in calls.jsonl line 1, calls.jsonl line {n + 6}"):
        assert any(fragment in line for line in skipped), (fragment, skipped)
    assert "Traceback" not in result.stderr
    with duckdb.connect(str(tmp_path / "home" / "tkg.duckdb"), read_only=True) as connection:
        assert connection.execute("SELECT count(*) FROM transcripts").fetchone()[0] == n - 1  # all but the conflicting call


def test_csv_and_parquet_rows_are_checked_one_by_one(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tkg.ingest.sources import load_source

    text = json.loads(sample_lines("HLIO")[0])["transcript"]
    csv_path = tmp_path / "calls.csv"
    csv_path.write_bytes(b"company,date,transcript\n" + f'HLIO,2024-02-06,"{text}"\n'.encode()
                         + b'HLIO,2024-05-07,"na\xefve"\nHLIO,not-a-date,"x"\n')
    loaded = load_source(str(csv_path))
    assert len(loaded.rows) == 1 and loaded.rows[0].origin == "calls.csv line 2"
    after = 2 + text.count("\n") + 1  # the first row's quoted text spans many lines; rows are named by their first
    assert [str(p) for p in loaded.problems] == [
        f"calls.csv line {after}, field 'transcript': is not UTF-8",
        f"calls.csv line {after + 1}, field 'date': 'not-a-date' is not a date (YYYY-MM-DD)"]

    parquet_path = tmp_path / "calls.parquet"
    table = pa.table({"company": ["HLIO", "HLIO"], "date": ["2024-02-06", "2024-05-07"],
                      "transcript": pa.array([text.encode(), b"\xff\xfe"], pa.binary())})
    pq.write_table(table, parquet_path)
    loaded = load_source(str(parquet_path))
    assert len(loaded.rows) == 1
    assert str(loaded.problems[0]).startswith("calls.parquet row 2, field 'transcript': is not UTF-8")


# --- publish only a consistent graph ----------------------------------------------------------


def _children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(condition, timeout: float = 120.0, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(step)


@pytest.fixture(scope="module")
def qntx_clean(provider, tmp_path_factory):
    """QNTX built over the LLM path without interruption: (its facts, the requests it took)."""
    provider.reset_stats()
    provider.clear_faults()
    provider.configure(p_429=0.0, p_500=0.0, latency_s=0.0)
    home = tmp_path_factory.mktemp("qntx_clean")
    environment = {"OPENAI_BASE_URL": provider.base_url, "TKG_LLM_ATTEMPTS": "2", "_unset": ("TKG_EMBEDDINGS",)}
    built = tkg(home, "build", "--company", "QNTX", env=environment)
    assert built.returncode == 0, built.stderr[-3000:]
    return facts_digest(home), provider.stats().total_requests


def test_ctrl_c_stops_the_whole_build_and_publishes_nothing(tmp_path, provider, qntx_clean, llm):
    home = tmp_path / "home"
    provider.configure(latency_s=0.2)
    build = tkg(home, "build", "--company", "QNTX", "--workers", "2", env=llm, wait=False)
    _wait_for(lambda: len(_children(build.pid)) >= 2 and provider.stats().status_200 >= 20)
    workers = _children(build.pid)
    started = time.monotonic()
    build.send_signal(signal.SIGINT)
    _, stderr = build.communicate(timeout=60)
    assert build.returncode == 130, stderr[-3000:]
    assert time.monotonic() - started < 15
    assert "interrupted" in stderr
    _wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=10)
    assert facts_digest(home) is None
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    try:
        assert not instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
    finally:
        instance.dispose()
    provider.configure(latency_s=0.0)
    rerun = tkg(home, "build", "--company", "QNTX", env=llm)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert facts_digest(home) == qntx_clean[0]


# --- kills leave nothing behind ---------------------------------------------------------------


def test_kill_9_orphans_no_worker_no_run_and_repays_only_requests_in_flight(tmp_path, provider, qntx_clean, llm):
    clean_facts, cold = qntx_clean
    home = tmp_path / "home"
    provider.configure(latency_s=0.2)
    build = tkg(home, "build", "--company", "QNTX", "--workers", "2", env={**llm, "TKG_MAX_IN_FLIGHT": "8"}, wait=False)
    _wait_for(lambda: len(_children(build.pid)) >= 2 and provider.stats().status_200 >= cold // 3)
    workers = _children(build.pid)
    build.send_signal(signal.SIGKILL)
    build.wait(timeout=10)
    answered = provider.stats().status_200
    _wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=10)  # workers die with their parent
    in_flight_after = provider.stats().status_200 - answered  # answered while the workers were dying

    provider.reset_stats()
    provider.configure(latency_s=0.0)
    rerun = tkg(home, "build", "--company", "QNTX", env=llm)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "marked 1 run(s) of killed builds as failed" in rerun.stderr
    # every answer that arrived before the kill was cached: at most the requests in flight are paid again
    assert provider.stats().total_requests <= cold - answered + in_flight_after + 8
    assert facts_digest(home) == clean_facts
    leftovers = [p for p in home.rglob(".*") if p.suffix in (".tmp", ".building", ".wal")]
    assert not leftovers
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    try:
        statuses = {run.status for run in instance.get_runs()}
        assert dg.DagsterRunStatus.STARTED not in statuses and dg.DagsterRunStatus.FAILURE in statuses
    finally:
        instance.dispose()


def test_a_killed_run_gives_back_its_publish_slot_at_the_next_start(tmp_path):
    """A build killed while it published held the one tkg_duckdb_write slot; the next start
    marks its run failed and frees the slot, so the next publish is not left waiting for it."""
    from tkg_assets.assets.common import RUN_HOST_TAG, RUN_PID_TAG
    from tkg_assets.instance import DUCKDB_POOL, fail_orphaned_runs, open_instance

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    instance = open_instance(tmp_path / "dagster_home")
    try:
        killed = instance.add_run(dg.DagsterRun(job_name="tkg_build", status=dg.DagsterRunStatus.STARTED, tags={
            RUN_PID_TAG: str(dead.pid), RUN_HOST_TAG: socket.gethostname()}))
        storage = instance.event_log_storage
        assert storage.claim_concurrency_slot(DUCKDB_POOL, killed.run_id, "warehouse").is_claimed
        assert not storage.claim_concurrency_slot(DUCKDB_POOL, "the next build", "warehouse").is_claimed
        assert fail_orphaned_runs(instance) == [killed.run_id]
        assert instance.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.FAILURE
        assert storage.claim_concurrency_slot(DUCKDB_POOL, "the next build", "warehouse").is_claimed
        # a run an older tkg marked failed without freeing its slot: freed at the next start too
        storage.free_concurrency_slots_for_run("the next build")
        stuck = instance.add_run(dg.DagsterRun(job_name="tkg_build", status=dg.DagsterRunStatus.FAILURE))
        assert storage.claim_concurrency_slot(DUCKDB_POOL, stuck.run_id, "warehouse").is_claimed
        assert fail_orphaned_runs(instance) == []
        assert storage.claim_concurrency_slot(DUCKDB_POOL, "the build after", "warehouse").is_claimed
    finally:
        instance.dispose()


def test_temporary_files_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    from tkg.store.parquet import remove_orphaned_temporaries, temporary_path

    folder = tmp_path / "parquet" / "statements"
    folder.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    mine = temporary_path(folder / "statements.parquet")
    theirs = Path(str(mine).replace(f"-{os.getpid()}.", f"-{dead.stdout.strip()}."))
    wal = tmp_path / (theirs.name.replace(".tmp", ".building") + ".wal")
    # a writer that exited and was never reaped (a zombie: in a container whose first process
    # does not reap a killed build's workers) left its file too
    unreaped = subprocess.Popen([sys.executable, "-c", "pass"])
    _wait_for(lambda: not _alive(unreaped.pid), timeout=30)  # exited: held unreaped by this Popen
    zombies = Path(str(mine).replace(f"-{os.getpid()}.", f"-{unreaped.pid}."))
    for path in (mine, theirs, wal, zombies):
        path.write_bytes(b"half")
    try:
        assert sorted(remove_orphaned_temporaries(tmp_path)) == sorted([theirs, wal, zombies])
    finally:
        unreaped.wait()
    assert mine.exists()


def test_two_first_builds_at_once_on_a_fresh_home_both_succeed(tmp_path):
    home = tmp_path / "fresh"
    builds = [tkg(home, "build", "--company", company, "--workers", "1", wait=False) for company in ("HLIO", "QNTX")]
    outcomes = [(build.wait(timeout=600), build.stderr.read()) for build in builds]
    for code, stderr in outcomes:
        assert code == 0, stderr[-3000:]
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        assert connection.execute("SELECT count(DISTINCT company) FROM transcripts").fetchone()[0] == 2


# --- results do not depend on build history ---------------------------------------------------


def metrics_history(home: Path) -> list[tuple]:
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        return connection.execute("SELECT company, metric, segment, basis, kind, fiscal_year, fiscal_quarter, value, low, high, "
                                  "call_date, valid_at, invalid_at, invalidated_by FROM metrics ORDER BY ALL").fetchall()


def test_facts_and_metrics_do_not_depend_on_the_order_calls_were_built_in(tmp_path, sample_home):
    """The sample built newest quarters first, one company at a time (each step publishing over
    the last), equals the all-at-once build: facts, validity, retirements, metrics and revisions."""
    piecewise = tmp_path / "piecewise"
    for company, since in (("QNTX", "2024-07-01"), ("HLIO", None), ("QNTX", None)):
        assert tkg(piecewise, "build", "--company", company, *(("--since", since) if since else ())).returncode == 0
    assert facts_digest(piecewise) == facts_digest(sample_home)
    assert metrics_history(piecewise) == metrics_history(sample_home)
    assert len(metrics_history(sample_home)) > 40


@needs_corpus
def test_real_names_do_not_depend_on_build_history(tmp_path):
    """AMD's January 2017 call says 'Vijay Rakesh'; its July call 'Vijay Raghavan Rakesh'."""
    stepwise, at_once = tmp_path / "stepwise", tmp_path / "at_once"
    source = ["--source", str(CORPUS), "--company", "AMD", "--since", "2017-01-01"]
    assert tkg(stepwise, "build", *source, "--until", "2017-03-31").returncode == 0
    more = tkg(stepwise, "build", *source, "--until", "2017-09-30")
    assert more.returncode == 0 and "building 2 of 3 partition(s)" in more.stderr and "(1 up to date)" in more.stderr
    assert tkg(at_once, "build", *source, "--until", "2017-09-30").returncode == 0
    assert facts_digest(stepwise) == facts_digest(at_once)
    with duckdb.connect(str(at_once / "tkg.duckdb"), read_only=True) as connection:
        names = {name for (name,) in connection.execute("SELECT DISTINCT subject FROM facts WHERE subject LIKE 'Vijay%'").fetchall()}
    assert names == {"Vijay Raghavan Rakesh"}
