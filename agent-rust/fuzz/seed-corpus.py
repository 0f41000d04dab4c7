#!/usr/bin/env python3
"""Seeds the fuzz corpora with real inputs.

- corpus/mapping: the __llvm_covmap, __llvm_covfun and __llvm_prf_names
  sections of every fixture binary under target/fixtures (build them with
  `cargo test -p livecov-tests`), and of the C fixture built by clang-19
  with -fcoverage-mcdc when clang-19 is there, in the layout of
  fuzz_targets/mapping.rs: u32 LE covmap length, u32 LE covfun length,
  then the three sections.
- corpus/profile: one .profraw of every fixture run, and the real profiles
  of the unit tests (agent-rust/src/profile/real_profiles.rs).
- corpus/indexed_profile: the profiles of every fixture run indexed by each
  llvm-profdata there is (rustup's LLVM 22, Debian's 19, 14 and 13) that
  reads them.

Usage: agent-rust/fuzz/seed-corpus.py   (from anywhere; idempotent)
"""
import hashlib
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile

FUZZ = pathlib.Path(__file__).resolve().parent
ROOT = FUZZ.parent.parent
FIXTURES = ROOT / "target" / "fixtures"


def sections(path, names):
    """Contents of the named sections of a little-endian ELF64 file."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    found = {}
    for name_off, _type, _flags, _addr, off, size in headers:
        start = strtab[4] + name_off
        name = data[start:data.index(b"\0", start)].decode()
        if name in names:
            found[name] = data[off:off + size]
    return [found.get(n, b"") for n in names]


def save(corpus, data):
    corpus.mkdir(parents=True, exist_ok=True)
    (corpus / hashlib.sha1(data).hexdigest()).write_bytes(data)


def mapping_seed(binary):
    covmap, covfun, names = sections(binary, ["__llvm_covmap", "__llvm_covfun", "__llvm_prf_names"])
    if not covmap:
        return None
    return struct.pack("<II", len(covmap), len(covfun)) + covmap + covfun + names


def main():
    if not FIXTURES.is_dir():
        sys.exit(f"{FIXTURES} does not exist: run `cargo test -p livecov-tests` first")
    binaries = [p for p in FIXTURES.glob("*/*") if p.is_file() and p.name in ("main", "host", "libplugin.so")]
    binaries += [FIXTURES / "rust" / "debug" / "app"]
    with tempfile.TemporaryDirectory() as tmp:
        clang = shutil.which("clang-19")
        if clang:
            mcdc = pathlib.Path(tmp) / "mcdc"
            subprocess.run(
                [clang, "-fprofile-instr-generate", "-fcoverage-mapping", "-fcoverage-mcdc", "-O0",
                 "main.c", "util.c", "-o", str(mcdc)],
                cwd=ROOT / "fixtures" / "c", check=True)
            binaries.append(mcdc)
        n = 0
        for binary in binaries:
            if binary.is_file():
                seed = mapping_seed(binary)
                if seed:
                    save(FUZZ / "corpus" / "mapping", seed)
                    n += 1
    print(f"corpus/mapping: {n} seeds")

    n = 0
    for run in FIXTURES.glob("*/runs/*/*"):
        profraws = sorted(run.glob("*.profraw"))
        if profraws:
            save(FUZZ / "corpus" / "profile", profraws[0].read_bytes())
            n += 1
    real = (ROOT / "agent-rust" / "src" / "profile" / "real_profiles.rs").read_text()
    for block in re.findall(r"bytes: concat!\((.*?)\)", real, re.S):
        save(FUZZ / "corpus" / "profile", bytes.fromhex("".join(re.findall(r'"([0-9a-f]*)"', block))))
        n += 1
    print(f"corpus/profile: {n} seeds")

    sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True).stdout.strip()
    tools = [str(p) for p in pathlib.Path(sysroot).glob("lib/rustlib/*/bin/llvm-profdata")]
    tools += [t for t in map(shutil.which, ["llvm-profdata-19", "llvm-profdata-14", "llvm-profdata-13"]) if t]
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "indexed.profdata"
        for run in FIXTURES.glob("*/runs/*/*"):
            profraws = sorted(map(str, run.glob("*.profraw")))
            for tool in tools if profraws else []:
                # Each llvm-profdata reads only its own LLVM's raw profiles.
                merged = subprocess.run([tool, "merge", "-o", str(out)] + profraws, capture_output=True)
                if merged.returncode == 0:
                    save(FUZZ / "corpus" / "indexed_profile", out.read_bytes())
                    n += 1
    print(f"corpus/indexed_profile: {n} seeds")


main()
