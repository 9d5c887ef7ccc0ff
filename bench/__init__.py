"""forgetkit benchmarks: `python -m bench --help`."""
