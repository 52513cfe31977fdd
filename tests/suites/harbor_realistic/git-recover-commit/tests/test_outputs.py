import subprocess


def git(*args):
    return subprocess.run(["git", "-C", "/app/repo", *args], capture_output=True, text=True, check=True).stdout


def test_content_restored():
    assert open("/app/repo/notes.txt").read().strip() == "v2 important"


def test_on_main_and_committed():
    assert git("rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert "important work" in git("log", "--format=%s")
