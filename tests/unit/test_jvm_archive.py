from pathlib import Path

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
