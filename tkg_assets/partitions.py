"""The Dagster partitions: company x calendar quarter of the call date (see tkg.partitions).

Keys look like 'INTC|2016-10-01' (dimensions sorted by name: company, then quarter).
"""

from datetime import date

import dagster as dg

from tkg.companies import load_companies
from tkg.partitions import FIRST_QUARTER, parse_key

company_partitions = dg.StaticPartitionsDefinition(sorted(load_companies()))
# end_offset=1 includes the quarter under way: a call held now belongs to it.
quarter_partitions = dg.TimeWindowPartitionsDefinition(
    start=FIRST_QUARTER.isoformat(), cron_schedule="0 0 1 1,4,7,10 *", fmt="%Y-%m-%d", end_offset=1
)
company_quarter = dg.MultiPartitionsDefinition({"company": company_partitions, "quarter": quarter_partitions})


def partition_key(company: str, quarter: date) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"company": company, "quarter": quarter.isoformat()})


def partition_of(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> tuple[str, date]:
    """(ticker, quarter start) of the partition being materialised or checked."""
    return parse_key(str(context.partition_key))
