import os
from pathlib import Path

import pyspark
from streamjobs_worker import jvm_archive


def test_the_archive_is_mapped_only_when_it_exists(tmp_path, monkeypatch):
    archive = tmp_path / "spark.jsa"
    monkeypatch.setenv(jvm_archive.ARCHIVE_ENV, str(archive))
    assert jvm_archive.java_options() == ""
    archive.write_bytes(b"archive")
    assert jvm_archive.java_options() == f"-XX:SharedArchiveFile={archive}"


def test_an_empty_setting_turns_archives_off(monkeypatch):
    monkeypatch.setenv(jvm_archive.ARCHIVE_ENV, "")
    assert jvm_archive.archive_path() is None
    assert jvm_archive.java_options() == ""
    assert jvm_archive.build() is None


def test_the_default_archive_is_in_the_cache_and_named_after_the_java_binary(tmp_path, monkeypatch):
    monkeypatch.delenv(jvm_archive.ARCHIVE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = jvm_archive.archive_path()
    assert first.parent == tmp_path / "streamjobs" and first.suffix == ".jsa"
    other_java = tmp_path / "jdk" / "bin"
    other_java.mkdir(parents=True)
    (other_java / "java").write_text("#!/bin/sh\n")
    (other_java / "java").chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(other_java.parent))
    assert jvm_archive.archive_path() != first


def test_an_archive_already_there_is_not_dumped_again(tmp_path, monkeypatch):
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"archive")
    monkeypatch.setattr(jvm_archive.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    assert jvm_archive.build(archive) == archive
    assert archive.read_bytes() == b"archive"


def test_a_failed_dump_says_why_and_leaves_no_partial_file(tmp_path, monkeypatch):
    class Failed:
        returncode, stderr = 1, "Error: Could not create the Java Virtual Machine."

    monkeypatch.setattr(jvm_archive.subprocess, "run", lambda *a, **k: Failed())
    archive = tmp_path / "spark.jsa"
    try:
        jvm_archive.build(archive)
    except jvm_archive.ArchiveError as exc:
        assert "Could not create the Java Virtual Machine" in str(exc)
    else:
        raise AssertionError("no error")
    assert list(Path(tmp_path).iterdir()) == []


def test_a_reinstall_at_the_same_place_names_another_archive(tmp_path, monkeypatch):
    # The JVM checks each class path jar's size and modification time: a cached archive of the installation
    # before (a CI's clean clone at the same path) is not mapped, so it must not be found either.
    monkeypatch.delenv(jvm_archive.ARCHIVE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    jars = tmp_path / "pyspark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"classes")
    monkeypatch.setattr(pyspark, "__file__", str(tmp_path / "pyspark" / "__init__.py"))
    before = jvm_archive.archive_path()
    assert jvm_archive.archive_path() == before
    os.utime(jars / "spark-core.jar", ns=(0, 10**18))
    after = jvm_archive.archive_path()
    assert after != before and after.parent == before.parent
    assert after.name.split("-")[1] == before.name.split("-")[1]  # the same installation


def test_a_new_dump_removes_the_installations_stale_archives_and_no_others(tmp_path, monkeypatch):
    def dump(command, **_):
        Path(command[-1]).write_bytes(b"archive")
        return type("Done", (), {"returncode": 0, "stderr": ""})()

    monkeypatch.setattr(jvm_archive.subprocess, "run", dump)
    stale, other, configured = (tmp_path / f"spark-{'a' * 16}-{'0' * 16}.jsa",
                                tmp_path / f"spark-{'b' * 16}-{'0' * 16}.jsa", tmp_path / f"spark-{'a' * 16}.jsa")
    for archive in (stale, other, configured):
        archive.write_bytes(b"older")
    fresh = jvm_archive.build(tmp_path / f"spark-{'a' * 16}-{'1' * 16}.jsa")
    assert fresh.read_bytes() == b"archive"
    assert sorted(tmp_path.iterdir()) == sorted([fresh, other, configured])
