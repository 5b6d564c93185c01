"""Exported C built for other machines with zig cc (codegen.export(..., target=...)): a static
library of the model and a command-line program around it, for aarch64, 32-bit ARM, RISC-V or
x86-64 Linux (static executables on zig's own musl libc), run on this machine under qemu-user,
or for WebAssembly with WASI (zig's wasi-libc), run by the wasmtime package (codegen/backend/wasi.py).

One row per target in TARGETS: its zig triple, its ELF machine, what runs it elsewhere, and what
the exported C's loops become on it (`vectors`). Building C only: no graphs.
"""
from __future__ import annotations

import importlib.util
import pathlib
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

from .builds import ToolchainError
from .compilers import find_compiler
from .run import run_compiler

EMULATOR_ADVICE = "install qemu-user: `apt-get install qemu-user`"
WASI_RUNNER = "wasmtime"  # the package that runs wasm32-wasi programs (codegen/backend/wasi.py)


@dataclass(frozen=True)
class Target:
    triple: str       # zig's -target
    machine: int | None  # e_machine of its ELF files (None: WebAssembly)
    emulator: str     # what runs its programs on another machine: a qemu-user program, or WASI_RUNNER
    # What the exported loops become (dot() and sum_range() are written as sixteen independent
    # lanes, templates/kernels/dot.c: Clang's SLP vectoriser packs them into the target's vectors,
    # each lane's sum in the same order as the scalar code's, so the bits do not depend on it)
    vectors: str
    features: str = ""     # CPU features beyond the triple's baseline (zig's -mcpu=baseline+...)
    emulator_cpu: str = ""  # qemu-user's -cpu for them

    @property
    def arch(self) -> str:
        return self.triple.partition("-")[0]

    @property
    def name(self) -> str:
        """The key of TARGETS: the triple, then "+" and the features when there are some."""
        return f"{self.triple}+{self.features}" if self.features else self.triple

    @property
    def cpu(self) -> str:
        """zig's -mcpu: the triple's baseline, plus the features (RISC-V names its baseline per width)."""
        if not self.features:
            return "baseline"
        return ("baseline_rv64" if self.arch == "riscv64" else "baseline") + "+" + self.features


TARGETS = {t.name: t for t in [
    Target("x86_64-linux-musl", 62, "qemu-x86_64",
           "SSE2, 2 doubles a vector (zig's baseline x86-64; -march=native is for the host's modules)"),
    Target("aarch64-linux-musl", 183, "qemu-aarch64",
           "NEON (Advanced SIMD), 2 doubles a vector: ARMv8-A's baseline, so every aarch64 machine runs it"),
    Target("riscv64-linux-musl", 243, "qemu-riscv64",
           "none: scalar rv64gc code (the vector extension, V, is not in zig's baseline RISC-V)"),
    Target("riscv64-linux-musl", 243, "qemu-riscv64",
           "RVV 1.0, the vector extension (rv64gcv: boards with V, e.g. SpacemiT K1; qemu at VLEN 128)",
           features="v", emulator_cpu="rv64,v=true,vext_spec=v1.0,vlen=128"),
    Target("arm-linux-musleabihf", 40, "qemu-arm",
           "none: scalar VFP code (32-bit ARM's NEON has no float64 lanes)"),
    Target("wasm32-wasi", None, WASI_RUNNER,
           "none: scalar WebAssembly (simd128 is not in zig's baseline wasm32)"),
]}


class EmulatorNotFound(ToolchainError):
    pass


class ProgramFailed(ValueError):
    """A target's program exited with an error: a bad row (a token out of range), a partial row."""


def lookup(triple: str) -> Target:
    """The row of TARGETS for a zig triple (with "+features" for a row that has some, e.g.
    "riscv64-linux-musl+v"); a ValueError listing the known ones otherwise."""
    try:
        return TARGETS[triple]
    except (KeyError, TypeError):
        raise ValueError(f"unknown target {triple!r}; the known targets: {', '.join(TARGETS)}") from None


def check(triple: str, opt: int) -> Target:
    """lookup(triple), and a ValueError unless opt is a -O level: what build() would refuse."""
    if type(opt) is not int or opt not in (0, 1, 2, 3):
        raise ValueError(f"opt must be 0, 1, 2 or 3, not {opt!r}")
    return lookup(triple)


@dataclass(frozen=True)
class TargetBuild:
    target: Target
    library: pathlib.Path    # DIR/<triple>/lib<name>.a: the model, to link into a program of one's own
    program: pathlib.Path    # DIR/<triple>/<name>: the command-line program (templates/export/*_main.c)
    commands: tuple          # the zig commands run, in order
    seconds: float           # their wall time

    def command(self, *args) -> list[str]:
        """The command that runs the program here: itself on a machine of its architecture, else under
        its qemu-user emulator, or WebAssembly through wasmtime (EmulatorNotFound when missing)."""
        if platform.machine() == self.target.arch:
            return [str(self.program), *map(str, args)]
        if self.target.emulator == WASI_RUNNER:
            if importlib.util.find_spec(WASI_RUNNER) is None:
                raise EmulatorNotFound(f"{WASI_RUNNER} not found to run {self.program.name}; `pip install wasmtime`")
            return [sys.executable, "-m", "codegen.backend.wasi", str(self.program), *map(str, args)]
        emulator = shutil.which(self.target.emulator)
        if emulator is None:
            raise EmulatorNotFound(f"{self.target.emulator} not found to run {self.program.name} for "
                                   f"{self.target.triple}; {EMULATOR_ADVICE}")
        cpu = ["-cpu", self.target.emulator_cpu] if self.target.emulator_cpu else []
        return [emulator, *cpu, str(self.program), *map(str, args)]

    def run(self, *args, stdin: bytes = b"") -> str:
        """The program's stdout, run here by command(); ProgramFailed with its stderr if it fails."""
        done = subprocess.run(self.command(*args), input=stdin, capture_output=True)
        if done.returncode != 0:
            raise ProgramFailed(f"{self.program} failed (exit status {done.returncode}): "
                                f"{done.stderr.decode(errors='replace').strip()}")
        return done.stdout.decode()

    def predict(self, rows) -> np.ndarray:
        """The frozen program's outputs for float64 rows of inputs, a row each."""
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        return np.array([[float(v) for v in line.split()] for line in self.run(stdin=rows.tobytes()).splitlines()])

    def train(self, rows, lr: float, params_file) -> tuple[np.ndarray, np.ndarray]:
        """The trainable program's losses, one SGD step of rate lr per float64 row of inputs, and its
        final parameters (written to params_file)."""
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        losses = self.run(repr(float(lr)), params_file, stdin=rows.tobytes()).split()
        return np.array([float(v) for v in losses]), np.fromfile(params_file)


def build(source: pathlib.Path, main: str, name: str, triple: str, opt: int = 2, fma: bool = False,
          timeout: float | None = None) -> TargetBuild:
    """Builds the exported C `source` (its header beside it) for `triple` into source's directory's
    <triple>/: lib<name>.a, and the program of the C text `main` linked with it (static, on zig's
    musl or wasi-libc).
    fma=False compiles with -ffp-contract=off: the target's fused multiply-adds (aarch64, RISC-V
    and ARM's VFPv4 have them; baseline x86-64 has none) would round a*b+c once, not twice, and the
    numbers would no longer be the host module's bits. CompileError with the output on failure;
    CompilerNotFound (how to install it) without zig."""
    target = check(triple, opt)
    source = pathlib.Path(source)
    zig, flags = _zig(), _flags(target, opt, fma, source.parent)
    directory = source.parent / triple
    directory.mkdir(parents=True, exist_ok=True)
    main_source = directory / f"{name}_main.c"
    main_source.write_text(main)
    library = directory / f"lib{name}.a"
    program = directory / (f"{name}.wasm" if target.machine is None else name)
    obj, main_obj = directory / f"{name}.o", directory / f"{name}_main.o"
    library.unlink(missing_ok=True)  # ar adds to an archive that exists
    # The link names the triple only: zig builds its libc (musl, wasi-libc) from source once per
    # distinct target, CPU and mode (a minute or two each), so linking every build of a triple
    # against the baseline's shares one libc between -O levels and CPU features (+v's objects link
    # with the baseline rv64gc musl as any RISC-V objects do)
    commands = [[*zig, *flags, "-c", str(source), "-o", str(obj)],
                [zig[0], "ar", "rcs", str(library), str(obj)],
                [*zig, *flags, "-c", str(main_source), "-o", str(main_obj)],
                [*zig, "-target", target.triple, str(main_obj), str(library), "-lm", "-o", str(program)]]
    seconds = sum(run_compiler(command, timeout)[0] for command in commands)
    obj.unlink()
    main_obj.unlink()
    return TargetBuild(target, library, program, tuple(map(tuple, commands)), seconds)


def assembly(source: pathlib.Path, triple: str, opt: int = 2, fma: bool = False) -> str:
    """The assembly zig cc makes of `source` for `triple` with build()'s flags: what its loops became."""
    target = check(triple, opt)
    source = pathlib.Path(source)
    output = source.parent / f"{source.stem}.{triple}.s"
    run_compiler([*_zig(), *_flags(target, opt, fma, source.parent), "-S", str(source), "-o", str(output)], None)
    text = output.read_text(errors="replace")
    output.unlink()
    return text


def _zig() -> tuple[str, ...]:
    return find_compiler("zig").argv  # (zig, "cc"); CompilerNotFound says how to install it


def _flags(target: Target, opt: int, fma: bool, include: pathlib.Path) -> list[str]:
    # -fno-sanitize=undefined: zig cc's -O0 adds UBSan, which would make -O0 builds another program
    return ["-target", target.triple, f"-mcpu={target.cpu}", f"-O{opt}", "-std=c99", "-fno-sanitize=undefined",
            f"-ffp-contract={'on' if fma else 'off'}", f"-I{include}"]
