#!/bin/bash
# Device call h1: the host facts behind the swap-in's growth with the host pool (BENCHMARKS 6n /
# 6t): is the GPU's DMA to host memory translated by an IOMMU, which huge pages does the host
# have, and how does the driver map host memory. Reads only; writes nothing outside $OUT.
set -u
mkdir -p $OUT
{
  echo "== id"; id
  echo "== cmdline"; cat /proc/cmdline
  echo "== kernel"; uname -a
  echo "== iommu classes"; ls /sys/class/iommu 2>&1
  echo "== iommu groups"; ls /sys/kernel/iommu_groups 2>&1 | wc -l
  for g in /sys/kernel/iommu_groups/*/type; do echo "$g $(cat $g 2>&1)"; done 2>/dev/null | sort -k2 | uniq -c -f1 | head
  echo "== gpu pci"; nvidia-smi --query-gpu=pci.bus_id,driver_version,name --format=csv,noheader
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-F' 'a-f' | sed 's/^0000//; s/^/0000/' | sed 's/^00000000/0000/')
  echo "bus=$bus"
  for d in /sys/bus/pci/devices/*; do
    if [ "$(cat $d/vendor 2>/dev/null)" = "0x10de" ] && [ "$(cat $d/class 2>/dev/null | cut -c1-6)" = "0x0302" ]; then
      echo "$d group=$(readlink $d/iommu_group 2>&1) type=$(cat $d/iommu_group/type 2>&1)"
      echo "  max_link_speed $(cat $d/max_link_speed 2>&1) width $(cat $d/current_link_width 2>&1) numa $(cat $d/numa_node 2>&1)"
    fi
  done
  echo "== dmesg iommu"; (dmesg 2>&1 | grep -i -m8 "iommu\|DMAR\|AMD-Vi") || true
  echo "== hugepages"; grep -i huge /proc/meminfo
  for h in /sys/kernel/mm/hugepages/*; do echo "$h nr=$(cat $h/nr_hugepages) free=$(cat $h/free_hugepages) writable=$([ -w $h/nr_hugepages ] && echo yes || echo no)"; done
  echo "thp enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled) defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)"
  echo "hugetlbfs mounts:"; grep huge /proc/mounts || echo none
  echo "== nvidia params"; grep -v "^$" /proc/driver/nvidia/params 2>&1 | head -60
  echo "== nvidia-smi -q (addressing, bar1)"; nvidia-smi -q | grep -i -A3 "addressing\|BAR1 Memory\|ATS" | head -30
  echo "== cpu"; lscpu | grep -i "model name\|numa\|socket" 
} > $OUT/host_facts.txt 2>&1
cat $OUT/host_facts.txt
python3 - <<'PY' 2>&1 | tee -a $OUT/host_facts.txt
import mmap
MAP_HUGETLB, SHIFT = 0x40000, 26
for name, size, log2 in (("2MiB", 2 << 20, 21), ("1GiB", 1 << 30, 30)):
    try:
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB | (log2 << SHIFT))
        m[0:1] = b"x"; m.close(); print(f"hugetlb {name}: mapped")
    except OSError as e:
        print(f"hugetlb {name}: {e}")
PY
git -C . log -1 --format=%h 2>/dev/null || true
