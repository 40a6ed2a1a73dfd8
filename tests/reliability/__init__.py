"""Fault and fuzz suite (issue 9): hostile outputs, bad input, reward, numerical and process faults.

A package, so its helper modules are importable as ``reliability.<module>`` from the tests and,
through ``PYTHONPATH`` (set by ``tests/conftest.py``), from sandbox workers and subprocesses.
"""
