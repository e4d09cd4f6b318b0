"""Shared core of laya-grpc: checkpoints, request rules, decoding, CLI. Never imports torch at module level."""
__version__ = "0.1.0"
