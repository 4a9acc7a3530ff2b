"""mqstore benchmark suite (pytest-benchmark). Run explicitly: ``python -m pytest bench``.

A package so its module names (bench.test_put, ...) never clash with tests/ when both
directories are collected in one run.
"""
