"""What a person reads: the HTML report page and its charts (from the service's report data),
result files (JSON lines, CSV, Parquet) and a run followed live in the terminal."""
