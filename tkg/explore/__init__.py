"""`tkg explore`: a read-only web page over the published tkg.duckdb.

Search (alias-aware), an entity's timeline with an as-of control, a company's officers, calls
and guidance chains, a subgraph as of a date, and the statement, speaker and call behind every
fact. Every view is a plain GET URL that can be bookmarked. Pages are rendered on the server
(HTML and SVG); the stylesheet ships in this package, so the page needs no network.
"""
