"""Benchmarks: `streamjobs bench NAME [--quick] --json PATH`. Each reports what it measured on this machine."""
