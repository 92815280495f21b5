"""Is a file a delegate library this process can load? Checked before dlopen ever sees it.

dlopen trusts the file: a truncated library maps pages past its end and dies with SIGBUS, a
library for another machine or one without the external-delegate entry points fails inside
LiteRT with a traceback. `check_delegate_library` reads the ELF headers (pyelftools) and refuses,
with one line, anything that is not a complete shared library for this machine exporting
`tflite_plugin_create_delegate` and `tflite_plugin_destroy_delegate`.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from .model.errors import ModelError

ENTRY_POINTS = ("tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate")
# ELF e_machine names (as pyelftools spells them) of the machines a delegate may be built for.
_MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "arm64": "EM_AARCH64"}


def check_delegate_library(path: str | os.PathLike, machine: str | None = None) -> None:
    """Raises ModelError (one line) unless `path` is a complete ELF shared library for `machine`
    (Python's platform.machine() name; default: this machine) that exports the TFLite
    external-delegate entry points."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: no such delegate library")
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            elf = ELFFile(handle)
            problem = _problem(elf, size, machine or platform.machine())
    except ELFError as exc:
        problem = f"not an ELF file ({exc})"
    except Exception as exc:  # pyelftools raises what its parsers raise on cut-off tables
        problem = f"a damaged ELF file ({type(exc).__name__})"
    if problem:
        raise ModelError(f"{path}: not a delegate library: {problem}")


def _problem(elf: ELFFile, size: int, machine: str) -> str | None:
    """What is wrong with an opened ELF file as a delegate library for `machine`, or None."""
    if elf["e_type"] != "ET_DYN":
        return f"an ELF file of type {elf['e_type']}, not a shared library"
    expected = _MACHINES.get(machine)
    if expected and elf["e_machine"] != expected:
        here = "this machine is" if machine == platform.machine() else "it must be for"
        return f"built for {elf['e_machine']}, {here} {machine}"
    for segment in elf.iter_segments():
        if segment["p_type"] == "PT_LOAD" and segment["p_offset"] + segment["p_filesz"] > size:
            return f"truncated: a loadable segment ends at byte {segment['p_offset'] + segment['p_filesz']}, the file at {size}"
    if elf["e_shoff"] + elf["e_shnum"] * elf["e_shentsize"] > size:
        return "truncated: its section headers lie past the end of the file"
    dynsym = elf.get_section_by_name(".dynsym")
    if dynsym is None:
        return "no dynamic symbol table"
    missing = [name for name in ENTRY_POINTS if not _defined(dynsym, name)]
    if missing:
        return f"it does not export {', '.join(missing)} (the TFLite external-delegate entry points)"
    return None


def _defined(dynsym, name: str) -> bool:
    symbols = dynsym.get_symbol_by_name(name) or []
    return any(s["st_shndx"] != "SHN_UNDEF" for s in symbols)
