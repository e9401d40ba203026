"""``python -m harness.doctor [--json] [--skip-ceilings]``: what a run of this machine will use and
what is missing, checked rather than assumed.

Sections (each item has a status: ``ok``, ``missing`` (an optional part is unavailable; the
detail says why), ``info``, or ``problem`` (the default run cannot work)):

* ``versions``: Python, torch (and its CUDA), Triton, Hydra, rich;
* ``device``: the default run's device and model (``device=auto``), every visible GPU (name,
  compute capability, memory), and whether a tensor operation runs there;
* ``triton``: compiled or interpreter (``TRITON_INTERPRET``) and whether that agrees with the
  device, then one real kernel (``convert_req_index_to_global_index``) run in that mode and
  compared with its formula;
* ``hydra``: the default config composes (``conf/config.yaml`` with the registered schema);
* ``ceilings``: ``harness.ceilings.measure`` on the GPU (HBM copy, pinned host-to-device copy,
  bf16 matmul; a few seconds); skipped on the CPU, where runs are correctness runs;
* ``memory``: the pinned-memory limit (``RLIMIT_MEMLOCK``, i.e. ``ulimit -l``), free host and
  device memory (``harness.memory``), the free explicit huge pages (``host_alloc=hugetlb_*``),
  whether the host is a virtual machine (``harness.env.host_virtualized``), and on the GPU one
  real pinned allocation;
* ``kernels``: which resolve ``hisparse.resolve_kernel=auto`` takes here: the CUDA one (a GPU,
  and its library built or ``nvcc`` to build it, which the check does) or the Triton one, and
  why;
* ``peers``: FlashMLA (``sgl-flash-mla`` importable, SM90 legacy ops), the SGLang swap-in kernel
  (staged sources, built libraries, ``nvcc``), vLLM's index conversion; each with the reason it
  is unavailable;
* ``launchers``: every ``hydra/launcher`` choice Hydra sees (its basic one, installed plugins
  such as joblib and submitit, the project's own configs), composed and its class imported, and
  the launcher plugins that are not installed.

Exit code 0 when the default run can work (no ``problem``), else 1 with the reasons on stderr.
``--json`` prints the same items as one JSON object: ``{"ok", "problems", <section>: {<item>:
{"status", "detail", ...}}}``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
from dataclasses import dataclass, field
from importlib import metadata, util
from typing import Dict, List, Optional

SECTIONS = ("versions", "device", "triton", "hydra", "ceilings", "memory", "kernels", "peers",
            "launchers")
STATUSES = ("ok", "missing", "info", "problem")
#: launcher plugins worth having, by ``hydra/launcher`` choice -> the package that provides it
KNOWN_LAUNCHERS = {"joblib": "hydra-joblib-launcher", "submitit_local": "hydra-submitit-launcher",
                   "submitit_slurm": "hydra-submitit-launcher"}
GiB = 2 ** 30


@dataclass
class Item:
    """One line of the report; ``data`` holds its values for ``--json`` (bytes, GB/s, ...)."""
    section: str
    name: str
    status: str
    detail: str
    data: Dict[str, object] = field(default_factory=dict)


def _gib(n: Optional[int]) -> str:
    """``23.0 GiB``, ``64.0 MiB`` or ``8.0 KiB`` (``-`` when unknown)."""
    if n is None:
        return "-"
    for unit, size in (("GiB", GiB), ("MiB", 2 ** 20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 1024:.1f} KiB"


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> List[Item]:
    import torch
    import triton
    items = [Item("versions", "python", "info", platform.python_version(),
                  {"version": platform.python_version()}),
             Item("versions", "torch", "info", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})",
                  {"version": torch.__version__, "cuda": torch.version.cuda}),
             Item("versions", "triton", "info", triton.__version__, {"version": triton.__version__})]
    for dist, name in (("hydra-core", "hydra"), ("rich", "rich")):
        v = _version(dist)
        items.append(Item("versions", name, "info" if v else "problem",
                          v or f"{dist} is not installed (pip install -e .)", {"version": v}))
    return items


def device_items() -> List[Item]:
    """The default run's device (``device=auto``) and whether a tensor operation runs on it."""
    import torch
    cuda = torch.cuda.is_available()
    dev, model = ("cuda", "dsv32") if cuda else ("cpu", "tiny")
    items = [Item("device", "default", "info", f"device={dev} model={model}",
                  {"device": dev, "model": model, "cuda": cuda,
                   "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})]
    if not cuda:
        cpu = platform.processor() or platform.machine()
        x = torch.arange(8, dtype=torch.float32)
        ok = float((x * 2).sum()) == 56.0
        items.append(Item("device", "cpu", "ok" if ok else "problem",
                          f"{cpu}, {os.cpu_count()} cores; no CUDA GPU (CPU runs are correctness runs)",
                          {"name": cpu, "cores": os.cpu_count()}))
        return items
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        data = {"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                "total_bytes": int(p.total_memory), "sms": p.multi_processor_count}
        try:
            with torch.cuda.device(i):
                x = torch.arange(8, dtype=torch.float32, device=f"cuda:{i}")
                ok, err = float((x * 2).sum()) == 56.0, ""
        except Exception as e:  # noqa: BLE001  (a broken driver or a busy, exclusive GPU)
            ok, err = False, f"; a tensor operation failed: {type(e).__name__}: {e}"
        items.append(Item("device", f"cuda:{i}", "ok" if ok else "problem",
                          f"{p.name}, SM{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                          f"{_gib(p.total_memory)}{err}", data))
    return items


def triton_items(user_interpret: Optional[str]) -> List[Item]:
    """Triton's mode for the default run and one real kernel run in it (the caller has already
    chosen the mode as ``python -m harness`` does: ``harness.device.choose_triton_mode``)."""
    import torch
    cuda = torch.cuda.is_available()
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    mode = "interpreter" if interpret else "compiled"
    data = {"mode": mode, "TRITON_INTERPRET": user_interpret, "cuda": cuda}
    if cuda and interpret:
        items = [Item("triton", "mode", "problem",
                      f"TRITON_INTERPRET={user_interpret} is set but the default run uses the GPU: its "
                      "kernels would run in the interpreter (unset TRITON_INTERPRET)", data)]
    elif cuda:
        items = [Item("triton", "mode", "ok", "compiled (CUDA GPU)", data)]
    else:
        items = [Item("triton", "mode", "ok", "interpreter (no CUDA GPU: TRITON_INTERPRET=1, "
                      "kernels run on CPU tensors)", data)]
    device = torch.device("cuda" if cuda else "cpu")
    try:
        from backends.kernels import convert_req_index_to_global_index
        g = torch.Generator().manual_seed(0)
        page, pages, reqs, k = 16, 8, 3, 32
        table = torch.randperm(reqs * pages, generator=g).view(reqs, pages).to(torch.int32)
        pos = torch.randint(-1, pages * page, (reqs, k), generator=g, dtype=torch.int32)
        rid = torch.arange(reqs, dtype=torch.int32)
        want = torch.where(pos >= 0, table[rid[:, None].long(), (pos.clamp(min=0) // page).long()] * page
                           + pos.clamp(min=0) % page, torch.full_like(pos, -1))
        got = convert_req_index_to_global_index(rid.to(device), table.to(device), pos.to(device), page).cpu()
        ok = torch.equal(got, want)
        items.append(Item("triton", "kernel", "ok" if ok else "problem",
                          f"convert_req_index_to_global_index on {device.type}: "
                          + ("matches its formula" if ok else "differs from its formula"), {"ran": True}))
    except Exception as e:  # noqa: BLE001  (no compiler, no driver, an incompatible Triton)
        items.append(Item("triton", "kernel", "problem", f"a Triton kernel failed to run on {device.type}: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", {"ran": False}))
    return items


def hydra_items() -> List[Item]:
    """The default configuration composes (schema registered, conf/ readable)."""
    try:
        cfg = compose_config([])
        return [Item("hydra", "config", "ok", f"conf/config.yaml composes (backend={cfg.backend}, "
                     f"scenario={cfg.scenario}, model={cfg.model.name})")]
    except Exception as e:  # noqa: BLE001
        return [Item("hydra", "config", "problem", f"the default config does not compose: "
                     f"{type(e).__name__}: {e}")]


def compose_config(overrides: List[str], hydra_cfg: bool = False):
    """The composed config of ``overrides`` (with the ``hydra`` node when ``hydra_cfg``)."""
    from hydra import compose, initialize_config_dir
    import harness.cli  # noqa: F401  (registers the structured configs)
    from harness.config import CONF_DIR
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra_cfg)


def ceiling_items(skip: bool) -> List[Item]:
    import torch
    if not torch.cuda.is_available():
        return [Item("ceilings", "measured", "info", "skipped on the CPU: CPU runs are correctness runs "
                     "and carry NaN ceilings", {"measured": False})]
    if skip:
        return [Item("ceilings", "measured", "info", "skipped (--skip-ceilings)", {"measured": False})]
    from harness.ceilings import measure
    try:
        c = measure(torch.device("cuda"))
    except Exception as e:  # noqa: BLE001  (every run measures them: a failure stops the run)
        return [Item("ceilings", "measured", "problem", f"measuring failed: {type(e).__name__}: "
                     f"{str(e).splitlines()[0]}", {"measured": False})]
    return [Item("ceilings", "hbm", "ok", f"{c.hbm_gbps:.0f} GB/s (1 GiB device copy, read + write)",
                 {"gbps": c.hbm_gbps}),
            Item("ceilings", "h2d", "ok", f"{c.h2d_gbps:.1f} GB/s (256 MiB pinned host -> device)",
                 {"gbps": c.h2d_gbps}),
            Item("ceilings", "bf16_matmul", "ok", f"{c.bf16_tflops:.0f} TFLOP/s (8192^3 bf16)",
                 {"tflops": c.bf16_tflops})]


def _limit(v: int) -> Optional[int]:
    return None if v == resource.RLIM_INFINITY else int(v)


def memory_items() -> List[Item]:
    import torch
    from backends.host_memory import hugetlb_free_pages
    from harness.env import host_virtualized
    from harness.memory import free_bytes, host_available_bytes, meminfo_bytes
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    soft, hard = _limit(soft), _limit(hard)
    fmt = lambda v: "unlimited" if v is None else _gib(v)  # noqa: E731
    items = [Item("memory", "memlock", "info", f"RLIMIT_MEMLOCK (ulimit -l) soft {fmt(soft)}, hard {fmt(hard)}",
                  {"soft_bytes": soft, "hard_bytes": hard})]
    avail, total = host_available_bytes(), meminfo_bytes("MemTotal")
    try:
        from harness.scenarios.capacity import HOST_FRACTION
        budget = f" (scenario=capacity's default host budget: {HOST_FRACTION:.0%} of it)"
    except ImportError:  # the scenario needs Hydra's schema; the hydra section says why
        budget = ""
    items.append(Item("memory", "host", "info", f"{_gib(avail)} available of {_gib(total)}{budget}",
                      {"available_bytes": avail, "total_bytes": total}))
    free = hugetlb_free_pages()
    items.append(Item("memory", "hugepages", "info",
                      "free explicit huge pages: " + ", ".join(f"{n} for host_alloc={a}"
                                                               for a, n in free.items()),
                      {f"free_{a[-2:]}": n for a, n in free.items()}))
    vm = host_virtualized()
    items.append(Item("memory", "virtualized", "info",
                      {True: "a virtual machine: the GPU reads host memory through the "
                             "hypervisor's address translation (timing.cold_host_translations "
                             "gives a served model's figures; BENCHMARKS 6v)",
                       False: "not a virtual machine", None: "unknown (no /proc/cpuinfo)"}[vm],
                      {"virtualized": vm}))
    if not torch.cuda.is_available():
        return items
    for i in range(torch.cuda.device_count()):
        free = free_bytes(torch.device(f"cuda:{i}"))
        tot = torch.cuda.get_device_properties(i).total_memory
        items.append(Item("memory", f"cuda:{i}", "info", f"{_gib(free)} free of {_gib(tot)}",
                          {"free_bytes": free, "total_bytes": int(tot)}))
    n = 256 << 20
    try:
        buf = torch.empty(n, dtype=torch.uint8).pin_memory()
        ok = buf.is_pinned()
        del buf
        items.append(Item("memory", "pinned", "ok" if ok else "problem",
                          f"a {n >> 20} MiB pinned host buffer " + ("allocates" if ok else "is not pinned"),
                          {"bytes": n}))
    except Exception as e:  # noqa: BLE001  (the host pools of hisparse need pinned memory)
        items.append(Item("memory", "pinned", "problem", f"pinning {n >> 20} MiB failed: "
                          f"{type(e).__name__}: {e}", {"bytes": n}))
    return items


def kernel_items() -> List[Item]:
    """The CUDA resolve: whether ``hisparse.resolve_kernel=auto`` takes it here (checked at
    top_k 2048, 4096 hot slots; on a GPU this builds the library when it is not built)."""
    import torch
    from backends.kernels.flashmla_peer import PeerUnavailable
    from backends.kernels.nvcc_build import default_arch, find_nvcc
    from backends.kernels.swap_in_cuda import DEFAULT_BUILD_DIR, cuda_resolve_unavailable
    built = sorted(p.name for p in DEFAULT_BUILD_DIR.glob("libswap_in_resolve_*.so"))
    try:
        nvcc: Optional[str] = find_nvcc(None, "the CUDA resolve")
    except PeerUnavailable:
        nvcc = None
    cuda = torch.cuda.is_available()
    data = {"built": built, "nvcc": nvcc, "arch": default_arch() if cuda else None}
    facts = f"built: {', '.join(built) or 'none'}; nvcc: {nvcc or 'not found'}"
    why = cuda_resolve_unavailable("cuda" if cuda else "cpu", 2048, 4096)
    if why:
        return [Item("kernels", "cuda_resolve", "missing", "hisparse.resolve_kernel=auto takes the "
                     f"Triton resolve here: {why}; {facts}", data)]
    return [Item("kernels", "cuda_resolve", "ok", "hisparse.resolve_kernel=auto takes the CUDA "
                 f"resolve; {facts}", data)]


def flashmla_item() -> Item:
    import torch
    from backends.kernels.flashmla_peer import PeerUnavailable, flashmla_attention
    installed = util.find_spec("flash_mla") is not None
    data = {"installed": installed, "version": _version("sgl-flash-mla")}
    if not torch.cuda.is_available():
        why = "needs a CUDA GPU (SM90)" + ("" if installed else "; sgl-flash-mla is not installed "
                                             "(pip install -e '.[flashmla]')")
        return Item("peers", "flashmla", "missing", why, data)
    try:
        flashmla_attention(torch.device("cuda"))
    except PeerUnavailable as e:
        return Item("peers", "flashmla", "missing", str(e), data)
    return Item("peers", "flashmla", "ok", f"sgl-flash-mla {data['version']}: importable, SM90 legacy ops "
                "(attention_kernel=flashmla)", data)


def sglang_item() -> Item:
    import torch
    from backends.kernels.flashmla_peer import PeerUnavailable
    from backends.kernels.sglang_peer import DEFAULT_BUILD_DIR, staged_sources
    from backends.kernels.nvcc_build import default_arch, find_nvcc
    st = staged_sources()
    libs = []
    for lib in sorted(DEFAULT_BUILD_DIR.glob("libsglang_hisparse_*.so")):
        meta_file = lib.with_suffix(".json")
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
        c = meta.get("config", {})
        libs.append({"file": lib.name, "top_k": c.get("top_k"), "hot": c.get("hot_buffer_size"),
                     "arch": meta.get("arch")})
    try:
        nvcc: Optional[str] = find_nvcc(None, "the peer")
    except PeerUnavailable:
        nvcc = None
    cuda = torch.cuda.is_available()
    arch = default_arch() if cuda else None
    usable = [x for x in libs if arch is None or x["arch"] == arch]
    data = {"staged": st.version if st else None, "libraries": libs, "nvcc": nvcc, "arch": arch}
    built = ", ".join(f"k{x['top_k']}/h{x['hot']} sm{x['arch']}" for x in libs) or "none"
    facts = (f"staged: {'sglang ' + st.version if st else 'nothing'}; built: {built}; "
             f"nvcc: {nvcc or 'not found'}")
    if not cuda:
        return Item("peers", "sglang_kernel", "missing", f"needs a CUDA GPU; {facts}", data)
    if not usable and not (st and nvcc):
        how = ("python -m backends.kernels.sglang_peer build --top-k K --hot D" if st else
               "python -m backends.kernels.sglang_peer stage --sglang SGLANG.whl --tvm-ffi TVM_FFI.whl, then build")
        return Item("peers", "sglang_kernel", "missing", f"no library for sm{arch} and none can be built here "
                    f"({how}); {facts}", data)
    return Item("peers", "sglang_kernel", "ok", f"hisparse.coordinator=sglang for the built (top_k, "
                f"device_buffer_size){' and any other (staged + nvcc)' if st and nvcc else ''}; {facts}", data)


def vllm_item() -> Item:
    data = {"installed": util.find_spec("vllm") is not None, "version": _version("vllm")}
    if not data["installed"]:
        return Item("peers", "vllm", "missing", "vllm is not installed (pip install -e '.[vllm]'); "
                    "python -m harness.bench peers skips its index conversion", data)
    from backends.kernels.flashmla_peer import PeerUnavailable
    from backends.kernels.vllm_peer import vllm_convert_kernel
    try:
        vllm_convert_kernel()
    except PeerUnavailable as e:
        return Item("peers", "vllm", "missing", str(e), data)
    return Item("peers", "vllm", "ok", f"vllm {data['version']}: triton_convert_req_index_to_global_index "
                "importable", data)


def peer_items() -> List[Item]:
    items = []
    for fn, name in ((flashmla_item, "flashmla"), (sglang_item, "sglang_kernel"), (vllm_item, "vllm")):
        try:
            items.append(fn())
        except Exception as e:  # noqa: BLE001  (a peer's own set-up failing is a reason too)
            items.append(Item("peers", name, "missing", f"checking it failed: {type(e).__name__}: {e}"))
    return items


def launcher_items() -> List[Item]:
    """Every ``hydra/launcher`` choice Hydra finds, composed, with its class imported."""
    import torch
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import get_class
    import harness.cli  # noqa: F401
    from harness.config import CONF_DIR
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        names = GlobalHydra.instance().config_loader().get_group_options("hydra/launcher")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    items = []
    for name in names:
        data = {"gpus": gpus}
        try:
            target = str(compose_config([f"hydra/launcher={name}"], hydra_cfg=True).hydra.launcher._target_)
            data["target"] = target
            get_class(target)
        except Exception as e:  # noqa: BLE001  (a plugin whose own dependency is missing)
            items.append(Item("launchers", name, "missing", f"{type(e).__name__}: {str(e).splitlines()[0]}", data))
            continue
        detail = target + (f" ({gpus} GPUs visible)" if "gpu" in name else "")
        status = "ok"
        if "slurm" in name and shutil.which("sbatch") is None:
            status, detail = "missing", f"{target} imports, but sbatch is not on PATH: no Slurm to submit to here"
        items.append(Item("launchers", name, status, detail, data))
    for name, dist in KNOWN_LAUNCHERS.items():
        if name not in names:
            items.append(Item("launchers", name, "missing", f"{dist} is not installed", {"package": dist}))
    return items


def _section(name: str, fn, *args) -> List[Item]:
    """``fn``'s items, or one item saying why the section could not be checked (a ``problem``
    for what the default run needs, else ``missing``)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        needed = name in ("versions", "device", "triton", "hydra", "memory")
        return [Item(name, "check", "problem" if needed else "missing",
                     f"could not be checked: {type(e).__name__}: {e}")]


def collect(skip_ceilings: bool = False) -> List[Item]:
    """Every item of the report. Chooses Triton's mode first, as ``python -m harness`` does."""
    from harness.device import choose_triton_mode
    user_interpret = os.environ.get("TRITON_INTERPRET")
    choose_triton_mode([])
    return (_section("versions", versions) + _section("device", device_items)
            + _section("triton", triton_items, user_interpret) + _section("hydra", hydra_items)
            + _section("ceilings", ceiling_items, skip_ceilings) + _section("memory", memory_items)
            + _section("kernels", kernel_items) + _section("peers", peer_items)
            + _section("launchers", launcher_items))


def problems(items: List[Item]) -> List[str]:
    return [f"{i.section}.{i.name}: {i.detail}" for i in items if i.status == "problem"]


def as_json(items: List[Item]) -> Dict[str, object]:
    out: Dict[str, object] = {"ok": not problems(items), "problems": problems(items)}
    for s in SECTIONS:
        out[s] = {i.name: {"status": i.status, "detail": i.detail, **i.data} for i in items if i.section == s}
    return out


def plain_table(items: List[Item]) -> str:
    """The report as aligned plain text (no escape sequences)."""
    w = [max(len(getattr(i, a)) for i in items) for a in ("section", "name", "status")]
    return "\n".join(f"{i.section:<{w[0]}}  {i.name:<{w[1]}}  {i.status:<{w[2]}}  {i.detail}" for i in items)


def print_table(items: List[Item], stream=None) -> None:
    """A rich table on a terminal, plain text elsewhere."""
    stream = sys.stdout if stream is None else stream
    if not stream.isatty():
        print(plain_table(items), file=stream)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text  # plain Text: details such as '.[flashmla]' are not markup
    colour = {"ok": "green", "missing": "yellow", "info": "", "problem": "bold red"}
    t = Table("section", "item", "status", "detail", title="python -m harness.doctor")
    for i in items:
        t.add_row(Text(i.section), Text(i.name), Text(i.status, style=colour[i.status]), Text(i.detail))
    Console(file=stream).print(t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.doctor", description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    ap.add_argument("--skip-ceilings", action="store_true", help="do not measure the GPU's ceilings")
    args = ap.parse_args(argv)
    items = collect(skip_ceilings=args.skip_ceilings)
    if args.json:
        print(json.dumps(as_json(items), indent=1, default=str))
    else:
        print_table(items)
    bad = problems(items)
    if bad:
        print("the default run cannot work:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    if not args.json:
        print("the default run can work (ok: works; missing: optional, the detail says why)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
