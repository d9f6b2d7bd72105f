"""The aiocheckpoint benchmark suite: run ``python bench/run.py --help``."""
