"""``ascend-patch run`` at its edges, through the real CLI in a subprocess.

- ``--report PATH`` refuses a FIFO, a device or a socket (or a link to one) before the
  program runs -- a FIFO made the run wait at exit for a reader, or handed the report
  to whoever read it -- and never replaces one either (as root, replacing ``/dev/null``
  with a regular file broke the machine once; these tests use stand-ins under
  ``tmp_path`` and never write to a real device); it replaces a file or a link with a
  private (0600) file, creates its temporary file under a name nobody can plant a link
  at, and refuses an empty path;
- a script with NUL bytes or undecodable bytes prints what ``python script.py`` prints,
  byte for byte, with its exit status;
- ``--strict`` stopped by a broken plugin or patch says so once, and says how to go on.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ascend_patch_core._cli import report_file as _report_file
from ascend_patch_core._cli import script_source as _script_source


BIN = Path(sys.executable).parent
CLI = BIN / "ascend-patch"

TARGET = {"apx_edge_target.py": "def where():\n    return 'original'\n"}
HEALTHY = """
from ascend_patch_core import AtomicPatch, hookimpl


def patched_where():
    return "patched"


@hookimpl
def register_patches():
    return [AtomicPatch("apx_edge_target.where", "apx_edge_healthy:patched_where")]
"""
BROKEN = """
from ascend_patch_core import hookimpl


@hookimpl
def register_patches():
    raise RuntimeError("this plugin is broken on purpose")
"""
# A patch on a module imported before apply() (os): it fails at apply(), not at an import.
FAILING_PATCH = """
from ascend_patch_core import AtomicPatch, hookimpl


@hookimpl
def register_patches():
    return [AtomicPatch("os.apx_no_such_function", "apx_edge_failing:replacement", name="apx_gone")]


def replacement():
    return None
"""


def cli(*args: str) -> list[str]:
    if CLI.exists():
        return [str(CLI), *args]
    return [sys.executable, "-m", "ascend_patch_core._cli", *args]


def clean_env(tmp_path: Path, site: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env


def run(
    cmd: list[str], cwd: Path, env: dict[str, str], **kwargs: object
) -> subprocess.CompletedProcess[str]:
    options: dict[str, object] = {"capture_output": True, "text": True, "timeout": 120}
    options.update(kwargs)
    return subprocess.run(cmd, cwd=cwd, env=env, **options)  # type: ignore[call-overload,no-any-return]


#: How the one line starts that run says when torch_npu is missing and no --emulate-npu
#: (docs/cli-reference.md): the launcher's, before the program's first line -- not the program's output.
REDIRECT_NOTE = "ascend-patch run: note: torch_npu is not installed"


def program_stderr(stderr: Any) -> Any:
    """run's stderr (text or bytes) without the launcher's note on inactive redirects (said at most once)."""
    note = REDIRECT_NOTE.encode() if isinstance(stderr, bytes) else REDIRECT_NOTE
    lines = stderr.splitlines(keepends=True)
    assert sum(line.startswith(note) for line in lines) <= 1, stderr
    return stderr[:0].join(line for line in lines if not line.startswith(note))


def install(site: Path, dist: str, plugin: str, source: str) -> None:
    """A plugin distribution as importlib.metadata finds one: a .dist-info on PYTHONPATH."""
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[ascend_patch]\n{plugin} = {plugin}\n")
    (site / f"{plugin}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    for name, source in TARGET.items():
        (root / name).write_text(source)
    install(root, "apx-edge-healthy", "apx_edge_healthy", HEALTHY)
    install(root, "apx-edge-broken", "apx_edge_broken", BROKEN)
    return root


def report_of(text: str) -> dict[str, object]:
    data = json.loads(text)
    assert data["schema"] == "ascend-patch-run/1"
    return data  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- --report PATH


def _refused(done: subprocess.CompletedProcess[str], path: Path, kind: str) -> None:
    """Exit 2 before the program ran, one line naming the path and what it is."""
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith(f"ascend-patch run: --report {path}: is {kind}"), done.stderr
    assert "not a regular file" in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_fifo_at_the_report_path_is_refused_before_the_program_runs(tmp_path: Path) -> None:
    """--report FIFO: a usage error before the program runs (it used to run, then wait at
    exit for a reader of the FIFO -- forever without one -- or hand the report to
    whoever read it). The FIFO is left as it was, and nobody reading it gets anything."""
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    (tmp_path / "prog.py").write_text("open('ran', 'w').close()\n")

    done = run(
        cli("run", "--report", str(fifo), "prog.py"), tmp_path, clean_env(tmp_path), timeout=60
    )

    _refused(done, fifo, "a FIFO")
    assert not (tmp_path / "ran").exists()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name) == []


def test_a_link_to_a_fifo_or_a_device_is_refused_and_left_alone(tmp_path: Path) -> None:
    """--report LINK where LINK -> a FIFO, or -> /dev/null: refused the same way; the link
    stays a link and what it points to is untouched."""
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    (tmp_path / "prog.py").write_text("print('ran')\n")
    for name, target, kind in (
        ("fifo-link", str(fifo), "a FIFO (through a symbolic link)"),
        ("null-link", os.devnull, "a character device (through a symbolic link)"),
    ):
        link = tmp_path / name
        link.symlink_to(target)

        done = run(
            cli("run", "--report", str(link), "prog.py"), tmp_path, clean_env(tmp_path), timeout=60
        )

        _refused(done, link, kind)
        assert link.is_symlink() and os.readlink(link) == target
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # read-only look at the real one


def test_a_character_device_at_the_report_path_is_refused_and_kept(tmp_path: Path) -> None:
    """--report DEVICE: a null device made under tmp_path (a stand-in for /dev/null; needs
    the right to mknod) is refused before the program runs, and stays a character device."""
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # Linux's /dev/null numbers
    except (PermissionError, AttributeError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    (tmp_path / "prog.py").write_text("print('ran')\n")

    done = run(cli("run", "--report", str(device), "prog.py"), tmp_path, clean_env(tmp_path))

    _refused(done, device, "a character device")
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    assert os.major(os.lstat(device).st_rdev) == 1


def test_a_fifo_that_appears_at_the_report_path_during_the_run_is_left_alone(
    tmp_path: Path,
) -> None:
    """The program puts a FIFO where the report goes: the run still ends at once (nothing
    opens the FIFO), says the report was not written and why, and the FIFO stays a FIFO."""
    report = tmp_path / "run.json"
    (tmp_path / "prog.py").write_text(f"import os\nos.mkfifo({str(report)!r})\nprint('ran')\n")

    done = run(
        cli("run", "--report", str(report), "prog.py"), tmp_path, clean_env(tmp_path), timeout=60
    )

    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
    assert f"could not write the run report to {report}" in done.stderr
    assert "is now a FIFO, which is left alone" in done.stderr
    assert stat.S_ISFIFO(os.lstat(report).st_mode)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("stdout_is", ["pipe", "file"])
def test_a_report_to_stdout_follows_the_program_s_output(tmp_path: Path, stdout_is: str) -> None:
    """--report to a link to /proc/self/fd/1 (what /dev/stdout is): the report is appended to
    stdout after what the program printed -- down a pipe, or into the file stdout was
    redirected to, which is neither truncated nor replaced."""
    link = tmp_path / "stdout-link"
    link.symlink_to("/proc/self/fd/1")
    (tmp_path / "prog.py").write_text("print('ran first')\n")
    cmd = cli("run", "--report", str(link), "prog.py")
    env = clean_env(tmp_path)

    if stdout_is == "pipe":
        done = run(cmd, tmp_path, env)
        output = done.stdout
    else:
        out = tmp_path / "out.txt"
        with out.open("w") as fh:
            done = run(cmd, tmp_path, env, stdout=fh, capture_output=False, stderr=subprocess.PIPE)
        output = out.read_text()

    assert done.returncode == 0, done.stderr
    assert output.startswith("ran first\n")
    assert report_of(output[len("ran first\n") :])["exit_status"] == 0
    assert link.is_symlink()


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o277])
def test_a_regular_report_is_replaced_whole_and_private(tmp_path: Path, umask: int) -> None:
    """A regular file is replaced atomically by a new private file: mode 0600 whatever the
    umask (it was 0666 under umask 000, like the cache before it), and no temporary file
    is left beside it."""
    report = tmp_path / "out" / "run.json"
    report.parent.mkdir()
    report.write_text("stale and much longer than nothing " * 100)
    (tmp_path / "prog.py").write_text("print('ran')\n")

    done = run(
        cli("run", "--report", str(report), "prog.py"), tmp_path, clean_env(tmp_path), umask=umask
    )

    assert done.returncode == 0, done.stderr
    assert report_of(report.read_text())["exit_status"] == 0
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    assert [p.name for p in report.parent.iterdir()] == ["run.json"]


def test_a_link_planted_at_the_report_path_is_replaced_not_followed(tmp_path: Path) -> None:
    """--report LINK where LINK -> someone's file (a link planted at a predictable path):
    the link is replaced by the report, the file it pointed to is left as it was."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    planted = tmp_path / "run.json"
    planted.symlink_to(victim)
    (tmp_path / "prog.py").write_text("print('ran')\n")

    done = run(cli("run", "--report", str(planted), "prog.py"), tmp_path, clean_env(tmp_path))

    assert (done.returncode, done.stdout, program_stderr(done.stderr)) == (0, "ran\n", "")
    assert victim.read_text() == "precious\n"
    assert not planted.is_symlink()
    assert report_of(planted.read_text())["exit_status"] == 0


def test_the_temporary_file_cannot_be_planted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary name is random and created exclusively without following links: a link
    planted at the name about to be used is neither followed nor replaced; another name is
    drawn."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    report = tmp_path / "run.json"
    draws = iter([b"\x01" * 6, b"\x02" * 6])
    monkeypatch.setattr(_report_file.os, "urandom", lambda n: next(draws))
    planted = Path(f"{report}.{os.getpid()}.{'01' * 6}.tmp")
    planted.symlink_to(victim)

    _report_file.write_json(str(report), {"schema": "ascend-patch-run/1", "exit_status": 0})

    assert victim.read_text() == "precious\n"
    assert planted.is_symlink() and planted.resolve() == victim
    assert report_of(report.read_text())["exit_status"] == 0
    assert not report.is_symlink()


@pytest.mark.parametrize("args", [["--report", ""], ["--report="]], ids=["separate", "equals"])
def test_an_empty_report_path_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    """--report '' (an unset shell variable) is a usage error naming the problem: exit 2, the
    program does not run (it used to run and write no report, silently)."""
    (tmp_path / "prog.py").write_text("print('ran')\n")

    done = run(cli("run", *args, "prog.py"), tmp_path, clean_env(tmp_path))

    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("ascend-patch run: --report needs the file to write")
    assert "empty" in done.stderr and len(done.stderr.splitlines()) == 1


# ---------------------------------------------------------------------------- odd encodings

_ODD_SOURCES = {
    "nul-line-1": b"x = 1\x00\nprint(x)\n",
    "nul-line-3": b"print('before')\ny = 2\nz = 3\x00 # c\n",
    "nul-in-comment": b"# hello \x00 there\nprint(1)\n",
    "nul-in-string": b'x = "a\x00b"\n',
    "nul-after-cr": b"x = 1\r\x00\n",
    "nul-at-eof": b"print(1)\x00",
    "nul-declared-latin-1": b"# coding: latin-1\nx = 1\x00\n",
    "non-utf8-line-1": b'x = "\xff"\nprint(x)\n',
    "non-utf8-line-3": b'print(1)\n\nx = "\xfe"\n',
    "non-utf8-in-comment": b"# \xe9t\xe9\nprint('ran')\n",
    "non-utf8-crlf": b'x = 1\r\ny = "\xff"\r\n',
    "truncated-utf8-at-eof": b"x = 1\n\xc3",
    "utf8-surrogate": b'x = "\xed\xa0\x80"\n',
    "coding-on-line-3-ignored": b'#!/usr/bin/env python\n\n# coding: latin-1\nx = "\xe9"\n',
    "declared-ascii-fails": b'# coding: ascii\nx = "\xe9"\n',
    "declared-utf8-fails": b'# coding: utf-8\nx = "\xff"\n',
    "unknown-encoding": b"# -*- coding: bogus -*-\nx = 1\n",
    "bom-against-latin-1": b"\xef\xbb\xbf# -*- coding: latin-1 -*-\nx = 1\n",
    "bom-then-bad-byte": b'\xef\xbb\xbfx = "\xff"\n',
    "syntax-error-and-bad-byte": b"x = = 1\ny = '\xff'\n",
    # Files Python does run: the same output, the same status.
    "declared-latin-1-runs": b'# -*- coding: latin-1 -*-\nprint(len("\xe9\xe8"))\n',
    "declared-on-line-2-runs": b'#!/usr/bin/env python\n# coding: cp1252\nprint(len("\x80"))\n',
    "utf8-runs": 'print("ok é 中")\n'.encode(),
}


@pytest.mark.parametrize("source", list(_ODD_SOURCES.values()), ids=list(_ODD_SOURCES))
def test_odd_bytes_show_what_python_shows(tmp_path: Path, source: bytes) -> None:
    """NUL bytes, undecodable bytes (with and without a declared encoding), unknown encodings,
    BOM conflicts: run's stdout, stderr and exit status equal `python prog.py`'s, byte for byte,
    on the interpreter running the tests (whatever its version says)."""
    (tmp_path / "prog.py").write_bytes(source)
    env = clean_env(tmp_path)

    expected = subprocess.run(
        [sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, timeout=120
    )
    got = subprocess.run(
        cli("run", "prog.py"), cwd=tmp_path, env=env, capture_output=True, timeout=120
    )

    assert (got.returncode, got.stdout, program_stderr(got.stderr)) == (
        expected.returncode,
        expected.stdout,
        expected.stderr,
    )


def test_python_s_file_reader_never_runs_the_script(tmp_path: Path) -> None:
    """The child interpreter that compiles a script the way `python script.py` reads it stops
    before the script's first line: a script that would leave a file leaves none."""
    marker = tmp_path / "ran.txt"
    script = tmp_path / "prog.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\nprint('ran')\n")

    code = _script_source.read_like_python(str(script))

    assert code is not None and code.co_filename == str(script)
    assert not marker.exists()
    exec(code, {"__name__": "__main__"})  # the code is the script's, and runs where it is run
    assert marker.exists()


# ---------------------------------------------------------------------------- --strict


def test_strict_stop_says_it_once_and_how_to_go_on(tmp_path: Path, site: Path) -> None:
    """--strict and a broken plugin: one line, one `ascend-patch run:` prefix (no nested
    `ascend-patch (strict):`), naming the plugin and what broke, and the ways on, which work:
    --disable NAME and ASCEND_PATCH_DISABLE=NAME run the program patched by the healthy plugin."""
    (tmp_path / "prog.py").write_text("import apx_edge_target\nprint(apx_edge_target.where())\n")
    env = clean_env(tmp_path, site)

    stopped = run(cli("run", "--strict", "prog.py"), tmp_path, env)
    by_option = run(
        cli("run", "--strict", "--disable", "apx_edge_broken", "prog.py"), tmp_path, env
    )
    by_variable = run(
        cli("run", "--strict", "prog.py"),
        tmp_path,
        clean_env(tmp_path, site, ASCEND_PATCH_DISABLE="apx_edge_broken"),
    )

    assert (stopped.returncode, stopped.stdout) == (1, "")
    line = stopped.stderr
    assert len(line.splitlines()) == 1, line
    assert line.startswith("ascend-patch run: plugin 'apx_edge_broken' from apx-edge-broken 0.1.0")
    assert line.count("ascend-patch run:") == 1 and "(strict)" not in line
    assert "RuntimeError: this plugin is broken on purpose" in line
    assert "stopped the program before its first line" in line
    assert "--disable apx_edge_broken" in line and "ASCEND_PATCH_DISABLE=apx_edge_broken" in line
    assert "without --strict" in line
    for ok in (by_option, by_variable):
        assert (ok.returncode, ok.stdout) == (0, "patched\n"), ok.stderr


def test_strict_stop_by_a_patch_names_it(tmp_path: Path) -> None:
    """--strict and a patch that fails at apply() (its module is already imported): one prefix,
    the patch and its plugin named, the way on (--disable NAME) said once, and that way works."""
    site = tmp_path / "site"
    site.mkdir()
    install(site, "apx-edge-failing", "apx_edge_failing", FAILING_PATCH)
    (tmp_path / "prog.py").write_text("print('ran')\n")
    env = clean_env(tmp_path, site)

    stopped = run(cli("run", "--strict", "prog.py"), tmp_path, env)
    disabled = run(cli("run", "--strict", "--disable", "apx_gone", "prog.py"), tmp_path, env)

    assert (stopped.returncode, stopped.stdout) == (1, ""), stopped.stderr
    said = stopped.stderr
    assert said.startswith("ascend-patch run: patch 'apx_gone' (plugin 'apx_edge_failing'")
    assert said.count("ascend-patch run:") == 1 and "(strict)" not in said
    assert "could not be applied on os.apx_no_such_function" in said
    assert said.count("--disable apx_gone") == 1  # the way on, said once
    assert "ASCEND_PATCH_DISABLE=apx_edge_failing drops its whole plugin" in said
    assert (disabled.returncode, disabled.stdout) == (0, "ran\n"), disabled.stderr


def test_strict_stop_by_an_unknown_name_says_the_option_it_came_from(tmp_path: Path) -> None:
    """`run --strict --disable NoSuch`: named as the user wrote it (--disable), once, with the way on."""
    (tmp_path / "prog.py").write_text("print('ran')\n")
    env = clean_env(tmp_path, tmp_path)

    stopped = run(cli("run", "--strict", "--disable", "NoSuchGroup", "prog.py"), tmp_path, env)

    assert (stopped.returncode, stopped.stdout) == (1, ""), stopped.stderr
    said = stopped.stderr
    assert said.count("ascend-patch run:") == 1 and "(strict)" not in said
    assert "--disable names 'NoSuchGroup', which matches no patch" in said
    assert "run without --strict" in said


def test_a_strict_child_says_it_once_and_how_to_go_on(tmp_path: Path, site: Path) -> None:
    """A process started under a strict `run` whose patching fails: one line from the start
    hook, without a nested prefix, with the way on; the process does not run."""
    (tmp_path / "prog.py").write_text(
        "import subprocess, sys\n"
        "done = subprocess.run([sys.executable, '-c', 'print(\"child ran\")'])\n"
        "print('child status', done.returncode)\n"
    )
    env = clean_env(tmp_path, site)

    done = run(cli("run", "--strict", "--disable", "apx_edge_broken", "prog.py"), tmp_path, env)
    child = run(
        [sys.executable, "-c", "print('child ran')"],
        tmp_path,
        clean_env(
            tmp_path, site, ASCEND_PATCH_RUN=json.dumps({"strict": True}, separators=(",", ":"))
        ),
    )

    assert (done.returncode, done.stdout) == (0, "child ran\nchild status 0\n"), done.stderr
    assert (child.returncode, child.stdout) == (1, "")
    assert len(child.stderr.splitlines()) == 1, child.stderr
    assert child.stderr.startswith("ascend-patch (start hook, pid ")
    assert "(strict)" not in child.stderr and "PluginError" not in child.stderr
    assert "stopped this process before its first line" in child.stderr
    assert "--disable apx_edge_broken" in child.stderr
