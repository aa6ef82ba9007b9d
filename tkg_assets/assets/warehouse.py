"""The published DuckDB file and its SQL models (dbt-style: one asset per sql/*.sql file)."""


import base64
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import duckdb

from resources.tkg import (
    ExtractionBackend,
    TkgStorage,
    TranscriptSource,
    fetch_warehouse,
    settings_of,
    share_warehouse,
)
from tkg.build.catalog import WAREHOUSE
from tkg.build.graph import run_warehouse
from tkg.settings import Settings
from tkg.store.checks import CHECKS, CheckResult, WarehouseCheckFailed, guard
from tkg.store.warehouse import (
    PublishResult,
    SqlModel,
    applied_sha256s,
    describe_models,
    load_models,
    reapply_model,
    warehouse_code_version,
)
from tkg_assets.assets.common import OWNERS, column_schema, version_tags
from tkg_assets.instance import DUCKDB_POOL


WAREHOUSE_KEY = dg.AssetKey(WAREHOUSE.name)


def _check_evaluation(result: CheckResult) -> dg.AssetCheckEvaluation:
    """A check's result as an event an op logs for the warehouse asset."""
    evaluation = _check_result(result)
    return dg.AssetCheckEvaluation(asset_key=WAREHOUSE_KEY, check_name=result.name, passed=result.passed,
                                   severity=evaluation.severity, metadata=evaluation.metadata)


def _check_result(result: CheckResult) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=result.name, passed=result.passed,
        severity=dg.AssetCheckSeverity.ERROR if result.blocking else dg.AssetCheckSeverity.WARN,
        metadata={"failures": result.failures, "examples": dg.MetadataValue.md("\n".join(f"- {e}" for e in result.examples) or "none")})


@dg.asset(
    group_name="warehouse",
    kinds={"duckdb"},
    owners=OWNERS,
    deps=list(WAREHOUSE.inputs),
    code_version=warehouse_code_version(),
    description=WAREHOUSE.description,
    pool=DUCKDB_POOL,
    check_specs=[dg.AssetCheckSpec(check.name, asset="warehouse", description=check.description, blocking=check.blocking)
                 for check in CHECKS],
)
def warehouse(context: dg.AssetExecutionContext, storage: TkgStorage, source: TranscriptSource,
              extraction: ExtractionBackend) -> dg.MaterializeResult:
    published, metadata, results = publish_checked(context, settings_of(storage, source, extraction))
    return dg.MaterializeResult(
        data_version=dg.DataVersion(published.stamp.version), check_results=[_check_result(r) for r in results],
        metadata=metadata)


def publish_checked(context: dg.OpExecutionContext | dg.AssetExecutionContext,
                    settings: Settings) -> tuple[PublishResult, dict[str, object], list[CheckResult]]:
    """Publish tkg.duckdb with its checks (the warehouse asset's work, and the publish at the end
    of the `refresh_and_publish` job): what was published, its metadata and the check results.
    A failing blocking check logs every check's evaluation and raises a Failure: the last good
    file stays."""
    results: list[CheckResult] = []
    try:
        published = run_warehouse(settings, check=guard(results))
    except WarehouseCheckFailed as failure:
        for result in failure.results:
            context.log_event(_check_evaluation(result))
        raise dg.Failure(description=str(failure)) from None
    share_warehouse(settings)
    metadata = {"path": dg.MetadataValue.path(str(published.path)), "size_bytes": published.size_bytes,
                "raw_rows": dg.MetadataValue.json(published.raw_rows), "models": ", ".join(published.models),
                "publish": published.summary(), "raw_tables": dg.MetadataValue.json(published.tables),
                "in_place": dg.MetadataValue.json(published.in_place), "seconds": dg.MetadataValue.json(published.seconds)}
    growth = _growth_markdown(context, published.path)
    if growth is not None:
        metadata["growth"] = growth
    return published, metadata, results


def publish_events(context: dg.OpExecutionContext, settings: Settings) -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """`publish_checked` from an op: the warehouse's materialisation (with the code and data
    versions the asset would record), its check evaluations, then every SQL model's."""
    published, metadata, results = publish_checked(context, settings)
    yield dg.AssetMaterialization(asset_key=WAREHOUSE_KEY, metadata=metadata,
                                  tags=version_tags(WAREHOUSE, published.stamp))
    for result in results:
        yield _check_evaluation(result)
    for model, metadata in model_metadata(context, settings, MODELS):
        yield dg.AssetMaterialization(asset_key=model_key(model), metadata=metadata,
                                      tags={"dagster/code_version": model.sha256[:16]})


def _growth_markdown(context: dg.AssetExecutionContext, path: Path) -> dg.MarkdownMetadataValue | None:
    """A small chart of facts and retirements per quarter from the published file, inlined as a
    data URI in markdown; None (with a warning) when it cannot be drawn: a picture never fails
    the publish."""
    try:
        from tkg.answer.pictures import growth_chart

        with duckdb.connect(str(path), read_only=True) as connection:
            png = growth_chart(connection, dpi=80)
    except Exception as error:  # noqa: BLE001 - any failure to draw only costs the chart
        context.log.warning(f"no growth chart in the metadata: {type(error).__name__}: {error}")
        return None
    encoded = base64.b64encode(png).decode("ascii")
    return dg.MetadataValue.md(f"![facts and retirements per quarter](data:image/png;base64,{encoded})")


def model_key(model: SqlModel) -> dg.AssetKey:
    return dg.AssetKey(["sql", model.name])


def _model_spec(model: SqlModel) -> dg.AssetSpec:
    # Lineage as in dbt: a model depends on the models it selects from (refs) and on the
    # warehouse, which publishes the raw tables it reads (sources). The pipeline assets behind
    # those raw tables are named in metadata; as direct deps they would make automation refresh
    # the model whenever a partition lands, before the warehouse has republished.
    return dg.AssetSpec(
        key=model_key(model),
        group_name="sql_models",
        kinds={"duckdb", "sql"},
        owners=OWNERS,
        deps=[WAREHOUSE_KEY, *(dg.AssetKey(["sql", name]) for name in model.depends_on)],
        description=f"{model.description}\n\n```sql\n{model.sql}\n```",
        code_version=model.sha256[:16],
        metadata={
            "sql_file": dg.MetadataValue.path(str(model.path)),
            "reads_raw_tables_of": ", ".join(model.upstream_assets) or "other models only",
        },
    )


MODELS = load_models()


@dg.multi_asset(name="sql_models", specs=[_model_spec(model) for model in MODELS], can_subset=True, pool=DUCKDB_POOL)
def sql_models(context: dg.AssetExecutionContext, storage: TkgStorage):
    """The SQL models of the published file (one asset per sql/*.sql file, in one step): each
    re-applies its SQL if the file changed since the publish, and reports its row count and
    column schema."""
    selected = [model for model in MODELS if model_key(model) in context.selected_asset_keys]
    for model, metadata in model_metadata(context, settings_of(storage), selected):
        yield dg.MaterializeResult(asset_key=model_key(model), metadata=metadata)


def model_metadata(context: dg.OpExecutionContext | dg.AssetExecutionContext, settings: Settings,
                   selected: list[SqlModel]) -> Iterator[tuple[SqlModel, dict[str, object]]]:
    """Each of the `selected` SQL models of the published file, re-applied first if its SQL
    changed since the publish, with its row count and column schema."""
    target = settings.warehouse
    fetch_warehouse(settings)
    if not target.exists():
        raise FileNotFoundError(f"{target} does not exist; materialise `warehouse` first")
    applied = applied_sha256s(target)
    changed = [model for model in selected if applied.get(model.name) != model.sha256]
    for model in changed:  # dependency order
        context.log.info(f"sql/{model.name}.sql changed since the last publish; re-applying it")
        reapply_model(target, model)
    if changed:
        share_warehouse(settings)
    descriptions = describe_models(target, selected)
    for model in selected:
        description = descriptions[model.name]
        metadata: dict[str, object] = {"kind": model.kind.lower()}
        if description.row_count is not None:
            metadata["dagster/row_count"] = description.row_count
        if description.columns:
            metadata["dagster/column_schema"] = column_schema(description.columns)
        yield model, metadata
