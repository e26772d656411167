"""The extension carries LLVM inside it (linked statically): it needs no LLVM library at run
time. Checked by its dynamic dependencies, and by importing and compiling in a mount
namespace where every LLVM library on this machine is hidden (root and unshare only)."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

import tapejit

EXTENSION = tapejit._tapejit.__file__


def test_no_llvm_library_among_the_dynamic_dependencies():
    if shutil.which("ldd") is None:
        pytest.skip("no ldd")
    deps = subprocess.run(["ldd", EXTENSION], capture_output=True, text=True, check=True).stdout
    assert "LLVM" not in deps, deps


def test_imports_and_compiles_with_every_llvm_library_hidden():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare")
    hidden = [d for d in glob.glob("/usr/lib/llvm-*") if os.path.isdir(d)]
    libraries = [f for pattern in ("/usr/lib/*/libLLVM*", "/usr/lib/libLLVM*", "/usr/local/lib/libLLVM*")
                 for f in glob.glob(pattern) if os.path.isfile(f) and not os.path.islink(f)]
    script = "; ".join(
        ["set -e", "mount --make-rprivate /"]
        + [f"mount -t tmpfs none {d}" for d in hidden]
        + [f"mount --bind /dev/null {f}" for f in libraries]
        + ["ls /usr/lib/llvm-*/lib 2>/dev/null | wc -l",
           f"{sys.executable} -c '{PROGRAM}'"]
    )
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[0] == "0" and lines[-1] == "ok", done.stdout


PROGRAM = (
    "import tapejit; from tapejit import Value; "
    "x = Value(0.0); w = Value(0.5); loss = (w * x - 1.0) ** 2; "
    "p = tapejit.compile(loss, inputs=[x], opt=\"O2\"); p.step([2.0], 0.1); "
    "print(\"ok\")"
)
