"""Correctness of the CUDA path on a real GPU, before anything is timed (the first step of a GPU run).

1. The Triton kernels (inference/cuda_kernels.py) against the eager torch ops they replace, on
   fresh random inputs (fp16; add_layer_norm also bf16 and fp32, and with the decision head's biases), every element compared.
2. Tiny checkpoints (sequential and parallel option layout): the CUDA runner (CUDA graphs, fused
   encoder packed and padded, reference encoder; fp16 and fp32) against the CPU fp32 runner on real
   tokenized rows, logits compared; a forward started without waiting (`start_rows`) keeps its
   outputs when another forward runs first; and (printed, not judged) how closely the fused encoder's fp16
   hidden states track the eager `encode`.

`python -m benchmarks.cuda_check --work-dir DIR`; prints one line per check, exits 1 on a failure.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def check_kernels(torch) -> list[str]:
    import torch.nn.functional as F
    from laya_grpc.inference import cuda_kernels as ck
    from laya_grpc.inference.torch_model import _rotate_half
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
    for dtype in (torch.float16, torch.float32):       # the decision head's bias + ReLU (exact: eager fp32 ops)
        x = torch.randn(160, 4096, device="cuda", generator=g) * 3
        b = torch.randn(4096, device="cuda", generator=g).to(dtype)
        same = torch.equal(ck.bias_relu(x, b, dtype), torch.relu(x + b.float()).to(dtype))
        print("bias_relu %s: bit-equal to relu(x + b) in fp32 %s" % (str(dtype)[6:], same), flush=True)
        if not same:
            bad.append("bias_relu %s" % str(dtype)[6:])
    bad += check_add_layer_norm(torch, g)
    bad += check_split_outputs(torch, g)
    return bad


def check_split_outputs(torch, g) -> list[str]:
    """The kernels that write a split GEMM's input (`split=`: add_layer_norm, gelu_gate, attention)
    against the same kernel's float32 output (with biases, |v| below reads |w n| + |b|: the sum may
    cancel, and its float32 error scales with its terms). What the GEMM multiplies is the pair's value hi + lo
    (the third part of split=3 repeats hi), so that is what must hold: |hi + lo - v| <= 2^-20 |v| +
    2^-24 for the plain kernel's v. The split kernel is another compile of the same code: the
    compiler may order a row's sums differently (the norm's mean and variance) or contract a product
    into an FMA, which moves its float32 value by a few ulps (2^-23 |v| each); lo's fp16 rounding
    adds at most 2^-23 |v|; 2^-24 is fp16's subnormal spacing. Hi bit for bit against `split_fp16` of
    v is printed too: a value a few ulps away may round hi to its neighbour, with lo making up for it."""
    from laya_grpc.inference import cuda_attention as ca
    from laya_grpc.inference import cuda_kernels as ck
    bad = []
    for terms in (2, 3):
        n, d, inter = 333, 1024, 2624
        x = torch.randn(n, d, device="cuda", generator=g) * 8
        o = torch.randn(n, d, device="cuda", generator=g)
        w = 1 + 0.3 * torch.randn(d, device="cuda", generator=g)
        xa, xb = x.clone(), x.clone()
        y = ck.add_layer_norm(xa, o, w, 1e-5)[1]
        ys = ck.add_layer_norm(xb, o, w, 1e-5, split=terms)[1]
        u = torch.randn(n, 2 * inter, device="cuda", generator=g) * 3
        qkv = torch.randn(2 * 160, 3 * 16 * 64, device="cuda", generator=g)
        cos, sin = torch.randn(512, 64, device="cuda", generator=g), torch.randn(512, 64, device="cuda", generator=g)
        lengths = torch.tensor([160, 97], dtype=torch.int32, device="cuda")
        ob, b = torch.randn(d, device="cuda", generator=g), torch.randn(d, device="cuda", generator=g)
        xc, xd = x.clone(), x.clone()
        yb = ck.add_layer_norm(xc, o, w, 1e-5, bias=b, o_bias=ob)[1]
        ybs = ck.add_layer_norm(xd, o, w, 1e-5, bias=b, o_bias=ob, split=terms)[1]
        # y = w n + b may cancel: its float32 error scales with |w n| + |b|, not |y|
        scale = {"add_layer_norm with biases": torch.nn.functional.layer_norm(xc, (d,), w, None, 1e-5).abs() + b.abs()}
        r = torch.randn(n, 4096, device="cuda", generator=g) * 3
        pairs = {"add_layer_norm": (ys, y, torch.equal(xa, xb)),
                 "add_layer_norm with biases": (ybs, yb, torch.equal(xc, xd)),
                 "bias_relu": (ck.bias_relu(r, ob.repeat(4), torch.float32, split=terms),
                               ck.bias_relu(r, ob.repeat(4), torch.float32), True),
                 "gelu_gate": (ck.gelu_gate(u, split=terms), ck.gelu_gate(u), True),
                 "attention": (ca.attention(qkv, cos, sin, lengths, 2, 160, 16, 64, True, 0.125, split=terms),
                               ca.attention(qkv, cos, sin, lengths, 2, 160, 16, 64, True, 0.125), True)}
        for name, (got, plain, residual_same) in pairs.items():
            if name == "attention":   # rows past a row's length are not written: compare the written ones
                keep = torch.cat([torch.arange(160), 160 + torch.arange(97)]).to("cuda")
                got, plain = got[keep], plain[keep]
            ref = ck.split_fp16(plain.contiguous(), terms)
            k = plain.shape[1]
            hi_same = torch.equal(got[:, :k], ref[:, :k])
            repeat_ok = terms == 2 or torch.equal(got[:, 2 * k:], got[:, :k])
            v = plain.double()
            err = (got[:, :k].double() + got[:, k:2 * k].double() - v).abs()
            bound = scale.get(name, v.abs()).double() * 2.0 ** -20 + 2.0 ** -24
            value_ok = bool((err <= bound).all())
            same = residual_same and repeat_ok and value_ok
            print("%s split=%d: hi + lo within 2^-20|v| + 2^-24 of the plain kernel %s (max |err|/|v| %.2g); "
                  "hi bit-equal to split_fp16 %s; hi repeated %s"
                  % (name, terms, value_ok, float((err / v.abs().clamp_min(2.0 ** -14)).max()), hi_same, repeat_ok),
                  flush=True)
            if not same:
                bad.append("%s split=%d" % (name, terms))
    return bad


def _spacing(torch, ref):
    """The spacing of ref's dtype at each element's magnitude, as float32."""
    mant = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}[ref.dtype]
    return torch.exp2(torch.floor(torch.log2(ref.float().abs().clamp_min(torch.finfo(ref.dtype).tiny))) - mant)


def ulps(torch, got, ref):
    """|got - ref| in units of the spacing of ref's dtype at ref's magnitude, per element."""
    return (got.float() - ref.float()).abs() / _spacing(torch, ref)


def _norm_bound(torch, ref, h, w, eps: float, b=None):
    """How far the kernel's y = LayerNorm(h) w (+ b) may lie from torch's `ref` (in ref's dtype): 1 ulp
    of ref (each side rounds once; a value near a midpoint may round the other way) + 2^-20 (|w| rstd
    max|h| + |b|). Both sides compute in float32 but reduce the mean and variance in other orders, and
    h - mean cancels where h lies near the mean, so the float32 error scales with the row's largest
    |h| (times rstd and |w|), not with y; w n + b cancels likewise. 2^-20 is 8 to 16 float32 ulps
    of those terms. (A bound relative to y alone fails on near-mean values: 12 bf16 ulp at 10,240 rows.)"""
    hf = h.float()
    rstd = torch.rsqrt(hf.var(dim=1, unbiased=False, keepdim=True) + eps)
    scale = w.float().abs() * rstd * hf.abs().amax(dim=1, keepdim=True)
    if b is not None:
        scale = scale + b.float().abs()
    return _spacing(torch, ref) + 2.0 ** -20 * scale


def check_add_layer_norm(torch, g) -> list[str]:
    """x += o in place must equal the eager `x + o` bit for bit (the same fp32 add, one rounding); y
    must equal the eager F.layer_norm of that sum within `_norm_bound`. The no-`o` variant (the
    embedding norm) the same against F.layer_norm(x); the decision head's variant (a float32 GEMM
    output plus its bias, then the norm's bias) against the same operations in float32."""
    import torch.nn.functional as F
    from laya_grpc.inference import cuda_kernels as ck
    bad = []
    eps = 1e-5
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for n, d in ((1, 1024), (160, 1024), (10240, 1024), (37, 96), (5, 200)):
            x = (torch.randn(n, d, device="cuda", generator=g) * 4 + 1).to(dtype)
            o = (torch.randn(n, d, device="cuda", generator=g) * 2).to(dtype)
            w = (1 + 0.3 * torch.randn(d, device="cuda", generator=g)).to(dtype)
            ob, b = (torch.randn(d, device="cuda", generator=g) * 0.5).to(dtype), \
                (torch.randn(d, device="cuda", generator=g) * 0.5).to(dtype)
            h = x + o
            hb = (x.float() + (o.float() + ob.float())).to(dtype)
            x0, xb = x.clone(), x.clone()
            xx, y = ck.add_layer_norm(x, o, w, eps)
            y0 = ck.layer_norm(x0, w, eps)
            yb = ck.add_layer_norm(xb, o.float(), w, eps, bias=b, o_bias=ob)[1]
            h_ok = xx is x and torch.equal(x, h) and torch.equal(xb, hb)
            cases = {"add": (y, F.layer_norm(h, (d,), w, None, eps), h, None),
                     "norm": (y0, F.layer_norm(x0, (d,), w, None, eps), x0, None),
                     "biases": (yb, F.layer_norm(hb.float(), (d,), w.float(), b.float(), eps).to(dtype), hb, b)}
            worst, line = 0.0, []
            for name, (got, ref, hh, bias) in cases.items():
                r = float(((got.float() - ref.float()).abs() / _norm_bound(torch, ref, hh, w, eps, bias)).max())
                worst = max(worst, r)
                line.append("%s %d differing, %.2f ulp, %.3f of the bound" % (name, int((got != ref).sum()),
                                                                             float(ulps(torch, got, ref).max()), r))
            print("add_layer_norm %s n=%d d=%d: h bit-equal %s; y: %s" % (str(dtype)[6:], n, d, h_ok, "; ".join(line)),
                  flush=True)
            if not (h_ok and worst <= 1.0 and all(bool(torch.isfinite(v).all()) for v in (y, y0, yb))):
                bad.append("add_layer_norm %s" % ((str(dtype)[6:], n, d),))
    return bad


def check_runners(torch, work: str) -> list[str]:
    from laya_grpc.cli.make_checkpoint import make_checkpoint
    from laya_grpc.core.wire.packed_rows import PackedRows
    from laya_grpc.core.decisions.questions import parse_questions
    from laya_grpc.core.checkpoints.sources import open_source
    from laya_grpc.inference.runners import TorchRunner
    from laya_grpc.tokenizer.encoding import TextEncoder
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
        prows = PackedRows.from_rows(rows)
        # the fast mode (float16) in every kernel and row layout; auto, the exact mode on CUDA (float32)
        for kernels, pack, budget, dtype in (("fused", "auto", 16384, "float16"), ("fused", "auto", 256, "float16"),
                                             ("fused", "off", 16384, "float16"), ("reference", "auto", 16384, "float16"),
                                             ("fused", "auto", 16384, None)):
            r = TorchRunner(path, "cuda", dtype, cuda_kernels=kernels, pack_rows=pack, max_batch_tokens=budget)
            n_graphs = r.warm()
            # the serving call: rows in (packed, split by the plan under a small budget, or padded)
            lg, act = r.run_rows(prows, int(ck.special.pad_id))
            K = batch["marker_mask"].sum(1)
            err = max(float(np.abs(lg[i, :k] - ref[i, :k]).max()) for i, k in enumerate(K))
            name = "%s %s %s" % (r.kernels, r.dtype(), " packed (budget %d)" % budget if r.packing is not None
                                 else " padded")
            print("%s %s: %d graphs, %d rows, max|dlogit| vs cpu fp32 %.5f, finite %s"
                  % (preset, name, n_graphs, len(K), err, bool(np.isfinite(lg).all() and np.isfinite(act).all())),
                  flush=True)
            tol = 1e-3 if r.dtype() == "float32" else 0.05
            if r.kernels != kernels or not err < tol or not np.isfinite(lg).all():
                bad.append("%s %s" % (preset, name))
            if r.packing is not None and budget == 16384:
                # start_rows queues the forward; a forward of other rows in the same bucket, run before
                # its result is read, must not overwrite its outputs (bit-equal: same graph, same rows)
                started = r.start_rows(prows, int(ck.special.pad_id))
                rev = PackedRows.from_rows(rows[::-1])
                other = r.run_rows(rev, int(ck.special.pad_id))
                got = started.result()
                same = (np.array_equal(got[0], lg) and np.array_equal(got[1], act)
                        and np.array_equal(other[0], r.run_rows(rev, int(ck.special.pad_id))[0]))
                print("%s %s: start_rows then another forward: outputs kept %s" % (preset, name, same), flush=True)
                if not same:
                    bad.append("%s %s start_rows" % (preset, name))
            r.close()
        encoder_rounding(torch, path, batch)
    return bad


def encoder_rounding(torch, path: str, batch) -> None:
    """Printed, not judged: fp16 hidden states of `encode_fused` (eager, no graphs) against the eager
    fp16 `encode` and against CPU fp32 `encode`, on the real positions."""
    from laya_grpc.inference.torch_model import LayaTorch
    model = LayaTorch.from_checkpoint(path, "cuda", torch.float16)
    cpu = LayaTorch.from_checkpoint(path, "cpu", torch.float32)
    t = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in batch.items()}
    args = (t["input_ids"], t["attention_mask"], t.get("position_ids"), t.get("option_ids"))
    real = t["attention_mask"].bool()
    with torch.inference_mode():
        ref16 = model.encode(*args).float()
        ref32 = cpu.encode(*(None if v is None else v.cpu() for v in args)).cuda()
        model.use_fused_kernels()
        got = model.encode_fused(*args).float()
        for name, ref in (("fp16 encode", ref16), ("cpu fp32 encode", ref32)):
            e = (got - ref)[real].abs()
            print("  encode_fused fp16 vs %s: mean|diff| %.3g max %.3g, bit-equal %.1f%%"
                  % (name, float(e.mean()), float(e.max()), 100 * float((e == 0).float().mean())), flush=True)


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
