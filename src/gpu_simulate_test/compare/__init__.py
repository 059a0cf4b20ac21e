"""Analysis: metrics, comparisons and reports over run artifacts."""
