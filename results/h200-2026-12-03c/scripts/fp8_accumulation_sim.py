"""max |err| / max |ref| of fp8-query indexer logits under a model of Hopper's fp8 MMA
accumulation (each 32-product wgmma step aligned to its largest term, BITS bits kept, truncated),
on the bench's data (randn queries, fp8 keys, weights randn / sqrt(H)): the basis of
harness.indexer_ref.FP8_QUERY_TOL. CPU only:

    PYTHONPATH=$PWD BITS=14 .venv/bin/python results/h200-2026-12-03c/scripts/fp8_accumulation_sim.py
"""
import os

import numpy as np
import torch

from backends.kernels.index_cache import quantize_index_keys
from backends.kernels.indexer import quantize_index_query

BITS = int(os.environ.get("BITS", 14))
H, D, T, STEP = 64, 128, 8192, 32


def truncated_step(terms: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """``acc + sum(terms)`` (float64 ``[..., STEP]``, ``[...]``) with every addend floored to the
    grid of BITS bits below the largest addend's leading bit."""
    allt = np.concatenate([terms, acc[..., None]], axis=-1)
    m = np.abs(allt).max(-1, keepdims=True)
    ulp = 2.0 ** (np.floor(np.log2(np.where(m > 0, m, 1))) - BITS + 1)
    return (np.floor(allt / ulp) * ulp).sum(-1)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(3):
        q8, qs = quantize_index_query(torch.randn(H, D, generator=g).to(torch.bfloat16))
        w = (torch.randn(H, generator=g) * H ** -0.5).double().numpy() * qs.double().numpy()
        kv, ks = quantize_index_keys(torch.randn(T, D, generator=g))
        k8 = kv.view(torch.float8_e4m3fn).double().numpy()
        prod = k8[:, None, :] * q8.double().numpy()[None, :, :]  # [T, H, D], exact
        acc = np.zeros((T, H))
        for c in range(0, D, STEP):
            acc = truncated_step(prod[..., c:c + STEP], acc)
        logits = [(np.maximum(s, 0) * w[None]).sum(1) * ks.double().numpy()
                  for s in (prod.sum(-1), acc)]
        err = np.abs(logits[1] - logits[0]).max() / np.abs(logits[0]).max()
        print(f"BITS {BITS} trial {trial}: max_rel_err {err:.2e}")


if __name__ == "__main__":
    main()
