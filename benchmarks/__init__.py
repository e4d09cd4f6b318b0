"""Benchmark suite: `laya-grpc bench`."""
