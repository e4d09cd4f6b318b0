"""Which 16-bit rounding of the fused CUDA forward carries the error, simulated on the CPU.

The network runs in float64 with fp16 rounding applied exactly where the served CUDA forward rounds
(inference/precision.py, torch_model._fused_stack and forward_packed), one group of roundings
switchable at a time, against the same network in float64 with none:

- `gemm_in`: the encoder GEMMs' inputs (the normed residual, attention's output, the GELU gate's
  output) in fp16 (the weights are fp16 already);
- `gemm_out`: the Wqkv and Wi outputs stored in fp16 (fp32 accumulation, then rounded);
- `attn`: attention's probabilities rounded to fp16 before the PV product (flash-attention form);
- `head_in`: the encoder output rounded to fp16 where it enters the decision head;
- `head_res`: the decision head's residual stream and its GEMMs' outputs in fp16;
- `head_gin`: the decision head's GEMM inputs (its norms' outputs, attention's output, the ReLU's) in fp16;
- `scorer`: the scorer's input in fp16.

Reported: max |dp| and max |d(z/T)| (logits over temperature, centred per row: dp <= |d(z/T)| / 2
whatever the probabilities, so it says how a sharper checkpoint would fare). Probabilities are softmax(logits / T) with the checkpoint's temperature for the row's type and
option count (what decoding serves). `served16` is every rounding the served fp16 default does.
Rounding to fp16 is exact in float64 (round to nearest even), so each figure is the error of that
rounding alone; accumulation order is not modelled (float32 accumulation adds ~K 2^-24 relative).

`python -m benchmarks.precision_sim --ckpt DIR [--lengths 48,160,400] [--options 8]`
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

GROUPS = ("gemm_in", "gemm_out", "attn", "head_in", "head_res", "head_gin", "scorer")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.precision_sim")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--lengths", default="48,160,400")
    p.add_argument("--options", type=int, default=8)
    p.add_argument("--variants", default="served16," + ",".join(GROUPS) + ",served16-head,served16-head_res,served16-gemm_in")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from benchmarks.model_speed import rows
    from laya_grpc.core.decisions.temperatures import Temperatures
    from laya_grpc.inference.torch_model import LayaTorch, _rotate_half
    torch.set_num_threads(a.threads)
    m = LayaTorch.from_checkpoint(a.ckpt, "cpu", torch.float64).double()
    spec = m.spec
    with open(os.path.join(a.ckpt, "rl_agent_config.json")) as f:
        temps = Temperatures.from_config(json.load(f))
    lengths = [int(x) for x in a.lengths.split(",")]
    b = rows(lengths, a.options, spec.vocab_size, seed=11)
    tb = {k: torch.from_numpy(v) for k, v in b.items()}
    qtypes = [int(q) for q in b["qtype"]]

    def run(on: set) -> np.ndarray:
        r16 = (lambda name: (lambda t: t.half().double()) if name in on else (lambda t: t))
        g_in, g_out, att, h_in, hd, hg, sc = (r16(g) for g in GROUPS)
        enc = m.encoder
        ids, mask = tb["input_ids"], tb["attention_mask"]
        B, L = ids.shape
        H, dh = spec.heads, spec.head_dim
        x = enc.embeddings.norm(enc.embeddings.tok_embeddings(ids))
        masks = m._masks(mask, None, None, L)
        for i, (layer, kind) in enumerate(zip(enc.layers, spec.layer_types)):
            y = x if layer.attn_norm is None else layer.attn_norm(x)
            qkv = g_out(F.linear(g_in(y), layer.attn.Wqkv.weight))
            q, k, v = qkv.view(B, L, 3, H, dh).transpose(1, 3).unbind(dim=2)
            cos, sin = m._rope(spec.rope_theta[kind], L, x.device, torch.float64)
            q = g_out(q * cos + _rotate_half(q) * sin)
            k = g_out(k * cos + _rotate_half(k) * sin)
            s = (q @ k.transpose(-1, -2)) * dh ** -0.5
            s = s.masked_fill(~masks[kind], float("-inf"))
            e = torch.exp(s - s.amax(-1, keepdim=True))
            o = g_in((att(e) @ v) / e.sum(-1, keepdim=True))
            x = x + F.linear(o.transpose(1, 2).reshape(B, L, -1), layer.attn.Wo.weight)
            u, g = g_out(F.linear(g_in(layer.mlp_norm(x)), layer.mlp.Wi.weight)).chunk(2, dim=-1)
            x = x + F.linear(g_in(F.gelu(u) * g), layer.mlp.Wo.weight)
        h = h_in(enc.final_norm(x))
        h = hd(h + m.type_emb(tb["qtype"])[:, None, :])
        pad = ~mask.bool()
        for layer in (m.head.layers if m.head is not None else ()):
            sa, nh = layer.self_attn, spec.head_heads
            d = h.shape[-1]
            y = hg(layer.norm1(h))
            qh, kh, vh = (t.view(B, L, nh, d // nh).transpose(1, 2)
                          for t in hd(F.linear(y, sa.in_proj_weight, sa.in_proj_bias)).chunk(3, dim=-1))
            s = (qh @ kh.transpose(-1, -2)) * (d // nh) ** -0.5
            s = s.masked_fill(pad[:, None, None, :], float("-inf"))
            e = torch.exp(s - s.amax(-1, keepdim=True))
            ah = hg((att(e) @ vh) / e.sum(-1, keepdim=True))
            h = hd(h + hd(F.linear(ah.transpose(1, 2).reshape(B, L, d), sa.out_proj.weight, sa.out_proj.bias)))
            f = hg(F.relu(hd(F.linear(hg(layer.norm2(h)), layer.linear1.weight, layer.linear1.bias))))
            h = hd(h + hd(F.linear(f, layer.linear2.weight, layer.linear2.bias)))
        idx = tb["marker_pos"].clamp(min=0)[:, :, None].expand(-1, -1, h.size(-1))
        logits = m.scorer(sc(torch.gather(h, 1, idx))).squeeze(-1)
        out, zs = [], []
        for r in range(B):
            kk = int(tb["marker_mask"][r].sum())
            t = temps.for_question(qtypes[r], kk)
            z = logits[r, :kk].numpy() / t
            e = np.exp(z - z.max())
            out.append(e / e.sum())
            zs.append(z - z.mean())
        return out, zs

    named = {"none": set(), "served16": set(GROUPS),
             "served16-head": set(GROUPS) - {"head_res", "head_gin", "head_in", "scorer"},
             "served16-head_res": set(GROUPS) - {"head_res", "head_in"},
             "served16-gemm_in": set(GROUPS) - {"gemm_in"}}
    named.update({g: {g} for g in GROUPS})
    ref = None
    t0 = time.perf_counter()
    with torch.inference_mode():
        ref, zref = run(set())
        print("reference probs (T applied): %s" % ["%s" % np.round(r, 3).tolist() for r in ref], flush=True)
        res = {}
        for v in a.variants.split(","):
            if v == "none":
                continue
            got, z = run(named[v])
            dp = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
            dz = max(float(np.abs(g - r).max()) for g, r in zip(z, zref))
            res[v] = {"dp": dp, "dz_over_t": dz}
            print("%-18s max|dp| %.5f  max|d(z/T)| %.5f  (%.0fs)" % (v, dp, dz, time.perf_counter() - t0), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps({"ckpt": a.ckpt, "lengths": lengths, "options": a.options, "max_abs_dp": res}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
