"""The Dagster partitions: company x calendar quarter of the call date (see tkg.core.partitions).

Keys look like 'INTC|2016-10-01' (dimensions sorted by name: company, then quarter). The space
follows the configured source: the registry's companies that have calls in it, from the
quarter of its first call to the quarter under way, so the UI shows what could be built, not
ten empty years of companies the source never mentions. When the source cannot be listed
cheaply (the Hugging Face hub), every registered company from 2016 on.
"""

from datetime import date

import dagster as dg

from tkg.build.catalog import shard_keys
from tkg.core.companies import load_companies
from tkg.core.partitions import FIRST_QUARTER
from tkg.ingest.sources import SourceError, load_source, source_path


def partition_space(source: str) -> dg.MultiPartitionsDefinition:
    companies, first = sorted(load_companies()), FIRST_QUARTER
    if source_path(source) is not None:
        try:
            partitions = load_source(source).partitions()
        except SourceError:
            partitions = []
        if partitions:
            companies = sorted({company for company, _ in partitions})
            first = min(quarter for _, quarter in partitions)
    # end_offset=1 includes the quarter under way: a call held now belongs to it.
    quarters = dg.TimeWindowPartitionsDefinition(start=first.isoformat(), cron_schedule="0 0 1 1,4,7,10 *", fmt="%Y-%m-%d",
                                                 end_offset=1)
    return dg.MultiPartitionsDefinition({"company": dg.StaticPartitionsDefinition(companies), "quarter": quarters})


def shard_space(shards: int) -> dg.StaticPartitionsDefinition:
    """The shards of the global half's shard steps ('00', '01', ...; TKG_SHARDS of them)."""
    return dg.StaticPartitionsDefinition(shard_keys(shards))


def partition_key(company: str, quarter: date) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"company": company, "quarter": quarter.isoformat()})
