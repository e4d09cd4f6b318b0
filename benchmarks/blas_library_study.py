"""The served GEMMs under each BLAS library torch can prefer on CUDA (`torch.backends.cuda.
preferred_blas_library`: cuBLAS, torch's default, or cuBLASLt): which picks the faster kernels at
the served shapes.

Per linear of a `large` layer (d 1024, intermediate 2624) and token count of the packed buckets:
  exact  mm([x_hi | x_lo], [W | W]^T) with a float32 result, the exact mode's split GEMM (split_gemm.py)
  fp16   mm(x16, W^T), the fast mode's Wqkv / Wi GEMM
Microseconds per call (20 calls in one CUDA graph, median of 15 replays: attention_check.graph_time),
each library in turn, and whether the two libraries' results are equal bit for bit.

    python3 -m benchmarks.blas_library_study
"""
from __future__ import annotations

from benchmarks.attention_check import graph_time
from benchmarks.exact_kernels_study import LINEARS

TOKENS = (160, 896, 2048, 16384)
LIBRARIES = ("cublas", "cublaslt")


def main() -> None:
    import torch
    torch.manual_seed(0)
    before = torch.backends.cuda.preferred_blas_library()
    print("torch %s, default library %s" % (torch.__version__, before))
    print("| linear | tokens | form | " + " | ".join("%s us" % lib for lib in LIBRARIES) + " | lt / default | equal |")
    print("|---|---|---|---|---|---|---|")
    totals = {(n, f, lib): 0.0 for n in TOKENS for f in ("exact", "fp16") for lib in LIBRARIES}
    for n in TOKENS:
        for name, k, m in LINEARS:
            w = (torch.randn(m, k, device="cuda") * k ** -0.5).half()
            x = torch.randn(n, k, device="cuda")
            hi = x.half()
            x2 = torch.cat([hi, (x - hi.float()).half()], dim=1)
            w2t = torch.cat([w, w], dim=1).t()
            forms = {"exact": lambda: torch.mm(x2, w2t, out_dtype=torch.float32), "fp16": lambda: torch.mm(hi, w.t())}
            for form, fn in forms.items():
                us, outs = {}, {}
                for lib in LIBRARIES:
                    torch.backends.cuda.preferred_blas_library(lib)
                    us[lib] = graph_time(torch, fn)
                    outs[lib] = fn()
                    totals[(n, form, lib)] += us[lib]
                torch.backends.cuda.preferred_blas_library(before)
                print("| %s | %d | %s | %s | %.3f | %s |" % (
                    name, n, form, " | ".join("%.1f" % us[lib] for lib in LIBRARIES), us["cublaslt"] / us["cublas"],
                    bool(torch.equal(outs["cublas"], outs["cublaslt"]))), flush=True)
    print("\nper layer (four linears), us:")
    for n in TOKENS:
        for form in ("exact", "fp16"):
            print("  %5d tokens %-5s " % (n, form) + "  ".join("%s %.1f" % (lib, totals[(n, form, lib)]) for lib in LIBRARIES))


if __name__ == "__main__":
    main()
