"""`--out DIR` checks itself: a damaged, swapped or foreign batch file, and a damaged or edited index, are found
before anything is read from them; on resume a damaged batch is computed again, on load the error names the
file. Values are compared with the example run alone with plain hooks on the same weights."""
import json
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import save_file

import nbgrad
from nbgrad.datasets import folder as out_folder

PROMPTS = ["The Eiffel Tower is in", "Hi", "A longer prompt, one of several", "Paris", "x y"]
BODY = "last = model.transformer.h[1].output[:, -1].save()\n"


def plain_last(model, prompt):
    """The oracle: the example alone, a plain forward hook on the same block."""
    ids = torch.tensor([nbgrad.tokenizer_for(model)(prompt)["input_ids"]])
    kept = {}
    handle = model.transformer.h[1].register_forward_hook(lambda m, a, o: kept.__setitem__("last", o[:, -1]))
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        handle.remove()
    return kept["last"]


def run(model, out, prompts=PROMPTS):
    """The cell over `prompts` into `out`: (namespace, how many forward calls of the model it made)."""
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    namespace = {"model": model}
    try:
        nbgrad.trace(model, None, BODY, namespace, over=prompts, batch_size=2, out=out)
    finally:
        handle.remove()
    return namespace, len(calls)


def assert_values_right(model, namespace, prompts=PROMPTS):
    for index, prompt in enumerate(prompts):
        torch.testing.assert_close(namespace["last"][index], plain_last(model, prompt), atol=1e-5, rtol=1e-4)


def batch(folder, start):
    return folder / f"batch-{start:08d}.safetensors"


def cut_short(path):
    path.write_bytes(path.read_bytes()[:-7])


def garbled(path):
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF                        # the same size, one byte of a tensor changed
    path.write_bytes(bytes(data))


def foreign(path):
    save_file({"last/0": torch.zeros(3)}, str(path))        # a safetensors file without nbgrad's layout


@pytest.mark.parametrize("damage", [cut_short, garbled, foreign, os.remove])
def test_a_damaged_batch_file_is_computed_again_on_resume_and_named_on_load(default_model, tmp_path, damage):
    model = default_model
    run(model, tmp_path)
    damage(batch(tmp_path, 2))
    namespace, calls = run(model, tmp_path)
    assert calls == 1                       # examples 2-3 only
    assert_values_right(model, namespace)
    assert nbgrad.datasets.verify(tmp_path) == {"examples": 5, "batches": 3, "names": ["last"]}
    # damaged after the run: reading it says which file, and what to do
    torch.testing.assert_close(namespace["last"][0], plain_last(model, PROMPTS[0]), atol=1e-5, rtol=1e-4)
    damage(batch(tmp_path, 4))
    with pytest.raises(nbgrad.NbgradError) as caught:
        namespace["last"][4]
    assert str(caught.value).startswith(f"{batch(tmp_path, 4)} cannot be read: ")
    assert str(caught.value).endswith(". Run the same cell with the same --out DIR again: it computes this batch "
                                      "again (or `nbgrad.datasets.verify(DIR)` lists every such file)")


def test_a_batch_file_swapped_for_another_is_found(default_model, tmp_path):
    model = default_model
    run(model, tmp_path, PROMPTS[:4])
    first, second = batch(tmp_path, 0), batch(tmp_path, 2)
    first_data = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(first_data)
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.datasets.verify(tmp_path)
    swapped = r"(its checksum differs from the index's \(damaged, or another file put in its place\)|it holds \d+ " \
              r"bytes where the index says \d+ \(cut short, or another file\))"
    assert re.fullmatch(
        f"verify: 2 of 2 batch files in {re.escape(str(tmp_path))} cannot be used:\n"
        f"  batch-00000000.safetensors: {swapped}\n  batch-00000002.safetensors: {swapped}\n"
        f"Run the same cell with the same --out DIR again: it computes these batches again and keeps the others",
        str(caught.value))
    namespace, calls = run(model, tmp_path, PROMPTS[:4])
    assert calls == 2
    assert_values_right(model, namespace, PROMPTS[:4])
    nbgrad.datasets.verify(tmp_path)


def test_a_folder_in_place_of_a_batch_file_is_named(default_model, tmp_path):
    model = default_model
    run(model, tmp_path)
    batch(tmp_path, 2).unlink()
    batch(tmp_path, 2).mkdir()
    with pytest.raises(nbgrad.NbgradError) as caught:
        run(model, tmp_path)
    assert str(caught.value) == (f"{batch(tmp_path, 2)} is a folder where the batch of examples 2-3 belongs: move "
                                 f"or delete it, and run the cell again")


@pytest.mark.parametrize("index_text, problem", [
    ("", "it cannot be read as JSON (Expecting value: line 1 column 1 (char 0))"),
    ('{"cell": "ab', "it cannot be read as JSON (Unterminated string starting at: line 1 column 10 (char 9))"),
    ("[1]", "it holds a list, not the index nbgrad writes"),
    ("names", "its content does not match its checksum (edited or damaged)"),
    ("format", "it was not written by this version of nbgrad (no checksums of the batch files)"),
])
def test_a_damaged_or_edited_index_is_an_error_that_says_what_to_do(default_model, tmp_path, index_text, problem):
    model = default_model
    run(model, tmp_path)
    index_path = tmp_path / "index.json"
    if index_text in ("names", "format"):         # edited by hand: a name dropped, or an old index without checksums
        index = json.loads(index_path.read_text())
        index.pop(index_text)
        index_path.write_text(json.dumps(index))
    else:
        index_path.write_text(index_text)
    namespace = {"model": model}
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, None, BODY, namespace, over=PROMPTS, batch_size=2, out=tmp_path)
    assert str(caught.value) == (f"{index_path} cannot be used: {problem}. It lists the batches of --out {tmp_path}: "
                                 f"delete index.json to compute every batch again (the batch files are written "
                                 f"anew), or give a new DIR")
    assert namespace == {"model": model}
    with pytest.raises(nbgrad.NbgradError, match="cannot be used: " + problem.split(" (")[0]):
        nbgrad.datasets.verify(tmp_path)
    index_path.unlink()                     # what the message says to do
    namespace, calls = run(model, tmp_path)
    assert calls == 3
    assert_values_right(model, namespace)


def test_verify_of_a_folder_that_is_no_out_folder_says_so(tmp_path):
    with pytest.raises(nbgrad.NbgradError, match=r"verify: .* holds no index.json: it is not a folder that --out "
                                                 r"wrote, or its run finished no batch"):
        nbgrad.datasets.verify(tmp_path)


def test_temporary_files_a_killed_run_left_are_removed_by_the_next_run(default_model, tmp_path):
    gone_pid = 2 ** 22 + 1                 # above Linux's largest process id: no such process
    left = [tmp_path / f".batch-00000002.safetensors.{gone_pid}.tmp", tmp_path / f".index.json.{gone_pid}.tmp"]
    mine = tmp_path / ".notes.tmp"          # not a name nbgrad writes: left alone
    for path in left + [mine]:
        path.write_bytes(b"half a file")
    run(default_model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [".notes.tmp"]


def test_an_interrupt_during_a_batch_write_counts_only_what_is_in_dir(default_model, tmp_path, monkeypatch):
    written = []
    write = out_folder.write_atomic

    def interrupted_second_batch(path, data):
        if path.name == "batch-00000002.safetensors":
            raise KeyboardInterrupt
        written.append(path.name)
        write(path, data)
    monkeypatch.setattr(out_folder, "write_atomic", interrupted_second_batch)
    with pytest.raises(KeyboardInterrupt) as raised:
        run(default_model, tmp_path)
    assert raised.value.__notes__ == ["nbgrad: interrupted after 2 examples; every batch finished is in DIR: run "
                                      "the cell again to compute only the rest"]
    assert written == ["batch-00000000.safetensors", "index.json"]


def test_a_folder_that_cannot_be_written_is_refused_before_any_batch_runs(default_model):
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc, a folder no process may write, root included")
    with pytest.raises(nbgrad.NbgradError, match=r"^--out /proc/self: the folder cannot be written \(.+\): give a "
                                                 r"folder this process may write to$"):
        run(default_model, "/proc/self")
    calls = []
    handle = default_model.register_forward_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(nbgrad.NbgradError):
            nbgrad.trace(default_model, None, BODY, {"model": default_model}, over=PROMPTS, out="/proc/self")
    finally:
        handle.remove()
    assert calls == []


def test_dot_dots_in_dir_make_no_stray_folder(default_model, tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    namespace, _ = run(default_model, "x/../../../y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "y"]
    assert list((tmp_path / "a" / "b").iterdir()) == []
    assert (tmp_path / "y" / "index.json").exists() and len(namespace["last"]) == len(PROMPTS)


def test_the_magic_expands_a_tilde_in_dir(shell, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    shell.run_cell("model = nbgrad.load_model()\nprompts = ['Hello there', 'Hi']")
    result = shell.run_cell("%%trace model --over prompts --out ~/acts -q\n" + BODY)
    result.raise_error()
    assert (tmp_path / "home" / "acts" / "index.json").exists()
    assert not (tmp_path / "~").exists()
    shutil.rmtree(tmp_path / "home")
