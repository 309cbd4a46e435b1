"""The native kernel's build: a cache folder per environment (keyed on what changes the build), an honest message on
stderr before a build whoever triggers it, and `tf-family build-kernels` to build ahead of time."""

import os
import sys
import time

import pytest
import torch.utils.cpp_extension

from tf_family import cli
from tf_family.attention import native


def test_the_build_key_follows_everything_that_changes_the_build(monkeypatch):
    key = native.build_key()
    assert key == native.build_key() and len(key) == 16
    monkeypatch.setattr(sys, "prefix", "/some/other/venv")  # another virtual environment
    other_python = native.build_key()
    monkeypatch.setenv("CXX", "clang++")
    other_compiler = native.build_key()
    monkeypatch.setattr(native, "_CFLAGS", (*native._CFLAGS, "-DNDEBUG"))
    other_flags = native.build_key()
    assert len({key, other_python, other_compiler, other_flags}) == 4
    assert native.build_key() in str(native.build_directory())


def _fake_load(calls):
    def load(name, sources, extra_cflags, extra_ldflags, verbose):
        calls.append((name, extra_cflags))
        return object()

    return load


def test_a_fresh_build_says_so_on_stderr_and_a_cached_one_is_silent(monkeypatch, capsys, tmp_path):
    calls = []
    monkeypatch.setattr(native, "build_directory", lambda: tmp_path)  # not the real one (another build's lock)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", _fake_load(calls))
    monkeypatch.setattr(native, "is_built", lambda: False)
    native._build()
    err = capsys.readouterr().err
    assert "compiling the native CPU attention kernel" in err and native.BUILD_TIME_NOTE in err
    assert "tf-family build-kernels" in err and "built in" in err
    assert calls[0][0].endswith(native.build_key()) and "-march=native" in calls[0][1]
    monkeypatch.setattr(native, "is_built", lambda: True)
    native._build()
    assert capsys.readouterr().err == ""


def test_build_kernels_command(monkeypatch, capsys):
    monkeypatch.setattr(native, "_state", {"module": object()})
    monkeypatch.setattr(native, "is_built", lambda: True)
    assert cli.main(["build-kernels"]) == 0
    assert "already built" in capsys.readouterr().out
    monkeypatch.setattr(native, "_state", {"module": None})
    monkeypatch.setenv("TF_FAMILY_NATIVE", "0")
    assert cli.main(["build-kernels"]) == 1
    assert "TF_FAMILY_NATIVE=0" in capsys.readouterr().err


@pytest.mark.skipif(native.extension() is None, reason="the native attention kernel could not be built here")
def test_the_built_kernel_sits_in_its_keyed_folder():
    assert native.is_built() and native.build_directory().name.endswith(native.build_key())


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path, capsys, monkeypatch):
    # a killed build leaves `lock` behind and the builder of torch 2.13 (a FileBaton: the file's existence is the
    # lock) would wait on it forever; torch 2.14's builder holds an advisory lock on a file that stays
    lock = tmp_path / "lock"
    if not hasattr(torch.utils.cpp_extension, "FileBaton"):
        lock.write_text("")
        native._clear_stale_lock(tmp_path, stale_after_s=0)
        assert lock.exists() and capsys.readouterr().err == ""
        monkeypatch.setattr(torch.utils.cpp_extension, "FileBaton", object, raising=False)  # the rule on 2.13's
    lock.write_text("")
    native._clear_stale_lock(tmp_path)
    assert lock.exists() and "waiting for another process's build" in capsys.readouterr().err
    old = time.time() - native.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    native._clear_stale_lock(tmp_path)
    assert not lock.exists() and "did not finish" in capsys.readouterr().err
    native._clear_stale_lock(tmp_path)  # no lock: nothing to say
    assert capsys.readouterr().err == ""
