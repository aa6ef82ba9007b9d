"""The layout holds together: the Dagster assets follow the stage catalog, the phases import
each other without cycles, only the Dagster layer imports dagster, and the wheel ships no
test doubles."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import dagster as dg
import pytest

from tests.conftest import ROOT
from tkg.build import catalog
from tkg.providers import fingerprints
from tkg.settings import Settings
from tkg_assets.definitions import build_definitions

SNAPSHOT = ROOT / "tests" / "snapshots" / "definitions.json"


def _definitions() -> dg.Definitions:
    return build_definitions(Settings.resolve(source="sample", backend="offline"))


def test_the_asset_graph_follows_the_catalog():
    """Every stage of the catalog is an asset with the catalog's lineage, group, code version and
    partitioning; the warehouse reads every stage; nothing else is a pipeline asset."""
    settings = Settings.resolve(source="sample", backend="offline")
    graph = build_definitions(settings).resolve_asset_graph()
    versions = catalog.code_versions(fingerprints(settings))
    for stage in (*catalog.STAGES, catalog.WAREHOUSE):
        node = graph.get(dg.AssetKey(stage.name))
        assert {key.to_user_string() for key in node.parent_keys} == set(stage.inputs), stage.name
        assert node.group_name == stage.group, stage.name
        assert node.is_partitioned == (stage.partitioned or stage.sharded), stage.name
        if stage.sharded:
            assert node.partitions_def.get_partition_keys() == catalog.shard_keys(settings.shards), stage.name
        assert node.code_version == versions[stage.name], stage.name
    pipeline = {key.to_user_string() for key in graph.get_all_asset_keys() if key.path[0] != "sql"}
    assert pipeline == {stage.name for stage in (*catalog.STAGES, catalog.WAREHOUSE)}
    # the catalog's own order runs every stage after the stages it reads
    seen: set[str] = set()
    for stage in catalog.STAGES:
        assert set(stage.inputs) <= seen, stage.name
        seen.add(stage.name)


def _snapshot(defs: dg.Definitions) -> dict:
    """What a change to the definitions must show in review: assets, their lineage, groups,
    kinds, partitioning, pools and automation, and the jobs, schedules and sensors."""
    graph = defs.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        condition = node.automation_condition
        assets[key.to_user_string()] = {
            "group": node.group_name, "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "kinds": sorted(node.kinds), "partitioned": node.is_partitioned, "owners": sorted(node.owners),
            "pool": node.pools and sorted(node.pools) or None,
            "automation": condition.get_label() or type(condition).__name__ if condition else None,
            "description": (node.description or "").split(". ")[0],
        }
    jobs = {job.name: sorted(k.to_user_string() for k in job.asset_layer.executable_asset_keys) if job.asset_layer else []
            for job in (defs.resolve_job_def(name) for name in ("ingest_partition", "refresh_graph", "build_partitions", "refresh_and_publish"))}
    return {"assets": assets, "jobs": jobs,
            "schedules": sorted(schedule.name for schedule in defs.schedules or []),
            "sensors": sorted(sensor.name for sensor in defs.sensors or []),
            "resources": sorted(defs.resources or {})}


def test_the_definitions_match_their_snapshot():
    """A snapshot of the definitions, as dagster-open-platform keeps one: a change to the asset
    graph shows up in review as a change to tests/snapshots/definitions.json (rewrite it with
    TKG_UPDATE_SNAPSHOTS=1)."""
    current = _snapshot(_definitions())
    if os.environ.get("TKG_UPDATE_SNAPSHOTS"):
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    assert current == json.loads(SNAPSHOT.read_text())


def _imports(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same packages it imports, lazy imports included."""
    modules = {}
    for file in package.rglob("*.py"):
        name = ".".join(file.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = file
    edges: dict[str, set[str]] = {}
    for name, file in modules.items():
        found = set()
        for node in ast.walk(ast.parse(file.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(target for target in targets if target in modules and target != name)
        edges[name] = found
    return edges


def test_tkg_has_no_import_cycles():
    edges = _imports(ROOT / "tkg")
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        for target in edges[module]:
            if target in path:
                cycles.append(path[path.index(target):] + [target])
            elif target not in done:
                visit(target, path + [target])
        done.add(module)

    done: set[str] = set()
    for module in sorted(edges):
        if module not in done:
            visit(module, [module])
    assert not cycles, cycles[:5]


def test_only_the_dagster_layer_imports_dagster():
    """tkg's phases are plain Python: only tkg_assets and resources import dagster (the CLI
    drives Dagster through tkg_assets)."""
    importers = []
    for file in (ROOT / "tkg").rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name == "dagster" or name.startswith(("dagster.", "dagster_")) for name in names):
                importers.append(str(file.relative_to(ROOT)))
    assert not importers


@pytest.mark.slow
def test_the_wheel_ships_the_prompts_and_sql_and_no_test_doubles(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                                "--wheel-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-2000:]
    (wheel,) = tmp_path.glob("tkg-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("tkg-")}
    assert packages == {"tkg", "tkg_assets", "resources"}
    assert not [name for name in names if "fakes" in name or "/testing/" in name or name.startswith("tests/")]
    assert "tkg/_prompts/triplet_extraction.j2" in names and "tkg/_sql/facts.sql" in names
    assert "tkg/sample/transcripts.jsonl" in names and "tkg/config/companies.yaml" in names
