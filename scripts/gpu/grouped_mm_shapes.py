# moe-1b's six grouped GEMMs (E 64, d 1024, expert width 256, 16384 tokens x 6 slots) timed by
# themselves in PyTorch's torch._grouped_mm, at even and uneven expert counts (skew: each expert's
# share drawn as U^skew), beside a dense product of the same FLOPs; and the MoE router's three fp32
# products in fp32, TF32 and bf16. Usage on the GPU machine: python3 scripts/gpu/grouped_mm_shapes.py
import torch, time
torch.manual_seed(0)
dev = "cuda"
E, d, fe, rows = 64, 1024, 256, 16384 * 6
def offsets(skew):
    p = torch.rand(E) ** skew; p = p / p.sum()
    c = torch.distributions.Multinomial(rows, p).sample().long()
    return torch.cumsum(c, 0).to(torch.int32).to(dev), c
def t(f, reps=20):
    for _ in range(3): f()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps): f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps
bf = torch.bfloat16
x = torch.randn(rows, d, device=dev, dtype=bf)
h = torch.randn(rows, fe, device=dev, dtype=bf)
dyu = torch.randn(rows, 2 * fe, device=dev, dtype=bf)
dyd = torch.randn(rows, d, device=dev, dtype=bf)
wgu = torch.randn(E, 2 * fe, d, device=dev, dtype=bf)
wd = torch.randn(E, d, fe, device=dev, dtype=bf)
for skew in (0.0, 1.0, 3.0):
    offs, c = offsets(skew)
    print(f"--- skew {skew}: counts min {c.min().item()} max {c.max().item()}")
    fl = lambda m, n, k: 2 * m * n * k / 1e12
    cases = {
        "fwd gate|up  x·Wᵀ": (lambda: torch._grouped_mm(x, wgu.transpose(1, 2), offs), fl(rows, 2*fe, d)),
        "fwd down     h·Wᵀ": (lambda: torch._grouped_mm(h, wd.transpose(1, 2), offs), fl(rows, d, fe)),
        "dX gate|up   dy·W": (lambda: torch._grouped_mm(dyu, wgu, offs), fl(rows, 2*fe, d)),
        "dX down      dy·W": (lambda: torch._grouped_mm(dyd, wd, offs), fl(rows, d, fe)),
        "dW gate|up dyᵀ·x (now)": (lambda: torch._grouped_mm(dyu.t(), x, offs), fl(rows, 2*fe, d)),
        "dW gate|up xᵀ·dy": (lambda: torch._grouped_mm(x.t(), dyu, offs), fl(rows, 2*fe, d)),
        "dW down dyᵀ·h (now)": (lambda: torch._grouped_mm(dyd.t(), h, offs), fl(rows, d, fe)),
        "dW down hᵀ·dy": (lambda: torch._grouped_mm(h.t(), dyd, offs), fl(rows, d, fe)),
    }
    if skew == 0.0:
        xc = x.view(E, rows // E, d); dyuc = dyu.view(E, rows // E, 2 * fe)
        cases["dense mm x·W (same flops)"] = (lambda: x @ wgu[0].t(), fl(rows, 2*fe, d))
        cases["bmm dW gate|up, equal counts"] = (lambda: torch.bmm(dyuc.transpose(1, 2), xc), fl(rows, 2*fe, d))
        cases["bmm fwd gate|up, equal counts"] = (lambda: torch.bmm(xc, wgu.transpose(1, 2)), fl(rows, 2*fe, d))
    for name, (f, tf) in cases.items():
        try:
            ms = t(f)
            print(f"{name:32s} {ms:7.3f} ms  {tf/ms*1e3:6.0f} TFLOP/s")
        except Exception as ex:
            print(f"{name:32s} failed: {str(ex)[:120]}")
    try:
        ms = t(lambda: torch._grouped_mm(dyu.t(), x, offs, out_dtype=torch.float32))
        print(f"{'dW gate|up fp32 out':32s} {ms:7.3f} ms")
    except Exception as ex:
        print("fp32 out failed:", str(ex)[:160])
# the router's three fp32 products
u = torch.randn(16384, d, device=dev); wr = torch.randn(E, d, device=dev); dl = torch.randn(16384, E, device=dev)
for tf32 in (False, True):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = t(lambda: u @ wr.t()); b = t(lambda: dl @ wr); c = t(lambda: dl.t() @ u)
    print(f"router fp32 products tf32={tf32}: fwd {a:.3f} dU {b:.3f} dW {c:.3f} ms")
ub = u.to(bf); wrb = wr.to(bf); dlb = dl.to(bf)
a = t(lambda: ub @ wrb.t()); b = t(lambda: dlb @ wrb); c = t(lambda: dlb.t() @ ub)
print(f"router bf16: fwd {a:.3f} dU {b:.3f} dW {c:.3f} ms")
