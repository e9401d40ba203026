"""Does host memory mapped for the GPU through CUDA's virtual memory API (cuMemCreate with a
host location, mapped at its allocation granularity) translate cheaper than page-locked
malloc'd memory? tlb33.py's gather (9824 random 656-byte rows, the coordinator's default copy
launch) from pools of 0.32 / 1.28 / 2.56 GiB, registered (cudaHostRegister) against VMM host
memory (CU_MEM_LOCATION_TYPE_HOST_NUMA, node 0, then HOST), the same rows every call, warm and
with a 4 GiB ``HostTranslationFlusher`` before each call (cold). The VMM pool is filled by the
GPU and viewed as a CUDA tensor (``__cuda_array_interface__``); every call's rows checked
against the device mirror. CUDA events, L2 flushed, median of 24. Usage: python3 vmm35.py"""
import ctypes as C
import types

import numpy as np
import torch

from harness.bench.swap_in import GatherCase, HostPool, evict_host_caches, gather_engine
from harness.timing import HostTranslationFlusher, time_fn

ROW, N = 656, 9824
dev = torch.device("cuda")
torch.cuda.init()
torch.empty(1, device=dev)                       # the primary context
cu = C.CDLL("libcuda.so.1")


class Loc(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class Flags(C.Structure):
    _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte),
                ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]


class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc),
                ("win32HandleMetaData", C.c_void_p), ("allocFlags", Flags)]


class Access(C.Structure):
    _fields_ = [("location", Loc), ("flags", C.c_int)]


def ck(rc, what):
    if rc != 0:
        name = C.c_char_p()
        cu.cuGetErrorName(rc, C.byref(name))
        raise RuntimeError(f"{what}: {rc} {name.value}")


class VmmHost:
    """``nbytes`` of host memory from cuMemCreate at location ``loc_type`` (2 HOST, 3
    HOST_NUMA), mapped into a reserved VA range with read/write access for device 0."""

    def __init__(self, nbytes, loc_type):
        prop = Prop(type=1, requestedHandleTypes=0, location=Loc(loc_type, 0))
        gran = C.c_size_t()
        ck(cu.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 1), "granularity")
        self.gran = gran.value
        self.size = -(-nbytes // self.gran) * self.gran
        self.handle = C.c_ulonglong()
        ck(cu.cuMemCreate(C.byref(self.handle), C.c_size_t(self.size), C.byref(prop),
                          C.c_ulonglong(0)), "cuMemCreate")
        self.ptr = C.c_ulonglong()
        ck(cu.cuMemAddressReserve(C.byref(self.ptr), C.c_size_t(self.size),
                                  C.c_size_t(self.gran), C.c_ulonglong(0), C.c_ulonglong(0)),
           "reserve")
        ck(cu.cuMemMap(self.ptr, C.c_size_t(self.size), C.c_size_t(0), self.handle,
                       C.c_ulonglong(0)), "map")
        acc = Access(Loc(1, 0), 3)
        ck(cu.cuMemSetAccess(self.ptr, C.c_size_t(self.size), C.byref(acc), C.c_size_t(1)),
           "access")
        iface = {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr.value, False),
                 "version": 3, "strides": None}
        self.tensor = torch.as_tensor(types.SimpleNamespace(__cuda_array_interface__=iface),
                                      device=dev)


flusher = HostTranslationFlusher(dev, 4 << 30)
engine = gather_engine("default", dev)
rows = []
for gib in (0.32, 1.28, 2.56):
    pool_rows = int(gib * (1 << 30)) // ROW
    for kind in ("registered", "vmm_host_numa", "vmm_host"):
        try:
            if kind == "registered":
                pool = HostPool(pool_rows, ROW, "registered", dev, seed=pool_rows)
            else:
                vm = VmmHost(pool_rows * ROW, 3 if kind == "vmm_host_numa" else 2)
                t = vm.tensor[:pool_rows * ROW].view(pool_rows, ROW)
                mirror = torch.randint(0, 256, (pool_rows, ROW), dtype=torch.uint8, device=dev,
                                       generator=torch.Generator(dev).manual_seed(pool_rows))
                t.copy_(mirror)
                torch.cuda.synchronize()
                pool = types.SimpleNamespace(tensor=t, mirror=mirror)
                print(f"{kind} {gib} GiB: granularity {vm.gran >> 20} MiB, ptr {vm.ptr.value:#x}",
                      flush=True)
        except Exception as e:                       # noqa: BLE001 - report and go on
            print(f"{kind} {gib} GiB: {type(e).__name__}: {e}", flush=True)
            continue
        evict_host_caches()
        rng = np.random.default_rng(pool_rows)
        case = GatherCase(pool, rng.choice(pool_rows, N, replace=False), rng, dev)
        for mode, fl in (("warm", None), ("cold", flusher)):
            t_ = time_fn(lambda: engine.copy(case.pool, case.dev, case.plan, 1, 1), dev, warmup=3,
                         repeats=24, setup=case.setup, host_flush=fl)
            ok = not case.check().failure()
            rows.append((gib, kind, mode, t_.median_us, t_.p10_us, t_.p90_us, "ok" if ok else "BAD"))
            print(rows[-1], flush=True)
        del case, pool
        torch.cuda.synchronize()
print(f"{'pool_GiB':>8} {'memory':14} {'mode':5} {'median_us':>9} {'p10':>7} {'p90':>7} check")
for r in rows:
    print(f"{r[0]:8.2f} {r[1]:14} {r[2]:5} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]}")
