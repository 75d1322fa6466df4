"""`python cli.py bench`: the measured case for paging (memory, sharing, prefix
caching, throughput) against baselines run in the same process."""
