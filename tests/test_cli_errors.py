"""Bad input on the command line and in the environment: one line that names the problem and the
fix, and an exit status, never a traceback."""

from __future__ import annotations

import pytest

from tests.clirun import ft


@pytest.mark.parametrize(("args", "env", "code", "words"), [
    (("pull", "hf://Qwen/Qwen3-30B-A3B:fp8"), {}, 1, "an address is hf://org/name"),
    (("ps",), {"FT_HOST": "localhost:99999"}, 1, "FT_HOST='localhost:99999': the port must be a number"),
    (("pull", "hf://org/name"), {"FT_PULL_RETRIES": "abc"}, 1, "FT_PULL_RETRIES='abc'"),
    (("bench", "--shape", "tiny", "--device", "cpu", "--prefill", "abc"), {}, 2, "Invalid value for --prefill: 'abc'"),
    (("bench", "--shape", "tiny", "--device", "cpu", "--tokens", "0"), {}, 2, "Invalid value for '--tokens'"),
    (("pull", "./no-such-checkpoint"), {}, 1, "no-such-checkpoint does not exist: give a Hugging Face checkpoint"),
    (("pull", "/etc/hostname/config.json"), {}, 1, "does not exist"),
])
def test_bad_input_is_one_clear_line(capsys, monkeypatch, tmp_path, args: tuple[str, ...], env: dict[str, str],
                                     code: int, words: str) -> None:
    monkeypatch.setenv("FT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FT_HOST", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    status, _, err = ft(capsys, *args)
    assert status == code and words in err, err


def test_a_config_file_given_for_its_checkpoint_names_the_directory(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("FT_HOME", str(tmp_path / "home"))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    code, _, err = ft(capsys, "pull", str(tmp_path / "ckpt" / "config.json"))
    assert code == 1 and f"is a checkpoint's config file: give its directory, {tmp_path / 'ckpt'}" in err


def test_ctrl_c_during_a_pull_says_how_to_resume(capsys, monkeypatch, tmp_path) -> None:
    """click turns Ctrl-C inside a command into Abort, so the resume hint never showed: "aborted"."""
    import ftpull.cli

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setenv("FT_HOME", str(tmp_path))
    monkeypatch.setattr(ftpull.cli, "pull", interrupted)
    code, _, err = ft(capsys, "pull", "tiny")
    assert code == 130 and "interrupted; run the same command again: a download resumes where it stopped" in err
    monkeypatch.setattr(ftpull.cli, "_store", interrupted)  # a command that downloads nothing promises nothing
    code, _, err = ft(capsys, "fit", "tiny")
    assert code == 130 and err.strip() == "interrupted"


def test_version(capsys) -> None:
    code, out, _ = ft(capsys, "--version")
    assert code == 0 and out.startswith("ft version ")
