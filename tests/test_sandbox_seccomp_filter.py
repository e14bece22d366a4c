"""The seccomp filter's binary-tree layout decides every syscall exactly as the plain linear list."""

from __future__ import annotations

import struct

import pytest

seccomp = pytest.importorskip("pyseccomp")

from rlcode.sandbox import seccomp_policy  # noqa: E402

AUDIT_ARCH_X86_64, AUDIT_ARCH_I386 = 0xC000003E, 0x40000003


def _run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...]) -> int:
    """A classic-BPF interpreter for what libseccomp emits, over one struct seccomp_data."""
    data = struct.pack("<IIQ6Q", nr, arch, 0, *args)
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    a = x = pc = 0
    memory = [0] * 16
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            a = struct.unpack_from("<I", data, k)[0]
        elif code == 0x00:  # ld #k
            a = k
        elif code == 0x60:  # ld M[k]
            a = memory[k]
        elif code == 0x02:  # st M[k]
            memory[k] = a
        elif code == 0x07:  # tax
            x = a
        elif code == 0x87:  # txa
            a = x
        elif code == 0x54:  # and #k
            a &= k
        elif code == 0x05:  # ja
            pc += k
        elif code in (0x15, 0x25, 0x35, 0x45):  # jeq / jgt / jge / jset #k
            taken = {0x15: a == k, 0x25: a > k, 0x35: a >= k, 0x45: bool(a & k)}[code]
            pc += jt if taken else jf
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"opcode {code:#x} not handled by this interpreter")


def _filter(optimize: bool, monkeypatch) -> bytes:
    original = seccomp.SyscallFilter

    class Linear(original):
        def set_attr(self, attr, value):
            if attr != seccomp.Attr.CTL_OPTIMIZE:
                super().set_attr(attr, value)

    if not optimize:
        monkeypatch.setattr(seccomp, "SyscallFilter", Linear)
    try:
        return seccomp_policy.build_filter_bpf()
    finally:
        monkeypatch.setattr(seccomp, "SyscallFilter", original)


def test_tree_and_linear_filters_agree(monkeypatch):
    tree, linear = _filter(True, monkeypatch), _filter(False, monkeypatch)
    assert tree != linear  # the optimisation is really on (else this test proves nothing)
    values = {0, 1, 2, 10, 0xFFFFFFFF, 0x1_0000_0001, seccomp_policy.TIOCSTI, 0x5413,
              *seccomp_policy.NAMESPACE_CLONE_FLAGS, 0x01200011}
    argument_sets = [(v, w, 0, 0, 0, 0) for v in values for w in values]
    denied = 0
    for arch in (AUDIT_ARCH_X86_64, AUDIT_ARCH_I386):
        for nr in (*range(0, 460), 0x40000000 | 1, 0xFFFFFFFF):
            for args in argument_sets if nr in (16, 41, 53, 56, 135, 435) else argument_sets[:3]:
                verdict = _run_bpf(tree, nr, arch, args)
                assert verdict == _run_bpf(linear, nr, arch, args), (arch, nr, args)
                denied += verdict != 0x7FFF0000
    assert denied > 100  # the policy denies plenty (not two filters that allow everything)


ALLOW, ENOSYS, EPERM = 0x7FFF0000, 0x00050000 | 38, 0x00050000 | 1


@pytest.mark.skipif(seccomp_policy.platform.machine() != "x86_64", reason="x86_64 syscall numbers")
def test_unreviewed_syscalls_fail_as_on_an_older_kernel():
    """Guards the boundary by number: every syscall above the reviewed range (x32 ones too) gets
    ENOSYS, the reviewed new ones the list denies get EPERM, and the rest of the reviewed range
    (fchmodat2, futex2, mseal, the *xattrat family...) is allowed. Other architectures' calls still
    go to libseccomp's own architecture check."""
    bpf = seccomp_policy.build_filter_bpf()
    args = (0, 0, 0, 0, 0, 0)
    for nr in (470, 471, 500, 1023, 0xFFFF, 0x40000000 | 1, 0x40000000 | 470, 0xFFFFFFFF):
        assert _run_bpf(bpf, nr, AUDIT_ARCH_X86_64, args) == ENOSYS, nr
    for nr, name in seccomp_policy.DENIED_BY_NUMBER.items():
        assert _run_bpf(bpf, nr, AUDIT_ARCH_X86_64, args) == EPERM, name
    for nr in (424, 434, 436, 437, 439, 441, 444, 449, 450, 452, 453, 454, 455, 456, 462, 463, 464, 465,
               466, 468, 469, 0, 1, 2, 60, 231, 318, 332, 334):
        assert _run_bpf(bpf, nr, AUDIT_ARCH_X86_64, args) == ALLOW, nr
    assert _run_bpf(bpf, 470, AUDIT_ARCH_I386, args) != ENOSYS  # i386's numbering: libseccomp's check


def test_a_child_calling_new_syscalls_beside_an_honest_one():
    """Guards the filter as loaded: a program calling listmount, open_tree_attr and a syscall past
    the reviewed range gets EPERM, EPERM and ENOSYS; an honest program in the same pool is unchanged."""
    from rlcode.sandbox import SandboxPool

    attack = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "for nr in (458, 467, 470, 500):\n"
              "    print(nr, libc.syscall(nr, 0, 0, 0, 0), ctypes.get_errno())\n")
    honest = "import os, tempfile, threading, subprocess\nprint(sum(range(10)), os.getpid() > 0)\n"
    with SandboxPool(workers=2, timeout=10.0) as pool:
        attacked, plain = pool.submit(attack).result(), pool.submit(honest).result()
    if seccomp_policy.platform.machine() == "x86_64":
        assert attacked.stdout.split("\n")[:4] == ["458 -1 1", "467 -1 1", "470 -1 38", "500 -1 38"], attacked
    assert plain.status.value == "ok" and plain.stdout == "45 True\n"


@pytest.mark.skipif(seccomp_policy.platform.machine() != "x86_64", reason="x86_64 syscall numbers")
def test_page_cache_drops_are_ignored_and_non_blocking_probes_refused():
    """Guards the page-cache rules as compiled: dropping a file's pages (fadvise DONTNEED/NOREUSE,
    madvise PAGEOUT/COLD) returns 0 without running; preadv2/pwritev2 with RWF_NOWAIT, alone or
    among other flags, get EOPNOTSUPP; every other advice and flag runs (the filter allows it)."""
    bpf = seccomp_policy.build_filter_bpf()
    fadvise64, madvise, preadv2, pwritev2 = 221, 28, 327, 328
    skipped, refused = 0x00050000, 0x00050000 | 95

    def verdict(nr, *args):
        return _run_bpf(bpf, nr, AUDIT_ARCH_X86_64, (*args, *(0,) * (6 - len(args))))

    for advice, expected in ((4, skipped), (5, skipped), (0, ALLOW), (1, ALLOW), (2, ALLOW), (3, ALLOW)):
        assert verdict(fadvise64, 3, 0, 0, advice) == expected, advice
    for advice, expected in ((20, skipped), (21, skipped), (4, ALLOW), (8, ALLOW), (14, ALLOW)):
        assert verdict(madvise, 0x7F0000000000, 4096, advice) == expected, advice
    for nr in (preadv2, pwritev2):
        for flags, expected in ((0x8, refused), (0x9, refused), (0x18, refused), (0, ALLOW), (0x1, ALLOW),
                                (0x10, ALLOW)):
            assert verdict(nr, 3, 0, 1, 0, 0, flags) == expected, (nr, flags)
