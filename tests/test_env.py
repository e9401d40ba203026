"""Provenance of every row (``harness/env.py``): whether the host is a virtual machine."""
from harness.env import host_virtualized, provenance


def test_host_virtualized_reads_the_hypervisor_flag(tmp_path):
    bare, vm = tmp_path / "bare", tmp_path / "vm"
    head = "processor\t: 0\nvendor_id\t: GenuineIntel\n"
    bare.write_text(head + "flags\t\t: fpu vme sse2 avx512f hypervisorx\n")
    vm.write_text(head + "flags\t\t: fpu vme sse2 hypervisor avx512f\n")
    assert host_virtualized(str(bare)) is False        # a flag's prefix is not the flag
    assert host_virtualized(str(vm)) is True
    assert host_virtualized(str(tmp_path / "absent")) is None
    (tmp_path / "noflags").write_text(head)
    assert host_virtualized(str(tmp_path / "noflags")) is None


def test_provenance_carries_this_hosts_virtualization():
    assert provenance("cpu")["host_virtualized"] == host_virtualized()
