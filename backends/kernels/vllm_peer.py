"""vLLM's own index-conversion Triton kernel, run beside ``convert_req_index_to_global_index``
without installing vllm (its wheel needs a newer torch than the GPU machine has).

vLLM's FLASHMLA_SPARSE backend converts each query token's request-local top-k positions to
global slots with ``triton_convert_req_index_to_global_index``
(``vllm/v1/attention/backends/mla/sparse_utils.py``), whose kernel is the ``@triton.jit``
function ``sparse_mla_index_remap_kernel`` (a static method of
``ConvertReqIndexToGlobalIndexKernel`` in vllm 0.33). Its fp8 decode path launches it with every
optional feature off (no prefill workspace, no idx mapping, no valid counts, DCP size 1),
``BLOCK_N = 128``, ``num_warps = 4`` and a ``(T, K / 128)`` grid; that is the launch here.
vLLM's top-k per row itself (``top_k_per_row_decode``) is a compiled CUDA op, not Triton, so it
is not staged.

Staging (``python -m backends.kernels.vllm_peer stage --vllm vllm-X.whl``, on any machine with
the wheel; it needs no vllm install): the source file is read out of the wheel, the named
``@triton.jit`` function is cut out of it by ``ast`` (decorators other than ``triton.jit``
dropped, the body unchanged) and written with only ``import triton`` /
``import triton.language as tl`` above it to the git-ignored ``.peer_build/vllm/`` (a few KB,
carried with ``.peer_build``), with the wheel's name in ``SOURCE``. A function that needs any
other global name fails staging with that name. Loading imports that file; nothing of vllm is
imported at any time.

Known differences from ours, from the source: vLLM maps a negative page id in the block table to
``page * P + offset`` (ours: -1) and does not range-check the request id (ours: -1 for ids
outside ``[0, R)``); on valid block tables and request ids the outputs are equal.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import importlib.util
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from backends.kernels.flashmla_peer import PeerUnavailable

REPO_ROOT = Path(__file__).resolve().parents[2]
STAGE_DIR = REPO_ROOT / ".peer_build" / "vllm"
#: the file of the vllm wheel that holds the kernel, and the kernel's name
SOURCE_PATH = "vllm/v1/attention/backends/mla/sparse_utils.py"
KERNEL = "sparse_mla_index_remap_kernel"
STAGED_FILE = "index_remap.py"
#: the kernel's column tile and warps in vLLM's launch (``BLOCK_N=128``, 4 warps)
BLOCK_N = 128
NUM_WARPS = 4
#: parameters the launch below passes (checked against the staged function's signature)
_PARAMS = ("req_id_ptr", "block_table_ptr", "token_indices_ptr", "out_ptr", "valid_count_ptr",
           "idx_mapping_ptr", "prefill_request_id_ptr", "workspace_starts_ptr",
           "workspace_rank_stride", "max_num_blocks_per_req", "BLOCK_SIZE", "BLOCK_STRIDE_ROWS",
           "BLOCK_N", "NUM_TOPK_TOKENS", "HAS_PREFILL", "HAS_IDX_MAPPING", "COUNT_VALID",
           "SINGLE_TILE", "COMPACT_TO_FRONT", "DCP_SIZE", "DCP_RANK", "DCP_INTERLEAVE",
           "bt_stride0", "bt_stride1", "ti_stride0", "ti_stride1", "out_stride0", "out_stride1")


class ExtractionError(ValueError):
    """The source has no such ``@triton.jit`` function, or it needs names beyond triton/tl."""


def _is_triton_jit(dec: ast.expr) -> bool:
    node = dec.func if isinstance(dec, ast.Call) else dec
    return (isinstance(node, ast.Attribute) and node.attr == "jit"
            and isinstance(node.value, ast.Name) and node.value.id == "triton")


def _free_names(fn: ast.FunctionDef) -> List[str]:
    """Global names ``fn`` (decorators included) reads that are not builtins, its parameters,
    or names it assigns."""
    a = fn.args
    bound = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    bound |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    loads, stores = set(), set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else stores).add(node.id)
    return sorted(loads - stores - bound - set(dir(builtins)) - {fn.name})


def extract_jit_source(source: str, names: Sequence[str]) -> str:
    """Module text holding just the ``@triton.jit`` functions ``names`` of ``source`` (found at
    any depth, e.g. a class's static method), each with only its ``triton.jit`` decorator, below
    ``import triton`` / ``import triton.language as tl``. Raises ExtractionError naming a
    missing function or any global name beyond triton, tl and the other extracted functions."""
    tree = ast.parse(source)
    found: Dict[str, ast.FunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in names \
                and any(_is_triton_jit(d) for d in node.decorator_list):
            if node.name in found:
                raise ExtractionError(f"more than one @triton.jit function named {node.name!r}")
            found[node.name] = node
    missing = [n for n in names if n not in found]
    if missing:
        raise ExtractionError(f"no @triton.jit function named {', '.join(missing)} in the source")
    parts = ["import triton", "import triton.language as tl", ""]
    for name in names:
        fn = found[name]
        extra = [n for n in _free_names(fn) if n not in ("triton", "tl", *names)]
        if extra:
            raise ExtractionError(f"{name} needs names beyond triton/tl: {', '.join(extra)}")
        fn.decorator_list = [d for d in fn.decorator_list if _is_triton_jit(d)]
        parts += [ast.unparse(fn), "", ""]
    return "\n".join(parts)


def load_module(path: Path, name: str = "_vllm_peer_staged"):
    """Imports the staged file at ``path`` as a module (Triton needs a real file for a jit
    function's source)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def stage(wheel: Path, out_dir: Path = STAGE_DIR) -> Path:
    """Writes ``out_dir/index_remap.py`` (the kernel cut out of ``wheel``'s ``SOURCE_PATH``)
    and ``out_dir/SOURCE`` (wheel file name and source path). Returns the staged file."""
    wheel = Path(wheel)
    with zipfile.ZipFile(wheel) as z:
        try:
            source = z.read(SOURCE_PATH).decode()
        except KeyError as e:
            raise ExtractionError(f"{wheel.name} has no {SOURCE_PATH}") from e
    text = extract_jit_source(source, [KERNEL])
    out_dir.mkdir(parents=True, exist_ok=True)
    staged = out_dir / STAGED_FILE
    staged.write_text(f"# {KERNEL} from {wheel.name}:{SOURCE_PATH}, extracted unchanged by "
                      "backends/kernels/vllm_peer.py (not part of the project)\n" + text)
    (out_dir / "SOURCE").write_text(f"{wheel.name}\n{SOURCE_PATH}\n")
    return staged


_KERNEL: Dict[str, object] = {}


def staged_source(stage_dir: Path = STAGE_DIR) -> str:
    """``"<wheel file> <source path>"`` of what is staged, or "none"."""
    p = stage_dir / "SOURCE"
    return " ".join(p.read_text().split()) if p.exists() else "none"


def vllm_convert_kernel(stage_dir: Path = STAGE_DIR):
    """The staged vLLM kernel (a Triton jit function), or PeerUnavailable saying why not."""
    key = str(stage_dir)
    if key not in _KERNEL:
        staged = stage_dir / STAGED_FILE
        if not staged.exists():
            raise PeerUnavailable(f"vLLM's index conversion is not staged ({staged} missing): "
                                  "pip download --no-deps vllm, then python -m "
                                  "backends.kernels.vllm_peer stage --vllm vllm-*.whl")
        fn = getattr(load_module(staged), KERNEL, None)
        params = _staged_params(staged)
        if fn is None or params != _PARAMS:
            raise PeerUnavailable(f"the staged {KERNEL} ({staged_source(stage_dir)}) has parameters "
                                  f"{params}, not the ones this launch passes")
        _KERNEL[key] = fn
    return _KERNEL[key]


def _staged_params(path: Path) -> Optional[tuple]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == KERNEL:
            return tuple(a.arg for a in node.args.args)
    return None


def vllm_convert_req_index_to_global_index(req_id: torch.Tensor, block_table: torch.Tensor,
                                           token_indices: torch.Tensor, page_size: int, *,
                                           stage_dir: Path = STAGE_DIR) -> torch.Tensor:
    """Same signature and result as ``backends.kernels.convert_req_index_to_global_index`` on
    valid block tables (module doc): req_id ``[T]``, block_table ``[R, max_blocks]``,
    token_indices ``[T, K]``, all int32, ``K`` a multiple of 128; returns int32 ``[T, K]``
    global slots (-1 for -1 or a position beyond the table). Raises PeerUnavailable when not
    staged (in ``stage_dir``), ValueError for inputs outside the kernel's contract."""
    fn = vllm_convert_kernel(stage_dir)
    for name, x, nd in (("req_id", req_id, 1), ("block_table", block_table, 2),
                        ("token_indices", token_indices, 2)):
        if not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or x.dim() != nd:
            raise ValueError(f"{name} must be a {nd}-D torch.int32 tensor")
    t, k = token_indices.shape
    if req_id.shape[0] != t:
        raise ValueError(f"token_indices must have T={req_id.shape[0]} rows, got {t}")
    if k % BLOCK_N:
        raise ValueError(f"vLLM's kernel needs top_k (token_indices.shape[1]) to be a multiple "
                         f"of {BLOCK_N}, got {k}")
    if not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    req, bt, tok = req_id.contiguous(), block_table.contiguous(), token_indices.contiguous()
    out = torch.empty_like(tok)
    if t == 0 or k == 0:
        return out
    unused = torch.zeros(1, dtype=torch.int32, device=tok.device)  # pointers of disabled features
    fn[(t, k // BLOCK_N)](
        req_id_ptr=req, block_table_ptr=bt, token_indices_ptr=tok, out_ptr=out,
        valid_count_ptr=unused, idx_mapping_ptr=unused, prefill_request_id_ptr=unused,
        workspace_starts_ptr=unused, workspace_rank_stride=0, max_num_blocks_per_req=bt.shape[1],
        BLOCK_SIZE=page_size, BLOCK_STRIDE_ROWS=page_size, BLOCK_N=BLOCK_N, NUM_TOPK_TOKENS=k,
        HAS_PREFILL=False, HAS_IDX_MAPPING=False, COUNT_VALID=False, SINGLE_TILE=False,
        COMPACT_TO_FRONT=False, DCP_SIZE=1, DCP_RANK=0, DCP_INTERLEAVE=1,
        bt_stride0=bt.stride(0), bt_stride1=bt.stride(1), ti_stride0=tok.stride(0),
        ti_stride1=tok.stride(1), out_stride0=out.stride(0), out_stride1=out.stride(1),
        num_warps=NUM_WARPS)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backends.kernels.vllm_peer",
                                 description="stage vLLM's index-conversion Triton kernel")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="cut the kernel out of a vllm wheel into .peer_build/vllm")
    s.add_argument("--vllm", required=True, type=Path, help="a vllm-*.whl (pip download --no-deps vllm)")
    sub.add_parser("info", help="what is staged")
    args = ap.parse_args(argv)
    if args.cmd == "stage":
        try:
            print(f"staged {stage(args.vllm)}")
        except (ExtractionError, OSError, zipfile.BadZipFile) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    print(f"staged: {staged_source()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
