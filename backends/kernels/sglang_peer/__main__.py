"""``python -m backends.kernels.sglang_peer stage|build|info``: set-up of the peer (no GPU
needed; ``info`` reads kernel attributes when there is one)."""
from __future__ import annotations

import argparse
import json
import sys

import torch

import backends.kernels.sglang_peer as sglang_peer
from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported
from backends.kernels.sglang_peer.binding import SGLangSwapInKernel
from backends.kernels.sglang_peer.build import (DEFAULT_ARCH, DEFAULT_BLOCK_SIZE, KernelConfig,
                                                build_library, smem_bytes)
from backends.kernels.sglang_peer.staging import DEFAULT_BUILD_DIR, stage_sources, staged_sources


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backends.kernels.sglang_peer",
                                 description=sglang_peer.__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="stage upstream sources into the build dir")
    s.add_argument("--sglang", help="sglang wheel or directory (default: installed package)")
    s.add_argument("--tvm-ffi", help="apache-tvm-ffi wheel or directory (headers only)")
    b = sub.add_parser("build", help="compile the peer library (needs nvcc, not a GPU)")
    b.add_argument("--top-k", type=int, required=True)
    b.add_argument("--hot", type=int, required=True, help="device_buffer_size")
    b.add_argument("--block", type=int, default=DEFAULT_BLOCK_SIZE)
    b.add_argument("--arch", default=None, help=f"e.g. 90a (default: this GPU, else {DEFAULT_ARCH})")
    b.add_argument("--force", action="store_true")
    sub.add_parser("info", help="staged sources, built libraries, kernel attributes on a GPU")
    for p in (s, b):
        p.add_argument("--build-dir", default=str(DEFAULT_BUILD_DIR))
    args = ap.parse_args(argv)
    try:
        if args.cmd == "stage":
            src = stage_sources(args.sglang, args.tvm_ffi, args.build_dir)
            size = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
            print(f"staged {src} ({size / 1e6:.2f} MB)")
            print((src / "SOURCE.json").read_text())
        elif args.cmd == "build":
            cfg = KernelConfig(args.top_k, args.hot, args.block)
            lib = build_library(cfg, arch=args.arch, build_dir=args.build_dir, force=args.force)
            meta = json.loads(lib.with_suffix(".json").read_text())
            print(f"{lib} ({lib.stat().st_size / 1e6:.2f} MB, {meta['nvcc']}), dynamic smem "
                  f"{smem_bytes(cfg.top_k, cfg.hot_buffer_size)} B")
            for k in meta["ptxas"]:
                print(f"  {k['registers']} regs, spills {k['spill_stores']}/{k['spill_loads']} B "
                      f"{k['kernel']}")
        else:
            st = staged_sources()
            print(f"staged: {st.origin if st else None} (sglang {st.version if st else '-'})")
            for lib in sorted(DEFAULT_BUILD_DIR.glob("libsglang_hisparse_*.so")):
                meta = json.loads(lib.with_suffix(".json").read_text())
                print(f"{lib.name}: {meta['config']} sm{meta['arch']} {meta['nvcc']}")
                if torch.cuda.is_available():
                    k = SGLangSwapInKernel(lib, KernelConfig(**meta["config"]))
                    print("  ", k.kernel_attrs())
    except (PeerUnavailable, PeerUnsupported) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main())
