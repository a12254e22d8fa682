"""An `--out DIR` folder that checks itself.

`index.json` records each batch file's size and SHA-256 and a checksum of its own content, so a file cut
short, garbled, put in another batch's place or written by something else, and an index edited by hand,
are found before anything is read from them. Files are written under a temporary name and moved into
place; a temporary file a stopped process left behind is removed by the next run.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from ..errors import ArgumentError, NbgradError
from ..errors.naming import a_or_an

INDEX = "index.json"
FORMAT = 2                       # index.json with file records and its own checksum
_LEFTOVER = re.compile(r"^\.(?:batch-\d+\.safetensors|index\.json|probe)\.(\d+)\.tmp$")


def batch_file(folder: Path, start: int) -> Path:
    return folder / f"batch-{start:08d}.safetensors"


def out_folder(folder) -> Path:
    """DIR as the user wrote it, `~` expanded and `..` resolved by its text, so that `x/../../y` makes no `x`."""
    if not isinstance(folder, (str, os.PathLike)) or not str(folder).strip():
        what = "an empty path" if isinstance(folder, str) else f"{a_or_an(type(folder).__name__)} `{folder!r}`"[:80]
        raise ArgumentError(f"--out (out=) is {what}, not a folder: give the path of a folder (made if missing), "
                            f"e.g. --out acts/")
    return Path(os.path.abspath(os.path.expanduser(str(folder))))


def prepare(folder: Path, shown) -> None:
    """Make DIR, remove what stopped runs left, and find out now, before any batch is computed, whether
    files can be written there."""
    if folder.exists() and not folder.is_dir():
        raise ArgumentError(f"--out {shown} is a file, not a folder: give a folder (made if missing), where each "
                            f"batch's values are written")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        remove_leftovers(folder)
        probe = folder / f".probe.{os.getpid()}.tmp"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ArgumentError(f"--out {shown}: the folder cannot be written ({error.strerror or error}): give a "
                            f"folder this process may write to") from None


def remove_leftovers(folder: Path) -> None:
    """The temporary files of writes that never finished (their process is gone)."""
    for path in folder.glob(".*.tmp"):
        found = _LEFTOVER.match(path.name)
        if found and (int(found.group(1)) == os.getpid() or not _alive(int(found.group(1)))):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                 # another user's process
        return True
    return True


def write_atomic(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def record(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_index(folder: Path) -> dict | None:
    """DIR's index, checked against its own checksum; None where DIR has none."""
    path = folder / INDEX
    if not path.exists():
        return None
    try:
        index = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise _unusable_index(path, f"it cannot be read as JSON ({error})") from None
    if not isinstance(index, dict):
        raise _unusable_index(path, f"it holds {a_or_an(type(index).__name__)}, not the index nbgrad writes")
    if index.get("format") != FORMAT:
        raise _unusable_index(path, "it was not written by this version of nbgrad (no checksums of the batch files)")
    if index.get("sha256") != _index_digest(index):
        raise _unusable_index(path, "its content does not match its checksum (edited or damaged)")
    return index


def write_index(folder: Path, index: dict) -> None:
    index = dict(index, format=FORMAT)
    index["sha256"] = _index_digest(index)
    write_atomic(folder / INDEX, json.dumps(index, indent=1).encode())


def _index_digest(index: dict) -> str:
    content = {key: value for key, value in index.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _unusable_index(path: Path, problem: str) -> NbgradError:
    return NbgradError(f"{path} cannot be used: {problem}. It lists the batches of --out {path.parent}: delete "
                       f"{path.name} to compute every batch again (the batch files are written anew), or give a "
                       f"new DIR")


def file_problem(path: Path, held: dict | None, data: bytes | None = None) -> str | None:
    """What is wrong with a batch file against its record in the index (None: it is the file written)."""
    if held is None:
        return "the index has no record of it"
    if path.is_dir():
        return "it is a folder, not a batch file"
    if data is None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return "it is missing"
        except OSError as error:
            return f"it cannot be read ({error.strerror or error})"
    if len(data) != held["bytes"]:
        return f"it holds {len(data)} bytes where the index says {held['bytes']} (cut short, or another file)"
    if hashlib.sha256(data).hexdigest() != held["sha256"]:
        return "its checksum differs from the index's (damaged, or another file put in its place)"
    return None


def verify(folder) -> dict:
    """Check a whole `--out` folder: its index and every batch file it lists. Returns what DIR holds
    (`examples`, `batches`, `names`); raises an error naming every file that cannot be used, and what to do."""
    path = out_folder(folder)
    if not path.is_dir():
        raise NbgradError(f"verify: {folder} is not a folder")
    index = read_index(path)
    if index is None:
        raise NbgradError(f"verify: {folder} holds no {INDEX}: it is not a folder that --out wrote, or its run "
                          f"finished no batch")
    problems = []
    for start in sorted(int(s) for s in index["batches"]):
        file = batch_file(path, start)
        problem = file_problem(file, index["files"].get(str(start)))
        if problem:
            problems.append(f"  {file.name}: {problem}")
    if problems:
        raise NbgradError(f"verify: {len(problems)} of {len(index['batches'])} batch files in {folder} cannot be "
                          f"used:\n" + "\n".join(problems) + "\nRun the same cell with the same --out DIR again: "
                          "it computes these batches again and keeps the others")
    return {"examples": sum(index["batches"].values()), "batches": len(index["batches"]), "names": index["names"]}
