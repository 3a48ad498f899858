"""Speed benchmarks: print a table, write JSON. Commands in docs/PERFORMANCE.md."""
