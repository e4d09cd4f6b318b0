"""Clients for a running laya-grpc gateway."""
from .client import AsyncLayaClient, LayaClient

__all__ = ["LayaClient", "AsyncLayaClient"]
