"""/metrics scraped at the endpoint picker's rate during load: `python -m bench.scrape.run`."""
