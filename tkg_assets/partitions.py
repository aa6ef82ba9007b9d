"""Partitions: company x calendar quarter of the call date.

Keys look like 'INTC|2016-10-01' (dimensions sorted by name: company, then quarter). The
calendar quarter is unambiguous per company, whereas fiscal labels are not (NVIDIA's and AMD's
'Q1 2019' are different periods); the fiscal label is kept as data in `transcripts`.
"""


from datetime import date

import dagster as dg

from tkg.companies import load_companies

FIRST_QUARTER = "2016-01-01"

company_partitions = dg.StaticPartitionsDefinition(sorted(load_companies()))
# end_offset=1 includes the quarter under way: a call held now belongs to it.
quarter_partitions = dg.TimeWindowPartitionsDefinition(
    start=FIRST_QUARTER, cron_schedule="0 0 1 1,4,7,10 *", fmt="%Y-%m-%d", end_offset=1
)
company_quarter = dg.MultiPartitionsDefinition({"company": company_partitions, "quarter": quarter_partitions})


def partition_key(company: str, quarter: date) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"company": company, "quarter": quarter.isoformat()})


def partition_of(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> tuple[str, date]:
    """(ticker, quarter start) of the partition being materialised or checked."""
    key = context.partition_key
    dimensions = key.keys_by_dimension if isinstance(key, dg.MultiPartitionKey) else (
        company_quarter.get_partition_key_from_str(str(key)).keys_by_dimension
    )
    return dimensions["company"], date.fromisoformat(dimensions["quarter"])
