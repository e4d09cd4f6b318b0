"""The tokenizer service's settings; its flags and environment variables are generated from them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from laya_grpc.core.runtime import cpu_quota
from laya_grpc.core.runtime.flags import positive_int, setting
from laya_grpc.core.runtime.settings import ServiceSettings, ipc_setting, listen_setting, metrics_setting

LISTEN = "127.0.0.1:50053"


@dataclass
class TokenizerOnlySettings:
    """The tokenizer's own settings, which `serve` passes to its tokenizer workers."""
    SECTION = "tokenizer"

    tokenizer_threads: int = setting(cpu_quota.pool_size(4),
                                     "threads running encode_batch in each tokenizer process (the tokenizers "
                                     "library releases the GIL; default: the CPUs this process may use, affinity and cgroup CPU "
                                     "quota, at most 4)", type=positive_int, deprecated=("--threads",))


@dataclass
class TokenizerSettings(TokenizerOnlySettings, ServiceSettings):
    SECTION = "this process"

    listen: str = listen_setting(LISTEN, "tokenizer")
    metrics: Optional[str] = metrics_setting("tokenizer")
    ipc: Optional[str] = ipc_setting("tokenizer", "Tokenize")
