"""PyTorch SDPA on the shapes of `sift bench attention --device cuda`.

Called by the bench when torch is importable; prints one line per figure:
  copy GBPS                   device-to-device copy, bytes read + written per second
  prefill L MS                causal SDPA, L queries against L keys
  decode L MS                 one query row against L keys
q 32 heads, K/V 8 heads (GQA), head_dim 128, bf16; median of CUDA-event timings.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F


def timed(fn, repeats, calls):
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / calls)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", default="")
    ap.add_argument("--decode", default="")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)

    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), a.repeats, 10)
    print(f"copy {2 * src.numel() / ms / 1e6:.1f}", flush=True)
    del src, dst

    for L in [int(x) for x in a.prefill.split(",") if x]:
        q = torch.randn(1, 32, L, 128, device=dev, dtype=dt)
        k = torch.randn(1, 8, L, 128, device=dev, dtype=dt)
        v = torch.randn(1, 8, L, 128, device=dev, dtype=dt)
        ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                   a.repeats, 1)
        print(f"prefill {L} {ms:.4f}", flush=True)
        del q, k, v
    for L in [int(x) for x in a.decode.split(",") if x]:
        q = torch.randn(1, 32, 1, 128, device=dev, dtype=dt)
        k = torch.randn(1, 8, L, 128, device=dev, dtype=dt)
        v = torch.randn(1, 8, L, 128, device=dev, dtype=dt)
        ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), a.repeats, 50)
        print(f"decode {L} {ms:.5f}", flush=True)
        del q, k, v


if __name__ == "__main__":
    main()
