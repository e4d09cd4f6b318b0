"""`laya-grpc serve`'s settings: every setting of the three services it runs, plus its own.

serve hands its children their settings whole, as environment variables (core/runtime/flags.py `to_env`),
so each child resolves exactly what serve resolved; only what differs per child (its socket, its
device) goes on the child's command line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from laya_grpc.core.runtime.flags import non_negative_int, positive_int, setting
from laya_grpc.core.runtime.settings import ServiceSettings
from laya_grpc.gateway.settings import GatewayOptions
from laya_grpc.inference.settings import EngineSettings
from laya_grpc.tokenizer.settings import TokenizerOnlySettings


@dataclass
class ServeOwnSettings:
    SECTION = "serve"

    tokenizer_workers: int = setting(0, "tokenizer processes; each gateway spreads requests over them (0 = auto: "
                                     "one per 4 CPUs, 1-4)", type=non_negative_int)
    gateway_workers: int = setting(0, "gateway processes sharing the HTTP and gRPC ports (Python work per request "
                                   "is the ceiling under many clients; 0 = auto: one per 4 CPUs, 1 to 4)",
                                   type=non_negative_int)
    inference_replicas: int = setting(1, "inference processes; the gateway spreads calls over those that are "
                                      "SERVING, so one can die or restart without failing requests. With --device "
                                      "listing several devices (cuda:0,cuda:1) there is one per listed device; "
                                      "otherwise N share --device (each holds its own copy of the weights)",
                                      type=positive_int)
    metrics: Optional[str] = setting(None, "one Prometheus endpoint for every process of this serve (each "
                                     "family exported by the service it describes, summed across gateway and "
                                     "tokenizer workers; off by default)", metavar="HOST:PORT")
    run_dir: Optional[str] = setting(None, "directory for the unix sockets (default: a fresh temporary "
                                     "directory, removed on exit)", metavar="DIR")


@dataclass
class ServeSettings(ServeOwnSettings, EngineSettings, TokenizerOnlySettings, GatewayOptions, ServiceSettings):
    """Everything `serve` takes."""


# Settings of serve itself, which its children do not take.
SERVE_ONLY = tuple(f for f in ServeOwnSettings.__dataclass_fields__)
