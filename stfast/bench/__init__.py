"""Benchmarks a user runs on their own data and hardware (`stfast bench ...`)."""
