"""Correctness of the CUDA path on a real GPU, before anything is timed (the device machine's first step).

1. The Triton kernels (inference_svc/cuda_kernels.py) against the eager torch ops they replace, on
   fresh random fp16 inputs, outputs poisoned first so an unwritten element fails.
2. Tiny checkpoints (sequential and parallel option layout): the CUDA runner (CUDA graphs, fused and
   reference encoders) against the CPU fp32 runner on real tokenized rows, logits compared.

`python -m benchmarks.cuda_check --work-dir DIR`; prints one line per check, exits 1 on a failure.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def check_kernels(torch) -> list[str]:
    import torch.nn.functional as F
    from inference_svc import cuda_kernels as ck
    from inference_svc.torch_model import _rotate_half
    bad = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, L, H, hd, par in ((1, 160, 16, 64, False), (8, 96, 16, 64, True), (3, 40, 3, 12, True)):
        qkv = torch.randn(B * L, 3 * H * hd, device="cuda", generator=g).half()
        cos = torch.randn(512, hd, device="cuda", generator=g).half()
        sin = torch.randn(512, hd, device="cuda", generator=g).half()
        pos = torch.randint(0, L, (B, L), device="cuda", generator=g) if par else None
        out = ck.rope_qk(qkv, cos, sin, pos, B, L, H)
        p = pos.reshape(-1) if par else torch.arange(L, device="cuda").repeat(B)
        c, s = cos[p][:, None].float(), sin[p][:, None].float()
        x = qkv.view(B * L, 3, H, hd)[:, :2].float()
        ref = torch.stack([(x[:, i] * c + _rotate_half(x[:, i]) * s).half() for i in range(2)])
        err = float((out.float() - ref.float()).abs().max())
        ulp = float((ref.float().abs() * 2 ** -10).max()) + 1e-3
        print("rope_qk B=%d L=%d H=%d hd=%d pos=%s max|err| %.3g" % (B, L, H, hd, par, err), flush=True)
        if not err <= ulp:
            bad.append("rope_qk %s" % ((B, L, H, hd, par),))
    for n, inter in ((1, 2624), (160, 2624), (37, 96)):
        x = torch.randn(n, 2 * inter, device="cuda", generator=g).half()
        out = ck.gelu_gate(x)
        u, gate = x.chunk(2, dim=-1)
        ref = F.gelu(u) * gate
        diff = (out != ref).sum().item()
        err = float((out.float() - ref.float()).abs().max())
        print("gelu_gate n=%d I=%d elements differing %d max|err| %.3g" % (n, inter, diff, err), flush=True)
        if not err <= 1e-2 or not torch.isfinite(out).all():
            bad.append("gelu_gate %s" % ((n, inter),))
    return bad


def check_runners(torch, work: str) -> list[str]:
    from laya_grpc.make_checkpoint import make_checkpoint
    from laya_grpc.packed_rows import PackedRows
    from laya_grpc.questions import parse_questions
    from laya_grpc.sources import open_source
    from inference_svc.runners import TorchRunner
    from tokenizer_svc.encoding import TextEncoder
    bad = []
    questions = parse_questions({
        "c%d" % n: {"type": "choice", "instructions": "Pick one of %d." % n,
                    "criteria": {"o%d" % i: "option number %d" % i for i in range(n)}} for n in (2, 5, 9)})
    states = ["Short.", "My parcel never arrived and I want my money back today. " * 30,
              {"customer": "Ana", "order": 4711, "notes": ["late", "damaged box"]}]
    for preset in ("tiny", "tiny-par"):
        path = make_checkpoint(os.path.join(work, preset), preset)
        ck = open_source(path)
        enc = TextEncoder(ck.tokenizer_dir, max_len=ck.max_len, head_max_len=ck.head_max_len, parallel_layout=ck.parallel)
        rows = [r for e in enc.encode_many(states, questions) for r in e.rows]
        batch = PackedRows.from_rows(rows).pad(int(ck.special.pad_id))
        ref, _ = TorchRunner(path, "cpu", None).forward(batch)
        for kernels in ("fused", "reference"):
            r = TorchRunner(path, "cuda", None, cuda_kernels=kernels)
            n_graphs = r.warm()
            lg, act = r.forward(batch)
            K = batch["marker_mask"].sum(1)
            err = max(float(np.abs(lg[i, :k] - ref[i, :k]).max()) for i, k in enumerate(K))
            print("%s %s: %d graphs, %d rows, max|dlogit| vs cpu fp32 %.4f, finite %s"
                  % (preset, r.kernels, n_graphs, len(K), err, bool(np.isfinite(lg).all() and np.isfinite(act).all())),
                  flush=True)
            if r.kernels != kernels or not err < 0.05 or not np.isfinite(lg).all():
                bad.append("%s %s" % (preset, kernels))
            r.close()
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cuda_check")
    p.add_argument("--work-dir", default="/tmp/cuda_check")
    a = p.parse_args(argv)
    import torch
    bad = check_kernels(torch) + check_runners(torch, a.work_dir)
    print("cuda_check:", "FAILED " + ", ".join(bad) if bad else "all passed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
