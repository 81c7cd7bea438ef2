"""What several test files share and conftest.py does not hold: the process-group harness that the `*_cases.py`
files run their cases under (`helpers.process_group`), and hand-made runs' `metrics.jsonl` (`helpers.metrics`)."""
