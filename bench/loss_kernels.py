#!/usr/bin/env python3
"""The language-model loss on the GPU, three ways, at GPT-2 small's step (16 x 1024 tokens, vocabulary
50 304, bfloat16 logits as autocast leaves them): forward and backward time by CUDA events, and how
far each loss and logits-gradient lies from the float32 reference.

  cast     logits.float(), then cross_entropy (mpiddp's Trainer: the outputs leave autocast as float32)
  autocast cross_entropy on the bfloat16 logits under autocast (nanoGPT's)
  dtype    log_softmax(logits, dtype=float32), then nll_loss (the cast inside the kernel)

usage: python3 bench/loss_kernels.py [--tokens 16384] [--vocab 50304] [--repeat 20]
"""
import argparse
import json

import torch
import torch.nn.functional as F


def variants():
    def cast(logits, y):
        return F.cross_entropy(logits.float(), y)

    def autocast(logits, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return F.cross_entropy(logits, y)

    def dtype(logits, y):
        return F.nll_loss(F.log_softmax(logits, -1, dtype=torch.float32), y)

    return {"cast": cast, "autocast": autocast, "dtype": dtype}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16 * 1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    torch.manual_seed(0)
    base = (torch.randn(a.tokens, a.vocab, device="cuda") * 3).to(torch.bfloat16)
    y = torch.randint(0, a.vocab, (a.tokens,), device="cuda")
    ref_logits = base.float().requires_grad_()
    ref = F.cross_entropy(ref_logits, y)
    ref.backward()
    for name, fn in variants().items():
        logits = base.clone().requires_grad_()
        loss = fn(logits, y)
        loss.backward()
        dloss = abs(loss.item() - ref.item()) / abs(ref.item())
        dgrad = (logits.grad.float() - ref_logits.grad).abs().max().item()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(a.repeat):
            logits.grad = None
            start.record()
            fn(logits, y).backward()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        print(json.dumps({"loss": name, "ms_median": round(times[len(times) // 2], 3), "ms_min": round(times[0], 3),
                          "loss_rel_diff": dloss, "grad_max_abs_diff": dgrad,
                          "loss_dtype": str(loss.dtype), "grad_dtype": str(logits.grad.dtype),
                          "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}))
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
