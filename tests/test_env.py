"""Provenance of every row (``harness/env.py``): whether the host is a virtual machine, and
which code ran (``code_tree_sha``)."""
import subprocess

from harness.env import code_tree_sha, host_virtualized, provenance


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


def test_code_tree_sha_names_the_code_on_disk(tmp_path):
    """A repository of its own: the code paths' tree id on disk equals the committed one while
    they are the commit's; an edit, an untracked file under a code path, or a file mode change
    makes it differ; ignored files, files outside the code paths and the repository's own index
    do not count (it is left as it was); an older ``.git`` with newer files (the GPU machine's
    copy) names the newer commit's code, not its own HEAD's."""
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "a.py").write_text("x = 1\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "c.yaml").write_text("k: 1\n")
    (tmp_path / ".gitignore").write_text("*.pyc\n")
    (tmp_path / "notes.md").write_text("not code\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    one = code_tree_sha(root=tmp_path)
    assert one is not None and one == code_tree_sha("HEAD", root=tmp_path)
    (tmp_path / "notes.md").write_text("still not code\n")
    (tmp_path / "harness" / "b.pyc").write_bytes(b"\0")
    assert code_tree_sha(root=tmp_path) == one
    (tmp_path / "harness" / "a.py").write_text("x = 2\n")
    two = code_tree_sha(root=tmp_path)
    assert two not in (None, one)
    (tmp_path / "harness" / "new.py").write_text("y = 1\n")
    three = code_tree_sha(root=tmp_path)
    assert three not in (None, one, two)
    assert git("diff", "--cached", "--name-only") == ""          # nothing staged in .git/index
    assert "?? harness/new.py" in git("status", "--porcelain")
    (tmp_path / "harness" / "new.py").chmod(0o755)
    assert code_tree_sha(root=tmp_path) not in (one, two, three)
    (tmp_path / "harness" / "new.py").chmod(0o644)
    git("add", "-A")
    git("commit", "-qm", "two")
    assert code_tree_sha("HEAD", root=tmp_path) == three
    git("reset", "-q", "--soft", "HEAD~1")         # an older .git, the newer files on disk
    assert code_tree_sha(root=tmp_path) == three != code_tree_sha("HEAD", root=tmp_path) == one
    assert code_tree_sha(root=tmp_path / "harness" / "nowhere") is None


def test_provenance_names_the_code():
    row = provenance("cpu")
    assert set(row) >= {"git_sha", "git_dirty", "code_tree_sha"}
    if row["git_sha"] != "unknown":
        assert len(row["code_tree_sha"]) == 40
